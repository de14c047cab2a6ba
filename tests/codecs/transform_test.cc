// Each transform on its own: exact round trips for the lossless ones (every
// bit pattern, NaN payloads included), the stated error bounds for the lossy
// ones, determinism, and refusal of encodings of the wrong size or content.
#include <cstdio>
#include <limits>

#include "codec_test_util.h"
#include "codecs/shuffle.h"

namespace primecache {
namespace {

using testing_util::BitEqual;
using testing_util::Rng;
using testing_util::SmoothPlane;

const Transform& T(std::string_view id) {
  auto t = CodecRegistry::Default().FindTransform(id);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return **t;
}

// Values that stress every class of f32: zeros of both signs, subnormals,
// extremes, infinities, NaNs with payloads, and ordinary noise.
std::vector<float> Awkward(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> specials = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,
                                         0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                         0x7f800001u, 0xffbadbadu, 0x3f800000u, 0x3f7fffffu};
  Rng r(seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t x = r.Next();
    v[i] = (x & 3) == 0 ? std::bit_cast<float>(specials[(x >> 8) % specials.size()])
                        : std::bit_cast<float>(static_cast<std::uint32_t>(x >> 32));
  }
  return v;
}

std::vector<float> Decode(const Transform& t, const std::string& enc, std::size_t n, Status* s) {
  std::vector<float> out(n);
  *s = t.Decode(AsBytes(enc), out);
  return out;
}

class LosslessTest : public ::testing::TestWithParam<std::string_view> {};

TEST_P(LosslessTest, RoundTripsEveryBitPatternAtEverySize) {
  const Transform& t = T(GetParam());
  const std::int32_t level = GetParam() == kShuffleZstdTransform ? 3 : 0;
  for (std::size_t n : {0u, 1u, 3u, 15u, 16u, 17u, 31u, 32u, 33u, 1000u, 65536u + 7u}) {
    for (const auto& values : {Awkward(n, n), SmoothPlane(n, 0, 1, n)}) {
      std::string enc;
      ASSERT_TRUE(t.Encode(values, level, &enc).ok());
      Status s;
      auto back = Decode(t, enc, n, &s);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(BitEqual(values, back)) << GetParam() << " n=" << n;
    }
  }
}

TEST_P(LosslessTest, IsDeterministic) {
  const Transform& t = T(GetParam());
  auto v = SmoothPlane(9, 0, 64, 100);
  std::string a, b;
  ASSERT_TRUE(t.Encode(v, 0 + (GetParam() == kShuffleZstdTransform), &a).ok());
  ASSERT_TRUE(t.Encode(v, 0 + (GetParam() == kShuffleZstdTransform), &b).ok());
  EXPECT_EQ(a, b);
}

TEST_P(LosslessTest, RefusesAnEncodingOfAnotherLength) {
  const Transform& t = T(GetParam());
  auto v = SmoothPlane(2, 0, 1, 100);
  std::string enc;
  ASSERT_TRUE(t.Encode(v, GetParam() == kShuffleZstdTransform ? 1 : 0, &enc).ok());
  Status s;
  Decode(t, enc, 99, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  Decode(t, enc, 101, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  Decode(t, enc.substr(0, enc.size() - 1), 100, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  Decode(t, enc + "x", 100, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Transforms, LosslessTest, ::testing::Values(kRawTransform, kShuffleZstdTransform),
                         [](const auto& info) {
                           return std::string(info.param == kRawTransform ? "raw" : "shuffle_zstd");
                         });

TEST(ShuffleTest, EveryImplementationGroupsBytesBySignificance) {
  using codecs::ShuffleIsa;
  for (ShuffleIsa isa : {ShuffleIsa::kScalar, ShuffleIsa::kSse2, ShuffleIsa::kAvx2}) {
    if (!codecs::ShuffleIsaAvailable(isa)) {
      std::printf("shuffle ISA %d not available here; not tested\n", static_cast<int>(isa));
      continue;
    }
    for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 31u, 32u, 33u, 48u, 50u, 64u, 95u, 96u, 1000u, 4099u}) {
      std::vector<std::byte> in(4 * n), shuffled(4 * n), back(4 * n);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::byte>(i * 7 + 3 + i / 251);
      codecs::ShuffleBytes4With(isa, in.data(), n, shuffled.data());
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t b = 0; b < 4; ++b) {
          ASSERT_EQ(shuffled[b * n + i], in[4 * i + b])
              << static_cast<int>(isa) << " n=" << n << " " << i << " " << b;
        }
      }
      codecs::UnshuffleBytes4With(isa, shuffled.data(), n, back.data());
      EXPECT_EQ(in, back) << static_cast<int>(isa) << " n=" << n;
      std::vector<std::byte> dispatched(4 * n);
      codecs::ShuffleBytes4(in.data(), n, dispatched.data());
      EXPECT_EQ(dispatched, shuffled);
    }
  }
}

TEST(ShuffleZstdTest, CompressesSmoothPlanesAndTakesEveryLevel) {
  const Transform& t = T(kShuffleZstdTransform);
  auto v = SmoothPlane(4, 0, 256, 64);
  std::string enc;
  ASSERT_TRUE(t.Encode(v, 1, &enc).ok());
  EXPECT_LT(enc.size(), v.size() * 4);
  EXPECT_TRUE(t.CheckLevel(-5).ok());
  EXPECT_TRUE(t.CheckLevel(19).ok());
  EXPECT_TRUE(t.CheckLevel(1000).IsInvalidArgument());
  EXPECT_TRUE(t.Encode(v, 1000, &enc).IsInvalidArgument());
}

TEST(ShuffleZstdTest, RefusesFramesThatAreNotExactlyOneFrameOfTheRightSize) {
  const Transform& t = T(kShuffleZstdTransform);
  auto v = SmoothPlane(4, 0, 8, 8);
  std::string enc;
  ASSERT_TRUE(t.Encode(v, 1, &enc).ok());
  Status s;
  Decode(t, "garbage that is not zstd", 64, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  Decode(t, enc + enc, 64, &s);  // two frames
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("one zstd frame"), std::string::npos) << s.message();
  std::string damaged = enc;
  damaged[damaged.size() / 2] ^= 0x55;
  Decode(t, damaged, 64, &s);  // may decode to other bytes; must never overrun
  std::string empty;
  ASSERT_TRUE(t.Encode({}, 1, &empty).ok());
  Decode(t, empty, 64, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

TEST(LevelTest, OnlyShuffleZstdTakesALevel) {
  for (auto id : {kRawTransform, kBf16Transform, kQ8_0Transform}) {
    EXPECT_TRUE(T(id).CheckLevel(0).ok());
    EXPECT_TRUE(T(id).CheckLevel(1).IsInvalidArgument()) << id;
  }
}

// ---- bf16 ------------------------------------------------------------------------

// The bound docs/codecs.md states for bf16/v1.
void ExpectWithinBf16Bound(float x, float y) {
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(y));
    return;
  }
  if (std::isinf(x)) {
    EXPECT_EQ(x, y);
    return;
  }
  ASSERT_TRUE(std::isfinite(y)) << x;
  const double err = std::fabs(static_cast<double>(x) - static_cast<double>(y));
  const double ax = std::fabs(static_cast<double>(x));
  if (ax < std::numeric_limits<float>::min()) {
    EXPECT_LE(err, std::ldexp(1.0, -134)) << x;
  } else if (ax >= std::ldexp(2.0 - std::ldexp(1.0, -8), 127)) {
    EXPECT_LE(err, std::ldexp(ax, -7)) << x;  // saturated
  } else {
    EXPECT_LE(err, std::ldexp(ax, -8)) << x;
  }
}

TEST(Bf16Test, StaysWithinTheStatedBound) {
  const Transform& t = T(kBf16Transform);
  auto v = Awkward(200000, 17);
  for (float x : SmoothPlane(5, 0, 100, 100)) v.push_back(x);
  std::string enc;
  ASSERT_TRUE(t.Encode(v, 0, &enc).ok());
  EXPECT_EQ(enc.size(), v.size() * 2);
  Status s;
  auto back = Decode(t, enc, v.size(), &s);
  ASSERT_TRUE(s.ok());
  for (std::size_t i = 0; i < v.size(); ++i) ExpectWithinBf16Bound(v[i], back[i]);
}

TEST(Bf16Test, RoundsToNearestEvenAndSaturates) {
  const Transform& t = T(kBf16Transform);
  auto one = [&](std::uint32_t bits) {
    std::vector<float> v = {std::bit_cast<float>(bits)};
    std::string enc;
    EXPECT_TRUE(t.Encode(v, 0, &enc).ok());
    std::uint16_t b;
    std::memcpy(&b, enc.data(), 2);
    return b;
  };
  EXPECT_EQ(one(0x3f808000u), 0x3f80u);  // tie, even below
  EXPECT_EQ(one(0x3f818000u), 0x3f82u);  // tie, even above
  EXPECT_EQ(one(0x3f808001u), 0x3f81u);
  EXPECT_EQ(one(0x7f7fffffu), 0x7f7fu);  // FLT_MAX saturates instead of becoming inf
  EXPECT_EQ(one(0xff7fffffu), 0xff7fu);
  EXPECT_EQ(one(0x7f800000u), 0x7f80u);
  EXPECT_EQ(one(0x7f800001u) & 0x7fc0u, 0x7fc0u);  // signalling NaN stays a NaN
}

// ---- q8_0 ------------------------------------------------------------------------

TEST(Q8Test, StaysWithinTheStatedBound) {
  const Transform& t = T(kQ8_0Transform);
  Rng r(23);
  std::vector<float> v;
  // Blocks at many magnitudes, down to subnormal scales and up to FLT_MAX.
  for (int e : {-149, -140, -130, -126, -100, -20, -1, 0, 3, 30, 100, 127}) {
    for (int i = 0; i < 32 * 40; ++i) v.push_back(std::ldexp(r.Uniform(), e));
  }
  for (int i = 0; i < 32; ++i)
    v.push_back(i % 2 ? std::numeric_limits<float>::max() : -std::numeric_limits<float>::max());
  for (float x : SmoothPlane(6, 0, 37, 77)) v.push_back(x);  // a short last block
  std::string enc;
  ASSERT_TRUE(t.Encode(v, 0, &enc).ok());
  EXPECT_EQ(enc.size(), (v.size() + 31) / 32 * 4 + v.size());
  Status s;
  auto back = Decode(t, enc, v.size(), &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (std::size_t start = 0; start < v.size(); start += 32) {
    double amax = 0;
    const std::size_t end = std::min(v.size(), start + 32);
    for (std::size_t i = start; i < end; ++i) amax = std::max(amax, std::fabs(static_cast<double>(v[i])));
    const double bound = amax / 254 + std::ldexp(amax, -20) + std::ldexp(1.0, -140);
    for (std::size_t i = start; i < end; ++i) {
      ASSERT_TRUE(std::isfinite(back[i])) << i;
      ASSERT_LE(std::fabs(static_cast<double>(v[i]) - back[i]), bound) << "value " << i << " = " << v[i];
    }
  }
}

TEST(Q8Test, RefusesNonFiniteInputAndForeignScalesOrValues) {
  const Transform& t = T(kQ8_0Transform);
  std::string enc;
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::infinity()};
  EXPECT_TRUE(t.Encode(bad, 0, &enc).IsInvalidArgument());
  bad[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(t.Encode(bad, 0, &enc).IsInvalidArgument());

  std::vector<float> v = {1.0f, -2.0f, 0.5f};
  ASSERT_TRUE(t.Encode(v, 0, &enc).ok());
  Status s;
  std::string neg = enc;
  testing_util::Store<float>(neg, 0, -1.0f);
  Decode(t, neg, 3, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  std::string nan = enc;
  testing_util::Store<float>(nan, 0, std::numeric_limits<float>::quiet_NaN());
  Decode(t, nan, 3, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  std::string m128 = enc;
  m128[4] = static_cast<char>(0x80);
  Decode(t, m128, 3, &s);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

TEST(WrappedIdentityTest, ATransformReportsItselfAroundTheInnerKind) {
  EXPECT_EQ(T(kShuffleZstdTransform).WrappedId(kMlaLatentKind), "shuffle-zstd/v1(mla-latent/v1)");
  EXPECT_EQ(T(kBf16Transform).WrappedId(kMlaLatentKind), "bf16/v1(mla-latent/v1)");
  EXPECT_NE(T(kRawTransform).WrappedId(kMlaLatentKind), T(kRawTransform).WrappedId(kKvPlainKind));
}

}  // namespace
}  // namespace primecache

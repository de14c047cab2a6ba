// The KV attention twins on the CPU: the TurboQuant row bytes as the model
// specification lays them out, the rotation, and the attention (window
// masking, grouped heads, the rotated domain) against a direct evaluation.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kv_attention.h"

namespace primecache::kernels {
namespace {

std::vector<std::uint8_t> Bytes(const std::vector<std::uint32_t>& words) {
  std::vector<std::uint8_t> b(words.size() * 4);
  for (std::size_t i = 0; i < words.size(); ++i)
    for (int k = 0; k < 4; ++k) b[i * 4 + k] = static_cast<std::uint8_t>(words[i] >> (8 * k));
  return b;
}

std::vector<std::uint32_t> Encode(const std::vector<float>& x, const std::vector<float>& signs, std::uint32_t bits,
                                  std::size_t heads = 1) {
  const std::size_t n = signs.size();
  std::vector<std::uint32_t> out(heads * KvEntryWords(n, bits), 0xdeadbeefu);
  TurboQuantEncodeArgs a{x.data(), out.data(), signs.data(), 1, heads, n, heads * n, bits};
  EXPECT_TRUE(TurboQuantEncodeCpu(a).ok());
  return out;
}

TEST(TurboQuantCpuTest, AUnitVectorEncodesToTheSpecifiedBytes) {
  // x = e0, signs +1: y = H e0 / 4 = 1/4 everywhere, n = 1, z = 1: the
  // nearest 4-bit level is 0.9424 (index 11), the nearest 2-bit 1.5104 (3).
  std::vector<float> x(16, 0.0f), signs(16, 1.0f);
  x[0] = 1.0f;
  std::vector<std::uint8_t> four = Bytes(Encode(x, signs, 4));
  ASSERT_EQ(four.size(), 4u + 16 * 4 / 8);
  EXPECT_EQ(four[0], 0x00);
  EXPECT_EQ(four[3], 0x3f);  // 1.0f little-endian: 00 00 80 3f
  EXPECT_EQ(four[2], 0x80);
  for (std::size_t i = 4; i < four.size(); ++i) EXPECT_EQ(four[i], 0xBB) << i;
  std::vector<std::uint8_t> two = Bytes(Encode(x, signs, 2));
  ASSERT_EQ(two.size(), 4u + 16 * 2 / 8);
  for (std::size_t i = 4; i < two.size(); ++i) EXPECT_EQ(two[i], 0xFF) << i;
}

TEST(TurboQuantCpuTest, ZeroRowsEncodeToNormZeroAndZeroCodes) {
  std::vector<float> x(32, 0.0f), signs(32, -1.0f);
  for (std::uint32_t bits : {2u, 4u}) {
    auto w = Encode(x, signs, bits);
    for (std::uint32_t v : w) EXPECT_EQ(v, 0u);
  }
}

// Codes packed LE: code i in byte i*bits/8 at bit (i*bits) % 8, checked
// against codes computed here from the spec's definition.
TEST(TurboQuantCpuTest, CodesArePackedLittleEndianByIndex) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::uint32_t bits : {2u, 4u}) {
    for (std::size_t n : {16u, 64u, 128u}) {
      std::vector<float> x(n), signs(n);
      for (auto& v : x) v = nd(rng);
      for (auto& s : signs) s = rng() % 2 ? 1.0f : -1.0f;
      auto bytes = Bytes(Encode(x, signs, bits));
      // The rotation by its definition: y = H·(s ⊙ x) / sqrt(n) (f32 butterfly).
      std::vector<float> y(n);
      for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * signs[i];
      const std::vector<float> ones(n, 1.0f);
      ASSERT_TRUE(HadamardRowsCpu({y.data(), ones.data(), 1, 1, n, n, false}).ok());
      float ss = 0.0f;
      for (float v : x) ss += v * v;
      const float norm = std::sqrt(ss), root = std::sqrt(float(n));
      float stored;
      std::memcpy(&stored, bytes.data(), 4);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(stored), std::bit_cast<std::uint32_t>(norm));
      const float* c = bits == 2 ? kTurboQuant2Levels : kTurboQuant4Levels;
      for (std::size_t i = 0; i < n; ++i) {
        const float z = y[i] * root / norm;
        std::uint32_t best = 0;
        for (std::uint32_t j = 1; j < (1u << bits); ++j)
          if (std::fabs(z - c[j]) < std::fabs(z - c[best])) best = j;
        const std::uint8_t byte = bytes[4 + i * bits / 8];
        EXPECT_EQ((byte >> ((i * bits) % 8)) & ((1u << bits) - 1), best) << "bits " << bits << " n " << n << " i " << i;
      }
    }
  }
}

TEST(TurboQuantCpuTest, TiesGoToTheLowerLevel) {
  // z exactly halfway between levels 7 (-0.1284) and 8 (0.1284) is 0: a row
  // whose rotation is 0 in one coordinate. x = e0 + e1 with signs +1 gives
  // y = H(e0 + e1)/4: coordinates 2/4 where i is even and 0 where i is odd.
  std::vector<float> x(16, 0.0f), signs(16, 1.0f);
  x[0] = x[1] = 1.0f;
  auto bytes = Bytes(Encode(x, signs, 4));
  for (std::size_t i = 1; i < 16; i += 2) EXPECT_EQ((bytes[4 + i / 2] >> 4) & 0xF, 7u) << i;
}

TEST(HadamardCpuTest, InverseUndoesForwardAndTheRotationIsOrthonormal) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t n = 64, rows = 3, heads = 2;
  std::vector<float> x(rows * heads * n), signs(n);
  for (auto& v : x) v = nd(rng);
  for (auto& s : signs) s = rng() % 2 ? 1.0f : -1.0f;
  std::vector<float> y = x;
  ASSERT_TRUE(HadamardRowsCpu({y.data(), signs.data(), rows, heads, n, heads * n, false}).ok());
  double nx = 0, ny = 0;
  for (std::size_t i = 0; i < n; ++i) {
    nx += double(x[i]) * x[i];
    ny += double(y[i]) * y[i];
  }
  EXPECT_NEAR(nx, ny, 1e-4 * nx);
  ASSERT_TRUE(HadamardRowsCpu({y.data(), signs.data(), rows, heads, n, heads * n, true}).ok());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5f * (1 + std::fabs(x[i])));
}

// Direct attention over decoded rows, in double, positions in a flat history.
std::vector<double> Direct(const std::vector<std::vector<float>>& K, const std::vector<std::vector<float>>& V,
                           const std::vector<float>& q, std::size_t heads, std::size_t kv_heads, std::size_t n,
                           std::uint64_t pos, std::uint64_t window) {
  std::vector<double> out(heads * n, 0.0);
  const std::uint64_t lo = window && pos + 1 > window ? pos + 1 - window : 0;
  for (std::size_t h = 0; h < heads; ++h) {
    const std::size_t g = h * kv_heads / heads;
    std::vector<double> sc;
    double mx = -1e300, z = 0;
    for (std::uint64_t s = lo; s <= pos; ++s) {
      double d = 0;
      for (std::size_t j = 0; j < n; ++j) d += double(q[h * n + j]) * K[s][g * n + j];
      sc.push_back(d / std::sqrt(double(n)));
      mx = std::max(mx, sc.back());
    }
    for (double& e : sc) z += (e = std::exp(e - mx));
    for (std::uint64_t s = lo; s <= pos; ++s)
      for (std::size_t j = 0; j < n; ++j) out[h * n + j] += sc[s - lo] / z * V[s][g * n + j];
  }
  return out;
}

// x̂ of one stored entry: decode ŷ, then Rᵀ.
std::vector<float> Decoded(const std::uint32_t* entry, const std::vector<float>& signs, std::uint32_t bits) {
  const std::size_t n = signs.size();
  std::vector<float> y(n);
  const float norm = std::bit_cast<float>(entry[0]);
  const float* c = bits == 2 ? kTurboQuant2Levels : kTurboQuant4Levels;
  for (std::size_t i = 0; i < n; ++i)
    y[i] = norm * c[(entry[1 + i * bits / 32] >> ((i * bits) % 32)) & ((1u << bits) - 1)] / std::sqrt(float(n));
  EXPECT_TRUE(HadamardRowsCpu({y.data(), signs.data(), 1, 1, n, n, true}).ok());
  return y;
}

// A rotating cache of `cap` rows holding positions before first_pos, new rows
// from the call, windows shorter and longer than the history, grouped heads,
// f32 and TurboQuant rows (attended in the rotated domain).
TEST(KvAttentionCpuTest, MatchesDirectAttentionAcrossWindowsAndKinds) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t n = 16, heads = 4, kv_heads = 2, total = 30, count = 7, first = total - count;
  for (std::uint32_t bits : {0u, 2u, 4u}) {
    for (std::uint64_t window : {0ull, 1ull, 5ull, 9ull, 100ull}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " window " + std::to_string(window));
      std::vector<float> signs(n);
      for (auto& s : signs) s = rng() % 2 ? 1.0f : -1.0f;
      const std::size_t words = kv_heads * KvEntryWords(n, bits);
      const std::uint64_t cap = window == 0 ? total : std::min<std::uint64_t>(window, total);
      std::vector<std::uint32_t> cache_k(cap * words), cache_v(cap * words), new_k(count * words), new_v(count * words);
      std::vector<std::vector<float>> K(total), V(total);
      for (std::size_t p = 0; p < total; ++p) {
        std::vector<float> k(kv_heads * n), v(kv_heads * n);
        for (auto& e : k) e = nd(rng);
        for (auto& e : v) e = nd(rng);
        std::uint32_t* dk = p < first ? &cache_k[(p % cap) * words] : &new_k[(p - first) * words];
        std::uint32_t* dv = p < first ? &cache_v[(p % cap) * words] : &new_v[(p - first) * words];
        if (bits == 0) {
          std::memcpy(dk, k.data(), words * 4);
          std::memcpy(dv, v.data(), words * 4);
          K[p] = k;
          V[p] = v;
          continue;
        }
        ASSERT_TRUE(TurboQuantEncodeCpu({k.data(), dk, signs.data(), 1, kv_heads, n, kv_heads * n, bits}).ok());
        ASSERT_TRUE(TurboQuantEncodeCpu({v.data(), dv, signs.data(), 1, kv_heads, n, kv_heads * n, bits}).ok());
        for (std::size_t g = 0; g < kv_heads; ++g) {
          auto kg = Decoded(dk + g * KvEntryWords(n, bits), signs, bits);
          auto vg = Decoded(dv + g * KvEntryWords(n, bits), signs, bits);
          K[p].insert(K[p].end(), kg.begin(), kg.end());
          V[p].insert(V[p].end(), vg.begin(), vg.end());
        }
      }
      std::vector<float> q(count * heads * n), rq;
      for (auto& e : q) e = nd(rng);
      rq = q;
      if (bits != 0) {
        ASSERT_TRUE(HadamardRowsCpu({rq.data(), signs.data(), count, heads, n, heads * n, false}).ok());
      }
      std::vector<float> out(count * heads * n);
      KvAttentionArgs a;
      a.q = rq.data();
      a.cache_k = cache_k.data();
      a.cache_v = cache_v.data();
      a.cache_rows = cap;
      a.new_k = new_k.data();
      a.new_v = new_v.data();
      a.out = out.data();
      a.count = count;
      a.first_pos = first;
      a.heads = heads;
      a.kv_heads = kv_heads;
      a.head_dim = n;
      a.window = window;
      a.bits = bits;
      a.scale = 1.0f / std::sqrt(float(n));
      ASSERT_TRUE(KvAttentionCpu(a).ok());
      if (bits != 0) {
        ASSERT_TRUE(HadamardRowsCpu({out.data(), signs.data(), count, heads, n, heads * n, true}).ok());
      }
      for (std::size_t i = 0; i < count; ++i) {
        auto want = Direct(K, V, std::vector<float>(q.begin() + i * heads * n, q.begin() + (i + 1) * heads * n), heads,
                           kv_heads, n, first + i, window);
        for (std::size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(out[i * heads * n + j], want[j], 2e-5) << i << "," << j;
      }
    }
  }
}

TEST(KvAttentionCpuTest, RefusesACacheThatNoLongerHoldsTheWindow) {
  std::vector<float> buf(1024);
  KvAttentionArgs a;
  a.q = a.out = buf.data();
  a.cache_k = a.cache_v = a.new_k = a.new_v = buf.data();
  a.count = 1;
  a.first_pos = 10;
  a.heads = a.kv_heads = 1;
  a.head_dim = 4;
  a.window = 8;
  a.cache_rows = 6;  // the query at 10 reads 3..9: seven cached rows
  EXPECT_TRUE(KvAttentionCpu(a).IsInvalidArgument());
  a.cache_rows = 7;
  EXPECT_TRUE(KvAttentionCpu(a).ok());
  a.heads = 3;
  a.kv_heads = 2;
  EXPECT_TRUE(KvAttentionCpu(a).IsInvalidArgument());
}

}  // namespace
}  // namespace primecache::kernels

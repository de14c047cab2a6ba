// The KV storage kinds on one backend (the CPU reference in engine_test, CUDA
// in engine_gpu_test): a rotating buffer across windows and call sizes, its
// resumable floor, capture (full, eager + deferred) and restore of rotating
// and TurboQuant layers as exact bytes, and every kind refusal by name.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/engine_core.h"
#include "primecache/internal/codec.h"
#include "tests/engine/engine_test_util.h"

namespace primecache::engine::testing {
namespace {

KvFormat Rotating(std::uint32_t w, std::uint32_t bits = 0, std::uint64_t signs = 0) {
  return KvFormat{w, bits, bits ? 16u : 0u, bits ? signs : 0};
}
KvFormat Plain(std::uint32_t bits = 0, std::uint64_t signs = 0) { return Rotating(0, bits, signs); }

// k width 2 entries; a TurboQuant-4 entry of head_dim 16 is 3 words.
KvPlan Kv(KvFormat f) {
  const std::uint32_t w = f.quantized() ? 2 * (1 + 16 * f.quant_bits / 32) : 6;
  return KvPlan{w, w, f};
}

// Rows of one position, any 32-bit pattern (TurboQuant words are opaque:
// NaN payloads and denormals must travel as they are).
std::vector<float> RowAt(std::uint64_t pos, std::uint32_t salt, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>((pos * 0x9E3779B1u) ^ (salt * 0x85EBCA77u) ^ (i * 0xC2B2AE3Du));
    std::memcpy(&v[i], &bits, 4);
  }
  return v;
}

// Feeds a KV layer per-position rows and keeps the whole history on the host.
struct KvFeeder {
  Device* dev;
  KvCacheLayer* kv;
  std::vector<float> k, v;  // every position's rows
  Status Append(std::uint64_t count) {
    const std::uint64_t kw = kv->plan().k_width, vw = kv->plan().v_width, first = kv->len();
    std::vector<float> kr, vr;
    for (std::uint64_t p = first; p < first + count; ++p) {
      auto a = RowAt(p, 1, kw), b = RowAt(p, 2, vw);
      kr.insert(kr.end(), a.begin(), a.end());
      vr.insert(vr.end(), b.begin(), b.end());
    }
    DeviceVec dk(dev, kr), dv(dev, vr);
    PC_RETURN_IF_ERROR(kv->Append(dk.get(), dv.get(), count));
    k.resize(first * kw);
    v.resize(first * vw);
    k.insert(k.end(), kr.begin(), kr.end());
    v.insert(v.end(), vr.begin(), vr.end());
    return Status::Ok();
  }
  // The rows the layer must hold: positions [first_held, len), logical order.
  std::vector<float> Held(bool key) const {
    const std::uint64_t w = key ? kv->plan().k_width : kv->plan().v_width;
    const auto& h = key ? k : v;
    return {h.begin() + kv->first_held() * w, h.begin() + kv->len() * w};
  }
};

class KvKindsSuite : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    PC_ENGINE_REQUIRE_DEVICE(GetParam());
    dev_ = MakeDevice(GetParam());
    ASSERT_NE(dev_, nullptr);
  }
  std::unique_ptr<Engine> NewEngine(const StatePlan& plan, std::uint64_t max_ctx = 64) {
    auto e = Engine::Create(dev_, ReserveRequest{plan, max_ctx, 2, 2, 0});
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  std::vector<float> HeldOnDevice(const KvCacheLayer& kv, bool key) {
    auto snap = SnapshotOf(kv);
    return key ? snap.k_rows : snap.v_rows;
  }
  KvSnapshot SnapshotOf(const KvCacheLayer& kv) {
    const std::uint64_t cap = kv.capacity(), kw = kv.plan().k_width, vw = kv.plan().v_width;
    auto K = Read(dev_.get(), kv.k_rows(), cap * kw), V = Read(dev_.get(), kv.v_rows(), cap * vw);
    KvSnapshot s{{kv.len(), kv.plan().k_width, kv.plan().v_width, kv.plan().format, 0}, {}, {}};
    for (std::uint64_t p = kv.first_held(); p < kv.len(); ++p) {
      s.k_rows.insert(s.k_rows.end(), K.begin() + (p % cap) * kw, K.begin() + (p % cap + 1) * kw);
      s.v_rows.insert(s.v_rows.end(), V.begin() + (p % cap) * vw, V.begin() + (p % cap + 1) * vw);
    }
    return s;
  }
  std::shared_ptr<Device> dev_;
};

TEST_P(KvKindsSuite, RotatingBufferKeepsTheLastWindowAcrossCallSizes) {
  for (std::uint32_t w : {1u, 4u, 5u, 8u}) {
    for (std::uint64_t call : {std::uint64_t{1}, std::uint64_t{3}, std::uint64_t{w}, std::uint64_t{w} + 1,
                               2 * std::uint64_t{w} + 3}) {
      SCOPED_TRACE("window " + std::to_string(w) + ", calls of " + std::to_string(call));
      auto e = NewEngine(StatePlan{{Kv(Rotating(w))}});
      auto s = e->NewSession().value();
      KvFeeder f{dev_.get(), s->kv(0), {}, {}};
      EXPECT_EQ(s->kv(0)->capacity(), w);
      while (s->kv(0)->len() + call <= 40) {
        ASSERT_TRUE(f.Append(call).ok());
        const KvCacheLayer& kv = *s->kv(0);
        ASSERT_TRUE(kv.CheckInvariants().ok()) << kv.CheckInvariants().ToString();
        EXPECT_EQ(kv.held_rows(), std::min<std::uint64_t>(kv.len(), w));
        EXPECT_EQ(kv.resumable_floor(), kv.len() > w ? kv.len() - 1 : 0);
        EXPECT_TRUE(BitEqual(HeldOnDevice(kv, true), f.Held(true)));
        EXPECT_TRUE(BitEqual(HeldOnDevice(kv, false), f.Held(false)));
        EXPECT_EQ(dev_->ReadI32(kv.len_device(), Lane::kCompute).value(), static_cast<int>(kv.len()));
      }
    }
  }
}

TEST_P(KvKindsSuite, RotatingTrimStopsAtTheResumableFloor) {
  auto e = NewEngine(StatePlan{{Kv(Rotating(6))}});
  auto s = e->NewSession().value();
  KvCacheLayer* kv = s->kv(0);
  KvFeeder f{dev_.get(), kv, {}, {}};
  // Not wrapped (exactly W rows): trimmable to anything.
  ASSERT_TRUE(f.Append(6).ok());
  EXPECT_EQ(kv->resumable_floor(), 0u);
  ASSERT_TRUE(kv->Truncate(2).ok());
  EXPECT_EQ(kv->held_rows(), 2u);
  ASSERT_TRUE(f.Append(9).ok());  // len 11, holds [5, 11)
  EXPECT_EQ(kv->first_held(), 5u);
  EXPECT_EQ(kv->resumable_floor(), 10u);
  EXPECT_TRUE(BitEqual(HeldOnDevice(*kv, true), f.Held(true)));
  // Below the floor: refused by name, nothing changes.
  Status st = kv->Truncate(9);
  EXPECT_TRUE(st.IsFailedPrecondition());
  EXPECT_NE(st.message().find("resumable floor is 10"), std::string::npos) << st.message();
  EXPECT_EQ(kv->len(), 11u);
  // To the floor: the window of the next query is still whole.
  ASSERT_TRUE(kv->Truncate(10).ok());
  EXPECT_EQ(kv->held_rows(), 5u);
  EXPECT_EQ(kv->resumable_floor(), 10u);
  EXPECT_TRUE(kv->Truncate(9).IsFailedPrecondition());
  ASSERT_TRUE(kv->CheckInvariants().ok());
  ASSERT_TRUE(f.Append(3).ok());  // rewrites position 10 onwards
  EXPECT_EQ(kv->held_rows(), 6u);
  EXPECT_TRUE(BitEqual(HeldOnDevice(*kv, true), f.Held(true)));
  EXPECT_TRUE(BitEqual(HeldOnDevice(*kv, false), f.Held(false)));
  EXPECT_EQ(dev_->ReadI32(kv->len_device(), Lane::kCompute).value(), 13);
}

TEST_P(KvKindsSuite, PlainKvStaysTrimmableToZero) {
  auto e = NewEngine(StatePlan{{Kv(Plain(4, 77))}});
  auto s = e->NewSession().value();
  KvFeeder f{dev_.get(), s->kv(0), {}, {}};
  ASSERT_TRUE(f.Append(30).ok());
  EXPECT_EQ(s->kv(0)->capacity(), 64u);
  EXPECT_EQ(s->kv(0)->resumable_floor(), 0u);
  ASSERT_TRUE(s->kv(0)->Truncate(0).ok());
  ASSERT_TRUE(f.Append(3).ok());
  EXPECT_TRUE(BitEqual(HeldOnDevice(*s->kv(0), true), f.Held(true)));
}

// Capture of every KV kind, restore into a fresh cache, and both continuing:
// the restored cache holds the very words captured and keeps them in step.
TEST_P(KvKindsSuite, EveryKindCapturesRestoresAndContinuesBitForBit) {
  for (KvFormat fmt : {Plain(), Rotating(5), Plain(2, 9), Plain(4, 9), Rotating(7, 2, 9), Rotating(7, 4, 9)}) {
    for (std::uint64_t len : {3ull, 5ull, 7ull, 8ull, 19ull}) {
      SCOPED_TRACE(std::string(KvKindOf(fmt)) + " at len " + std::to_string(len));
      auto e = NewEngine(StatePlan{{Kv(fmt), RecurrentShape{2, 4, 3}}});
      auto a = e->NewSession().value();
      auto b = e->NewSession().value();
      KvFeeder fa{dev_.get(), a->kv(0), {}, {}};
      ASSERT_TRUE(fa.Append(len).ok());
      auto full = a->CaptureFull();
      ASSERT_TRUE(full.ok()) << full.status().ToString();
      const auto& kv = std::get<KvSnapshot>((*full)[0]);
      EXPECT_EQ(kv.shape.format, fmt);
      EXPECT_EQ(kv.shape.held_rows(), fmt.rotating() ? std::min<std::uint64_t>(len, fmt.window) : len);
      EXPECT_TRUE(BitEqual(kv.k_rows, fa.Held(true)));
      // Through the codec and back: the words are copied, never reinterpreted.
      auto enc = EncodeLayer((*full)[0]);
      ASSERT_TRUE(enc.ok()) << enc.status().ToString();
      EXPECT_EQ(enc->header.kind, KvKindOf(fmt));
      auto dec = DecodeLayer(*enc);
      ASSERT_TRUE(dec.ok()) << dec.status().ToString();
      std::vector<LayerSnapshot> snap = *full;
      snap[0] = *dec;
      ASSERT_TRUE(b->Restore(snap).ok());
      EXPECT_EQ(b->kv(0)->len(), len);
      EXPECT_EQ(b->kv(0)->resumable_floor(), a->kv(0)->resumable_floor());
      ExpectSnapshotsEqual(b->CaptureFull().value(), *full);
      KvFeeder fb{dev_.get(), b->kv(0), fa.k, fa.v};
      for (std::uint64_t step : {1, 4, 9}) {
        ASSERT_TRUE(fa.Append(step).ok());
        ASSERT_TRUE(fb.Append(step).ok());
        ExpectSnapshotsEqual(b->CaptureFull().value(), a->CaptureFull().value());
      }
    }
  }
}

// The eager half holds a rotating layer's rows; generation that laps the
// buffer after the capture changes nothing in the completed snapshot.
TEST_P(KvKindsSuite, EagerRotatingRowsSurviveGenerationThatLapsTheBuffer) {
  auto e = NewEngine(StatePlan{{Kv(Rotating(6, 4, 3)), Kv(Plain(4, 3)), RecurrentShape{2, 4, 3}}});
  auto s = e->NewSession().value();
  KvFeeder f0{dev_.get(), s->kv(0), {}, {}}, f1{dev_.get(), s->kv(1), {}, {}};
  ASSERT_TRUE(f0.Append(9).ok());
  ASSERT_TRUE(f1.Append(9).ok());
  auto full = s->CaptureFull();
  ASSERT_TRUE(full.ok());
  auto pending = s->CaptureEager();
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  ASSERT_TRUE(f0.Append(14).ok());  // laps the 6-row buffer twice
  ASSERT_TRUE(f1.Append(14).ok());
  auto half = pending->Collect();
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  auto done = s->CompleteCapture(std::move(half).value());
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ExpectSnapshotsEqual(*done, *full);
}

// Every mismatch of kind, window, TurboQuant bits or sign vector is refused
// by name and restores nothing.
TEST_P(KvKindsSuite, KindMismatchesAreRefusedByNameAndMoveNoByte) {
  struct Case {
    KvFormat from, into;
    const char* says;
  };
  const Case cases[] = {
      {Rotating(8), Plain(), "kind kv-rotating/v1 != plan kv-plain/v1"},
      {Plain(), Rotating(8), "kind kv-plain/v1 != plan kv-rotating/v1"},
      {Plain(4, 5), Plain(2, 5), "kind turboquant4/v1(kv-plain/v1) != plan turboquant2/v1(kv-plain/v1)"},
      {Plain(4, 5), Plain(), "kind turboquant4/v1(kv-plain/v1) != plan kv-plain/v1"},
      {Rotating(8, 4, 5), Plain(4, 5), "kind turboquant4/v1(kv-rotating/v1) != plan turboquant4/v1(kv-plain/v1)"},
      {Rotating(8), Rotating(4), "window 8 != plan 4"},
      {Rotating(4), Rotating(8), "window 4 != plan 8"},
      {Plain(4, 5), Plain(4, 6), "sign vector"},
      {Rotating(8, 2, 5), Rotating(8, 2, 6), "sign vector"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    auto src_engine = NewEngine(StatePlan{{Kv(c.from)}});
    auto src = src_engine->NewSession().value();
    KvFeeder f{dev_.get(), src->kv(0), {}, {}};
    ASSERT_TRUE(f.Append(6).ok());
    auto snap = src->CaptureFull();
    ASSERT_TRUE(snap.ok());
    auto dst_engine = NewEngine(StatePlan{{Kv(c.into)}});
    auto dst = dst_engine->NewSession().value();
    const Memory& arena = EngineInternals::Arena(*dst);
    std::vector<std::byte> before(arena.bytes()), after(arena.bytes());
    ASSERT_TRUE(dev_->Download(before.data(), arena.data(), arena.bytes(), Lane::kCompute).ok());
    Status st = dst->Restore(*snap);
    EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    EXPECT_TRUE(dst->fresh());
    ASSERT_TRUE(dev_->Download(after.data(), arena.data(), arena.bytes(), Lane::kCompute).ok());
    EXPECT_TRUE(before == after) << "a refused restore moved bytes";
  }
}

INSTANTIATE_TEST_SUITE_P(PC_ENGINE_SUITE_NAME, KvKindsSuite, ::testing::Values(PC_ENGINE_SUITE_BACKEND));

}  // namespace
}  // namespace primecache::engine::testing

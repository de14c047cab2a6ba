// Capture and restore on one backend (the CPU reference in engine_test, CUDA
// in engine_gpu_test): round trips equal on every plane, restore then
// continue equal to never stopping, the eager half through its slot and the
// deferred half that joins it, and every refusal, each leaving the cache as
// it was.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/engine_core.h"
#include "tests/engine/engine_test_util.h"

namespace primecache::engine {

namespace testing {
namespace {

// A small hybrid: MLA with an indexer, KDA, NoPE MLA without an indexer, KDA,
// plain KV.
StatePlan Hybrid(std::uint32_t pool = 4) {
  return StatePlan{{LatentPlan{16, 8, 8, pool}, RecurrentShape{2, 4, 4}, LatentPlan{24, 0, 0, 0},
                    RecurrentShape{3, 2, 3}, KvPlan{6, 10}}};
}

std::vector<std::byte> ArenaBytes(const SessionCache& s) {
  const Memory& m = EngineInternals::Arena(s);
  std::vector<std::byte> v(m.bytes());
  Status st = EngineInternals::DeviceOf(s).Download(v.data(), m.data(), m.bytes(), Lane::kCompute);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return v;
}

class CaptureSuite : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    PC_ENGINE_REQUIRE_DEVICE(GetParam());
    dev_ = MakeDevice(GetParam());
    ASSERT_NE(dev_, nullptr);
  }
  std::unique_ptr<Engine> NewEngine(const StatePlan& plan, std::uint64_t max_ctx, std::uint64_t ring_rows,
                                    std::uint32_t sessions = 2, std::uint32_t slots = 2) {
    auto e = Engine::Create(dev_, ReserveRequest{plan, max_ctx, sessions, slots, ring_rows});
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  // Expects a refused restore that left the cache exactly as it was.
  void ExpectRefusedUntouched(SessionCache* s, const std::vector<LayerSnapshot>& snap, const char* why) {
    SCOPED_TRACE(why);
    const auto before = ArenaBytes(*s);
    const bool was_fresh = s->fresh();
    Status v = s->ValidateRestore(snap);
    Status r = s->Restore(snap);
    EXPECT_FALSE(v.ok());
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(v.code(), r.code());
    EXPECT_NE(r.message().find(why), std::string::npos) << r.message();
    EXPECT_EQ(s->fresh(), was_fresh);
    EXPECT_TRUE(ArenaBytes(*s) == before) << "a refused restore moved bytes";
    for (std::size_t i = 0; i < s->layer_count(); ++i) {
      if (const LatentCacheLayer* l = s->latent(i)) {
        EXPECT_EQ(l->pool(), 0u);
      }
    }
  }
  std::shared_ptr<Device> dev_;
};

TEST_P(CaptureSuite, FullCaptureRestoresEqualOnEveryPlaneAcrossBoundaries) {
  for (std::uint64_t ring : {0, 8, 13}) {
    // Boundaries with an empty tail, a full tail (pool - 1 rows), a short
    // ring-fitting one, and far past the ring.
    for (std::uint64_t len : {1, 3, 4, 7, 8, 45, 203}) {
      SCOPED_TRACE("ring " + std::to_string(ring) + " len " + std::to_string(len));
      auto e = NewEngine(Hybrid(), 256, ring);
      auto src = e->NewSession().value();
      SessionDriver drv(dev_.get(), src.get(), len * 7 + ring);
      for (std::uint64_t done = 0; done < len;) {
        const std::uint64_t t = std::min<std::uint64_t>(len - done, 1 + done % 11);
        ASSERT_TRUE(drv.Append(t).ok());
        done += t;
      }
      auto snap = src->CaptureFull();
      ASSERT_TRUE(snap.ok()) << snap.status().ToString();
      for (const auto& l : snap.value()) EXPECT_TRUE(CheckSnapshot(l).ok()) << CheckSnapshot(l).ToString();
      const auto& lp = std::get<LatentSnapshot>(snap.value()[0]);
      EXPECT_EQ(lp.shape.len, len);
      EXPECT_EQ(lp.shape.pools_ready, len / 4);
      EXPECT_EQ(lp.shape.index_is_ring, ring != 0);
      EXPECT_EQ(lp.shape.index_ring_rows, ring / 4 * 4);
      // The full snapshot's planes are the reference's.
      const LatentReference& ref = drv.latent[0]->ref;
      EXPECT_TRUE(BitEqual(lp.latent_rows, ref.latent));
      EXPECT_TRUE(BitEqual(lp.index_tail_rows, ref.IndexRows(len / 4 * 4, len)));
      EXPECT_LE(MaxRelErr(lp.pool_keys, ref.Keys(len / 4)), kKeyTolerance);

      auto dst = e->NewSession().value();
      ASSERT_TRUE(dst->Restore(snap.value()).ok());
      EXPECT_FALSE(dst->fresh());
      EXPECT_TRUE(dst->CheckInvariants().ok());
      auto again = dst->CaptureFull();
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      ExpectSnapshotsEqual(again.value(), snap.value());
      // On the device: len mirrors, the pool-key plane sized to capacity, the
      // tail rows at their physical addresses.
      const LatentCacheLayer* l = dst->latent(0);
      EXPECT_EQ(dev_->ReadI32(l->len_device(), Lane::kCompute).value(), static_cast<int>(len));
      EXPECT_EQ(dev_->ReadI32(dst->latent(2)->len_device(), Lane::kCompute).value(), static_cast<int>(len));
      EXPECT_EQ(dev_->ReadI32(dst->kv(4)->len_device(), Lane::kCompute).value(), static_cast<int>(len));
      EXPECT_EQ(l->pool_key_capacity(), 256u / 4);
      EXPECT_EQ(l->pool(), 4u);
      EXPECT_EQ(l->index_floor(), len / 4 * 4);
      EXPECT_TRUE(BitEqual(ReadIndexRows(dev_.get(), *l, len / 4 * 4, len), ref.IndexRows(len / 4 * 4, len)));
      if (HasFailure()) return;
    }
  }
}

TEST_P(CaptureSuite, RestoreThenContinueEqualsNeverStopping) {
  for (std::uint64_t ring : {0, 8}) {
    SCOPED_TRACE("ring " + std::to_string(ring));
    auto e = NewEngine(Hybrid(), 512, ring);
    auto src = e->NewSession().value();
    SessionDriver a(dev_.get(), src.get(), 99);
    for (std::uint64_t t : {13, 1, 7}) ASSERT_TRUE(a.Append(t).ok());  // boundary at 21: tail of 1 row
    auto snap = src->CaptureFull().value();
    auto dst = e->NewSession().value();
    ASSERT_TRUE(dst->Restore(snap).ok());
    SessionDriver b(dev_.get(), dst.get(), 99, a.pos);
    // The same suffix in the same call shapes, one of them longer than the ring.
    for (std::uint64_t t : {3, 1, 40, 2, 5}) {
      ASSERT_TRUE(a.Append(t).ok());
      ASSERT_TRUE(b.Append(t).ok());
      ExpectSnapshotsEqual(dst->CaptureFull().value(), src->CaptureFull().value());
    }
    // Rewinds above the restored floor work on the restored cache too.
    ASSERT_TRUE(dst->latent(0)->Truncate(70).ok());
    ASSERT_TRUE(src->latent(0)->Truncate(70).ok());
    EXPECT_EQ(dst->latent(0)->pools_ready(), 17u);
  }
}

TEST_P(CaptureSuite, RingSnapshotRestoresIntoAFlatCacheAndBack) {
  auto ring_engine = NewEngine(Hybrid(), 128, 12);
  auto flat_engine = NewEngine(Hybrid(), 128, 0);
  auto src = ring_engine->NewSession().value();
  SessionDriver drv(dev_.get(), src.get(), 5);
  ASSERT_TRUE(drv.Append(50).ok());
  ASSERT_TRUE(drv.Append(3).ok());
  auto snap = src->CaptureFull().value();
  auto flat = flat_engine->NewSession().value();
  ASSERT_TRUE(flat->Restore(snap).ok());
  auto flat_snap = flat->CaptureFull().value();
  EXPECT_FALSE(std::get<LatentSnapshot>(flat_snap[0]).shape.index_is_ring);
  ExpectSnapshotsEqual(flat_snap, snap, /*ignore_ring=*/true);
  auto ring = ring_engine->NewSession().value();
  ASSERT_TRUE(ring->Restore(flat_snap).ok());
  ExpectSnapshotsEqual(ring->CaptureFull().value(), snap);
}

TEST_P(CaptureSuite, EagerThenDeferredEqualsTheFullSnapshotAtTheBoundary) {
  for (std::uint64_t ring : {0, 8}) {
    SCOPED_TRACE("ring " + std::to_string(ring));
    auto e = NewEngine(Hybrid(), 512, ring, 1, 2);
    auto s = e->NewSession().value();
    SessionDriver drv(dev_.get(), s.get(), 31);
    ASSERT_TRUE(drv.Append(30).ok());
    ASSERT_TRUE(drv.Append(7).ok());  // boundary 37: tail of 1
    auto full = s->CaptureFull().value();
    auto pending = s->CaptureEager();
    ASSERT_TRUE(pending.ok()) << pending.status().ToString();
    EXPECT_EQ(e->free_snapshot_slots(), 1u);
    // Generation goes on: it laps the ring and steps every recurrent layer.
    for (std::uint64_t t : {1, 1, 1, 25}) ASSERT_TRUE(drv.Append(t).ok());
    auto half = pending.value().Collect();
    ASSERT_TRUE(half.ok()) << half.status().ToString();
    EXPECT_EQ(e->free_snapshot_slots(), 2u);
    EXPECT_TRUE(pending.value().Collect().status().IsFailedPrecondition());
    const auto& el = std::get<LatentSnapshot>(half.value().layers[0]);
    EXPECT_EQ(el.shape.len, 37u);
    EXPECT_EQ(el.shape.pools_ready, 9u);
    EXPECT_EQ(el.index_tail_rows.size(), 1u * 16);
    // A verify-style rollback that stays above the boundary is fine.
    ASSERT_TRUE(s->latent(0)->Truncate(60).ok());  // within what the ring still holds
    ASSERT_TRUE(s->kv(4)->Truncate(37).ok());
    auto joined = s->CompleteCapture(std::move(half).value());
    ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    ExpectSnapshotsEqual(joined.value(), full);
  }
}

TEST_P(CaptureSuite, EagerSlotsAreCountedFreedAndWaitedFor) {
  auto e = NewEngine(Hybrid(), 64, 8, 1, 2);
  auto s = e->NewSession().value();
  SessionDriver drv(dev_.get(), s.get(), 2);
  ASSERT_TRUE(drv.Append(9).ok());
  auto a = s->CaptureEager();
  auto b = s->CaptureEager();
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = s->CaptureEager();
  EXPECT_TRUE(c.status().IsResourceExhausted()) << c.status().ToString();
  EXPECT_EQ(e->free_snapshot_slots(), 0u);
  { PendingCapture dropped = std::move(b).value(); }  // destroyed uncollected: waits, then frees
  EXPECT_EQ(e->free_snapshot_slots(), 1u);
  auto ready = a.value().Ready();
  ASSERT_TRUE(ready.ok());
  auto half = a.value().Collect();
  ASSERT_TRUE(half.ok());
  EXPECT_TRUE(a.value().Ready().status().IsFailedPrecondition());
  EXPECT_EQ(e->free_snapshot_slots(), 2u);
  auto none = NewEngine(Hybrid(), 64, 8, 1, 0);
  auto t = none->NewSession().value();
  SessionDriver d2(dev_.get(), t.get(), 2);
  ASSERT_TRUE(d2.Append(9).ok());
  EXPECT_TRUE(t->CaptureEager().status().IsResourceExhausted());
}

TEST_P(CaptureSuite, CapturePreconditionsRefuse) {
  auto e = NewEngine(Hybrid(), 64, 8);
  auto s = e->NewSession().value();
  EXPECT_TRUE(s->CaptureFull().status().IsFailedPrecondition()) << "nothing appended";
  EXPECT_TRUE(s->CaptureEager().status().IsFailedPrecondition());
  SessionDriver drv(dev_.get(), s.get(), 3);
  ASSERT_TRUE(drv.Append(9).ok());
  ASSERT_TRUE(drv.latent[0]->Append(2).ok());  // one layer ahead: not a call boundary
  Status st = s->CaptureFull().status();
  EXPECT_TRUE(st.IsFailedPrecondition());
  EXPECT_NE(st.message().find("not a call boundary"), std::string::npos) << st.ToString();
  ASSERT_TRUE(s->latent(0)->Truncate(9).ok());
  ASSERT_TRUE(s->CaptureFull().ok());
  EngineInternals::SetPoolsReady(*s->latent(0), 1);
  EXPECT_EQ(s->CaptureFull().status().code(), StatusCode::kInternal);
  EXPECT_EQ(s->CaptureEager().status().code(), StatusCode::kInternal);
  EXPECT_EQ(e->free_snapshot_slots(), 2u) << "a refused eager capture holds no slot";
}

TEST_P(CaptureSuite, DeferredHalfRefusesEveryDisagreement) {
  auto e = NewEngine(Hybrid(), 256, 8, 2, 2);
  auto s = e->NewSession().value();
  SessionDriver drv(dev_.get(), s.get(), 77);
  ASSERT_TRUE(drv.Append(21).ok());
  auto take = [&]() {
    auto p = s->CaptureEager();
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    auto h = p.value().Collect();
    EXPECT_TRUE(h.ok());
    return std::move(h).value();
  };
  auto refuse = [&](EagerHalf h, const char* why) {
    SCOPED_TRACE(why);
    auto r = s->CompleteCapture(std::move(h));
    EXPECT_TRUE(r.status().IsFailedPrecondition()) << r.status().ToString();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  };
  const EagerHalf good = take();
  ASSERT_TRUE(s->CompleteCapture(good).ok());

  auto other = e->NewSession().value();
  SessionDriver od(dev_.get(), other.get(), 77);
  ASSERT_TRUE(od.Append(21).ok());
  {
    auto r = other->CompleteCapture(good);
    EXPECT_TRUE(r.status().IsFailedPrecondition());
    EXPECT_NE(r.status().message().find("captured from session"), std::string::npos);
  }
  {
    EagerHalf h = good;
    std::get<LatentSnapshot>(h.layers[0]).shape.pool = 2;
    refuse(h, "pool 2 != the layer's pool 4");
  }
  {
    EagerHalf h = good;
    std::get<LatentSnapshot>(h.layers[0]).index_tail_rows.push_back(0.0f);
    refuse(h, "the eager tail holds");
  }
  {
    EagerHalf h = good;
    std::get<LatentSnapshot>(h.layers[0]).shape.width = 23;
    refuse(h, "widths 23/16");
  }
  {
    EagerHalf h = good;
    std::get<LatentSnapshot>(h.layers[0]).shape.pools_ready = 4;
    refuse(h, "boundary pools_ready 4 != len / pool");
  }
  {
    EagerHalf h = good;
    std::get<LatentSnapshot>(h.layers[0]).shape.index_ring_rows = 4;
    refuse(h, "index ring 4 != the layer's 8");
  }
  {
    EagerHalf h = good;
    std::get<LatentSnapshot>(h.layers[2]).shape.pools_ready = 1;
    refuse(h, "pool state on a layer without an indexer");
  }
  {
    EagerHalf h = good;
    std::get<RecurrentSnapshot>(h.layers[1]).state.pop_back();
    refuse(h, "does not have the layer's shape");
  }
  {
    EagerHalf h = good;
    std::swap(h.layers[0], h.layers[2]);
    refuse(h, "widths");
    EagerHalf k = good;
    k.layers[1] = KvSnapshot{{21, 6, 10}};
    refuse(k, "another kind of layer");
  }
  {
    EagerHalf h = good;
    std::get<KvSnapshot>(h.layers[4]).shape.v_width = 9;
    refuse(h, "K/V widths differ");
  }
  {
    EagerHalf h = good;
    h.layers.pop_back();
    refuse(h, "the eager half has 4 layers");
    EagerHalf w = good;
    w.watch = nullptr;
    refuse(w, "no rewind watch");
  }
  {
    // Live pools_ready behind the boundary's (the boundary itself consistent).
    EngineInternals::SetPoolsReady(*s->latent(0), 4);
    refuse(good, "pools_ready 4 is behind the boundary's 5");
    EngineInternals::SetPoolsReady(*s->latent(0), 5);
  }
  // Fewer rows than the boundary.
  const EagerHalf at21 = take();
  ASSERT_TRUE(s->latent(0)->Truncate(20).ok());
  refuse(at21, "fewer than the boundary's 21");
  // A rewind below the boundary, then growth past it again: the rows below the
  // boundary are no longer the boundary's.
  ASSERT_TRUE(drv.latent[0]->Append(1).ok());  // back to 21, with other rows
  refuse(at21, "rewound to 20, below the boundary 21, since the capture");
  // A KV rewind below the boundary likewise.
  const EagerHalf again = take();
  ASSERT_TRUE(s->kv(4)->Truncate(3).ok());
  DeviceVec k(dev_.get(), std::vector<float>(18 * 6, 1.0f)), v(dev_.get(), std::vector<float>(18 * 10, 1.0f));
  ASSERT_TRUE(s->kv(4)->Append(k.get(), v.get(), 18).ok());
  refuse(again, "layer 4: rewound to 3");
  // A capture taken after the rewinds is not affected by them.
  ASSERT_TRUE(s->CompleteCapture(take()).ok());
}

TEST_P(CaptureSuite, RestoreRefusesEveryMismatchAndMovesNoByte) {
  auto e = NewEngine(Hybrid(), 64, 8, 3, 0);
  auto src = e->NewSession().value();
  SessionDriver drv(dev_.get(), src.get(), 8);
  ASSERT_TRUE(drv.Append(23).ok());
  const std::vector<LayerSnapshot> good = src->CaptureFull().value();
  auto dst = e->NewSession().value();
  auto mutate = [&](auto&& f) {
    std::vector<LayerSnapshot> s = good;
    f(s);
    return s;
  };
  auto L = [](std::vector<LayerSnapshot>& s, int i) -> LatentSnapshot& {
    return std::get<LatentSnapshot>(s[i]);
  };
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { L(s, 0).shape.width = 25; }), "width 25 != plan 24");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) {
                           L(s, 0).shape.pool = 2;
                           L(s, 0).shape.pools_ready = 11;
                         }),
                         "pool 2 != plan 4");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { L(s, 0).shape.pools_ready = 4; }),
                         "pools_ready 4 != len / pool");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { L(s, 0).shape.index_width = 6; }), "index_width");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { L(s, 0).pool_keys.pop_back(); }),
                         "pool_keys holds");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { L(s, 0).index_tail_rows.push_back(1); }),
                         "index_tail_rows holds");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { L(s, 0).latent_rows.resize(1); }),
                         "latent_rows holds");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) {
                           L(s, 0).shape.index_is_ring = true;
                           L(s, 0).shape.index_ring_rows = 6;
                         }),
                         "not a positive multiple of pool");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { L(s, 2).shape.pool = 4; }), "pool 4 without an indexer");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { std::get<RecurrentSnapshot>(s[1]).shape.kernel = 3; }),
                         "kernel 3 != plan 4");
  ExpectRefusedUntouched(dst.get(),
                         mutate([&](auto& s) { std::get<RecurrentSnapshot>(s[3]).state.pop_back(); }),
                         "layer 3: state holds");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { std::get<KvSnapshot>(s[4]).shape.k_width = 5; }),
                         "k_width 5 != plan 6");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { std::swap(s[1], s[3]); }), "heads 3 != plan 2");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { std::swap(s[0], s[1]); }),
                         "the plan expects a latent");
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { s.pop_back(); }), "4 layers; the cache has 5");
  // A different but self-consistent boundary in one layer.
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) {
                           auto& kv = std::get<KvSnapshot>(s[4]);
                           kv.shape.len = 22;
                           kv.k_rows.resize(22 * 6);
                           kv.v_rows.resize(22 * 10);
                         }),
                         "len 22 != len 23 of layer 0");
  // Past the cache's capacity.
  {
    auto big = NewEngine(Hybrid(), 128, 8, 1, 0);
    auto bs = big->NewSession().value();
    SessionDriver bd(dev_.get(), bs.get(), 1);
    ASSERT_TRUE(bd.Append(100).ok());
    ExpectRefusedUntouched(dst.get(), bs->CaptureFull().value(), "len 100 > max_ctx 64");
  }
  // A tail longer than the target's ring (from a cache with a bigger pool).
  {
    auto wide = NewEngine(Hybrid(16), 64, 32, 1, 0);
    auto ws = wide->NewSession().value();
    SessionDriver wd(dev_.get(), ws.get(), 1);
    ASSERT_TRUE(wd.Append(30).ok());
    auto snap = ws->CaptureFull().value();
    ExpectRefusedUntouched(dst.get(), snap, "pool 16 != plan 4");
  }
  // Every layer is validated before the first byte moves: only the last
  // layer is wrong here.
  ExpectRefusedUntouched(dst.get(), mutate([&](auto& s) { std::get<KvSnapshot>(s[4]).v_rows.push_back(0); }),
                         "layer 4: v_rows holds");
  // Several bad layers are all named.
  {
    auto s = mutate([&](auto& s) {
      L(s, 0).shape.width = 1;
      std::get<KvSnapshot>(s[4]).shape.k_width = 1;
    });
    Status st = dst->ValidateRestore(s);
    EXPECT_NE(st.message().find("layer 0"), std::string::npos);
    EXPECT_NE(st.message().find("layer 4"), std::string::npos) << st.message();
  }
  // A boundary header that disagrees with the layers.
  BoundarySnapshot b;
  b.header.tokens.assign(22, 7);
  b.header.boundary_len = 22;
  b.layers = good;
  const auto before = ArenaBytes(*dst);
  Status st = dst->Restore(b);
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("boundary_len 22"), std::string::npos) << st.ToString();
  EXPECT_TRUE(ArenaBytes(*dst) == before);
  b.header.tokens.assign(23, 7);
  b.header.boundary_len = 23;
  ASSERT_TRUE(dst->ValidateRestore(b).ok());
  ASSERT_TRUE(dst->Restore(b).ok());
  ExpectSnapshotsEqual(dst->CaptureFull().value(), good);
  // The cache is no longer fresh: a second restore is refused, untouched.
  const auto after = ArenaBytes(*dst);
  Status again = dst->Restore(good);
  EXPECT_TRUE(again.IsFailedPrecondition()) << again.ToString();
  EXPECT_TRUE(ArenaBytes(*dst) == after);
  // A cache that merely had tokens appended is not fresh either.
  auto used = e->NewSession().value();
  SessionDriver ud(dev_.get(), used.get(), 1);
  ASSERT_TRUE(ud.Append(1).ok());
  EXPECT_TRUE(used->Restore(good).IsFailedPrecondition());
}

TEST_P(CaptureSuite, RestoreFromPinnedViewsEqualsRestoreFromVectors) {
  auto e = NewEngine(Hybrid(), 128, 8, 3, 0);
  auto src = e->NewSession().value();
  SessionDriver drv(dev_.get(), src.get(), 12);
  ASSERT_TRUE(drv.Append(77).ok());
  const auto snap = src->CaptureFull().value();
  // Copy every plane into one pinned block and restore from views of it.
  std::size_t total = 0;
  for (const auto& l : snap) {
    const auto v = ViewOf(l);
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, LatentSnapshotView>) {
            total += x.latent_rows.size() + x.index_tail_rows.size() + x.pool_keys.size();
          } else if constexpr (std::is_same_v<T, RecurrentSnapshotView>) {
            total += x.conv_ring.size() + x.state.size();
          } else {
            total += x.k_rows.size() + x.v_rows.size();
          }
        },
        v);
  }
  Memory pinned = dev_->AllocatePinned(total * sizeof(float)).value();
  float* at = static_cast<float*>(pinned.data());
  auto place = [&](std::span<const float> s) {
    if (!s.empty()) std::memcpy(at, s.data(), s.size_bytes());
    std::span<const float> out(at, s.size());
    at += s.size();
    return out;
  };
  std::vector<LayerSnapshotView> views;
  for (const auto& l : snap) {
    auto v = ViewOf(l);
    std::visit(
        [&](auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, LatentSnapshotView>) {
            x.latent_rows = place(x.latent_rows);
            x.index_tail_rows = place(x.index_tail_rows);
            x.pool_keys = place(x.pool_keys);
          } else if constexpr (std::is_same_v<T, RecurrentSnapshotView>) {
            x.conv_ring = place(x.conv_ring);
            x.state = place(x.state);
          } else {
            x.k_rows = place(x.k_rows);
            x.v_rows = place(x.v_rows);
          }
        },
        v);
    views.push_back(v);
  }
  EXPECT_TRUE(dev_->IsPinned(
      views.front().index() == 0 ? std::get<LatentSnapshotView>(views.front()).latent_rows.data() : nullptr));
  auto dst = e->NewSession().value();
  ASSERT_TRUE(dst->Restore(views).ok());
  ExpectSnapshotsEqual(dst->CaptureFull().value(), snap);
  // A broken view is refused like a broken snapshot.
  auto bad = views;
  std::get<LatentSnapshotView>(bad[0]).pool_keys = std::get<LatentSnapshotView>(bad[0]).pool_keys.first(3);
  auto fresh = e->NewSession().value();
  Status st = fresh->Restore(bad);
  EXPECT_TRUE(st.IsInvalidArgument());
  EXPECT_TRUE(fresh->fresh());
}


// Views (in host memory) as snapshots of their own, for comparison.
std::vector<LayerSnapshot> FromViews(const std::vector<LayerSnapshotView>& views) {
  std::vector<LayerSnapshot> out;
  for (const auto& v : views) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          auto vec = [](std::span<const float> p) { return std::vector<float>(p.begin(), p.end()); };
          if constexpr (std::is_same_v<T, LatentSnapshotView>) {
            out.push_back(
                LatentSnapshot{x.shape, vec(x.latent_rows), vec(x.index_tail_rows), vec(x.pool_keys)});
          } else if constexpr (std::is_same_v<T, RecurrentSnapshotView>) {
            out.push_back(RecurrentSnapshot{x.shape, vec(x.conv_ring), vec(x.state)});
          } else {
            out.push_back(KvSnapshot{x.shape, vec(x.k_rows), vec(x.v_rows)});
          }
        },
        v);
  }
  return out;
}

// Captures into one pinned block (every copy enqueued, the lane waited for
// once) hold what the vector captures hold, full and eager + deferred; a
// block too small is refused; and the block staged on the device restores
// from device-resident views (PlaneResidence::kDevice) like the vectors do.
TEST_P(CaptureSuite, CapturesIntoPinnedBlocksEqualTheVectorsAndRestoreFromTheDevice) {
  auto e = NewEngine(Hybrid(), 256, 8, 3, 2);
  auto s = e->NewSession().value();
  SessionDriver drv(dev_.get(), s.get(), 41);
  ASSERT_TRUE(drv.Append(37).ok());  // a tail of 1
  const auto full = s->CaptureFull().value();
  std::vector<Memory> blocks;
  const CaptureSpace space = [&](std::uint64_t floats) -> Result<std::span<float>> {
    PC_ASSIGN_OR_RETURN(Memory m, dev_->AllocatePinned(floats * sizeof(float)));
    blocks.push_back(std::move(m));
    return std::span<float>(blocks.back().at<float>(0), floats);
  };
  auto into = s->CaptureFullInto(space);
  ASSERT_TRUE(into.ok()) << into.status().ToString();
  ExpectSnapshotsEqual(FromViews(*into), full);
  EXPECT_FALSE(s->CaptureFullInto([](std::uint64_t n) -> Result<std::span<float>> {
                  static std::vector<float> small;
                  small.resize(n - 1);
                  return std::span<float>(small);
                }).ok());
  auto a = s->CaptureEager(), b = s->CaptureEager();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(drv.Append(5).ok());  // generation goes on
  auto joined = s->CompleteCapture(a->Collect().value());
  auto joined_into = s->CompleteCaptureInto(b->Collect().value(), space);
  ASSERT_TRUE(joined.ok() && joined_into.ok()) << joined_into.status().ToString();
  ExpectSnapshotsEqual(FromViews(*joined_into), *joined);
  ExpectSnapshotsEqual(*joined, full);

  // The pinned block up to device memory, restored from there.
  std::uint64_t floats = 0;
  for (const auto& l : full) floats += ViewFloats(ShapeOf(l));
  Memory staged = dev_->Allocate(floats * sizeof(float)).value();
  ASSERT_TRUE(dev_->Upload(staged.data(), blocks.front().data(), floats * sizeof(float), Lane::kCompute).ok());
  std::vector<LayerSnapshotView> on_device;
  const float* at = staged.at<const float>(0);
  for (const auto& l : full) {
    on_device.push_back(ViewAt(ShapeOf(l), at));
    at += ViewFloats(ShapeOf(l));
  }
  auto dst = e->NewSession().value();
  ASSERT_TRUE(dst->Restore(on_device, PlaneResidence::kDevice).ok());
  ExpectSnapshotsEqual(dst->CaptureFull().value(), full);
}

INSTANTIATE_TEST_SUITE_P(PC_ENGINE_SUITE_NAME, CaptureSuite, ::testing::Values(PC_ENGINE_SUITE_BACKEND));

}  // namespace
}  // namespace testing
}  // namespace primecache::engine

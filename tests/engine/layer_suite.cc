// The cache layers on one backend (instantiated for the CPU reference in
// engine_test and for CUDA in engine_gpu_test): every invariant after every
// call, ring wrap across ring sizes and call sizes, rewinds, refusals.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/engine_core.h"
#include "tests/engine/engine_test_util.h"

namespace primecache::engine {

namespace testing {
namespace {

StatePlan OneLayer(LayerPlan l) {
  return StatePlan{{l}};
}
LatentPlan Latent(std::uint32_t kv_rank, std::uint32_t rope, std::uint32_t d, std::uint32_t pool) {
  return LatentPlan{kv_rank, rope, d, pool};
}

class LayerSuite : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    PC_ENGINE_REQUIRE_DEVICE(GetParam());
    dev_ = MakeDevice(GetParam());
    ASSERT_NE(dev_, nullptr);
  }
  std::unique_ptr<Engine> NewEngine(const StatePlan& plan, std::uint64_t max_ctx, std::uint64_t ring_rows) {
    ReserveRequest r;
    r.plan = plan;
    r.max_ctx = max_ctx;
    r.index_ring_rows = ring_rows;
    auto e = Engine::Create(dev_, r);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  std::shared_ptr<Device> dev_;
};

TEST_P(LayerSuite, FreshLatentLayerHoldsNothing) {
  auto e = NewEngine(OneLayer(Latent(8, 4, 4, 4)), 64, 0);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(s->recurrent(0), nullptr);
  EXPECT_EQ(s->kv(0), nullptr);
  EXPECT_EQ(s->latent(1), nullptr);
  EXPECT_TRUE(s->fresh());
  EXPECT_EQ(l->len(), 0u);
  EXPECT_EQ(l->pool(), 0u);
  EXPECT_EQ(l->pools_ready(), 0u);
  EXPECT_EQ(l->width(), 12u);
  EXPECT_EQ(l->index_width(), 8u);
  EXPECT_EQ(l->pool_key_capacity(), 16u);
  EXPECT_EQ(dev_->ReadI32(l->len_device(), Lane::kCompute).value(), 0);
  EXPECT_TRUE(s->CheckInvariants().ok());
}

TEST_P(LayerSuite, FlatAppendsKeepEveryInvariantAcrossCallSizes) {
  auto e = NewEngine(OneLayer(Latent(16, 8, 8, 4)), 512, 0);
  auto s = e->NewSession().value();
  LatentDriver drv(dev_.get(), s->latent(0), 11);
  for (std::uint64_t t : {1, 2, 3, 4, 5, 8, 13, 1, 1, 1, 100, 7}) {
    ASSERT_TRUE(drv.Append(t).ok());
    SCOPED_TRACE("after " + std::to_string(t) + " tokens, len " + std::to_string(drv.ref.len()));
    ExpectLatentMatches(dev_.get(), *s->latent(0), drv.ref);
    EXPECT_FALSE(s->latent(0)->index_is_ring());
    EXPECT_EQ(s->latent(0)->index_floor(), 0u);
  }
  EXPECT_FALSE(s->fresh());
}

TEST_P(LayerSuite, KeysAreBuiltOnlyForNewlyCompletedPools) {
  auto e = NewEngine(OneLayer(Latent(8, 0, 4, 4)), 256, 0);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  LatentDriver drv(dev_.get(), l, 5);
  ASSERT_TRUE(drv.Append(10).ok());  // pools 0 and 1 complete
  ASSERT_EQ(l->pools_ready(), 2u);
  // Overwrite the final keys with a marker: a later call that rebuilt them
  // would erase it.
  std::vector<float> marker(2 * 4, 12345.0f);
  Write(dev_.get(), const_cast<float*>(l->pool_keys()), marker);
  // Pools 2..4 complete now; pools 0 and 1 must stay as they were.
  ASSERT_TRUE(drv.Append(9).ok());
  ASSERT_EQ(l->pools_ready(), 4u);
  auto keys = Read(dev_.get(), l->pool_keys(), 5 * 4);
  EXPECT_TRUE(BitEqual({keys.begin(), keys.begin() + 8}, marker));
  auto want = drv.ref.Keys(4);
  EXPECT_LE(MaxRelErr({keys.begin() + 8, keys.begin() + 16}, {want.begin() + 8, want.begin() + 16}),
            kKeyTolerance);
  // Pool 4 is incomplete (len 19): its key slot was never written.
  EXPECT_TRUE(BitEqual({keys.begin() + 16, keys.end()}, std::vector<float>(4, 0.0f)));
}

TEST_P(LayerSuite, RingWrapsAcrossRingSizesAndCallSizesAndMatchesTheFlatPlane) {
  const std::uint32_t pool = 4;
  // Booked rows, including ones that round down (5 -> 4, 11 -> 8, 30 -> 28).
  for (std::uint64_t booked : {4, 5, 8, 11, 30, 64}) {
    for (std::vector<std::uint64_t> calls :
         {std::vector<std::uint64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
          {3, 3, 3, 3, 3, 3, 3, 3},
          {4, 4, 4, 4, 4},
          {7, 9, 2, 31, 1, 6},
          {booked - 1, booked, booked + 1, 1},
          {3 * booked + 2, 1, 5 * booked + 3}}) {
      SCOPED_TRACE("booked ring rows " + std::to_string(booked));
      auto e = NewEngine(OneLayer(Latent(8, 4, 4, pool)), 2048, booked);
      auto s = e->NewSession().value();
      LatentCacheLayer* l = s->latent(0);
      LatentDriver drv(dev_.get(), l, static_cast<unsigned>(booked * 131 + calls.size()));
      for (std::uint64_t t : calls) {
        ASSERT_TRUE(drv.Append(t).ok()) << "call of " << t;
        SCOPED_TRACE("call of " + std::to_string(t) + " to len " + std::to_string(drv.ref.len()));
        EXPECT_TRUE(l->index_is_ring());
        EXPECT_EQ(l->booked_ring_rows(), booked);
        EXPECT_EQ(l->index_ring_rows(), booked / pool * pool);
        const std::uint64_t r = l->index_ring_rows();
        EXPECT_EQ(l->index_floor(), l->len() > r ? l->len() - r : 0);
        ExpectLatentMatches(dev_.get(), *l, drv.ref);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(LayerSuite, OneCallFarLongerThanTheRingDrainsIt) {
  auto e = NewEngine(OneLayer(Latent(16, 8, 8, 4)), 4096, 8);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  LatentDriver drv(dev_.get(), l, 3);
  ASSERT_TRUE(drv.Append(3).ok());
  ASSERT_TRUE(drv.Append(1000).ok());  // 125 rings' worth in one call
  EXPECT_EQ(l->len(), 1003u);
  EXPECT_EQ(l->pools_ready(), 250u);
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
}

TEST_P(LayerSuite, RingKeysEqualFlatKeysForTheSameTokens) {
  auto e = NewEngine(OneLayer(Latent(8, 4, 16, 8)), 1024, 24);
  auto ef = NewEngine(OneLayer(Latent(8, 4, 16, 8)), 1024, 0);
  auto s = e->NewSession().value();
  auto f = ef->NewSession().value();
  LatentDriver a(dev_.get(), s->latent(0), 9), b(dev_.get(), f->latent(0), 9);
  for (std::uint64_t t : {5, 40, 1, 77, 8}) {
    ASSERT_TRUE(a.Append(t).ok());
    ASSERT_TRUE(b.Append(t).ok());
  }
  const std::uint64_t n = s->latent(0)->pools_ready() * 16;
  EXPECT_TRUE(BitEqual(Read(dev_.get(), s->latent(0)->pool_keys(), n),
                       Read(dev_.get(), f->latent(0)->pool_keys(), n)));
}

TEST_P(LayerSuite, TruncateClampsPoolsReadyInTheSameCall) {
  auto e = NewEngine(OneLayer(Latent(8, 4, 4, 4)), 256, 0);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  LatentDriver drv(dev_.get(), l, 21);
  ASSERT_TRUE(drv.Append(37).ok());
  ASSERT_EQ(l->pools_ready(), 9u);
  ASSERT_TRUE(l->Truncate(22).ok());
  EXPECT_EQ(l->len(), 22u);
  EXPECT_EQ(l->pools_ready(), 5u);
  EXPECT_EQ(dev_->ReadI32(l->len_device(), Lane::kCompute).value(), 22);
  drv.ref.Truncate(22);
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
  // New tokens over the rewound ones rebuild pools 5.. from the new rows.
  ASSERT_TRUE(drv.Append(15).ok());
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
  ASSERT_TRUE(l->Truncate(0).ok());
  EXPECT_EQ(l->pools_ready(), 0u);
  drv.ref.Truncate(0);
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
  EXPECT_TRUE(l->Truncate(1).IsInvalidArgument());
}

TEST_P(LayerSuite, TruncateIntoLappedRingRowsIsRefused) {
  auto e = NewEngine(OneLayer(Latent(8, 4, 4, 4)), 256, 8);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  LatentDriver drv(dev_.get(), l, 4);
  ASSERT_TRUE(drv.Append(30).ok());  // the ring holds rows [22, 30)
  ASSERT_EQ(l->index_floor(), 22u);
  Status st = l->Truncate(21);  // its tail would start at 20
  EXPECT_TRUE(st.IsFailedPrecondition()) << st.ToString();
  EXPECT_EQ(l->len(), 30u);
  EXPECT_EQ(l->pools_ready(), 7u);
  ASSERT_TRUE(l->Truncate(25).ok());  // tail [24, 25) is still held
  drv.ref.Truncate(25);
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
  ASSERT_TRUE(drv.Append(9).ok());
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
}

TEST_P(LayerSuite, AppendRefusalsLeaveTheLayerUnchanged) {
  auto e = NewEngine(OneLayer(Latent(8, 4, 4, 4)), 32, 0);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  LatentDriver drv(dev_.get(), l, 8);
  ASSERT_TRUE(drv.Append(30).ok());
  DeviceVec rows(dev_.get(), std::vector<float>(3 * 12, 1.0f)),
      idx(dev_.get(), std::vector<float>(3 * 8, 1.0f));
  IndexerInputs ix{4, drv.ape->get()};
  EXPECT_TRUE(l->Append(rows.get(), idx.get(), 3, &ix).IsResourceExhausted());  // passes max_ctx 32
  IndexerInputs wrong_pool{2, drv.ape->get()};
  EXPECT_TRUE(l->Append(rows.get(), idx.get(), 1, &wrong_pool).IsInvalidArgument());
  EXPECT_TRUE(l->Append(rows.get(), nullptr, 1, &ix).IsInvalidArgument());
  EXPECT_TRUE(l->Append(rows.get(), idx.get(), 1, nullptr).IsInvalidArgument());
  EXPECT_TRUE(l->Append(nullptr, idx.get(), 1, &ix).IsInvalidArgument());
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
  ASSERT_TRUE(drv.Append(2).ok());
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
}

TEST_P(LayerSuite, EveryCallChecksPoolsReadyAgainstLen) {
  auto e = NewEngine(OneLayer(Latent(8, 4, 4, 4)), 64, 0);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  LatentDriver drv(dev_.get(), l, 1);
  ASSERT_TRUE(drv.Append(9).ok());
  EngineInternals::SetPoolsReady(*l, 1);  // behind len / pool = 2
  EXPECT_EQ(l->CheckInvariants().code(), StatusCode::kInternal);
  EXPECT_EQ(drv.Append(1).code(), StatusCode::kInternal);
  EXPECT_EQ(l->Truncate(4).code(), StatusCode::kInternal);
  EXPECT_EQ(s->CheckInvariants().code(), StatusCode::kInternal);
  EXPECT_EQ(l->len(), 9u);
  EngineInternals::SetPoolsReady(*l, 2);
  EXPECT_TRUE(drv.Append(1).ok());
}

TEST_P(LayerSuite, LayerWithoutIndexerCarriesNoPoolState) {
  auto e = NewEngine(OneLayer(Latent(32, 0, 0, 0)), 64, 16);
  auto s = e->NewSession().value();
  LatentCacheLayer* l = s->latent(0);
  EXPECT_EQ(l->width(), 32u);  // NoPE: width == kv_rank
  LatentDriver drv(dev_.get(), l, 2);
  ASSERT_TRUE(drv.Append(40).ok());
  EXPECT_EQ(l->pool(), 0u);
  EXPECT_EQ(l->pools_ready(), 0u);
  EXPECT_FALSE(l->index_is_ring());
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
  DeviceVec rows(dev_.get(), std::vector<float>(32, 1.0f));
  IndexerInputs ix{4, rows.get()};
  EXPECT_TRUE(l->Append(rows.get(), rows.get(), 1, &ix).IsInvalidArgument());
  ASSERT_TRUE(l->Truncate(3).ok());
  drv.ref.Truncate(3);
  ExpectLatentMatches(dev_.get(), *l, drv.ref);
}

TEST_P(LayerSuite, RecurrentStepPushesTheConvRingAndSwapsThePingPongPair) {
  const RecurrentShape rp{2, 3, 4};  // 18 channels, ring of 3 inputs each
  auto e = NewEngine(OneLayer(rp), 16, 0);
  auto s = e->NewSession().value();
  RecurrentCacheLayer* r = s->recurrent(0);
  ASSERT_NE(r, nullptr);
  const std::size_t C = rp.conv_channels(), keep = rp.kernel - 1;
  std::mt19937 rng(17);
  std::vector<std::vector<float>> history;  // every token's inputs
  EXPECT_TRUE(BitEqual(Read(dev_.get(), r->conv_ring(), C * keep), std::vector<float>(C * keep, 0.0f)));
  EXPECT_TRUE(
      BitEqual(Read(dev_.get(), r->state(), rp.state_values()), std::vector<float>(rp.state_values(), 0.0f)));
  for (std::uint64_t t : {1, 2, 5, 1, 3, 7}) {
    auto in = RandomRows(rng, t * C);
    for (std::uint64_t i = 0; i < t; ++i) history.emplace_back(in.begin() + i * C, in.begin() + (i + 1) * C);
    auto next = RandomRows(rng, rp.state_values());
    const float* before = r->state();
    float* target = r->next_state();
    ASSERT_NE(before, target);
    Write(dev_.get(), target, next);
    DeviceVec din(dev_.get(), in);
    ASSERT_TRUE(r->Step(din.get(), t).ok());
    EXPECT_EQ(r->state(), target);
    EXPECT_EQ(r->next_state(), before);
    EXPECT_TRUE(BitEqual(Read(dev_.get(), r->state(), rp.state_values()), next));
    // The ring: the last kernel-1 inputs per channel, oldest first, zeros
    // standing for inputs before position 0.
    std::vector<float> want(C * keep, 0.0f);
    for (std::size_t c = 0; c < C; ++c) {
      for (std::size_t i = 0; i < keep; ++i) {
        const std::int64_t pos = static_cast<std::int64_t>(history.size()) - static_cast<std::int64_t>(keep) +
                                 static_cast<std::int64_t>(i);
        want[c * keep + i] = pos >= 0 ? history[pos][c] : 0.0f;
      }
    }
    EXPECT_TRUE(BitEqual(Read(dev_.get(), r->conv_ring(), C * keep), want)) << "after " << history.size();
  }
  EXPECT_TRUE(r->Step(nullptr, 1).IsInvalidArgument());
  EXPECT_FALSE(s->fresh());
}

TEST_P(LayerSuite, KvLayerAppendsRewindsAndMirrorsLen) {
  auto e = NewEngine(OneLayer(KvPlan{6, 5}), 20, 0);
  auto s = e->NewSession().value();
  KvCacheLayer* kv = s->kv(0);
  ASSERT_NE(kv, nullptr);
  std::mt19937 rng(3);
  std::vector<float> K, V;
  for (std::uint64_t t : {3, 1, 9}) {
    auto k = RandomRows(rng, t * 6), v = RandomRows(rng, t * 5);
    DeviceVec dk(dev_.get(), k), dv(dev_.get(), v);
    ASSERT_TRUE(kv->Append(dk.get(), dv.get(), t).ok());
    K.insert(K.end(), k.begin(), k.end());
    V.insert(V.end(), v.begin(), v.end());
    EXPECT_EQ(dev_->ReadI32(kv->len_device(), Lane::kCompute).value(), static_cast<int>(kv->len()));
  }
  EXPECT_TRUE(BitEqual(Read(dev_.get(), kv->k_rows(), 13 * 6), K));
  EXPECT_TRUE(BitEqual(Read(dev_.get(), kv->v_rows(), 13 * 5), V));
  DeviceVec big(dev_.get(), std::vector<float>(8 * 6, 0.0f));
  EXPECT_TRUE(kv->Append(big.get(), big.get(), 8).IsResourceExhausted());
  EXPECT_EQ(kv->len(), 13u);
  ASSERT_TRUE(kv->Truncate(4).ok());
  EXPECT_EQ(dev_->ReadI32(kv->len_device(), Lane::kCompute).value(), 4);
  EXPECT_TRUE(kv->Truncate(5).IsInvalidArgument());
  EXPECT_TRUE(kv->CheckInvariants().ok());
}

TEST_P(LayerSuite, SessionsAreReservedUpFrontAndComeBackFresh) {
  ReserveRequest r;
  r.plan = StatePlan{{Latent(8, 4, 4, 4), RecurrentShape{2, 4, 3}, KvPlan{4, 4}}};
  r.max_ctx = 64;
  r.sessions = 2;
  r.snapshot_slots = 3;
  r.index_ring_rows = 8;
  auto plan = PlanReserve(r).value();
  const std::uint64_t before = dev_->allocated_bytes();
  auto e = Engine::Create(dev_, r).value();
  EXPECT_EQ(dev_->allocated_bytes() - before, plan.device_bytes);
  EXPECT_EQ(e->free_snapshot_slots(), 3u);
  auto a = e->NewSession().value();
  auto b = e->NewSession().value();
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(e->open_sessions(), 2u);
  EXPECT_TRUE(e->NewSession().status().IsResourceExhausted());
  LatentDriver drv(dev_.get(), a->latent(0), 1);
  const std::uint64_t with_ape = dev_->allocated_bytes();
  ASSERT_TRUE(drv.Append(20).ok());
  EXPECT_EQ(dev_->allocated_bytes(), with_ape) << "layers allocate nothing beyond the reserve";
  a.reset();
  EXPECT_EQ(e->open_sessions(), 1u);
  auto c = e->NewSession().value();
  EXPECT_TRUE(c->fresh());
  EXPECT_EQ(c->latent(0)->len(), 0u);
  // The recycled arena was zeroed: rows, ring and keys read back as zeros.
  EXPECT_TRUE(BitEqual(Read(dev_.get(), c->latent(0)->rows(), 20 * 12), std::vector<float>(20 * 12, 0.0f)));
  EXPECT_EQ(dev_->ReadI32(c->latent(0)->len_device(), Lane::kCompute).value(), 0);
  e.reset();  // sessions outlive their engine safely
  EXPECT_TRUE(c->CheckInvariants().ok());
}

// The 2D copy that lays tensor-parallel head-group parts side by side: a
// column block lands where it belongs and nothing around it is touched.
TEST_P(LayerSuite, CopyOnDevice2DMovesAColumnBlockAndNothingElse) {
  constexpr std::size_t kRows = 5, kSrcWidth = 3, kDstWidth = 7, kAt = 2;
  std::vector<float> src(kRows * kSrcWidth), dst(kRows * kDstWidth, -1.0f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 0.5f;
  auto s = dev_->Allocate(src.size() * sizeof(float)).value();
  auto d = dev_->Allocate(dst.size() * sizeof(float)).value();
  ASSERT_TRUE(dev_->Upload(s.at<float>(0), src.data(), src.size() * sizeof(float), Lane::kTransfer).ok());
  ASSERT_TRUE(dev_->Upload(d.at<float>(0), dst.data(), dst.size() * sizeof(float), Lane::kTransfer).ok());
  ASSERT_TRUE(dev_->CopyOnDevice2D(d.at<float>(kAt * sizeof(float)), kDstWidth * sizeof(float),
                                   s.at<float>(0), kSrcWidth * sizeof(float), kSrcWidth * sizeof(float),
                                   kRows, Lane::kTransfer)
                  .ok());
  ASSERT_TRUE(dev_->Synchronize(Lane::kTransfer).ok());
  std::vector<float> want = dst;
  for (std::size_t r = 0; r < kRows; ++r)
    for (std::size_t c = 0; c < kSrcWidth; ++c) want[r * kDstWidth + kAt + c] = src[r * kSrcWidth + c];
  EXPECT_TRUE(BitEqual(Read(dev_.get(), d.at<float>(0), dst.size()), want));
  // A pitch narrower than the rows is refused.
  EXPECT_EQ(dev_->CopyOnDevice2D(d.at<float>(0), 4, s.at<float>(0), 12, 12, 1, Lane::kTransfer).code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(PC_ENGINE_SUITE_NAME, LayerSuite, ::testing::Values(PC_ENGINE_SUITE_BACKEND));

}  // namespace
}  // namespace testing
}  // namespace primecache::engine

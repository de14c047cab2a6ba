// Reserve planning: closed-form sizes, layout, refusals, the fit ladders, and
// the agreement between the preflight and what Engine::Create allocates.
#include <gtest/gtest.h>

#include <random>
#include <type_traits>
#include <vector>

#include "tests/engine/engine_test_util.h"

namespace primecache::engine {
namespace {

constexpr std::uint64_t A = kReserveAlignment;
std::uint64_t Block(std::uint64_t b) {
  return (b + kAllocationGranule - 1) / kAllocationGranule * kAllocationGranule;
}
std::uint64_t Up(std::uint64_t b) {
  return (b + A - 1) / A * A;
}

StatePlan Hybrid() {
  return StatePlan{
      {LatentPlan{512, 64, 128, 4}, RecurrentShape{64, 128, 4}, LatentPlan{512, 0, 0, 0}, KvPlan{96, 80}}};
}

TEST(StatePlanTest, ChecksEveryLayer) {
  EXPECT_TRUE(CheckPlan(Hybrid()).ok());
  EXPECT_TRUE(CheckPlan(StatePlan{}).IsInvalidArgument());
  Status st = CheckPlan(StatePlan{{LatentPlan{0, 0, 0, 0}, LatentPlan{8, 0, 4, 0}, LatentPlan{8, 0, 0, 4},
                                   RecurrentShape{0, 4, 4}, RecurrentShape{1, 4, 1}, KvPlan{0, 3},
                                   LatentPlan{kMaxPlanDim + 1, 0, 0, 0}}});
  ASSERT_TRUE(st.IsInvalidArgument());
  for (const char* want : {"layer 0: latent width 0", "layer 1: indexer without a pool",
                           "layer 2: pool 4 without", "layer 3: recurrent heads 0",
                           "layer 4: conv kernel 1 < 2", "layer 5: KV width 0", "layer 6: kv_rank"}) {
    EXPECT_NE(st.message().find(want), std::string::npos) << want << " in " << st.message();
  }
  LatentPlan l{512, 64, 128, 4};
  EXPECT_EQ(l.width(), 576u);
  EXPECT_EQ(l.index_width(), 256u);
  RecurrentShape r{64, 128, 4};
  EXPECT_EQ(r.conv_channels(), 3u * 64 * 128);
  EXPECT_EQ(r.conv_values(), 3u * 64 * 128 * 3);
  EXPECT_EQ(r.state_values(), 64u * 128 * 128);
}

TEST(ReserveTest, SizesEveryBufferInClosedForm) {
  ReserveRequest req{Hybrid(), 1000, 3, 5, 37};
  auto p = PlanReserve(req).value();
  ASSERT_EQ(p.layers.size(), 4u);
  const auto& l0 = std::get<LatentReserve>(p.layers[0]);
  EXPECT_EQ(l0.rows.bytes, 1000u * 576 * 4);
  EXPECT_EQ(l0.len_mirror.bytes, 4u);
  EXPECT_TRUE(l0.index_is_ring);
  EXPECT_EQ(l0.index_rows, 37u);  // booked, not yet rounded to the pool
  EXPECT_EQ(l0.index_plane.bytes, 37u * 256 * 4);
  EXPECT_EQ(l0.pool_key_capacity, 250u);
  EXPECT_EQ(l0.pool_keys.bytes, 250u * 128 * 4);
  EXPECT_EQ(l0.tail_scratch.bytes, 3u * 256 * 4);
  const auto& r1 = std::get<RecurrentReserve>(p.layers[1]);
  EXPECT_EQ(r1.conv_ring.bytes, 3u * 64 * 128 * 3 * 4);
  EXPECT_EQ(r1.state[0].bytes, 64u * 128 * 128 * 4);
  EXPECT_EQ(r1.state[1].bytes, r1.state[0].bytes);
  const auto& l2 = std::get<LatentReserve>(p.layers[2]);
  EXPECT_EQ(l2.index_plane.bytes, 0u);
  EXPECT_EQ(l2.pool_keys.bytes, 0u);
  EXPECT_FALSE(l2.index_is_ring);
  const auto& k3 = std::get<KvReserve>(p.layers[3]);
  EXPECT_EQ(k3.k_rows.bytes, 1000u * 96 * 4);
  EXPECT_EQ(k3.v_rows.bytes, 1000u * 80 * 4);

  const std::uint64_t session = Up(1000 * 576 * 4) + A + Up(37 * 256 * 4) + Up(250 * 128 * 4) +
                                Up(3 * 256 * 4) + Up(3 * 64 * 128 * 3 * 4) + 2 * Up(64 * 128 * 128 * 4) +
                                Up(1000 * 512 * 4) + A + Up(1000 * 96 * 4) + Up(1000 * 80 * 4) + A;
  EXPECT_EQ(p.session_bytes, Block(session));
  const std::uint64_t slot = Up(3 * 256 * 4) + Up(3 * 64 * 128 * 3 * 4) + Up(64 * 128 * 128 * 4);
  EXPECT_EQ(p.slot_bytes, Block(slot));
  EXPECT_EQ(p.device_bytes, 3 * Block(session) + 5 * Block(slot));
  EXPECT_EQ(p.pinned_bytes, 5 * Block(slot));
  EXPECT_NE(p.Summary().find("3 sessions"), std::string::npos);

  // Flat: max_ctx index rows.
  req.index_ring_rows = 0;
  auto f = PlanReserve(req).value();
  EXPECT_EQ(std::get<LatentReserve>(f.layers[0]).index_plane.bytes, 1000u * 256 * 4);
  EXPECT_FALSE(std::get<LatentReserve>(f.layers[0]).index_is_ring);
}

TEST(ReserveTest, BuffersAreAlignedDisjointAndInsideTheirArena) {
  ReserveRequest req{Hybrid(), 777, 1, 2, 9};
  auto p = PlanReserve(req).value();
  std::vector<BufferSpan> spans;
  for (const auto& l : p.layers) {
    std::visit(
        [&](const auto& r) {
          using T = std::decay_t<decltype(r)>;
          if constexpr (std::is_same_v<T, LatentReserve>) {
            spans.insert(spans.end(), {r.rows, r.len_mirror, r.index_plane, r.pool_keys, r.tail_scratch});
          } else if constexpr (std::is_same_v<T, RecurrentReserve>) {
            spans.insert(spans.end(), {r.conv_ring, r.state[0], r.state[1]});
          } else {
            spans.insert(spans.end(), {r.k_rows, r.v_rows, r.len_mirror});
          }
        },
        l);
  }
  std::uint64_t prev_end = 0;
  for (const auto& s : spans) {
    if (s.bytes == 0) continue;
    EXPECT_EQ(s.offset % A, 0u);
    EXPECT_GE(s.offset, prev_end);
    prev_end = s.offset + s.bytes;
  }
  EXPECT_LE(prev_end, p.session_bytes);
  std::uint64_t slot_end = 0;
  for (const auto& a : p.slot_areas) {
    for (const auto& s : {a.tail, a.conv_ring, a.state}) {
      if (s.bytes == 0) continue;
      EXPECT_EQ(s.offset % A, 0u);
      EXPECT_GE(s.offset, slot_end);
      slot_end = s.offset + s.bytes;
    }
  }
  EXPECT_LE(slot_end, p.slot_bytes);
}

TEST(ReserveTest, RefusesBadRequestsWithTheReason) {
  auto refuse = [](ReserveRequest r, const char* want) {
    auto p = PlanReserve(r);
    ASSERT_TRUE(p.status().IsInvalidArgument()) << want;
    EXPECT_NE(p.status().message().find(want), std::string::npos) << p.status().message();
  };
  refuse({Hybrid(), 0, 1, 0, 0}, "max_ctx 0");
  refuse({Hybrid(), 1ull << 31, 1, 0, 0}, "max_ctx 2147483648");
  refuse({Hybrid(), 64, 0, 0, 0}, "sessions");
  refuse({Hybrid(), 64, 1, 0, 3}, "a ring of 3 rows holds less than one pool of 4");
  refuse({StatePlan{}, 64, 1, 0, 0}, "no layers");
  refuse({StatePlan{{KvPlan{kMaxPlanDim, kMaxPlanDim}}}, (1ull << 31) - 1, 4000000000u, 0, 0}, "overflow");
  EXPECT_TRUE(PlanReserve({Hybrid(), (1ull << 31) - 1, 1, 0, 0}).ok());
}

TEST(ReserveTest, PreflightRefusesOneByteShortWithTheLargestTerms) {
  ReserveRequest req{Hybrid(), 4096, 2, 3, 0};
  auto p = PlanReserve(req).value();
  EXPECT_TRUE(Preflight(req, p.device_bytes).ok());
  auto r = Preflight(req, p.device_bytes - 1);
  ASSERT_TRUE(r.status().IsResourceExhausted());
  EXPECT_NE(r.status().message().find("exceeds free device memory"), std::string::npos);
  EXPECT_NE(r.status().message().find("layer 0 latent rows"), std::string::npos) << r.status().message();
}

// A rotating KV layer books W rows (at most max_ctx) in the arena and the
// same again in every slot; a plain one books max_ctx rows and no slot area.
// BytesPerToken stops at W for the rotating one.
TEST(ReserveTest, RotatingKvStopsGrowingAtItsWindow) {
  const KvPlan rotating{8, 8, KvFormat{64, 0, 0, 0}}, plain{8, 8, {}}, tq{6, 6, KvFormat{64, 4, 16, 1}};
  for (std::uint64_t max_ctx : {32ull, 64ull, 1000ull, 100000ull}) {
    auto p = PlanReserve(ReserveRequest{StatePlan{{rotating, plain, tq}}, max_ctx, 1, 2, 0});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const std::uint64_t w = std::min<std::uint64_t>(64, max_ctx);
    const auto& r = std::get<KvReserve>(p->layers[0]);
    EXPECT_EQ(r.rows, w);
    EXPECT_EQ(r.k_rows.bytes, w * 8 * 4);
    EXPECT_EQ(p->slot_areas[0].k_rows.bytes, w * 8 * 4);
    EXPECT_EQ(p->slot_areas[0].v_rows.bytes, w * 8 * 4);
    EXPECT_EQ(std::get<KvReserve>(p->layers[1]).rows, max_ctx);
    EXPECT_EQ(p->slot_areas[1].k_rows.bytes, 0u);
    EXPECT_EQ(std::get<KvReserve>(p->layers[2]).k_rows.bytes, w * 6 * 4);
  }
  EXPECT_EQ(BytesPerToken(rotating, 10), 64u);
  EXPECT_EQ(BytesPerToken(rotating, 64), 0u);
  EXPECT_EQ(BytesPerToken(plain, 100000), 64u);
  EXPECT_EQ(BytesPerToken(tq, 63), 48u);
  EXPECT_EQ(BytesPerToken(RecurrentShape{2, 4, 3}, 0), 0u);
  EXPECT_EQ(BytesPerToken(LatentPlan{16, 8, 0, 0}, 5), 96u);
  // A format the kinds do not know is refused by the plan check.
  auto bad = PlanReserve(ReserveRequest{StatePlan{{KvPlan{8, 8, KvFormat{0, 3, 16, 0}}}}, 100, 1, 0, 0});
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("bits 3"), std::string::npos) << bad.status().message();
}

TEST(ReserveTest, RingLadderHalvesDownToOnePool) {
  ReserveRequest req{Hybrid(), 1000, 1, 0, 0};
  EXPECT_EQ(RingFitLadder(req), (std::vector<std::uint64_t>{0, 500, 250, 125, 62, 31, 15, 7}));
  req.index_ring_rows = 64;
  EXPECT_EQ(RingFitLadder(req), (std::vector<std::uint64_t>{64, 32, 16, 8, 4}));
  ReserveRequest no_indexer{StatePlan{{KvPlan{4, 4}}}, 1000, 1, 0, 0};
  EXPECT_EQ(RingFitLadder(no_indexer), (std::vector<std::uint64_t>{0}));
}

// Rounds of T positions: each recurrent layer books its pre-round ring and
// state and T tokens of pre-conv, scan inputs and readout; a rotating layer
// T rows of K and V; latent and plain KV layers nothing. A ring too small to
// take a round after a partial pool, or a round longer than a rotating
// buffer, is refused by layer; the preflight names the stash.
TEST(ReserveTest, RoundStashIsBookedPerLayerAndRefusedWhenItCannotWork) {
  const KvPlan rotating{8, 8, KvFormat{64, 0, 0, 0}};
  ReserveRequest req{
      StatePlan{{LatentPlan{512, 64, 128, 4}, RecurrentShape{64, 128, 4}, KvPlan{96, 80}, rotating}}, 1000, 1,
      0, 8};
  req.round_tokens = 5;
  auto p = PlanReserve(req);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const auto& r = std::get<RecurrentReserve>(p->layers[1]).round;
  const std::uint64_t c = 3 * 64 * 128, nd = 64 * 128;
  EXPECT_EQ(r.conv_ring.bytes, c * 3 * 4);
  EXPECT_EQ(r.state.bytes, nd * 128 * 4);
  EXPECT_EQ(r.raw.bytes, 5 * c * 4);
  EXPECT_EQ(r.qkv.bytes, 5 * c * 4);
  EXPECT_EQ(r.g.bytes, 5 * nd * 4);
  EXPECT_EQ(r.b.bytes, 5u * 64 * 4);
  EXPECT_EQ(r.out.bytes, 5 * nd * 4);
  EXPECT_EQ(std::get<KvReserve>(p->layers[2]).round_k.bytes, 0u);
  EXPECT_EQ(std::get<KvReserve>(p->layers[3]).round_k.bytes, 5u * 8 * 4);
  EXPECT_EQ(std::get<KvReserve>(p->layers[3]).round_v.bytes, 5u * 8 * 4);
  std::uint64_t prev_end = 0;
  for (const BufferSpan& s : {r.conv_ring, r.state, r.raw, r.qkv, r.g, r.b, r.out}) {
    EXPECT_EQ(s.offset % A, 0u);
    EXPECT_GE(s.offset, prev_end);
    prev_end = s.offset + s.bytes;
  }
  ReserveRequest none = req;
  none.round_tokens = 0;
  EXPECT_GE(p->session_bytes - PlanReserve(none)->session_bytes, r.bytes());
  EXPECT_EQ(std::get<RecurrentReserve>(PlanReserve(none)->layers[1]).round.bytes(), 0u);

  EXPECT_EQ(MinRingRows(4, 5), 8u);
  EXPECT_EQ(MinRingRows(4, 6), 12u);
  EXPECT_EQ(MinRingRows(4, 0), 4u);
  ReserveRequest small = req;
  small.index_ring_rows = 7;
  auto refused = PlanReserve(small);
  ASSERT_TRUE(refused.status().IsInvalidArgument());
  EXPECT_NE(refused.status().message().find("layer 0: a ring of 7 rows cannot hold a round of 5 tokens"),
            std::string::npos)
      << refused.status().message();
  ReserveRequest narrow = req;
  narrow.plan.layers[3] = KvPlan{8, 8, KvFormat{4, 0, 0, 0}};
  auto too_long = PlanReserve(narrow);
  ASSERT_TRUE(too_long.status().IsInvalidArgument());
  EXPECT_NE(
      too_long.status().message().find("layer 3: a round of 5 tokens passes the rotating buffer of 4 rows"),
      std::string::npos)
      << too_long.status().message();
  // The ring ladder stops at the round's floor.
  ReserveRequest ladder = req;
  ladder.index_ring_rows = 64;
  EXPECT_EQ(RingFitLadder(ladder), (std::vector<std::uint64_t>{64, 32, 16, 8}));
  // Short by a byte: the stash is named among the largest terms when it is one.
  ReserveRequest heavy{StatePlan{{RecurrentShape{64, 128, 4}}}, 16, 1, 0, 0};
  heavy.round_tokens = 64;
  auto hp = PlanReserve(heavy).value();
  auto short_by_one = Preflight(heavy, hp.device_bytes - 1);
  ASSERT_TRUE(short_by_one.status().IsResourceExhausted());
  EXPECT_NE(short_by_one.status().message().find("layer 0 round stash"), std::string::npos)
      << short_by_one.status().message();
}

TEST(ReserveTest, FitPicksTheDeepestRingThatFits) {
  ReserveRequest req{Hybrid(), 8192, 2, 1, 0};
  const auto ladder = RingFitLadder(req);
  std::vector<std::uint64_t> need;
  for (std::uint64_t depth : ladder) {
    ReserveRequest r = req;
    r.index_ring_rows = depth;
    need.push_back(PlanReserve(r).value().device_bytes);
  }
  ASSERT_GT(need.front(), need.back());
  std::size_t distinct = 0;
  for (std::size_t i = 0; i < ladder.size(); ++i) {
    distinct += (i == 0 || need[i] != need[i - 1]) ? 1 : 0;
    for (std::uint64_t free_bytes : {need[i], need[i] - 1}) {
      // The deepest depth whose reserve fits.
      std::size_t want = 0;
      while (want < ladder.size() && need[want] > free_bytes) ++want;
      auto fit = FitReserve(req, free_bytes, FitTarget::kRingRows);
      if (want == ladder.size()) {
        ASSERT_TRUE(fit.status().IsResourceExhausted());
        EXPECT_NE(fit.status().message().find("no index ring depth fits"), std::string::npos);
        continue;
      }
      ASSERT_TRUE(fit.ok()) << fit.status().ToString();
      EXPECT_EQ(fit->request.index_ring_rows, ladder[want]) << "free " << free_bytes;
      EXPECT_EQ(fit->plan.device_bytes, need[want]);
      EXPECT_LE(fit->plan.device_bytes, free_bytes);
    }
  }
  EXPECT_GE(distinct, 4u) << "the ladder steps must change the reserve";
  EXPECT_TRUE(
      FitReserve({Hybrid(), 0, 1, 0, 0}, 1ull << 40, FitTarget::kRingRows).status().IsInvalidArgument());
}

TEST(ReserveTest, FitPicksTheMostSnapshotSlotsThatFit) {
  ReserveRequest req{Hybrid(), 2048, 1, 16, 64};
  ReserveRequest none = req;
  none.snapshot_slots = 0;
  auto base = PlanReserve(none).value();
  for (std::uint32_t k : {0u, 1u, 7u, 16u}) {
    const std::uint64_t free_bytes = base.device_bytes + k * base.slot_bytes + base.slot_bytes - 1;
    auto f = FitReserve(req, free_bytes, FitTarget::kSnapshotSlots);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->request.snapshot_slots, std::min(k, 16u));
    EXPECT_LE(f->plan.device_bytes, free_bytes);
  }
  auto f = FitReserve(req, 1ull << 50, FitTarget::kSnapshotSlots);
  EXPECT_EQ(f->request.snapshot_slots, 16u) << "never more than requested";
  EXPECT_TRUE(
      FitReserve(req, base.device_bytes - 1, FitTarget::kSnapshotSlots).status().IsResourceExhausted());
}

// The preflight and the allocation agree: on a device that hands out exactly
// `free` bytes, Engine::Create succeeds if and only if Preflight does, and
// then holds exactly the planned bytes.
TEST(ReserveTest, PreflightAndAllocationAgree) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<std::uint32_t> small(1, 6), pick(0, 3);
  int fits = 0, refusals = 0;
  for (int iter = 0; iter < 200; ++iter) {
    StatePlan plan;
    const int n = static_cast<int>(small(rng));
    for (int i = 0; i < n; ++i) {
      switch (pick(rng)) {
        case 0:
          plan.layers.push_back(LatentPlan{8 * small(rng), 2 * pick(rng), 4 * small(rng), small(rng)});
          break;
        case 1:
          plan.layers.push_back(LatentPlan{16 * small(rng), 0, 0, 0});
          break;
        case 2:
          plan.layers.push_back(RecurrentShape{small(rng), 4 * small(rng), 1 + small(rng)});
          break;
        default: {
          // Plain or rotating, f32 or TurboQuant-4 over head_dim 16 (3 words an entry).
          const std::uint32_t window = pick(rng) % 2 ? small(rng) : 0;
          if (pick(rng) % 2) {
            plan.layers.push_back(KvPlan{3 * small(rng), 3 * small(rng), KvFormat{window, 4, 16, 9}});
          } else {
            plan.layers.push_back(KvPlan{4 * small(rng), 4 * small(rng), KvFormat{window, 0, 0, 0}});
          }
        }
      }
    }
    ReserveRequest req{plan, 16u * small(rng) * small(rng), small(rng), pick(rng),
                       pick(rng) ? 6u + small(rng) : 0u};
    auto planned = PlanReserve(req);
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    const std::uint64_t need = planned->device_bytes;
    for (std::uint64_t free_bytes : {need, need - 1, need + 4096, need / 2}) {
      auto dev = NewCpuDevice({.memory_bytes = free_bytes});
      const bool preflight_ok = Preflight(req, free_bytes).ok();
      auto engine = Engine::Create(dev, req);
      ASSERT_EQ(engine.ok(), preflight_ok) << engine.status().ToString();
      if (engine.ok()) {
        ++fits;
        EXPECT_EQ(dev->allocated_bytes(), need);
        // Every reserved session opens without allocating anything more.
        std::vector<std::unique_ptr<SessionCache>> sessions;
        for (std::uint32_t s = 0; s < req.sessions; ++s)
          sessions.push_back(engine.value()->NewSession().value());
        EXPECT_EQ(dev->allocated_bytes(), need);
      } else {
        ++refusals;
        EXPECT_TRUE(engine.status().IsResourceExhausted());
        EXPECT_EQ(dev->allocated_bytes(), 0u) << "a refused configuration allocates nothing";
      }
    }
  }
  EXPECT_GT(fits, 0);
  EXPECT_GT(refusals, 0);
}

}  // namespace
}  // namespace primecache::engine

// Speculative verify rounds on one backend (the CPU reference in engine_test,
// CUDA in engine_gpu_test): for every layer kind and mixes of them, a
// rollback to every keep leaves the cache bit-identical to a cache armed at
// the same point and given only the kept tokens; random accept/reject
// sequences never drift from the plain run; captures before, during and
// after rounds; a restore of a boundary captured right after a rollback
// continues identically; and the refusals, by name.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/engine/engine_test_util.h"
#include "tests/engine/round_feeder.h"

namespace primecache::engine::testing {
namespace {

constexpr std::uint32_t kRound = 5;  // gamma 4
constexpr std::uint64_t kRing = 8;   // MinRingRows(4, 5)

KvPlan Kv(std::uint32_t window, std::uint32_t bits) {
  const KvFormat f{window, bits, bits ? 16u : 0u, bits ? 7u : 0u};
  const std::uint32_t w = bits ? 2 * (1 + 16 * bits / 32) : 6;
  return KvPlan{w, w, f};
}

struct Case {
  std::string name;
  StatePlan plan;
  std::uint64_t ring = 0;
};

std::vector<Case> Cases() {
  const LatentPlan dense{16, 8, 0, 0}, indexed{16, 8, 8, 4};
  const RecurrentShape rec{2, 4, 4}, rec2{1, 8, 2};
  return {
      {"latent-dense", StatePlan{{dense}}},
      {"latent-indexer-flat", StatePlan{{indexed}}},
      {"latent-indexer-ring", StatePlan{{indexed}}, kRing},
      {"recurrent", StatePlan{{rec, rec2}}},
      {"kv-plain", StatePlan{{Kv(0, 0)}}},
      {"kv-rotating", StatePlan{{Kv(8, 0)}}},
      {"kv-plain-tq4", StatePlan{{Kv(0, 4)}}},
      {"kv-rotating-tq2", StatePlan{{Kv(6, 2)}}},
      {"mix", StatePlan{{rec, indexed, Kv(8, 0), dense, Kv(6, 4), rec2, Kv(0, 2)}}, kRing},
  };
}

class RoundSuite : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    PC_ENGINE_REQUIRE_DEVICE(GetParam());
    dev_ = MakeDevice(GetParam());
    ASSERT_NE(dev_, nullptr);
  }
  std::unique_ptr<Engine> NewEngine(const Case& c, std::uint64_t max_ctx = 96, std::uint32_t round = kRound) {
    ReserveRequest r{c.plan, max_ctx, 3, 2, c.ring};
    r.round_tokens = round;
    auto e = Engine::Create(dev_, r);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  std::vector<LayerSnapshot> Capture(SessionCache* s) {
    auto c = s->CaptureFull();
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : std::vector<LayerSnapshot>{};
  }
  // Feeds `total` tokens in calls of at most `call`.
  static void Feed(RoundFeeder& f, std::uint64_t total, std::uint64_t call) {
    for (std::uint64_t done = 0; done < total;) {
      const std::uint64_t n = std::min(call, total - done);
      ASSERT_TRUE(f.Append(n).ok());
      done += n;
    }
  }
  std::shared_ptr<Device> dev_;
};

// The round appends kRound tokens (in one call, or in two), then keeps `keep`.
void RunRound(RoundFeeder& f, std::uint64_t keep, bool split) {
  ASSERT_TRUE(f.Arm(kRound).ok());
  if (split) {
    ASSERT_TRUE(f.Append(2).ok());
    ASSERT_TRUE(f.Append(kRound - 2).ok());
  } else {
    ASSERT_TRUE(f.Append(kRound).ok());
  }
  Status st = f.Rollback(keep);
  ASSERT_TRUE(st.ok()) << st.ToString();
}

// The reference: armed at the same point, given only the kept tokens in one call.
void RunReference(RoundFeeder& f, std::uint64_t keep) {
  ASSERT_TRUE(f.Arm(kRound).ok());
  if (keep != 0) {
    ASSERT_TRUE(f.Append(keep).ok());
  }
  ASSERT_TRUE(f.Commit().ok());
}

TEST_P(RoundSuite, RollbackToEveryKeepEqualsASessionGivenOnlyTheKeptTokens) {
  for (const Case& c : Cases()) {
    for (std::uint64_t prefix : {6u, 21u}) {
      for (std::uint64_t keep = 0; keep <= kRound; ++keep) {
        for (bool split : {false, true}) {
          SCOPED_TRACE(c.name + " prefix " + std::to_string(prefix) + " keep " + std::to_string(keep) +
                       (split ? " split" : ""));
          auto e = NewEngine(c);
          ASSERT_NE(e, nullptr);
          auto a = e->NewSession().value(), b = e->NewSession().value();
          RoundFeeder fa(dev_.get(), a.get(), 5), fb(dev_.get(), b.get(), 5);
          Feed(fa, prefix, 7);
          Feed(fb, prefix, 7);
          RunRound(fa, keep, split);
          RunReference(fb, keep);
          ASSERT_EQ(fa.position(), fb.position());
          ASSERT_TRUE(a->CheckInvariants().ok()) << a->CheckInvariants().ToString();
          ExpectSnapshotsEqual(Capture(a.get()), Capture(b.get()));
          // Both go on: the next call and the next round see the same state.
          ASSERT_TRUE(fa.Append(3).ok());
          ASSERT_TRUE(fb.Append(3).ok());
          RunRound(fa, 1, false);
          RunReference(fb, 1);
          ExpectSnapshotsEqual(Capture(a.get()), Capture(b.get()));
          if (HasFailure()) return;
        }
      }
    }
  }
}

// A long generation of rounds of random length, kept to a random prefix:
// the session never drifts from one that was only ever given the kept tokens.
TEST_P(RoundSuite, RandomAcceptRejectSequencesNeverDriftFromThePlainRun) {
  const Case mix = Cases().back();
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto e = NewEngine(mix, 400);
    auto a = e->NewSession().value(), b = e->NewSession().value();
    RoundFeeder fa(dev_.get(), a.get(), seed), fb(dev_.get(), b.get(), seed);
    std::mt19937 rng(seed);
    Feed(fa, 9, 9);
    Feed(fb, 9, 9);
    for (int round = 0; round < 70; ++round) {
      const std::uint64_t n = 1 + rng() % kRound, keep = rng() % (n + 1);
      ASSERT_TRUE(fa.Arm(n).ok());
      const std::uint64_t first = rng() % 2 ? n : 1 + rng() % n;
      ASSERT_TRUE(fa.Append(first).ok());
      if (first < n) {
        ASSERT_TRUE(fa.Append(n - first).ok());
      }
      if (keep == n && rng() % 2) {
        ASSERT_TRUE(fa.Commit().ok());
      } else {
        ASSERT_TRUE(fa.Rollback(keep).ok());
      }
      if (keep != 0) {
        ASSERT_TRUE(fb.Append(keep).ok());  // the plain run: no rounds at all
      }
      ASSERT_EQ(fa.position(), fb.position());
      if (round % 10 == 9) ExpectSnapshotsEqual(Capture(a.get()), Capture(b.get()));
      if (HasFailure()) return;
    }
    ExpectSnapshotsEqual(Capture(a.get()), Capture(b.get()));
  }
}

TEST_P(RoundSuite, CaptureDuringARoundTakesTheCommittedState) {
  const Case mix = Cases().back();
  for (std::uint64_t keep : {0u, 2u, 5u}) {
    SCOPED_TRACE("keep " + std::to_string(keep));
    auto e = NewEngine(mix);
    auto a = e->NewSession().value();
    RoundFeeder f(dev_.get(), a.get(), 9);
    Feed(f, 23, 6);  // the rotating layers have wrapped
    const auto before = Capture(a.get());
    ASSERT_TRUE(f.Arm(kRound).ok());
    auto early = a->CaptureEager();  // armed, nothing appended yet
    ASSERT_TRUE(early.ok()) << early.status().ToString();
    ASSERT_TRUE(f.Append(kRound).ok());
    ExpectSnapshotsEqual(Capture(a.get()), before);
    auto pending = a->CaptureEager();  // the verify call ran: still the committed state
    ASSERT_TRUE(pending.ok()) << pending.status().ToString();
    auto half = pending->Collect();
    ASSERT_TRUE(half.ok());
    auto during = a->CompleteCapture(*half);  // completed inside the round
    ASSERT_TRUE(during.ok()) << during.status().ToString();
    ExpectSnapshotsEqual(*during, before);
    if (keep == kRound) {
      ASSERT_TRUE(f.Commit().ok());
    } else {
      ASSERT_TRUE(f.Rollback(keep).ok());
    }
    // Completed after the round's resolution: the boundary is the round's start.
    auto done = a->CompleteCapture(std::move(half).value());
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    ExpectSnapshotsEqual(*done, before);
    auto early_half = early->Collect();
    ASSERT_TRUE(early_half.ok());
    auto early_done = a->CompleteCapture(std::move(early_half).value());
    ASSERT_TRUE(early_done.ok()) << early_done.status().ToString();
    ExpectSnapshotsEqual(*early_done, before);
  }
}

TEST_P(RoundSuite, APendingCaptureSurvivesRoundsAndIsRefusedByNameBelowItsBoundary) {
  const Case mix = Cases().back();
  auto e = NewEngine(mix);
  auto a = e->NewSession().value();
  RoundFeeder f(dev_.get(), a.get(), 4);
  Feed(f, 17, 17);
  const auto at_boundary = Capture(a.get());
  auto pending = a->CaptureEager();
  ASSERT_TRUE(pending.ok());
  auto half = pending->Collect();
  ASSERT_TRUE(half.ok());
  for (std::uint64_t keep : {0u, 3u, 0u, 5u, 1u}) {  // the first round goes back to the boundary itself
    RunRound(f, keep, keep == 3);
  }
  auto done = a->CompleteCapture(*half);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ExpectSnapshotsEqual(*done, at_boundary);
  // A rewind below the boundary: inside a round it is refused outright; after
  // one, the deferred half is refused naming the rewind.
  ASSERT_TRUE(f.Arm(kRound).ok());
  Status in_round = a->latent(3)->Truncate(10);
  EXPECT_TRUE(in_round.IsFailedPrecondition());
  EXPECT_NE(in_round.message().find("speculative round is armed"), std::string::npos) << in_round.message();
  ASSERT_TRUE(f.Rollback(0).ok());
  ASSERT_TRUE(a->latent(3)->Truncate(16).ok());
  DeviceVec rows(dev_.get(), std::vector<float>(2 * a->latent(3)->width(), 0.5f));
  ASSERT_TRUE(a->latent(3)->Append(rows.get(), nullptr, 2, nullptr).ok());  // back above the boundary
  Status below = a->CompleteCapture(std::move(half).value()).status();
  EXPECT_TRUE(below.IsFailedPrecondition());
  EXPECT_NE(below.message().find("rewound to 16, below the boundary 17"), std::string::npos)
      << below.message();
}

TEST_P(RoundSuite, RestoreOfABoundaryCapturedRightAfterARollbackContinuesIdentically) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto e = NewEngine(c);
    auto a = e->NewSession().value(), r = e->NewSession().value();
    RoundFeeder fa(dev_.get(), a.get(), 8), fr(dev_.get(), r.get(), 8);
    Feed(fa, 19, 19);
    RunRound(fa, 2, false);
    const auto boundary = Capture(a.get());
    ASSERT_TRUE(r->Restore(boundary).ok());
    fr.SetPosition(fa.position());
    for (RoundFeeder* f : {&fa, &fr}) {
      ASSERT_TRUE(f->Append(4).ok());
      RunRound(*f, 3, true);
      ASSERT_TRUE(f->Append(1).ok());
      RunRound(*f, 0, false);
    }
    ExpectSnapshotsEqual(Capture(a.get()), Capture(r.get()));
  }
}

TEST_P(RoundSuite, RefusalsLeaveTheCacheAsItWas) {
  const Case mix = Cases().back();
  auto e = NewEngine(mix);
  auto a = e->NewSession().value();
  RoundFeeder f(dev_.get(), a.get(), 2);
  EXPECT_TRUE(a->CommitRound().IsFailedPrecondition());
  EXPECT_TRUE(a->RollbackRound(0).IsFailedPrecondition());
  Status big = a->ArmRound(kRound + 1);
  EXPECT_TRUE(big.IsInvalidArgument());
  EXPECT_NE(big.message().find("rounds of 1 to 5"), std::string::npos) << big.message();
  EXPECT_TRUE(a->ArmRound(0).IsInvalidArgument());
  Feed(f, 12, 12);
  const auto before = Capture(a.get());
  ASSERT_TRUE(f.Arm(3).ok());
  EXPECT_FALSE(a->fresh());
  EXPECT_TRUE(a->ArmRound(3).IsFailedPrecondition());
  Status past = f.Append(4);
  EXPECT_TRUE(past.IsResourceExhausted()) << past.ToString();
  EXPECT_NE(past.message().find("passes the armed round of 3 positions"), std::string::npos)
      << past.message();
  // Nothing was appended by the refused call (it failed on the first layer).
  EXPECT_EQ(a->RoundAppended().value(), 0u);
  // A recurrent step whose scan inputs were not stashed is refused.
  RecurrentCacheLayer* r = a->recurrent(0);
  std::vector<float> raw(r->plan().conv_channels(), 1.0f);
  DeviceVec draw(dev_.get(), raw);
  Status unstashed = r->Step(draw.get(), 1);
  EXPECT_TRUE(unstashed.IsFailedPrecondition());
  EXPECT_NE(unstashed.message().find("StashScanInputs first"), std::string::npos) << unstashed.message();
  ASSERT_TRUE(f.Append(2).ok());
  EXPECT_TRUE(a->RollbackRound(3).IsInvalidArgument());
  ASSERT_TRUE(f.Rollback(0).ok());
  ExpectSnapshotsEqual(Capture(a.get()), before);
  // A fresh, armed cache takes no restore; an engine without rounds arms none.
  auto fresh = e->NewSession().value();
  ASSERT_TRUE(fresh->ArmRound(2).ok());
  EXPECT_TRUE(fresh->Restore(before).IsFailedPrecondition());
  auto plain = NewEngine(mix, 96, 0);
  auto p = plain->NewSession().value();
  EXPECT_TRUE(p->ArmRound(1).IsInvalidArgument());
}

INSTANTIATE_TEST_SUITE_P(PC_ENGINE_SUITE_NAME, RoundSuite, ::testing::Values(PC_ENGINE_SUITE_BACKEND));

}  // namespace
}  // namespace primecache::engine::testing

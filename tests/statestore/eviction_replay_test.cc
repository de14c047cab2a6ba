// Eviction and admission under replayed traces (tools/common/replay.h): the
// trace generator's determinism and distributions, the replay's determinism,
// the budget after every acknowledged publish, leases under eviction
// pressure, the utility formula on hand-computed cases, and admission by
// reuse.
#include <algorithm>
#include <cmath>
#include <map>

#include "primecache/internal/model.h"
#include "store_test_util.h"
#include "tools/common/replay.h"
#include "tools/common/traces.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

// ---- traces ---------------------------------------------------------------------------------

TEST(Traces, ASeedGivesTheSameBytesAndAnotherSeedOthers) {
  for (traces::Kind k : traces::kAllKinds) {
    const traces::TraceOptions a{7, 6, 0.2};
    const std::string one = traces::Serialize(traces::Generate(k, a));
    EXPECT_EQ(one, traces::Serialize(traces::Generate(k, a))) << traces::KindName(k);
    EXPECT_NE(one, traces::Serialize(traces::Generate(k, {8, 6, 0.2}))) << traces::KindName(k);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(Traces, SamplerDistributionsAreWithinTolerance) {
  traces::Sampler s(42);
  const traces::LogNormal d{250, 0.8, 1, 1u << 30};
  std::vector<double> logs;
  for (int i = 0; i < 20000; ++i) logs.push_back(std::log(static_cast<double>(s.Draw(d))));
  double mean = 0, var = 0;
  for (double x : logs) mean += x;
  mean /= static_cast<double>(logs.size());
  for (double x : logs) var += (x - mean) * (x - mean);
  var /= static_cast<double>(logs.size());
  EXPECT_NEAR(std::exp(Median(logs)), 250, 250 * 0.05);
  EXPECT_NEAR(std::sqrt(var), 0.8, 0.03);
  double e = 0;
  for (int i = 0; i < 20000; ++i) e += s.Exponential(3.0);
  EXPECT_NEAR(e / 20000, 3.0, 0.1);
  double turns = 0;
  for (int i = 0; i < 20000; ++i) turns += static_cast<double>(s.Geometric(0.25, 1000));
  EXPECT_NEAR(turns / 20000, 4.0, 0.15);  // mean 1/p
  const traces::LogNormal capped{100, 2.0, 10, 300};
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t x = s.Draw(capped);
    ASSERT_GE(x, 10u);
    ASSERT_LE(x, 300u);
  }
}

TEST(Traces, ChatConversationsGrowTurnByTurnAndShareTheirPrefix) {
  const traces::ChatParams p;
  const traces::Trace t = traces::GenerateChat(p, 3);
  std::map<std::uint64_t, std::vector<const traces::Request*>> conv;
  for (const auto& r : t.requests) conv[r.conversation].push_back(&r);
  ASSERT_EQ(conv.size(), p.conversations);
  double turns = 0;
  std::vector<double> user;
  for (const auto& [id, reqs] : conv) {
    turns += static_cast<double>(reqs.size());
    EXPECT_TRUE(reqs.back()->last);
    for (std::size_t k = 1; k < reqs.size(); ++k) {
      const auto& a = reqs[k - 1]->tokens;
      const auto& b = reqs[k]->tokens;
      ASSERT_GT(b.size(), a.size());
      ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "a turn extends the one before";
      const auto& reply = reqs[k - 1]->reply;
      ASSERT_GE(reply.size(), p.reply.min);
      ASSERT_GE(b.size(), a.size() + reply.size());
      EXPECT_TRUE(std::equal(reply.begin(), reply.end(), b.begin() + static_cast<std::ptrdiff_t>(a.size())))
          << "the next turn carries the reply right after the prompt";
      EXPECT_GT(reqs[k]->arrival_s, reqs[k - 1]->arrival_s);
    }
    user.push_back(static_cast<double>(reqs.front()->tokens.size() - p.system_tokens));
  }
  // Geometric turns with abandonment 0.25 (mean 4, a little less for the cap)
  // and the first user message's lognormal median 60.
  EXPECT_NEAR(turns / static_cast<double>(conv.size()), 4.0, 0.6);
  EXPECT_NEAR(Median(user), 60, 60 * 0.2);
  EXPECT_TRUE(std::is_sorted(t.requests.begin(), t.requests.end(),
                             [](const auto& a, const auto& b) { return a.arrival_s < b.arrival_s; }));
}

TEST(Traces, FewShotBatchesShareTheirPrefixAndAgentsTheirSystemPrompt) {
  const traces::Trace f = traces::Generate(traces::Kind::kFewShot, {5, 4, 1.0});
  std::map<std::uint64_t, std::size_t> shared;  // batch -> common prefix of its requests
  std::map<std::uint64_t, const traces::Request*> first;
  for (const auto& r : f.requests) {
    auto [it, fresh] = first.try_emplace(r.conversation, &r);
    if (fresh) continue;
    const auto& a = it->second->tokens;
    std::size_t n = std::mismatch(a.begin(), a.end(), r.tokens.begin(), r.tokens.end()).first - a.begin();
    shared[r.conversation] = shared.count(r.conversation) ? std::min(shared[r.conversation], n) : n;
  }
  for (const auto& [b, n] : shared) EXPECT_GE(n, 500u) << "batch " << b;
  const traces::AgenticParams ap;
  const traces::Trace a = traces::GenerateAgentic(ap, 5);
  std::map<std::uint64_t, const traces::Request*> before;  // session -> its previous step
  std::size_t carried = 0, steps = 0;
  for (const auto& r : a.requests) {
    ASSERT_GT(r.tokens.size(), ap.system_tokens);
    EXPECT_TRUE(std::equal(a.requests[0].tokens.begin(), a.requests[0].tokens.begin() + 6000, r.tokens.begin()));
    EXPECT_GE(r.reply.size(), ap.action.min) << "every step has the agent's action";
    if (const auto* prev = before[r.conversation]) {
      std::vector<std::uint32_t> answered = prev->tokens;
      answered.insert(answered.end(), prev->reply.begin(), prev->reply.end());
      // A step carries the previous one's action, unless it branched back.
      carried += r.tokens.size() >= answered.size() && std::equal(answered.begin(), answered.end(), r.tokens.begin());
      ++steps;
    }
    before[r.conversation] = &r;
  }
  EXPECT_GT(carried, steps * 3 / 4) << carried << " of " << steps << " steps carried their action";
  for (const auto& r : f.requests) EXPECT_TRUE(r.reply.empty()) << "few-shot requests have no reply";
}

// ---- replay ---------------------------------------------------------------------------------

replay::StateGeometry SmallGeometry() {
  auto config = model::LoadModelConfig(Env::Default(), std::string(PRIMECACHE_SOURCE_DIR) + "/configs/hrm-glm5-class.json");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  auto g = replay::GeometryFor(*config, 32);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

replay::ReplayResult MustReplay(const traces::Trace& t, const replay::StateGeometry& g, StoreOptions o,
                                std::uint64_t budget_real = 0) {
  o.byte_budget = budget_real / g.scale;
  MemStore m(o);
  replay::StoreTarget target(m.store.get(), g);
  replay::ReplayOptions ro;
  ro.budget_real_bytes = budget_real;
  auto r = replay::Replay(t, g, target, ro);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  ExpectConsistent(*m.store);
  return r.ok() ? *r : replay::ReplayResult{};
}

TEST(Replay, TheGeometryMatchesTheModelsStateSize) {
  const replay::StateGeometry g = SmallGeometry();
  // hrm-glm5-class at 32768 tokens holds 0.519 GB (docs/BENCHMARKS.md).
  EXPECT_NEAR(static_cast<double>(g.RealBytes(32768)) / 1e9, 0.519, 0.002);
  auto layers = replay::EncodeBoundary(g, Conversation(1000, 1));
  EXPECT_EQ(layers.size(), 24u);
  std::uint64_t raw = 0;
  for (const auto& l : layers) {
    for (const auto& c : l.chunks) raw += c.size();
  }
  // raw/v1 chunks hold the planes as they are (plus small per-chunk framing).
  EXPECT_NEAR(static_cast<double>(raw * g.scale), static_cast<double>(g.RealBytes(1000)), 0.02 * static_cast<double>(g.RealBytes(1000)));
}

TEST(Replay, ASeedReplaysToTheSameHits) {
  const replay::StateGeometry g = SmallGeometry();
  const traces::Trace t = traces::Generate(traces::Kind::kChat, {11, 10, 0.3});
  const replay::ReplayResult unlimited = MustReplay(t, g, CodecStoreOptions());
  ASSERT_GT(unlimited.hit_tokens, 0u);
  for (auto policy : {EvictionPolicy::kLru, EvictionPolicy::kUtility, EvictionPolicy::kMarginal}) {
    StoreOptions o = CodecStoreOptions();
    o.eviction.policy = policy;
    const std::uint64_t budget = unlimited.peak_stored_bytes / 5;
    const replay::ReplayResult a = MustReplay(t, g, o, budget);
    const replay::ReplayResult b = MustReplay(traces::Generate(traces::Kind::kChat, {11, 10, 0.3}), g, o, budget);
    EXPECT_EQ(a.hit_lengths, b.hit_lengths);
    EXPECT_EQ(a.bytes_written, b.bytes_written);
    EXPECT_EQ(a.evictions, b.evictions);
    EXPECT_GT(a.evictions, 0u);
    EXPECT_LT(a.hit_tokens, unlimited.hit_tokens);
    EXPECT_EQ(a.over_budget, 0u) << "the budget held after every acknowledged publish";
  }
}

TEST(Replay, TheBudgetHoldsAfterEveryAcknowledgedPublish) {
  const replay::StateGeometry g = SmallGeometry();
  const traces::Trace t = traces::Generate(traces::Kind::kAgentic, {3, 3, 0.2});
  const replay::ReplayResult unlimited = MustReplay(t, g, CodecStoreOptions());
  for (double share : {0.02, 0.1, 0.5}) {
    for (auto policy : {EvictionPolicy::kLru, EvictionPolicy::kUtility, EvictionPolicy::kMarginal}) {
      StoreOptions o = CodecStoreOptions();
      o.eviction.policy = policy;
      o.eviction.utility_window = 8;
      const auto budget = static_cast<std::uint64_t>(share * static_cast<double>(unlimited.peak_stored_bytes));
      const replay::ReplayResult r = MustReplay(t, g, o, budget);
      EXPECT_EQ(r.over_budget, 0u) << share;
      EXPECT_LE(r.peak_stored_bytes, budget) << share;
      EXPECT_LE(r.hit_tokens, unlimited.hit_tokens);
    }
  }
}

// ---- leases ---------------------------------------------------------------------------------

TEST(Replay, LeasedEntriesAreNeverEvicted) {
  for (auto policy : {EvictionPolicy::kLru, EvictionPolicy::kUtility, EvictionPolicy::kMarginal}) {
    const std::uint64_t one = [] {
      MemStore m;
      MustPublish(*m.store, Conversation(300, 1));
      return m.store->Stat()->stored_bytes;
    }();
    StoreOptions o = CodecStoreOptions();
    o.eviction.policy = policy;
    o.byte_budget = one * 6;
    MemStore m(o);
    std::vector<Lease> leases;
    std::vector<EntryId> leased;
    for (int i = 0; i < 40; ++i) {
      auto t = Conversation(300, 100 + i);
      auto r = m.store->Publish(Request(t), MakeLayers(t));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_LE(m.store->Stat()->stored_bytes, o.byte_budget);
      if (i % 10 == 0) {  // hold a few, across the whole run
        auto l = m.store->AcquireLease(r->id);
        ASSERT_TRUE(l.ok());
        leases.push_back(std::move(l).value());
        leased.push_back(r->id);
      }
      for (EntryId id : leased) ASSERT_TRUE(m.store->Describe(id).ok()) << "leased entry " << id << " evicted";
    }
    EXPECT_GT(m.store->Stat()->evictions, 20u);
    ExpectConsistent(*m.store);
  }
}

// ---- the utility formula ------------------------------------------------------------------

TEST(Utility, PrefillFlopsByHand) {
  // 10 tokens: 10 x 1000 per token, plus 2 attention layers x 64 per pair x 55 pairs.
  EXPECT_DOUBLE_EQ(EstimatePrefillFlops({1000, 2, 64}, 10), 10000.0 + 2 * 64 * 55);
  EXPECT_DOUBLE_EQ(EstimatePrefillFlops({}, 123), 123.0);
  EXPECT_DOUBLE_EQ(EstimatePrefillFlops({7, 0, 0}, 3), 21.0);
}

// Which of three unrelated entries the utility evicts for `alpha`: the one
// with the lowest rec + alpha * eff, rec = (tick - oldest) / (newest -
// oldest), eff = (flops / bytes) / the largest flops / bytes of the three.
TEST(Utility, EvictsTheLowestScoreComputedByHand) {
  // A long old entry, a short middle one, a mid-length new one.
  const std::vector<std::size_t> lengths = {2400, 100, 700};
  struct Case {
    double alpha;
    std::size_t victim;  // index into lengths, computed by hand below
  };
  for (const Case c : {Case{0.0, 0}, Case{0.2, 0}, Case{0.6, 1}, Case{5.0, 1}}) {
    StoreOptions o = CodecStoreOptions();
    o.eviction.policy = EvictionPolicy::kUtility;
    o.eviction.utility_alpha = c.alpha;
    o.eviction.utility_window = 3;
    MemStore m(o);
    std::vector<EntryInfo> e;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      e.push_back(m.store->Describe(MustPublish(*m.store, Conversation(lengths[i], 50 + i)))->info);
    }
    // The scores by hand, from the entries' own figures.
    auto eff = [&](const EntryInfo& x) { return x.flops / static_cast<double>(x.chunk_bytes + x.meta_bytes); };
    const double e1 = std::max({eff(e[0]), eff(e[1]), eff(e[2])});
    std::vector<double> score;
    for (const auto& x : e) {
      const double rec = static_cast<double>(x.last_access - e[0].last_access) /
                         static_cast<double>(e[2].last_access - e[0].last_access);
      score.push_back(rec + c.alpha * eff(x) / e1);
    }
    ASSERT_EQ(std::min_element(score.begin(), score.end()) - score.begin(), static_cast<std::ptrdiff_t>(c.victim))
        << "alpha " << c.alpha << ": the hand-picked victim disagrees with the formula";
    ASSERT_TRUE(m.store->SetByteBudget(m.store->Stat()->stored_bytes - 1).ok());
    for (std::size_t i = 0; i < e.size(); ++i) {
      EXPECT_EQ(m.store->Describe(e[i].id).ok(), i != c.victim) << "alpha " << c.alpha << " entry " << i;
    }
  }
}

// ---- admission by reuse -------------------------------------------------------------------

TEST(Admission, ReuseStoresWhatAnEarlierLookupShared) {
  StoreOptions o = CodecStoreOptions();
  o.eviction.admission = AdmissionPolicy::kReuse;
  o.eviction.admit_reuse_share = 0.5;
  o.block_tokens = 64;
  MemStore m(o);
  const auto conv = Conversation(1000, 9);
  const auto turn1 = Prefix(conv, 400), turn2 = Prefix(conv, 700);
  // A first turn shares nothing with anything: not stored.
  ASSERT_FALSE(m.store->Lookup(ModelDigest(1), "", turn1)->has_value());
  auto r = m.store->Publish(Request(turn1), MakeLayers(turn1));
  EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  // The second turn's lookup is the second to see 384 of its 700 tokens.
  ASSERT_FALSE(m.store->Lookup(ModelDigest(1), "", turn2)->has_value());
  EXPECT_TRUE(m.store->Publish(Request(turn2), MakeLayers(turn2)).ok());
  // A one-off prompt, looked up once: refused; another namespace's lookups do not count.
  const auto other = Conversation(700, 10);
  ASSERT_FALSE(m.store->Lookup(ModelDigest(1), "elsewhere", other)->has_value());
  ASSERT_FALSE(m.store->Lookup(ModelDigest(1), "", other)->has_value());
  EXPECT_EQ(m.store->Publish(Request(other), MakeLayers(other)).status().code(), StatusCode::kAborted);
  // A shared prefix under half of the boundary is not enough.
  auto longer = Prefix(conv, 700);
  longer.resize(1600, 7);
  ASSERT_EQ((*m.store->Lookup(ModelDigest(1), "", longer))->length, 700u);
  EXPECT_EQ(m.store->Publish(Request(longer), MakeLayers(longer)).status().code(), StatusCode::kAborted);
  EXPECT_EQ(m.store->Stat()->admission_refusals, 3u);
  ExpectConsistent(*m.store);
}

}  // namespace
}  // namespace primecache

// The session through the real daemon: restore exactness (a restored session
// continues bit for bit like the one that never stopped), across a daemon
// restart, refusals that fall back to a full prefill, and the daemon down.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "serving/prefix_cache.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/model/model_test_util.h"

namespace primecache::model {
namespace {

using primecache::testing::Daemon;

using testing::Mixed;

struct Variant {
  const char* name;
  ModelConfig config;
  std::uint64_t ring_rows;
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  ModelConfig dense = Mixed();
  dense.layers = {LayerType::kMla, LayerType::kMla};
  dense.mla.indexer.reset();
  v.push_back({"dense_mla", dense, 0});
  ModelConfig ix = Mixed();
  ix.layers = {LayerType::kMla, LayerType::kMla};
  v.push_back({"indexer_flat", ix, 0});
  v.push_back({"indexer_ring", ix, 10});
  ModelConfig kda = Mixed();
  kda.layers = {LayerType::kKda, LayerType::kKda};
  v.push_back({"kda", kda, 0});
  v.push_back({"mixed", Mixed(), 0});
  v.push_back({"mixed_ring", Mixed(), 10});
  // Attention layers; the boundary is the 45-token prefix, 58 tokens in all.
  auto attn = [](std::uint32_t window, std::uint32_t bits) {
    ModelConfig c = Mixed();
    c.layers = {LayerType::kKda, LayerType::kAttn, LayerType::kMla, LayerType::kAttn};
    c.attn = {4, 2, 16, window, 10000.0f, bits};
    return c;
  };
  v.push_back({"attn_full", attn(0, 0), 0});
  v.push_back({"attn_window_shorter", attn(16, 0), 0});
  v.push_back({"attn_window_longer", attn(100, 0), 0});
  v.push_back({"attn_window_full_at_boundary", attn(45, 0), 0});
  v.push_back({"attn_wrapped_by_one_at_boundary", attn(44, 0), 0});
  v.push_back({"attn_tq4_full", attn(0, 4), 0});
  v.push_back({"attn_tq2_window_shorter", attn(16, 2), 0});
  v.push_back({"attn_tq4_wrapped_by_one_at_boundary", attn(44, 4), 0});
  return v;
}

std::vector<std::uint32_t> Prompt(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> t = {kBosToken};
  while (t.size() < n) t.push_back(rng() % 256);
  return t;
}

// Every plane of a session, captured in full.
std::vector<LayerSnapshot> Planes(ModelSession& s) {
  auto layers = s.cache->CaptureFull();
  EXPECT_TRUE(layers.ok()) << layers.status().ToString();
  return layers.ok() ? std::move(layers).value() : std::vector<LayerSnapshot>{};
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty plane.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool SamePlanes(const std::vector<LayerSnapshot>& a, const std::vector<LayerSnapshot>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t l = 0; l < a.size(); ++l) {
    if (a[l].index() != b[l].index()) return false;
    bool same = std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          const T& y = std::get<T>(b[l]);
          if constexpr (std::is_same_v<T, LatentSnapshot>) {
            return x.shape == y.shape && SameBits(x.latent_rows, y.latent_rows) &&
                   SameBits(x.index_tail_rows, y.index_tail_rows) && SameBits(x.pool_keys, y.pool_keys);
          } else if constexpr (std::is_same_v<T, RecurrentSnapshot>) {
            return x.shape == y.shape && SameBits(x.conv_ring, y.conv_ring) && SameBits(x.state, y.state);
          } else {
            return x.shape == y.shape && SameBits(x.k_rows, y.k_rows) && SameBits(x.v_rows, y.v_rows);
          }
        },
        a[l]);
    if (!same) return false;
  }
  return true;
}

struct Harness {
  ModelConfig config;
  Weights weights;
  testing::CpuModel cpu;
  client::ModelId id;

  Harness(const ModelConfig& c, std::uint64_t ring_rows)
      : config(c), weights(Weights::Generate(c, 17)) {
    auto m = testing::MakeCpuModel(c, weights, 256, 8, 3, ring_rows);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    cpu = std::move(m).value();
    id = PrefixCache::ModelIdFor(c, weights);
  }
  std::unique_ptr<PrefixCache> Cache(const Daemon* d, const std::string& ns = "t", bool shm = false,
                                     PrefixCacheOptions options = {}, std::size_t shm_bytes = 0) {
    std::unique_ptr<client::Client> cl;
    if (d != nullptr) {
      client::ClientOptions o = d->Options(ns, shm);
      if (shm_bytes != 0) o.shared_memory_bytes = shm_bytes;
      o.reconnect_attempts = 2;
      auto c = client::Client::Connect(o);
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      if (c.ok()) cl = std::move(c).value();
    }
    return std::make_unique<PrefixCache>(cpu.model.get(), std::move(cl), id, options);
  }
};

class RestoreExactnessTest : public ::testing::TestWithParam<Variant> {};

// A session primes a prefix, is captured (published through the daemon), and
// primes a suffix; a fresh session restores that capture from the daemon and
// primes the same suffix with the same call shapes: logits and every plane
// bit-identical.
TEST_P(RestoreExactnessTest, RestoredSessionContinuesBitForBit) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h(GetParam().config, GetParam().ring_rows);
  auto cache = h.Cache(&daemon);
  const auto prefix = Prompt(45, 1), suffix = Prompt(14, 2);
  std::vector<std::uint32_t> full = prefix;
  full.insert(full.end(), suffix.begin() + 1, suffix.end());  // 58 tokens: the prefix, then 13 more

  auto first = cache->Prime(prefix);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->restored_tokens, 0u);
  EXPECT_EQ(first->prefilled_tokens, prefix.size());
  // The plan read back from the captured layers is the one the model id
  // names: the daemon checks it at every publish.
  std::vector<LayerShape> shapes;
  for (const LayerSnapshot& l : Planes(first->session)) shapes.push_back(ShapeOf(l));
  auto fp = DecodeFingerprint(h.id.descriptor);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(PlanDigest(shapes), fp->plan_digest);
  cache->Finish(*first);
  ASSERT_EQ(cache->Drain(), 0u);
  ASSERT_EQ(cache->published(), 1u);
  // The never-stopped reference: the captured session goes on with the suffix.
  std::vector<float> reference;
  ASSERT_TRUE(h.cpu.model->Prime(first->session, std::span(full).subspan(prefix.size()), LogitsWanted::kAll, &reference).ok());

  auto second = cache->Prime(full, /*all_logits=*/true);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->restored_tokens, prefix.size());
  EXPECT_EQ(second->prefilled_tokens, full.size() - prefix.size());
  EXPECT_TRUE(SameBits(second->all_logits, reference)) << "logits after the restore differ";
  EXPECT_TRUE(SamePlanes(Planes(second->session), Planes(first->session))) << "planes after the restore differ";
  EXPECT_TRUE(second->session.cache->CheckInvariants().ok());

  // Priming prefix + suffix in one call is a different computation, held to 1e-5.
  auto one = h.cpu.model->NewSession();
  ASSERT_TRUE(one.ok());
  std::vector<float> one_call;
  ASSERT_TRUE(h.cpu.model->Prime(*one, full, LogitsWanted::kAll, &one_call).ok());
  const std::size_t V = h.config.vocab;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    double d = double(one_call[prefix.size() * V + i]) - reference[i];
    num += d * d;
    den += double(reference[i]) * reference[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Stacks, RestoreExactnessTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- boundaries beyond the prompt's end -------------------------------------------

// `head`, then the tokens of Prompt(n, seed) after its BOS.
std::vector<std::uint32_t> Then(std::vector<std::uint32_t> head, std::size_t n, unsigned seed) {
  const auto tail = Prompt(n, seed);
  head.insert(head.end(), tail.begin() + 1, tail.end());
  return head;
}

// Logits of a session that never met the cache, its prefill split at `cut`
// (what a restore at `cut` and a prefill of the rest compute): the rows of
// positions [cut, end).
std::vector<float> SplitReference(Harness& h, const std::vector<std::uint32_t>& prompt, std::size_t cut) {
  auto s = h.cpu.model->NewSession();
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return {};
  EXPECT_TRUE(h.cpu.model->Prime(*s, std::span(prompt).first(cut), LogitsWanted::kNone, nullptr).ok());
  std::vector<float> out;
  EXPECT_TRUE(h.cpu.model->Prime(*s, std::span(prompt).subspan(cut), LogitsWanted::kAll, &out).ok());
  return out;
}

class BranchPointTest : public ::testing::TestWithParam<Variant> {};

// Three requests share a 150-token prefix (a system prompt) and differ
// after it. The first stores its prompt end only; the second's lookup finds
// the branch point at 150, its prefill stops there for an eager half, and
// it publishes that boundary too, its planes bit for bit those of an
// unsplit prefill; the third restores the 150 tokens and continues bit for
// bit like a run without cache split at the same place.
TEST_P(BranchPointTest, ThreeRequestsSharingAPrefixRestoreIt) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h(GetParam().config, GetParam().ring_rows);
  auto cache = h.Cache(&daemon);
  const auto shared = Prompt(150, 1);
  const auto a = Then(shared, 31, 2), b = Then(shared, 31, 3), c = Then(shared, 31, 4);
  ASSERT_TRUE(a[150] != b[150] && b[150] != c[150] && a[150] != c[150]);

  auto ra = cache->Prime(a);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  EXPECT_EQ(ra->shared_tokens, 0u);
  cache->Finish(*ra);
  ASSERT_EQ(cache->Drain(), 0u);
  ASSERT_EQ(cache->published(), 1u);

  auto rb = cache->Prime(b);
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_EQ(rb->restored_tokens, 0u);
  EXPECT_EQ(rb->shared_tokens, 150u);
  ASSERT_EQ(rb->prefill_captures.size(), 1u);
  {
    auto plain = h.cpu.model->NewSession();
    ASSERT_TRUE(plain.ok());
    ASSERT_TRUE(h.cpu.model->Prime(*plain, b, LogitsWanted::kNone, nullptr).ok());
    EXPECT_TRUE(SamePlanes(Planes(rb->session), Planes(*plain))) << "a prefill split at the branch point differs";
  }
  cache->Finish(*rb);
  ASSERT_EQ(cache->Drain(), 0u);
  ASSERT_EQ(cache->published(), 3u);  // a, the branch point, b
  ra->session = ModelSession{};  // the harness has three sessions
  rb->session = ModelSession{};

  auto rc = cache->Prime(c, /*all_logits=*/true);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(rc->restored_tokens, 150u);
  EXPECT_TRUE(rc->prefill_captures.empty()) << "the branch point is stored already";
  EXPECT_TRUE(SameBits(rc->all_logits, SplitReference(h, c, 150))) << "the continuation after the restore differs";
  EXPECT_TRUE(rc->session.cache->CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Stacks, BranchPointTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return std::string(info.param.name); });

// Two engines find the same branch point at once (each primes its request
// before the other's publishes land) and both publish it: the second
// publish deduplicates, the store keeps one entry of those tokens, and a
// later request restores it bit for bit.
TEST(PrefixCacheTest, TwoEnginesPublishingOneBranchPointStoreItOnce) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h1(Mixed(), 0), h2(Mixed(), 0);
  ASSERT_TRUE(h1.id.digest == h2.id.digest) << "one model, two engines";
  auto e1 = h1.Cache(&daemon), e2 = h2.Cache(&daemon);
  const auto shared = Prompt(150, 1);
  const auto a = Then(shared, 31, 2), b = Then(shared, 31, 3), c = Then(shared, 31, 4), d = Then(shared, 31, 5);
  auto ra = e1->Prime(a);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  e1->Finish(*ra);
  ASSERT_EQ(e1->Drain(), 0u);
  ra->session = ModelSession{};
  auto rb = e1->Prime(b);
  auto rc = e2->Prime(c);
  ASSERT_TRUE(rb.ok() && rc.ok());
  ASSERT_EQ(rb->prefill_captures.size(), 1u);
  ASSERT_EQ(rc->prefill_captures.size(), 1u) << "both engines capture the branch point";
  e1->Finish(*rb);
  ASSERT_EQ(e1->Drain(), 0u);
  e2->Finish(*rc);
  ASSERT_EQ(e2->Drain(), 0u) << "a publish of tokens stored meanwhile is no failure";
  auto admin = primecache::testing::Admin(daemon);
  ASSERT_NE(admin, nullptr);
  auto st = admin->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->store.entries, 4u) << "a, the branch point once, b and c";
  rb->session = ModelSession{};
  rc->session = ModelSession{};
  auto rd = e1->Prime(d, /*all_logits=*/true);
  ASSERT_TRUE(rd.ok()) << rd.status().ToString();
  EXPECT_EQ(rd->restored_tokens, 150u);
  EXPECT_TRUE(SameBits(rd->all_logits, SplitReference(h1, d, 150)));
}

// The daemon is killed around a branch capture: before the request's Finish
// (its publishes find no daemon), or a moment after it, while the branch
// point and the prompt end are on their way. The request never fails; the
// daemon restarted on the same directory finds a store that verifies clean,
// each boundary whole or absent; and a third request restores what is there
// and continues bit for bit like a run that split its prefill at that point.
TEST(PrefixCacheTest, ADaemonKilledAroundABranchCaptureLeavesNoTornEntry) {
  Harness h(Mixed(), 0);
  const auto shared = Prompt(150, 1);
  const auto a = Then(shared, 31, 2), b = Then(shared, 31, 3), c = Then(shared, 31, 4);
  std::set<std::uint64_t> restored_seen;
  for (int delay_us : {-1, 0, 300, 1000, 3000, 10000}) {
    SCOPED_TRACE("killed " + (delay_us < 0 ? std::string("before Finish") : std::to_string(delay_us) + " us after"));
    Daemon daemon;
    ASSERT_TRUE(daemon.Start());
    daemon.DisownDir();
    {
      auto cache = h.Cache(&daemon);
      auto ra = cache->Prime(a);
      ASSERT_TRUE(ra.ok()) << ra.status().ToString();
      cache->Finish(*ra);
      ASSERT_EQ(cache->Drain(), 0u);
      ra->session = ModelSession{};
      auto rb = cache->Prime(b);
      ASSERT_TRUE(rb.ok()) << rb.status().ToString();
      ASSERT_EQ(rb->prefill_captures.size(), 1u) << "the branch point is captured";
      if (delay_us < 0) daemon.Kill();
      std::thread killer;
      if (delay_us >= 0) {
        killer = std::thread([&daemon, delay_us] {
          std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
          daemon.Kill();
        });
      }
      cache->Finish(*rb);  // returns nothing to fail: a lost publish is a log line
      const std::size_t failed = cache->Drain();
      if (killer.joinable()) killer.join();
      if (delay_us < 0) {
        EXPECT_EQ(failed, 2u) << "both publishes found no daemon";
      }
      rb->session = ModelSession{};
    }
    Daemon again({}, daemon.dir());
    again.OwnDir();
    ASSERT_TRUE(again.Start());
    {
      auto admin = primecache::testing::Admin(again);
      ASSERT_NE(admin, nullptr);
      auto report = admin->CheckStore(/*read_chunks=*/true);
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      EXPECT_EQ(report->problem_count, 0u) << "a torn or inconsistent store after the kill: "
                                           << (report->problems.empty() ? "" : report->problems[0]);
      auto st = admin->Stat();
      ASSERT_TRUE(st.ok());
      EXPECT_GE(st->store.entries, 1u) << "the acknowledged first boundary is lost";
      EXPECT_LE(st->store.entries, 3u);
      EXPECT_EQ(report->entries, st->store.entries);
    }
    auto cache = h.Cache(&again);
    auto rc = cache->Prime(c, /*all_logits=*/true);
    ASSERT_TRUE(rc.ok()) << rc.status().ToString();
    ASSERT_TRUE(rc->restored_tokens == 0 || rc->restored_tokens == 150) << rc->restored_tokens;
    if (delay_us < 0) {
      EXPECT_EQ(rc->restored_tokens, 0u) << "nothing of the second request was stored";
    }
    restored_seen.insert(rc->restored_tokens);
    std::vector<float> reference;
    if (rc->restored_tokens == 0) {
      auto plain = h.cpu.model->NewSession();
      ASSERT_TRUE(plain.ok());
      ASSERT_TRUE(h.cpu.model->Prime(*plain, c, LogitsWanted::kAll, &reference).ok());
    } else {
      reference = SplitReference(h, c, rc->restored_tokens);
    }
    EXPECT_TRUE(SameBits(rc->all_logits, reference)) << "the continuation differs from a run without cache";
  }
  std::printf("[kill around the branch capture] third request restored: %s\n",
              [&] {
                std::string out;
                for (auto n : restored_seen) out += std::to_string(n) + " ";
                return out;
              }()
                  .c_str());
}

// A conversation's next turn holds the model's own reply: the boundary of
// the prompt and the generated tokens, published at Finish, is what it
// restores, and it continues bit for bit like a run without cache.
TEST(PrefixCacheTest, ANextTurnRestoresTheLastReply) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h(Mixed(), 0);
  auto cache = h.Cache(&daemon);
  const auto prompt = Prompt(90, 21);
  auto r = cache->Prime(prompt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto generated = h.cpu.model->Generate(r->session, r->last_logits, 8, nullptr);
  ASSERT_TRUE(generated.ok()) << generated.status().ToString();
  const std::uint64_t fed = r->session.position;
  ASSERT_GT(fed, prompt.size());
  cache->Finish(*r, *generated);
  ASSERT_EQ(cache->Drain(), 0u);
  EXPECT_EQ(cache->published(), 2u);  // the prompt's end and the generation's

  std::vector<std::uint32_t> next = prompt;
  next.insert(next.end(), generated->begin(), generated->begin() + static_cast<std::ptrdiff_t>(fed - prompt.size()));
  next = Then(next, 20, 22);
  auto r2 = cache->Prime(next, /*all_logits=*/true);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->restored_tokens, fed);
  EXPECT_TRUE(SameBits(r2->all_logits, SplitReference(h, next, fed)));
  r2->capture.reset();  // its snapshot slot (the harness has one) back

  // With the kind switched off, only the prompt's end is published.
  PrefixCacheOptions off;
  off.publish_generation_end = false;
  auto quiet = h.Cache(&daemon, "t2", false, off);
  auto r3 = quiet->Prime(prompt);
  ASSERT_TRUE(r3.ok());
  ASSERT_TRUE(h.cpu.model->Generate(r3->session, r3->last_logits, 8, nullptr).ok());
  quiet->Finish(*r3, *generated);
  ASSERT_EQ(quiet->Drain(), 0u);
  EXPECT_EQ(quiet->published(), 1u);
}

// Checkpoints every N prompt tokens: a long prompt asked again with its
// tail edited restores the last checkpoint before the edit.
TEST(PrefixCacheTest, CheckpointsLetAnEditedTailRestoreMostOfThePrompt) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h(Mixed(), 0);
  PrefixCacheOptions o;
  o.checkpoint_every = 64;
  auto cache = h.Cache(&daemon, "t", false, o);
  const auto doc = Prompt(220, 31);
  auto r = cache->Prime(doc);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prefill_captures.size(), 3u);  // 64, 128, 192
  cache->Finish(*r);
  ASSERT_EQ(cache->Drain(), 0u);
  EXPECT_EQ(cache->published(), 4u);
  auto edited = Then(std::vector<std::uint32_t>(doc.begin(), doc.begin() + 200), 30, 32);
  auto r2 = cache->Prime(edited, /*all_logits=*/true);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->restored_tokens, 192u);
  EXPECT_TRUE(SameBits(r2->all_logits, SplitReference(h, edited, 192)));
}


// ---- the restore through the client's shared region ----------------------------

struct RegionCase {
  Variant variant;
  PrefixCacheOptions::Staging staging;
  const char* transform;
};

std::vector<RegionCase> RegionCases() {
  std::vector<RegionCase> out;
  for (const Variant& v : Variants()) {
    const std::string n = v.name;
    if (n != "mixed" && n != "mixed_ring" && n != "indexer_flat" && n != "attn_window_shorter" &&
        n != "attn_tq4_wrapped_by_one_at_boundary" && n != "attn_full")
      continue;
    for (auto staging : {PrefixCacheOptions::Staging::kHost, PrefixCacheOptions::Staging::kDevice})
      for (const char* t : {"raw/v1", "shuffle-zstd/v1"}) out.push_back({v, staging, t});
  }
  return out;
}

std::string RegionCaseName(const ::testing::TestParamInfo<RegionCase>& info) {
  std::string t = info.param.transform;
  return std::string(info.param.variant.name) +
         (info.param.staging == PrefixCacheOptions::Staging::kDevice ? "_device_" : "_host_") +
         (t == "raw/v1" ? "raw" : "shuffle_zstd");
}

class RegionRestoreTest : public ::testing::TestWithParam<RegionCase> {};

// With shared memory, small chunks (many per plane) and either staging, the
// entry restored from the daemon holds exactly the planes of the same
// snapshot restored in process, and continues bit for bit. With device
// staging every raw chunk goes to the (CPU twin's) device straight from the
// region; encoded chunks never do. The CPU twin exports no device window,
// so no chunk comes as a device chunk.
TEST_P(RegionRestoreTest, RestoreThroughTheRegionIsTheInProcessRestore) {
  const RegionCase& c = GetParam();
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h(c.variant.config, c.variant.ring_rows);
  PrefixCacheOptions opt;
  opt.staging = c.staging;
  opt.encode.all_planes = TransformSpec{c.transform, std::string(c.transform) == "raw/v1" ? 0 : 1};
  opt.encode.target_chunk_bytes = 256;
  opt.decode_threads = 3;
  auto cache = h.Cache(&daemon, "t", /*shm=*/true, opt);
  EXPECT_EQ(cache->device_staging(), c.staging == PrefixCacheOptions::Staging::kDevice);
  EXPECT_FALSE(cache->device_window());
  ASSERT_TRUE(cache->ReserveStaging(64).ok());
  const auto prefix = Prompt(45, 1);
  std::vector<std::uint32_t> full = prefix;
  for (std::uint32_t t : {3u, 4u, 5u, 6u}) full.push_back(t);

  auto first = cache->Prime(prefix);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  cache->Finish(*first);
  ASSERT_EQ(cache->Drain(), 0u);
  ASSERT_EQ(cache->published(), 1u);
  EXPECT_EQ(cache->in_place_layers(), h.config.layers.size()) << "every layer encoded straight into the region";
  const std::vector<LayerSnapshot> captured = Planes(first->session);
  // The in-process restore of the same state.
  auto local = h.cpu.model->NewSession();
  ASSERT_TRUE(local.ok());
  ASSERT_TRUE(local->cache->Restore(captured).ok());
  local->position = prefix.size();

  auto second = cache->Prime(full);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(second->restored_tokens, prefix.size());
  const bool direct = c.staging == PrefixCacheOptions::Staging::kDevice && std::string(c.transform) == "raw/v1";
  if (direct) {
    EXPECT_GT(second->direct_chunks, 0u);
  } else {
    EXPECT_EQ(second->direct_chunks, 0u);
  }
  EXPECT_EQ(second->device_chunks, 0u);
  // The in-process restore, continued with the same suffix in the same call:
  // every plane and the logits are the daemon restore's.
  std::vector<float> local_logits;
  ASSERT_TRUE(h.cpu.model->Prime(*local, std::span(full).subspan(prefix.size()), LogitsWanted::kLast, &local_logits).ok());
  EXPECT_TRUE(SamePlanes(Planes(second->session), Planes(*local))) << "the region restore and the in-process restore differ";
  EXPECT_TRUE(SameBits(second->last_logits, local_logits));
  std::vector<float> reference;
  ASSERT_TRUE(h.cpu.model->Prime(first->session, std::span(full).subspan(prefix.size()), LogitsWanted::kLast, &reference).ok());
  EXPECT_TRUE(SameBits(second->last_logits, reference));
}

INSTANTIATE_TEST_SUITE_P(Region, RegionRestoreTest, ::testing::ValuesIn(RegionCases()), RegionCaseName);

// The CPU reference device shares no memory with another process: Export
// refuses with kNotSupported (never a handle that names nothing), so the
// prefix cache keeps the region path (RegionRestoreTest: no device window).
TEST(PrefixCacheTest, CpuDeviceExportsNoDeviceWindow) {
  auto dev = engine::NewCpuDevice();
  auto block = dev->Allocate(4096);
  ASSERT_TRUE(block.ok());
  auto exported = dev->Export(*block);
  ASSERT_FALSE(exported.ok());
  EXPECT_EQ(exported.status().code(), StatusCode::kNotSupported) << exported.status().ToString();
}

// An entry filed under this model whose second layer is of another kind (a
// KDA layer where the cache has an MLA one): layer 0 is staged (with device
// staging, copied to the device) before layer 1's header is refused. The
// session stays fresh and the request is prefilled in full, bit for bit like
// a plain prefill. (Published without the model's descriptor: with it, the
// daemon refuses layers that are not the model's plan at the commit.)
TEST(PrefixCacheTest, RefusedStagedRestoreLeavesTheSessionFresh) {
  for (auto staging : {PrefixCacheOptions::Staging::kHost, PrefixCacheOptions::Staging::kDevice}) {
    SCOPED_TRACE(staging == PrefixCacheOptions::Staging::kDevice ? "device staging" : "host staging");
    Daemon daemon;
    ASSERT_TRUE(daemon.Start());
    ModelConfig dense = Mixed();
    dense.layers = {LayerType::kMla, LayerType::kMla};
    dense.mla.indexer.reset();
    ModelConfig other = dense;
    other.layers = {LayerType::kMla, LayerType::kKda};
    Harness h(dense, 0), wrong(other, 0);
    PrefixCacheOptions opt;
    opt.staging = staging;
    opt.publish = false;
    opt.encode.all_planes = TransformSpec{"raw/v1", 0};
    auto cache = h.Cache(&daemon, "t", /*shm=*/true, opt);
    const auto prompt = Prompt(50, 8);
    auto s = wrong.cpu.model->NewSession();
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(wrong.cpu.model->Prime(*s, std::span(prompt).first(45), LogitsWanted::kNone, nullptr).ok());
    client::ModelId undescribed = h.id;
    undescribed.descriptor.clear();
    auto c = client::Client::Connect(daemon.Options("t"));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    PrefixCache liar(h.cpu.model.get(), std::move(c).value(), undescribed, opt);
    // With the descriptor, these layers are refused at the commit.
    const Status refused = cache->Publish(std::span(prompt).first(45), Planes(*s));
    EXPECT_TRUE(refused.IsInvalidArgument()) << refused.ToString();
    const Status published = liar.Publish(std::span(prompt).first(45), Planes(*s));
    ASSERT_TRUE(published.ok()) << published.ToString();
    std::vector<float> plain;
    {
      auto p = h.cpu.model->NewSession();
      ASSERT_TRUE(p.ok());
      ASSERT_TRUE(h.cpu.model->Prime(*p, prompt, LogitsWanted::kLast, &plain).ok());
    }
    auto r = cache->Prime(prompt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->restored_tokens, 0u);
    EXPECT_EQ(r->prefilled_tokens, prompt.size());
    EXPECT_TRUE(SameBits(r->last_logits, plain));
    EXPECT_TRUE(r->session.cache->CheckInvariants().ok());
  }
}


// A shared region too small to hold a latent layer's chunks at once: those
// layers are encoded into the worker's scratch and copied into the region,
// the smaller ones in place; the restore through the same small region (its
// fetch window a few chunks wide) is still bit for bit.
TEST(PrefixCacheTest, LayersLargerThanTheRegionPublishThroughScratch) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h(Mixed(), 0);
  PrefixCacheOptions opt;
  opt.staging = PrefixCacheOptions::Staging::kDevice;
  opt.encode.all_planes = TransformSpec{"raw/v1", 0};
  opt.encode.target_chunk_bytes = 256;
  auto cache = h.Cache(&daemon, "t", /*shm=*/true, opt, /*shm_bytes=*/64 << 10);
  const auto prefix = Prompt(45, 11);
  std::vector<std::uint32_t> full = prefix;
  full.push_back(9);
  auto first = cache->Prime(prefix);
  ASSERT_TRUE(first.ok());
  cache->Finish(*first);
  ASSERT_EQ(cache->Drain(), 0u);
  EXPECT_GT(cache->in_place_layers(), 0u);
  EXPECT_LT(cache->in_place_layers(), h.config.layers.size());
  std::vector<float> reference;
  ASSERT_TRUE(h.cpu.model->Prime(first->session, std::span(full).subspan(prefix.size()), LogitsWanted::kLast, &reference).ok());
  auto second = cache->Prime(full);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->restored_tokens, prefix.size());
  EXPECT_GT(second->direct_chunks, 0u);
  EXPECT_TRUE(SameBits(second->last_logits, reference));
}

TEST(PrefixCacheTest, EntriesSurviveADaemonRestart) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  daemon.DisownDir();
  Harness h(Mixed(), 0);
  const auto prefix = Prompt(40, 3);
  std::vector<std::uint32_t> full = prefix;
  for (std::uint32_t t : {7u, 8u, 9u}) full.push_back(t);
  std::vector<float> reference;
  {
    auto cache = h.Cache(&daemon);
    auto r = cache->Prime(prefix);
    ASSERT_TRUE(r.ok());
    cache->Finish(*r);
    ASSERT_EQ(cache->Drain(), 0u);
    ASSERT_TRUE(h.cpu.model->Prime(r->session, std::span(full).subspan(prefix.size()), LogitsWanted::kLast, &reference).ok());
  }
  ASSERT_EQ(daemon.Stop(), 0);
  Daemon again({}, daemon.dir());
  again.OwnDir();
  ASSERT_TRUE(again.Start());
  auto cache = h.Cache(&again);
  auto r = cache->Prime(full);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->restored_tokens, prefix.size());
  EXPECT_TRUE(SameBits(r->last_logits, reference));
}

TEST(PrefixCacheTest, OtherWeightsOrNamespacesNeverRestore) {
  Daemon daemon;
  ASSERT_TRUE(daemon.Start());
  Harness h(Mixed(), 0);
  const auto prefix = Prompt(30, 4);
  {
    auto cache = h.Cache(&daemon, "tenant-a");
    auto r = cache->Prime(prefix);
    ASSERT_TRUE(r.ok());
    cache->Finish(*r);
    ASSERT_EQ(cache->Drain(), 0u);
  }
  std::vector<std::uint32_t> longer = prefix;
  longer.push_back(5);
  auto other_ns = h.Cache(&daemon, "tenant-b");
  auto r = other_ns->Prime(longer);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->restored_tokens, 0u) << "a namespace must not see another's entries";
  Harness other(Mixed(), 0);
  other.weights = Weights::Generate(other.config, 99);
  other.id = PrefixCache::ModelIdFor(other.config, other.weights);
  auto cache = other.Cache(&daemon, "tenant-a");
  auto r2 = cache->Prime(longer);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->restored_tokens, 0u) << "other weights must not see these entries";
  auto same = h.Cache(&daemon, "tenant-a");
  auto r3 = same->Prime(longer);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->restored_tokens, prefix.size());
}

// The model identity covers each attn layer's kind, window, quantization and
// sign vector: the plan digest differs even where the name and every other
// weight are the same.
TEST(PrefixCacheTest, ModelIdentityCoversKvKindWindowQuantizationAndSigns) {
  auto with = [](std::uint32_t window, std::uint32_t bits) {
    ModelConfig c = Mixed();
    c.name = "same-name";
    c.layers = {LayerType::kKda, LayerType::kAttn};
    c.attn = {4, 2, 16, window, 10000.0f, bits};
    return c;
  };
  std::set<std::pair<std::uint64_t, std::uint64_t>> plans, ids;
  for (auto [window, bits] : {std::pair{0u, 0u}, {16u, 0u}, {32u, 0u}, {0u, 4u}, {0u, 2u}, {16u, 4u}}) {
    const ModelConfig c = with(window, bits);
    // One weight set for every variant (the f32 ones carry no signs).
    const Weights w = Weights::Generate(with(0, 4), 5);
    std::map<std::string, Tensor> t = w.tensors();
    if (bits == 0) t.erase("layers.1.attn.tq_signs");
    const Weights weights(std::move(t));
    ASSERT_TRUE(weights.CheckAgainst(c).ok()) << weights.CheckAgainst(c).ToString();
    const auto id = PrefixCache::ModelIdFor(c, weights);
    ids.insert({id.digest.lo, id.digest.hi});
    auto fp = DecodeFingerprint(id.descriptor);
    ASSERT_TRUE(fp.ok());
    plans.insert({fp->plan_digest.lo, fp->plan_digest.hi});
  }
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(plans.size(), 6u) << "the plan digest alone tells every KV format apart";
  // Flipping one sign changes the plan digest, not only the weights digest.
  const ModelConfig c = with(16, 4);
  const Weights w = Weights::Generate(c, 5);
  std::map<std::string, Tensor> t = w.tensors();
  t["layers.1.attn.tq_signs"].data[0] *= -1.0f;
  const auto a = DecodeFingerprint(PrefixCache::ModelIdFor(c, w).descriptor);
  const auto b = DecodeFingerprint(PrefixCache::ModelIdFor(c, Weights(std::move(t))).descriptor);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(a->plan_digest == b->plan_digest);
  // The codec versions are the kinds this model is stored as and nothing
  // else, so a kind added to the registry changes no existing fingerprint.
  EXPECT_EQ(a->codec_versions,
            (std::vector<std::string>{"kda-recurrent/v1", std::string(kTurboQuant4RotatingKind)}));
  const auto mixed = DecodeFingerprint(PrefixCache::ModelIdFor(Mixed(), Weights::Generate(Mixed(), 5)).descriptor);
  ASSERT_TRUE(mixed.ok());
  for (const std::string& v : mixed->codec_versions) {
    EXPECT_NE(v, kLinearStateKind) << "no layer of the reference engine is stored as linear-state";
    EXPECT_NE(v, kKvIndexedKind);
  }
}

TEST(PrefixCacheTest, DaemonDownFallsBackAndSaysSoOnce) {
  std::ostringstream log;
  auto saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("t", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  Harness h(Mixed(), 0);
  std::vector<float> expected;
  {
    auto plain = h.cpu.model->NewSession();
    ASSERT_TRUE(plain.ok());
    ASSERT_TRUE(h.cpu.model->Prime(*plain, Prompt(25, 5), LogitsWanted::kLast, &expected).ok());
  }
  {
    Daemon daemon;
    ASSERT_TRUE(daemon.Start());
    auto cache = h.Cache(&daemon);
    daemon.Kill();  // the daemon goes away under a connected client
    for (int i = 0; i < 3; ++i) {
      auto r = cache->Prime(Prompt(25, 5));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->restored_tokens, 0u);
      EXPECT_EQ(r->prefilled_tokens, 25u);
      EXPECT_TRUE(SameBits(r->last_logits, expected));
      cache->Finish(*r);
    }
    cache->Drain();
  }
  spdlog::set_default_logger(saved);
  const std::string text = log.str();
  std::size_t count = 0;
  const std::string needle = "the daemon is unavailable";
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  EXPECT_EQ(count, 1u) << text;
}

TEST(PrefixCacheTest, NoClientRunsWithoutTheStore) {
  Harness h(Mixed(), 0);
  auto cache = h.Cache(nullptr);
  EXPECT_FALSE(cache->connected());
  auto r = cache->Prime(Prompt(20, 6));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->restored_tokens, 0u);
  EXPECT_FALSE(r->capture.has_value());
  cache->Finish(*r);
  EXPECT_EQ(cache->Drain(), 0u);
}

}  // namespace
}  // namespace primecache::model

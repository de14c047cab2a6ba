// The TP model through a real daemon (TpPrefixCache): at TP 1, 2 and 4 a
// restored continuation is bit-identical to the same TP going on without a
// restore; an entry of TP a restores at TP b bit-identical to the boundary
// resharded in memory, and within the spec's tolerance of TP b uncached;
// the replicated planes are stored once.
#include <gtest/gtest.h>

#include <cmath>

#include "primecache/internal/shard.h"
#include "serving/prefix_cache.h"
#include "serving/tp_prefix_cache.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/model/model_test_util.h"
#include "tests/model/step_compare.h"

namespace primecache::model {
namespace {

using testing::MakeTp;
using testing::RandomPrompt;
using testing::RelErr;
using testing::TpMixed;

std::unique_ptr<client::Client> Connect(const primecache::testing::Daemon& d, const std::string& ns) {
  auto c = client::Client::Connect(d.Options(ns));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

struct Case {
  ModelConfig config = TpMixed(/*window=*/9);
  Weights weights = Weights::Generate(config, 31);
  std::vector<std::uint32_t> prompt = RandomPrompt(30, 41);
  std::vector<std::uint32_t> full = [this] {
    auto f = prompt;
    for (std::uint32_t t : RandomPrompt(13, 43)) f.push_back(t % 256);
    return f;
  }();
  std::span<const std::uint32_t> suffix() const { return std::span(full).subspan(prompt.size()); }
  client::ModelId id() const { return PrefixCache::ModelIdFor(config, weights); }
};

// Publishes the prompt's boundary at TP `tp` under namespace `ns`.
void PublishAt(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp, const std::string& ns) {
  auto m = MakeTp(k.config, k.weights, tp);
  TpPrefixCache cache(m.get(), Connect(d, ns), k.id());
  auto r = cache.Prime(k.prompt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto p = cache.Publish(r->session, k.prompt);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->group_pending);
  EXPECT_GT(p->id, 0u);
}

// The suffix's logits at TP `tp` restoring what is stored under `ns`.
std::vector<float> RestoreAt(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp,
                             const std::string& ns, std::uint32_t stored_ranks) {
  auto m = MakeTp(k.config, k.weights, tp);
  TpPrefixCache cache(m.get(), Connect(d, ns), k.id());
  auto r = cache.Prime(k.full, /*all_logits=*/true);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  EXPECT_EQ(r->restored_tokens, k.prompt.size());
  EXPECT_EQ(r->restored_ranks, stored_ranks);
  EXPECT_EQ(r->prefilled_tokens, k.suffix().size());
  return r->all_logits;
}

// The same TP going on from its own prompt without a restore (the same calls).
std::vector<float> Straight(const Case& k, std::uint32_t tp) {
  auto m = MakeTp(k.config, k.weights, tp);
  TpSession s = m->NewSession().value();
  std::vector<float> ignored, logits;
  EXPECT_TRUE(m->Prime(s, k.prompt, LogitsWanted::kLast, &ignored).ok());
  EXPECT_TRUE(m->Prime(s, k.suffix(), LogitsWanted::kAll, &logits).ok());
  return logits;
}

// TP `to` restoring TP `from`'s boundary resharded in memory (no daemon).
std::vector<float> ReshardedInMemory(const Case& k, std::uint32_t from, std::uint32_t to) {
  auto a = MakeTp(k.config, k.weights, from);
  TpSession sa = a->NewSession().value();
  std::vector<float> ignored, logits;
  EXPECT_TRUE(a->Prime(sa, k.prompt, LogitsWanted::kLast, &ignored).ok());
  const auto whole = GatherLayers(a->CaptureFull(sa).value()).value();
  std::vector<std::vector<LayerSnapshot>> shards;
  for (std::uint32_t r = 0; r < to; ++r)
    shards.push_back(SliceLayers(whole, k.config.attn.kv_heads, to, r).value());
  auto b = MakeTp(k.config, k.weights, to);
  TpSession sb = b->NewSession().value();
  EXPECT_TRUE(b->Restore(sb, shards, k.prompt.size()).ok());
  EXPECT_TRUE(b->Prime(sb, k.suffix(), LogitsWanted::kAll, &logits).ok());
  return logits;
}

TEST(TpPrefixCacheTest, ARestoreAtEachTpContinuesBitForBit) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  for (std::uint32_t tp : {1u, 2u, 4u}) {
    SCOPED_TRACE("TP " + std::to_string(tp));
    const std::string ns = "tp" + std::to_string(tp);
    PublishAt(k, d, tp, ns);
    EXPECT_EQ(RestoreAt(k, d, tp, ns, tp), Straight(k, tp));
  }
}

TEST(TpPrefixCacheTest, AnEntryOfOneTpRestoresAtAnother) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  for (auto [from, to] : {std::pair{2u, 4u}, {2u, 1u}, {4u, 2u}, {1u, 2u}}) {
    SCOPED_TRACE("TP " + std::to_string(from) + " to " + std::to_string(to));
    const std::string ns = "from" + std::to_string(from) + "to" + std::to_string(to);
    PublishAt(k, d, from, ns);
    const std::vector<float> got = RestoreAt(k, d, to, ns, from);
    EXPECT_EQ(got, ReshardedInMemory(k, from, to));
    EXPECT_LE(RelErr(got, Straight(k, to)), 1e-4);
  }
}

TEST(TpPrefixCacheTest, TheReplicatedPlanesAreStoredOnce) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  PublishAt(k, d, 1, "one");
  PublishAt(k, d, 4, "four");
  auto one = Connect(d, "one"), four = Connect(d, "four");
  auto hit1 = one->Lookup(k.id(), k.prompt).value(), hit4 = four->Lookup(k.id(), k.prompt).value();
  ASSERT_TRUE(hit1 && hit4);
  EXPECT_EQ(hit1->ranks, 1u);
  EXPECT_EQ(hit4->ranks, 4u);
  // 5 layers at TP 1; at TP 4 the 3 sharded layers (2 KDA, 1 attn) a part a rank, the 2 MLA layers once.
  EXPECT_EQ(hit1->layers, 5u);
  EXPECT_EQ(hit4->layers, 5u + 3u * 3u);
  // The same decoded bytes: every plane once, the latent and indexer planes not four times.
  EXPECT_EQ(hit4->raw_bytes, hit1->raw_bytes);
}

}  // namespace
}  // namespace primecache::model

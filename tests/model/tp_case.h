// One case of the TP model through a real daemon, shared by the TP serving
// tests (tp_prefix_cache_test.cc, tp_rank_cache_test.cc): a model, a prompt
// whose boundary is stored, a longer prompt that restores it, and the
// references a restore is held to (the same TP going on without a restore;
// a boundary resharded in memory).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "primecache/internal/shard.h"
#include "serving/prefix_cache.h"
#include "serving/tp_prefix_cache.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/model/model_test_util.h"

namespace primecache::model::tp_case {

using testing::MakeTp;
using testing::RandomPrompt;
using testing::TpMixed;

inline std::unique_ptr<client::Client> Connect(const primecache::testing::Daemon& d, const std::string& ns) {
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

// The parts an engine of TP `tp` stores Case's boundaries in (the entry's
// ranks): one entry at TP 1; above, HeadGroups' head-group parts, which for
// TpMixed's 4 KDA heads and 4 kv heads are 4 at TP 2 and at TP 4.
inline std::uint32_t StoredParts(std::uint32_t tp) {
  return tp == 1 ? 1 : 4;
}

// Publishes the prompt's boundary at TP `tp` under namespace `ns`.
inline void PublishAt(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp,
                      const std::string& ns) {
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
inline std::vector<float> RestoreAt(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp,
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
inline std::vector<float> Straight(const Case& k, std::uint32_t tp) {
  auto m = MakeTp(k.config, k.weights, tp);
  TpSession s = m->NewSession().value();
  std::vector<float> ignored, logits;
  EXPECT_TRUE(m->Prime(s, k.prompt, LogitsWanted::kLast, &ignored).ok());
  EXPECT_TRUE(m->Prime(s, k.suffix(), LogitsWanted::kAll, &logits).ok());
  return logits;
}

// TP `to` restoring TP `from`'s boundary resharded in memory (no daemon).
inline std::vector<float> ReshardedInMemory(const Case& k, std::uint32_t from, std::uint32_t to) {
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

}  // namespace primecache::model::tp_case

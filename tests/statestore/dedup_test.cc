// Dedup accounting: K boundaries of one growing conversation share their
// append-only chunks; reference counts stay exact through deletion and
// eviction.
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

struct Union {
  std::map<std::string, std::uint64_t> chunks;  // address -> size
  std::uint64_t logical = 0;
  void Add(const std::vector<LayerBytes>& layers) {
    for (const auto& l : layers) {
      for (const auto& c : l.chunks) {
        Hash128 h = Checksum128(AsBytes(c));
        chunks[std::to_string(h.hi) + ":" + std::to_string(h.lo)] = c.size();
        logical += c.size();
      }
    }
  }
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (auto& [k, v] : chunks) n += v;
    return n;
  }
};

TEST(Dedup, GrowingConversationStoresSharedChunksOnce) {
  MemStore m;
  TestModel model;
  model.latent_layers = 3;
  model.recurrent_layers = 2;
  model.chunk_bytes = 2048;
  auto conv = Conversation(1200, 1);
  Union all;
  std::vector<EntryId> ids;
  std::uint64_t final_planes = 0, states = 0;
  const int k = 8;
  for (int i = 1; i <= k; ++i) {
    auto t = Prefix(conv, 150 * static_cast<std::size_t>(i));
    auto layers = MakeLayers(t, model);
    all.Add(layers);
    auto r = m.store->Publish(Request(t), layers);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ids.push_back(r->id);
    if (i > 1) {
      EXPECT_GT(r->shared_chunk_bytes, 0u) << "boundary " << i << " shares rows with the one before";
    }
    EXPECT_EQ(r->new_chunk_bytes + r->shared_chunk_bytes, [&] {
      Union u;
      u.Add(layers);
      return u.bytes();
    }());
    // What the last boundary needs in full, and each boundary's eager state.
    std::uint64_t recurrent = 0;
    for (std::uint32_t l = model.latent_layers; l < layers.size(); ++l) {
      for (auto& c : layers[l].chunks) recurrent += c.size();
    }
    states += recurrent;
    if (i == k) final_planes = LayerBytesSize(layers) - recurrent;
  }
  auto st = m.store->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries, static_cast<std::uint64_t>(k));
  EXPECT_EQ(st->chunks, all.chunks.size());
  EXPECT_EQ(st->dedup_saved_bytes, all.logical - all.bytes());
  std::uint64_t stored_chunks = st->stored_bytes - (st->logical_bytes - all.logical);  // minus metadata
  EXPECT_EQ(stored_chunks, all.bytes());
  // Far below the sum of the snapshots; near the final planes plus K states
  // (each boundary adds its partial last chunks and its index tail).
  EXPECT_LT(stored_chunks * 2, all.logical);
  EXPECT_LE(stored_chunks,
            final_planes + states + static_cast<std::uint64_t>(k) * model.latent_layers * 3 * 2048);
  ExpectConsistent(*m.store);

  // Every boundary still reads back exactly.
  for (int i = 1; i <= k; ++i) {
    auto back = m.store->FetchAll(ids[i - 1]);
    ASSERT_TRUE(back.ok());
    ExpectSameLayers(*back, MakeLayers(Prefix(conv, 150 * static_cast<std::size_t>(i)), model));
  }
}

TEST(Dedup, ReferenceCountsStayExactThroughDeletion) {
  MemStore m;
  TestModel model;
  model.chunk_bytes = 1024;
  std::mt19937_64 rng(7);
  // Two conversations sharing a system prompt, several boundaries each.
  auto sys = Conversation(256, 100);
  std::vector<std::vector<std::uint32_t>> convs;
  for (int c = 0; c < 2; ++c) {
    auto t = sys;
    auto rest = Conversation(600, 200 + c);
    t.insert(t.end(), rest.begin(), rest.end());
    convs.push_back(t);
  }
  std::map<EntryId, std::vector<LayerBytes>> live;
  for (int c = 0; c < 2; ++c) {
    for (std::size_t len : {256u, 300u, 450u, 700u, 856u}) {
      auto t = Prefix(convs[c], len);
      auto layers = MakeLayers(t, model);
      auto r = m.store->Publish(Request(t), layers);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->existed) live[r->id] = layers;
    }
  }
  ASSERT_EQ(live.size(), 9u) << "the system-prompt boundary is one entry";
  while (!live.empty()) {
    auto it = live.begin();
    std::advance(it, static_cast<long>(rng() % live.size()));
    ASSERT_TRUE(m.store->Delete(it->first).ok());
    live.erase(it);
    Union u;
    for (auto& [id, layers] : live) u.Add(layers);
    auto st = m.store->Stat();
    EXPECT_EQ(st->entries, live.size());
    EXPECT_EQ(st->chunks, u.chunks.size());
    EXPECT_EQ(st->dedup_saved_bytes, u.logical - u.bytes());
    ExpectConsistent(*m.store);
    for (auto& [id, layers] : live) {
      auto back = m.store->FetchAll(id);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      ExpectSameLayers(*back, layers);
    }
  }
  auto st = m.store->Stat();
  EXPECT_EQ(st->chunks, 0u);
  EXPECT_EQ(st->stored_bytes, 0u);
}

TEST(Dedup, ReferenceCountsStayExactThroughEviction) {
  StoreOptions o = CodecStoreOptions();
  MemStore m(o);
  TestModel model;
  model.chunk_bytes = 1024;
  auto conv = Conversation(2000, 5);
  std::uint64_t last = 0;  // stored bytes of the longest boundary alone
  {
    MemStore scratch;
    MustPublish(*scratch.store, conv, 1, "", model);
    last = scratch.store->Stat()->stored_bytes;
  }
  const std::uint64_t budget = last + last / 2;
  ASSERT_TRUE(m.store->SetByteBudget(budget).ok());
  std::vector<std::pair<EntryId, std::size_t>> published;
  for (std::size_t len = 400; len <= 2000; len += 100) {
    auto t = Prefix(conv, len);
    auto r = m.store->Publish(Request(t), MakeLayers(t, model));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    published.emplace_back(r->id, len);
    auto st = m.store->Stat();
    EXPECT_LE(st->stored_bytes, budget);
    ExpectConsistent(*m.store);
  }
  auto st = m.store->Stat();
  EXPECT_GT(st->evictions, 0u);
  EXPECT_EQ(st->entries + st->evictions, published.size());
  // Whatever is left reads back exactly.
  for (auto& [id, len] : published) {
    auto back = m.store->FetchAll(id);
    if (back.status().IsNotFound()) continue;
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameLayers(*back, MakeLayers(Prefix(conv, len), model));
  }
}

}  // namespace
}  // namespace primecache

// The remote tier's layout against a real cluster: two tiers ("hosts") with
// their own clients share entries; lookups find the longest boundary; and
// whatever Redis hands back damaged, truncated, evicted or foreign is never
// returned as an entry, and is removed where it is damage.
#include <gtest/gtest.h>

#include <random>

#include "remote/manifest.h"
#include "remote/tier.h"
#include "tests/remote/redis_cluster_harness.h"

namespace primecache::remote {
namespace {

using testing::RedisCluster;

PublishRequest Entry(std::span<const std::uint32_t> tokens, std::string ns = "team-a") {
  PublishRequest e;
  e.model = Hash128{0x1234, 0x5678};
  e.model_name = "hrm-tiny";
  e.model_descriptor = "descriptor bytes";
  e.ns = std::move(ns);
  e.tokens.assign(tokens.begin(), tokens.end());
  e.cost.flops_per_token = 1000;
  return e;
}

// Layers whose chunks depend on the boundary length (and share one chunk).
std::vector<LayerBytes> Layers(std::size_t length) {
  std::vector<LayerBytes> layers(3);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    layers[l].header = "header of layer " + std::to_string(l) + " at " + std::to_string(length);
    layers[l].chunks.push_back(std::string(1000 + l, char('a' + l)));  // shared by every entry
    layers[l].chunks.push_back(std::to_string(length) + std::string(5000, char('k' + l)));
  }
  return layers;
}

std::vector<std::uint32_t> Tokens(std::size_t n, std::uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = rng() % 50000;
  return t;
}

TEST(Manifest, RoundTripsAndRefusesEveryTruncationAndFlip) {
  const auto tokens = Tokens(300);
  const RemoteManifest m = ManifestOf(Entry(tokens), Layers(300));
  const std::string bytes = EncodeManifest(m);
  auto back = DecodeManifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->entry.tokens, tokens);
  EXPECT_EQ(back->entry.ns, "team-a");
  EXPECT_EQ(back->entry.model, m.entry.model);
  ASSERT_EQ(back->layers.size(), 3u);
  EXPECT_EQ(back->layers[2].header, m.layers[2].header);
  EXPECT_EQ(back->layers[2].chunks, m.layers[2].chunks);
  for (std::size_t n = 0; n < bytes.size(); n += 7) {
    EXPECT_EQ(DecodeManifest(std::string_view(bytes).substr(0, n)).status().code(), StatusCode::kCorruption) << n;
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    std::string bad = bytes;
    bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    EXPECT_EQ(DecodeManifest(bad).status().code(), StatusCode::kCorruption);
  }
}

// A tensor-parallel entry's manifest (version 2) keeps its rank count: a
// group part's request is written as the whole entry's, without its group;
// an entry of one publisher is still written as version 1, byte for byte.
TEST(Manifest, ATensorParallelEntryKeepsItsRanks) {
  const auto tokens = Tokens(200);
  PublishRequest part = Entry(tokens);
  part.group = PublishGroup{9, 4, 2};
  const RemoteManifest m = ManifestOf(part, Layers(200));
  EXPECT_EQ(m.entry.ranks, 4u);
  EXPECT_FALSE(m.entry.group.has_value());
  const std::string bytes = EncodeManifest(m);
  auto back = DecodeManifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->entry.ranks, 4u);
  EXPECT_EQ(back->entry.tokens, tokens);
  EXPECT_EQ(back->layers.size(), 3u);
  for (std::size_t n = 0; n < bytes.size(); n += 5) {
    EXPECT_EQ(DecodeManifest(std::string_view(bytes).substr(0, n)).status().code(), StatusCode::kCorruption) << n;
  }
  const std::string one = EncodeManifest(ManifestOf(Entry(tokens), Layers(200)));
  EXPECT_EQ(one.substr(4, 4), std::string("\x01\0\0\0", 4));  // version 1
  EXPECT_EQ(bytes.substr(4, 4), std::string("\x02\0\0\0", 4));
  EXPECT_EQ(one.size() + 4, bytes.size());  // the rank count, and nothing else
  EXPECT_EQ(DecodeManifest(one)->entry.ranks, 1u);
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.ok()) << "tools/redis-cluster could not start a cluster: " << cluster_.error();
    for (auto* tier : {&host_a_, &host_b_}) {
      auto c = ClusterClient::Connect(cluster_.Options());
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      *tier = std::make_unique<RemoteTier>(std::shared_ptr<ClusterClient>(std::move(c).value()));
    }
  }
  // Looks the query up on host B and fetches what it finds.
  std::optional<RemoteEntry> FetchOnB(std::span<const std::uint32_t> query, std::string ns = "team-a") {
    const PublishRequest e = Entry(query, ns);
    auto hit = host_b_->Lookup(e.model, e.ns, query);
    EXPECT_TRUE(hit.ok()) << hit.status().ToString();
    if (!hit.ok() || !*hit) return std::nullopt;
    auto got = host_b_->Fetch(e.model, e.ns, query, **hit);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? std::move(*got) : std::nullopt;
  }
  RedisCluster cluster_;
  std::unique_ptr<RemoteTier> host_a_, host_b_;
};

TEST_F(RemoteTierTest, AnEntryPutByOneHostIsFoundWholeByAnother) {
  const auto tokens = Tokens(1000);
  for (std::size_t len : {100u, 300u, 600u}) {
    ASSERT_TRUE(host_a_->Put(Entry(std::span(tokens).first(len)), Layers(len)).ok());
  }
  struct Case {
    std::size_t query, hit;
  };
  for (Case c : {Case{650, 600}, Case{600, 600}, Case{599, 300}, Case{400, 300}, Case{101, 100}, Case{100, 100}}) {
    auto e = FetchOnB(std::span(tokens).first(c.query));
    ASSERT_TRUE(e.has_value()) << "query " << c.query;
    EXPECT_EQ(e->entry.tokens.size(), c.hit) << "query " << c.query;
    const auto want = Layers(c.hit);
    ASSERT_EQ(e->layers.size(), want.size());
    for (std::size_t l = 0; l < want.size(); ++l) {
      EXPECT_EQ(e->layers[l].header, want[l].header);
      EXPECT_EQ(e->layers[l].chunks, want[l].chunks);
    }
  }
  EXPECT_FALSE(FetchOnB(std::span(tokens).first(99)).has_value()) << "shorter than every boundary";
  EXPECT_FALSE(FetchOnB(Tokens(700, 2)).has_value()) << "other tokens";
  EXPECT_FALSE(FetchOnB(std::span(tokens).first(650), "team-b").has_value()) << "another namespace";
  PublishRequest other_model = Entry(std::span(tokens).first(650));
  other_model.model.lo ^= 1;
  EXPECT_FALSE(host_b_->Lookup(other_model.model, other_model.ns, other_model.tokens).value().has_value());
  EXPECT_EQ(host_a_->stats().puts, 3u);
}

TEST_F(RemoteTierTest, DamagedOrTruncatedChunksAreRefusedAndRemoved) {
  const auto tokens = Tokens(500);
  for (bool truncate : {false, true}) {
    SCOPED_TRACE(truncate ? "truncated" : "damaged");
    ASSERT_TRUE(host_a_->Put(Entry(tokens), Layers(500)).ok());
    const RemoteManifest m = ManifestOf(Entry(tokens), Layers(500));
    const std::string victim = ChunkKey(m.entry.ns, m.layers[1].chunks[1].address);
    std::string bytes = host_a_->client().Get(victim).value().value();
    if (truncate) {
      bytes.pop_back();
    } else {
      bytes[bytes.size() / 2] ^= 0x20;
    }
    ASSERT_TRUE(host_a_->client().Set(victim, bytes).ok());
    const auto before = host_b_->stats().damaged;
    EXPECT_FALSE(FetchOnB(tokens).has_value());
    EXPECT_EQ(host_b_->stats().damaged, before + 1);
    EXPECT_FALSE(host_a_->client().Get(victim).value().has_value()) << "the damaged chunk was removed";
    EXPECT_FALSE(host_a_->client().Get(ManifestKey(m.entry.model, m.entry.ns, tokens)).value().has_value());
    EXPECT_FALSE(host_b_->Lookup(m.entry.model, m.entry.ns, tokens).value().has_value()) << "and its index member";
  }
}

// A fetched entry's chunk buffers go back to the fetching tier's pool when
// it is dropped, and the next fetch receives into them: a reused buffer
// holds exactly the bytes of the fetch it was taken for, and a fetch that
// fails a check returns nothing and gives every buffer back.
TEST_F(RemoteTierTest, FetchBuffersAreReusedAndHoldOnlyTheirOwnFetchsBytes) {
  const auto tokens = Tokens(1000);
  for (std::size_t len : {500u, 600u}) ASSERT_TRUE(host_a_->Put(Entry(std::span(tokens).first(len)), Layers(len)).ok());
  auto expect_layers = [](const RemoteEntry& e, std::size_t len) {
    const auto want = Layers(len);
    ASSERT_EQ(e.layers.size(), want.size());
    for (std::size_t l = 0; l < want.size(); ++l) EXPECT_EQ(e.layers[l].chunks, want[l].chunks) << len;
  };
  {
    auto e = FetchOnB(std::span(tokens).first(600));
    ASSERT_TRUE(e.has_value());
    expect_layers(*e, 600);
    EXPECT_EQ(host_b_->receive_pool_stats().allocated, 6u);
    EXPECT_EQ(host_b_->receive_pool_stats().kept_bytes, 0u) << "every buffer lent to the entry";
  }
  const std::uint64_t kept = host_b_->receive_pool_stats().kept_bytes;
  EXPECT_GE(kept, 3u * 1000 + 3u * 5003) << "the dropped entry's buffers are kept";
  {
    auto e = FetchOnB(std::span(tokens).first(599));  // the 500 entry, same chunk sizes
    ASSERT_TRUE(e.has_value());
    expect_layers(*e, 500);
    EXPECT_EQ(host_b_->receive_pool_stats().reused, 6u);
    EXPECT_EQ(host_b_->receive_pool_stats().allocated, 6u);
    RemoteEntry moved;
    moved = std::move(*e);  // assigned over an empty entry, then dropped: given back once
  }
  EXPECT_EQ(host_b_->receive_pool_stats().kept_bytes, kept);
  // The 600 entry's own chunk, damaged in place (same size): it is received
  // into a reused buffer, fails its address, and nothing leaves the fetch.
  const RemoteManifest m = ManifestOf(Entry(std::span(tokens).first(600)), Layers(600));
  const std::string victim = ChunkKey(m.entry.ns, m.layers[2].chunks[1].address);
  std::string bytes = host_a_->client().Get(victim).value().value();
  bytes[0] = '5';  // "500...": the other entry's bytes, under this one's address
  ASSERT_TRUE(host_a_->client().Set(victim, bytes).ok());
  EXPECT_FALSE(FetchOnB(std::span(tokens).first(600)).has_value());
  EXPECT_EQ(host_b_->stats().damaged, 1u);
  EXPECT_EQ(host_b_->receive_pool_stats().kept_bytes, kept) << "a failed fetch gives back what it received";
  auto e = FetchOnB(std::span(tokens).first(600));  // now the 500 entry again, into reused buffers
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->entry.tokens.size(), 500u);
  expect_layers(*e, 500);
}

TEST_F(RemoteTierTest, EvictedChunksOrManifestsAreAMissAndCleanedUp) {
  const auto tokens = Tokens(500);
  ASSERT_TRUE(host_a_->Put(Entry(tokens), Layers(500)).ok());
  const RemoteManifest m = ManifestOf(Entry(tokens), Layers(500));
  ASSERT_TRUE(host_a_->client().Del(ChunkKey(m.entry.ns, m.layers[2].chunks[1].address)).value());
  EXPECT_FALSE(FetchOnB(tokens).has_value());
  EXPECT_EQ(host_b_->stats().evicted, 1u);
  EXPECT_FALSE(host_b_->Lookup(m.entry.model, m.entry.ns, tokens).value().has_value());
  // A manifest gone while its index member stays.
  ASSERT_TRUE(host_a_->Put(Entry(tokens), Layers(500)).ok());
  ASSERT_TRUE(host_a_->client().Del(ManifestKey(m.entry.model, m.entry.ns, tokens)).value());
  EXPECT_FALSE(FetchOnB(tokens).has_value());
  EXPECT_EQ(host_b_->stats().evicted, 2u);
  EXPECT_FALSE(host_b_->Lookup(m.entry.model, m.entry.ns, tokens).value().has_value());
}

TEST_F(RemoteTierTest, DamagedAndForeignManifestsAreNeverServed) {
  const auto tokens = Tokens(500), others = Tokens(500, 9);
  ASSERT_TRUE(host_a_->Put(Entry(tokens), Layers(500)).ok());
  ASSERT_TRUE(host_a_->Put(Entry(others), Layers(500)).ok());
  const PublishRequest e = Entry(tokens);
  const std::string key = ManifestKey(e.model, e.ns, tokens);
  // Another entry's manifest under this identity's key: never served, not removed.
  const std::string foreign = host_a_->client().Get(ManifestKey(e.model, e.ns, others)).value().value();
  ASSERT_TRUE(host_a_->client().Set(key, foreign).ok());
  EXPECT_FALSE(FetchOnB(tokens).has_value());
  EXPECT_EQ(host_b_->stats().foreign, 1u);
  // A damaged manifest: refused and removed.
  std::string damaged = foreign;
  damaged[40] ^= 1;
  ASSERT_TRUE(host_a_->client().Set(key, damaged).ok());
  EXPECT_FALSE(FetchOnB(tokens).has_value());
  EXPECT_EQ(host_b_->stats().damaged, 1u);
  EXPECT_FALSE(host_a_->client().Get(key).value().has_value());
  EXPECT_TRUE(FetchOnB(others).has_value()) << "the other entry is untouched";
}

}  // namespace
}  // namespace primecache::remote

// Redis's own capacity: primaries with a small maxmemory and an eviction
// policy (allkeys-lfu) evict chunks while entries keep being put (and their
// manifests and index nodes, read often, stay). Afterwards every lookup and fetch of every entry ever put is
// either the whole entry, byte for byte, or a miss, never a part; and the
// manifests whose chunks were evicted are removed as lookups meet them.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "remote/tier.h"
#include "tests/remote/random_entry.h"
#include "tests/remote/redis_cluster_harness.h"

namespace primecache::remote {
namespace {

using testing::RedisCluster;

// Each primary may hold 4 MiB over what it held empty (less when its
// replication backlog is allocated after that reading); 160 entries of 4
// chunks of 24 KiB are 15 MiB, against at most 12 MiB on the three.
constexpr std::uint64_t kHeadroom = 4u << 20;
constexpr std::uint32_t kEntries = 160;

using Stored = testing::RandomEntry;

Stored MakeEntry(std::uint32_t i) {
  return testing::MakeRandomEntry({Hash128{0x99, 0xaa}, "evict-model", 7000 + i, 100 + i, 24 << 10, 24 << 10}, i);
}

std::uint64_t InfoField(const Endpoint& at, const std::string& section, const std::string& field) {
  const std::string info = RedisCluster::On(at, {"INFO", section});
  const auto p = info.find(field + ":");
  return p == std::string::npos ? 0 : std::stoull(info.substr(p + field.size() + 1));
}

// Manifests in the cluster, and how many of them miss a chunk (stale), in
// all and among those a lookup of their tokens reaches.
struct Census {
  std::size_t manifests = 0, stale = 0, stale_reachable = 0;
};

Census Count(RemoteTier& tier) {
  Census c;
  auto keys = tier.ManifestKeys(100000);
  if (!keys.ok()) return c;
  auto manifests = tier.ReadManifests(*keys);
  if (!manifests.ok()) return c;
  for (auto& m : *manifests) {
    if (!m || !m->ok()) continue;
    ++c.manifests;
    auto chunks = tier.ReadChunks(**m);
    if (!chunks.ok()) continue;
    const bool whole = std::all_of(chunks->begin(), chunks->end(), [](const auto& v) { return v.has_value(); });
    if (whole) continue;
    ++c.stale;
    const PublishRequest& e = (*m)->entry;
    auto hit = tier.Lookup(e.model, e.ns, e.tokens);
    if (hit.ok() && *hit && (*hit)->length == e.tokens.size()) ++c.stale_reachable;
  }
  return c;
}

TEST(Eviction, EvictedChunksAreMissesNeverPartsAndTheirManifestsAreRemoved) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto wc = ClusterClient::Connect(cluster.Options()), rc = ClusterClient::Connect(cluster.Options());
  ASSERT_TRUE(wc.ok() && rc.ok());
  RemoteTier writer(std::shared_ptr<ClusterClient>(std::move(wc).value()));
  RemoteTier reader(std::shared_ptr<ClusterClient>(std::move(rc).value()));
  for (const Endpoint& p : writer.client().Primaries()) {
    const std::uint64_t used = InfoField(p, "memory", "used_memory");
    ASSERT_GT(used, 0u);
    // LFU, not LRU: Redis's LRU clock ticks once a second, so in a test of
    // seconds every key looks as old as any other and LRU evicts at random.
    // With lfu-log-factor 0 every read counts, and the keys read often
    // (manifests, index nodes) stay while chunks go.
    ASSERT_EQ(RedisCluster::On(p, {"CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"}), "OK");
    ASSERT_EQ(RedisCluster::On(p, {"CONFIG", "SET", "lfu-log-factor", "0"}), "OK");
    ASSERT_EQ(RedisCluster::On(p, {"CONFIG", "SET", "maxmemory", std::to_string(used + kHeadroom)}), "OK");
  }
  // Put every entry; after each, read every manifest so far and look the
  // entry up (as lookups would), so the policy keeps manifests and index
  // nodes and evicts chunks.
  std::vector<Stored> entries;
  std::vector<std::string> manifest_keys;
  std::size_t put_failed = 0;
  for (std::uint32_t i = 0; i < kEntries; ++i) {
    entries.push_back(MakeEntry(i));
    const PublishRequest& r = entries.back().request;
    if (!writer.Put(r, entries.back().layers).ok()) ++put_failed;
    manifest_keys.push_back(ManifestKey(r.model, r.ns, r.tokens));
    ASSERT_TRUE(writer.ReadManifests(manifest_keys).ok());
    ASSERT_TRUE(writer.Lookup(r.model, r.ns, r.tokens).ok());  // and the index nodes
  }
  std::uint64_t evicted_keys = 0;
  for (const Endpoint& p : writer.client().Primaries()) {
    evicted_keys += InfoField(p, "stats", "evicted_keys");
    // From here on nothing more is evicted: reading values fills output
    // buffers, which Redis counts against maxmemory, and would evict more
    // while the entries are counted and read back.
    ASSERT_EQ(RedisCluster::On(p, {"CONFIG", "SET", "maxmemory", "0"}), "OK");
  }
  const Census before = Count(writer);
  ASSERT_GT(evicted_keys, 0u) << "nothing was evicted: the test did not fill the primaries";
  ASSERT_GT(before.stale_reachable, 0u) << "no reachable manifest lost a chunk (" << evicted_keys << " keys evicted)";

  std::size_t whole = 0, missed = 0;
  for (const Stored& s : entries) {
    const auto& t = s.request.tokens;
    auto hit = reader.Lookup(s.request.model, s.request.ns, t);
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    if (!*hit) {
      ++missed;
      continue;
    }
    ASSERT_EQ((*hit)->length, t.size()) << "the index led to another entry";
    auto e = reader.Fetch(s.request.model, s.request.ns, t, **hit);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    if (!*e) {
      ++missed;
      continue;
    }
    ++whole;
    ASSERT_EQ((*e)->layers.size(), s.layers.size());
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      EXPECT_EQ((*e)->layers[l].header, s.layers[l].header);
      EXPECT_TRUE((*e)->layers[l].chunks == s.layers[l].chunks) << "entry of " << t.size() << " tokens, layer " << l;
    }
  }
  const Census after = Count(writer);
  std::printf("[ eviction ] %llu keys evicted, %zu puts refused; manifests %zu -> %zu, stale %zu (%zu reachable) -> "
              "%zu (%zu reachable); %zu whole, %zu misses; tier counted %llu evicted\n",
              static_cast<unsigned long long>(evicted_keys), put_failed, before.manifests, after.manifests,
              before.stale, before.stale_reachable, after.stale, after.stale_reachable, whole, missed,
              static_cast<unsigned long long>(reader.stats().evicted));
  EXPECT_EQ(whole + missed, entries.size());
  EXPECT_GT(missed, 0u);
  EXPECT_GT(whole, 0u) << "every entry was evicted: nothing whole was read back";
  EXPECT_EQ(after.stale_reachable, 0u) << "a lookup still reaches a manifest whose chunks are gone";
  EXPECT_EQ(after.manifests + before.stale_reachable, before.manifests) << "the stale manifests met were not removed";
  EXPECT_GE(reader.stats().evicted, before.stale_reachable);
  EXPECT_EQ(reader.stats().damaged, 0u);
}

}  // namespace
}  // namespace primecache::remote

// The Redis Cluster client against a real cluster (3 primaries, 3 replicas on
// loopback, started per test by tools/redis-cluster): slots as Redis computes
// them, values across every node, pipelined batches, ASK during a slot
// migration and MOVED after it, a primary killed under traffic, the whole
// cluster gone (breaker), replies over the size limit refused, and the data
// path (GetInto, SetFrom) through all of it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <set>
#include <thread>

#include "remote/cluster_client.h"
#include "remote/key_slot.h"
#include "tests/remote/redis_cluster_harness.h"

namespace primecache::remote {
namespace {

using testing::RedisCluster;

TEST(KeySlot, MatchesTheClusterSpecification) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);  // the CRC-16/XMODEM check value
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") % kClusterSlots);  // empty tag: the whole key
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), Crc16("{bar") % kClusterSlots);
  EXPECT_EQ(KeySlot("foo{bar}{zap}"), Crc16("bar") % kClusterSlots);
  EXPECT_EQ(KeySlot("no-tag"), Crc16("no-tag") % kClusterSlots);
}

TEST(ParseRedisUrl, TakesListsAndRefusesJunk) {
  auto two = ParseRedisUrl("redis://10.0.0.1:7000,host-b:7001");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1], (Endpoint{"host-b", 7001}));
  EXPECT_TRUE(ParseRedisUrl("127.0.0.1:6379").ok());
  for (const char* bad : {"", "redis://", "host", "host:", ":6379", "host:0", "host:65536", "host:12x", "a:1,,b:2"}) {
    EXPECT_FALSE(ParseRedisUrl(bad).ok()) << bad;
  }
}

class ClusterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.ok()) << "tools/redis-cluster could not start a cluster: " << cluster_.error();
    auto c = ClusterClient::Connect(cluster_.Options());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }
  RedisCluster cluster_;
  std::unique_ptr<ClusterClient> client_;
};

TEST_F(ClusterClientTest, SlotsAgreeWithRedis) {
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    std::string key = "k" + std::to_string(rng()) + (i % 3 == 0 ? "{tag" + std::to_string(i % 7) + "}" : "");
    const std::string theirs = RedisCluster::On(client_->Primaries()[0], {"CLUSTER", "KEYSLOT", key});
    EXPECT_EQ(theirs, std::to_string(KeySlot(key))) << key;
  }
}

TEST_F(ClusterClientTest, ValuesOnEveryPrimaryOneByOneAndInBatches) {
  EXPECT_EQ(client_->Primaries().size(), 3u);
  std::vector<std::pair<std::string, std::string>> items;
  std::set<std::string> owners;
  for (int i = 0; i < 300; ++i) {
    items.emplace_back("key:" + std::to_string(i), std::string(static_cast<std::size_t>(i * 7), char('a' + i % 26)));
    owners.insert(client_->PrimaryFor(items.back().first)->ToString());
  }
  EXPECT_EQ(owners.size(), 3u) << "the keys should span every primary";
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(client_->Set(items[i].first, items[i].second).ok());
  ASSERT_TRUE(client_->SetMany(std::span(items).subspan(100)).ok());
  std::vector<std::string> keys;
  for (const auto& [k, v] : items) keys.push_back(k);
  keys.push_back("key:absent");
  auto got = client_->GetMany(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (std::size_t i = 0; i < items.size(); ++i) EXPECT_EQ((*got)[i], items[i].second) << items[i].first;
  EXPECT_FALSE(got->back().has_value());
  EXPECT_EQ(client_->Get("key:150").value(), items[150].second);
  EXPECT_EQ(client_->Del("key:150").value(), true);
  EXPECT_EQ(client_->Del("key:150").value(), false);
  EXPECT_FALSE(client_->Get("key:150").value().has_value());
  auto listed = client_->Keys("key:*", 1000);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), items.size() - 1);
  EXPECT_EQ(client_->Keys("key:*", 10)->size(), 10u);
}

// The data path: values sent from the caller's bytes and received into the
// caller's buffers, across every node, with sizes that do not match, absent
// keys and keys of the wrong type among them; the pooled connections serve
// hiredis commands afterwards.
TEST_F(ClusterClientTest, TheDataPathMovesValuesFromAndIntoTheCallersBuffers) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < 120; ++i) {
    keys.push_back("chunk:" + std::to_string(i));
    std::string v(i % 10 == 0 ? std::size_t{2} << 20 : static_cast<std::size_t>(i * 131), '\0');
    for (std::size_t b = 0; b < v.size(); ++b) v[b] = static_cast<char>((b * 31 + i) & 0xff);
    values.push_back(std::move(v));
  }
  std::vector<std::span<const std::byte>> from;
  for (const std::string& v : values) from.push_back(std::as_bytes(std::span(v)));
  ASSERT_TRUE(client_->SetFrom(keys, from).ok());
  ASSERT_TRUE(client_->AddMember("a-set", "m").ok());
  EXPECT_EQ(client_->Get("chunk:7").value(), values[7]) << "what SetFrom wrote reads back through hiredis";

  keys.push_back("chunk:absent");
  std::vector<std::string> got(keys.size());
  for (std::size_t i = 0; i < values.size(); ++i) got[i].assign(values[i].size(), '\x7f');
  got[3].resize(values[3].size() + 1);  // expected one byte longer than stored
  got[40].resize(5);                     // a 2 MiB value expected as 5 bytes
  std::vector<std::span<std::byte>> into;
  for (std::string& g : got) into.push_back(std::as_writable_bytes(std::span(g)));
  std::vector<std::atomic<int>> calls(keys.size());
  auto states = client_->GetInto(keys, into, [&](std::size_t i) { calls[i].fetch_add(1); });
  ASSERT_TRUE(states.ok()) << states.status().ToString();
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i == 3 || i == 40) {
      EXPECT_EQ((*states)[i], ValueState::kWrongSize) << i;
      EXPECT_EQ(calls[i].load(), 0) << i;
      continue;
    }
    EXPECT_EQ((*states)[i], ValueState::kFilled) << i;
    EXPECT_TRUE(got[i] == values[i]) << "value " << i << " landed intact";
    EXPECT_EQ(calls[i].load(), 1) << "filled once for " << i;
  }
  EXPECT_EQ(states->back(), ValueState::kAbsent);
  EXPECT_EQ(calls.back().load(), 0);
  EXPECT_EQ(client_->Get("chunk:9").value(), values[9]) << "the connections are still in step";

  std::vector<std::string> wrong_type{"a-set"};
  std::string buf(1, '\0');
  std::vector<std::span<std::byte>> one{std::as_writable_bytes(std::span(buf))};
  EXPECT_EQ(client_->GetInto(wrong_type, one).status().code(), StatusCode::kIOError);
  EXPECT_EQ(client_->GetInto(std::span(keys).first(2), one).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ClusterClientTest, ValuesOverTheLimitAreRefused) {
  ASSERT_TRUE(client_->Set("big", std::string(4096, 'x')).ok());
  ClusterOptions o = cluster_.Options();
  o.max_value_bytes = 1024;
  auto small = ClusterClient::Connect(o).value();
  auto r = small->Get("big");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  std::vector<std::string> keys{"big"};
  EXPECT_EQ(small->GetMany(keys).status().code(), StatusCode::kCorruption);
  std::string buf(4096, '\0');
  std::vector<std::span<std::byte>> into{std::as_writable_bytes(std::span(buf))};
  EXPECT_EQ(small->GetInto(keys, into).status().code(), StatusCode::kCorruption) << "the data path bounds it too";
  EXPECT_EQ(buf, std::string(4096, '\0')) << "nothing of it reached the buffer";
  EXPECT_EQ(small->Get("absent").value(), std::nullopt) << "small values still pass";
}

// Moves `key`'s slot from its owner to another primary by hand, the way
// redis-cli --cluster reshard does: ASK while it migrates, MOVED after.
TEST_F(ClusterClientTest, FollowsAskDuringAMigrationAndMovedAfterIt) {
  const std::string key = "migrating{m}", newcomer = "arrives{m}";
  ASSERT_TRUE(client_->Set(key, "before").ok());
  const Endpoint from = client_->PrimaryFor(key).value();
  Endpoint to;
  for (const Endpoint& p : client_->Primaries())
    if (!(p == from)) to = p;
  const std::string slot = std::to_string(KeySlot(key));
  const std::string from_id = RedisCluster::On(from, {"CLUSTER", "MYID"}), to_id = RedisCluster::On(to, {"CLUSTER", "MYID"});
  ASSERT_EQ(RedisCluster::On(to, {"CLUSTER", "SETSLOT", slot, "IMPORTING", from_id}), "OK");
  ASSERT_EQ(RedisCluster::On(from, {"CLUSTER", "SETSLOT", slot, "MIGRATING", to_id}), "OK");
  // A key the old owner lacks is asked of the new one, for writes and reads.
  ASSERT_TRUE(client_->Set(newcomer, "new").ok());
  EXPECT_EQ(client_->Get(newcomer).value(), "new");
  EXPECT_EQ(client_->Get(key).value(), "before") << "still on the old owner";
  EXPECT_GE(client_->stats().asked, 2u);
  // The data path follows ASK too (the newcomer), and keeps the old owner's key.
  const std::vector<std::string> pair{key, newcomer};
  std::string b0(6, '\0'), b1(3, '\0');
  const std::vector<std::span<std::byte>> into{std::as_writable_bytes(std::span(b0)), std::as_writable_bytes(std::span(b1))};
  const auto asked_before = client_->stats().asked;
  auto states = client_->GetInto(pair, into);
  ASSERT_TRUE(states.ok()) << states.status().ToString();
  EXPECT_EQ((*states)[0], ValueState::kFilled);
  EXPECT_EQ((*states)[1], ValueState::kFilled);
  EXPECT_EQ(b0, "before");
  EXPECT_EQ(b1, "new");
  EXPECT_EQ(client_->stats().asked, asked_before + 1);
  ASSERT_EQ(RedisCluster::On(from, {"MIGRATE", to.host, std::to_string(to.port), key, "0", "5000"}), "OK");
  for (const Endpoint& p : client_->Primaries()) {
    ASSERT_EQ(RedisCluster::On(p, {"CLUSTER", "SETSLOT", slot, "NODE", to_id}), "OK");
  }
  const auto moved_before = client_->stats().moved;
  EXPECT_EQ(client_->Get(key).value(), "before");
  EXPECT_EQ(client_->stats().moved, moved_before + 1);
  EXPECT_EQ(client_->PrimaryFor(key).value(), to) << "the map was reloaded";
  std::vector<std::string> keys{key, newcomer};
  auto both = client_->GetMany(keys);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ((*both)[0], "before");
  EXPECT_EQ((*both)[1], "new");
  b0.assign(6, '\0');
  b1.assign(3, '\0');
  states = client_->GetInto(pair, into);
  ASSERT_TRUE(states.ok()) << states.status().ToString();
  EXPECT_EQ(b0, "before");
  EXPECT_EQ(b1, "new");
}

// Kills the primary of a key under reads: every read either returns the
// value or fails cleanly while the replica is elected, and once the cluster
// is healthy again the value is served by the promoted replica.
TEST_F(ClusterClientTest, APrimaryKilledUnderReadsFailsOverToItsReplica) {
  const std::string key = "survives";
  ASSERT_TRUE(client_->Set(key, "value").ok());
  // The replica may still be in its first sync: wait until it has the write.
  Result<std::optional<std::string>> acked = std::optional<std::string>();
  for (int i = 0; i < 40 && !(acked.ok() && *acked == "1"); ++i) acked = client_->Command(key, {"WAIT", "1", "500"});
  ASSERT_TRUE(acked.ok()) << acked.status().ToString();
  ASSERT_EQ(*acked, "1") << "the replica never acknowledged the write";
  const Endpoint primary = client_->PrimaryFor(key).value();
  cluster_.Kill(primary.port);
  int served = 0, refused = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = client_->Get(key);
    if (r.ok()) {
      ASSERT_EQ(*r, "value") << "a read during failover returned something else";
      auto owner = client_->PrimaryFor(key);  // unknown while a refresh saw the slot orphaned
      if (++served >= 3 && owner.ok() && !(*owner == primary)) break;
    } else {
      ++refused;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  EXPECT_GE(served, 3) << "no replica took over in 20 s (" << refused << " reads refused)";
  auto owner = client_->PrimaryFor(key);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_FALSE(*owner == primary);
  EXPECT_GT(client_->stats().retries, 0u);
  std::printf("[ failover ] %d reads refused while the replica was elected, then served\n", refused);
}

TEST_F(ClusterClientTest, AClusterThatIsGoneOpensTheBreaker) {
  ClusterOptions o = cluster_.Options();
  o.attempts = 2;
  o.backoff = std::chrono::milliseconds(1);
  o.breaker_failures = 3;
  o.breaker_open_for = std::chrono::seconds(60);
  auto c = ClusterClient::Connect(o).value();
  ASSERT_TRUE(c->Set("k", "v").ok());
  cluster_.StopAll();
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(c->Get("k").ok());
  EXPECT_TRUE(c->breaker_open());
  const auto before = c->stats();
  auto r = c->Get("k");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  std::vector<std::string> keys{"a", "b"};
  EXPECT_EQ(c->GetMany(keys).status().code(), StatusCode::kUnavailable);
  const auto after = c->stats();
  EXPECT_EQ(after.fast_failures, before.fast_failures + 3);
  EXPECT_EQ(after.failures, before.failures) << "refused calls never reached the network";
  EXPECT_EQ(before.breaker_opens, 1u);
}

}  // namespace
}  // namespace primecache::remote

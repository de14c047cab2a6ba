// Resharding under traffic: while one thread writes entries through a
// RemoteTier and reads every entry back through another (each with its own
// ClusterClient), the slots holding live keys (manifests, chunks, index
// nodes) are migrated between primaries key by key, as redis-cli --cluster
// reshard does. Every read returns the entry written, byte for byte, or a
// clean miss; MOVED and ASK are followed; nothing is lost.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "remote/key_slot.h"
#include "remote/tier.h"
#include "tests/remote/random_entry.h"
#include "tests/remote/redis_cluster_harness.h"

namespace primecache::remote {
namespace {

using testing::RedisCluster;

using Stored = testing::RandomEntry;

// Entry i: its own tokens (no entry's tokens prefix another's) and chunks.
Stored MakeEntry(std::uint32_t i) {
  return testing::MakeRandomEntry({Hash128{0x77, 0x88}, "reshard-model", 1000 + i, 200 + i % 50, 2000, 7999}, i);
}

bool SameLayers(const std::vector<LayerBytes>& a, const std::vector<LayerBytes>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t l = 0; l < a.size(); ++l) {
    if (a[l].header != b[l].header || a[l].chunks != b[l].chunks) return false;
  }
  return true;
}

// What one read of a stored entry gave.
enum class Read { kRight, kMiss, kError, kWrong };

Read ReadBack(RemoteTier& tier, const Stored& s) {
  const auto& t = s.request.tokens;
  auto hit = tier.Lookup(s.request.model, s.request.ns, t);
  if (!hit.ok()) return Read::kError;
  if (!*hit) return Read::kMiss;
  if ((*hit)->length != t.size()) return Read::kWrong;
  auto e = tier.Fetch(s.request.model, s.request.ns, t, **hit);
  if (!e.ok()) return Read::kError;
  if (!*e) return Read::kMiss;
  return (*e)->entry.tokens == t && SameLayers((*e)->layers, s.layers) ? Read::kRight : Read::kWrong;
}

std::unique_ptr<RemoteTier> NewTier(const RedisCluster& cluster) {
  auto c = ClusterClient::Connect(cluster.Options());
  if (!c.ok()) return nullptr;
  return std::make_unique<RemoteTier>(std::shared_ptr<ClusterClient>(std::move(c).value()));
}

// Reads every entry of `entries` (and writes new ones) until `stop`.
struct Traffic {
  RemoteTier* writer;
  RemoteTier* reader;
  std::vector<Stored> entries;  // grows as the thread writes
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> right{0}, miss{0}, error{0}, wrong{0}, written{0};

  void Run() {
    for (std::uint32_t next = static_cast<std::uint32_t>(entries.size()); !stop.load(); ++next) {
      Stored s = MakeEntry(next);
      if (writer->Put(s.request, s.layers).ok()) {
        entries.push_back(std::move(s));
        ++written;
      }
      for (const Stored& e : entries) {
        switch (ReadBack(*reader, e)) {
          case Read::kRight: ++right; break;
          case Read::kMiss: ++miss; break;
          case Read::kError: ++error; break;
          case Read::kWrong: ++wrong; break;
        }
      }
    }
  }
};

// Slots of live keys (manifests, the index node, chunks), at most `n`, each
// with one key it holds.
std::vector<std::pair<int, std::string>> LiveSlots(ClusterClient& c, std::size_t n) {
  std::vector<std::pair<int, std::string>> slots;
  std::set<int> seen;
  for (const char* pattern : {"pc:t:*:n:*", "pc:t:*:m:*", "pc:t:*:c:*"}) {
    auto keys = c.Keys(pattern, 100);
    if (!keys.ok()) continue;
    for (const std::string& k : *keys) {
      const int slot = static_cast<int>(KeySlot(k));
      if (slots.size() < n && seen.insert(slot).second) slots.emplace_back(slot, k);
    }
  }
  return slots;
}

TEST(Resharding, ReadsAndWritesDuringSlotMigrationsGetTheRightBytesOrAMiss) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto writer = NewTier(cluster), reader = NewTier(cluster);
  auto admin = ClusterClient::Connect(cluster.Options());
  ASSERT_TRUE(writer && reader && admin.ok());
  Traffic traffic{writer.get(), reader.get(), {}};
  for (std::uint32_t i = 0; i < 12; ++i) {
    traffic.entries.push_back(MakeEntry(i));
    ASSERT_TRUE(writer->Put(traffic.entries.back().request, traffic.entries.back().layers).ok());
  }
  const auto slots = LiveSlots(**admin, 12);
  ASSERT_GE(slots.size(), 8u);
  const std::vector<Endpoint> primaries = (*admin)->Primaries();
  ASSERT_EQ(primaries.size(), 3u);

  std::thread t([&] { traffic.Run(); });
  std::string failed;
  for (const auto& [slot, key] : slots) {
    auto from = (*admin)->Refresh().ok() ? (*admin)->PrimaryFor(key) : Result<Endpoint>(Status::Unavailable("refresh"));
    if (!from.ok()) {
      failed = "owner of slot " + std::to_string(slot) + ": " + from.status().ToString();
      break;
    }
    const auto at = std::find(primaries.begin(), primaries.end(), *from) - primaries.begin();
    const Endpoint& to = primaries[static_cast<std::size_t>(at + 1) % primaries.size()];
    failed = RedisCluster::MoveSlot(slot, *from, to, primaries, std::chrono::milliseconds(60));
    if (!failed.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  traffic.stop = true;
  t.join();
  ASSERT_EQ(failed, "");

  const ClusterStats cs = reader->client().stats();
  std::printf("[ reshard ] %zu slots moved; reads: %llu right, %llu misses, %llu errors, %llu wrong; %llu written; "
              "reader followed %llu MOVED, %llu ASK\n",
              slots.size(), static_cast<unsigned long long>(traffic.right.load()),
              static_cast<unsigned long long>(traffic.miss.load()), static_cast<unsigned long long>(traffic.error.load()),
              static_cast<unsigned long long>(traffic.wrong.load()), static_cast<unsigned long long>(traffic.written.load()),
              static_cast<unsigned long long>(cs.moved), static_cast<unsigned long long>(cs.asked));
  EXPECT_EQ(traffic.wrong.load(), 0u) << "a read returned another entry's bytes";
  EXPECT_GT(traffic.right.load(), 0u);
  EXPECT_GT(cs.moved, 0u) << "no read met a slot that had moved";
  EXPECT_GT(cs.asked + writer->client().stats().asked, 0u) << "no command met a slot being migrated";
  EXPECT_EQ(reader->stats().damaged, 0u);
  // Nothing was lost on the way: every entry, old or written under
  // migration, reads back whole from its new owner.
  for (const Stored& s : traffic.entries) EXPECT_EQ(ReadBack(*reader, s), Read::kRight) << s.request.tokens.size();
  ASSERT_TRUE((*admin)->Refresh().ok());
  for (const auto& [slot, key] : slots) {
    auto owner = (*admin)->PrimaryFor(key);
    ASSERT_TRUE(owner.ok());
    const auto held = RedisCluster::KeysInSlot(*owner, slot);
    EXPECT_NE(std::find(held.begin(), held.end(), key), held.end()) << key << " is not on its new owner";
  }
}

}  // namespace
}  // namespace primecache::remote

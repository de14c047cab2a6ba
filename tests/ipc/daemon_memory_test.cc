// The daemon's memory settings (docs/operations.md "Memory"): the block
// cache follows the byte budget unless told, the flags reach the store, a
// memtable budget past its cache refuses the start, and stats report every
// part of the daemon's memory.
#include <gtest/gtest.h>

#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

DaemonStats StatsOf(const Daemon& d) {
  auto admin = Admin(d);
  EXPECT_NE(admin, nullptr);
  if (admin == nullptr) return {};
  auto st = admin->Stat();
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  return st.ok() ? *st : DaemonStats{};
}

TEST(DaemonMemory, TheBlockCacheIsAQuarterOfTheCapacityUnlessTold) {
  Daemon small({"--capacity", "256M"});
  ASSERT_TRUE(small.Start());
  EXPECT_EQ(StatsOf(small).store.block_cache_capacity_bytes, 64 * kMiB);
  Daemon tiny({"--capacity", "16M"});  // never under 32 MiB
  ASSERT_TRUE(tiny.Start());
  EXPECT_EQ(StatsOf(tiny).store.block_cache_capacity_bytes, 32 * kMiB);
  Daemon unlimited;
  ASSERT_TRUE(unlimited.Start());
  EXPECT_EQ(StatsOf(unlimited).store.block_cache_capacity_bytes, 256 * kMiB);
  Daemon told({"--capacity", "256M", "--block-cache", "48M", "--memtables", "8M"});
  ASSERT_TRUE(told.Start());
  EXPECT_EQ(StatsOf(told).store.block_cache_capacity_bytes, 48 * kMiB);
}

TEST(DaemonMemory, StatsReportWhereTheMemoryGoes) {
  Daemon d({"--block-cache", "48M", "--memtables", "8M"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options()).value();
  for (std::uint32_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(c->Publish(TestModel(), Tokens(2048, 50 + i), MakeLayers(2048, 1, 50 + i)).ok());
  }
  const DaemonStats st = StatsOf(d);
  EXPECT_GT(st.store.memtable_bytes, 0u);  // the entries' records, not flushed yet
  EXPECT_LE(st.store.memtable_bytes, 8 * kMiB + 2 * kMiB);
  EXPECT_GE(st.store.block_cache_used_bytes, st.store.memtable_bytes / 2);  // charged to the cache
  EXPECT_LE(st.store.block_cache_used_bytes, st.store.block_cache_capacity_bytes);
  EXPECT_GT(st.heap_in_use_bytes, 0u);
  EXPECT_GT(st.rss_bytes, st.heap_in_use_bytes / 2);
}

TEST(DaemonMemory, MemtablesPastTheirCacheRefuseTheStart) {
  const std::string dir = MakeTempDir();
  const ProcessResult r = RunProcess({PRIMECACHED_PATH, "--data-dir", dir, "--no-admin-socket",
                                      "--block-cache", "16M", "--memtables", "32M"});
  std::filesystem::remove_all(dir);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("memtable_bytes must be at least 1 MiB and at most block_cache_bytes"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace primecache::testing

// RocksDB's memory: the block cache, which the memtables are charged to,
// and the memtables' own budget bound what the store's metadata takes in
// memory however much it writes; the store's stats report each part.
#include <algorithm>
#include <cstdio>

#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

// Metadata-heavy entries: small chunks (a chunk record each) and long
// prompts (their tokens and index nodes), little chunk data.
TestModel SmallChunkModel() {
  TestModel m;
  m.latent_layers = 1;
  m.recurrent_layers = 0;
  m.width = 4;
  m.index_head_dim = 0;
  m.chunk_bytes = 256;
  return m;
}

struct Peaks {
  std::uint64_t block_cache = 0, memtables = 0, table_readers = 0;
  void Note(const StoreStats& st) {
    block_cache = std::max(block_cache, st.block_cache_used_bytes);
    memtables = std::max(memtables, st.memtable_bytes);
    table_readers = std::max(table_readers, st.table_reader_bytes);
  }
};

// Publishes and looks up `entries` metadata-heavy entries into a store of
// these budgets (and a byte budget that makes it evict: deletions are
// metadata writes too); the peaks its stats showed.
Peaks Churn(std::uint64_t block_cache_bytes, std::uint64_t memtable_bytes, int entries) {
  StoreOptions o = CodecStoreOptions();
  o.block_cache_bytes = block_cache_bytes;
  o.memtable_bytes = memtable_bytes;
  o.byte_budget = 4ull << 20;
  MemStore ms(o);
  LocalStore& s = *ms.store;
  const TestModel m = SmallChunkModel();
  Peaks peaks;
  for (int i = 0; i < entries; ++i) {
    const auto tokens = Conversation(2048, 7000 + i);
    EXPECT_NE(MustPublish(s, tokens, 1, "", m), 0u) << "entry " << i;
    EXPECT_TRUE(s.Lookup(ModelDigest(1), "", tokens).ok());
    if (i % 10 == 0 || i + 1 == entries) {
      auto st = s.Stat();
      EXPECT_TRUE(st.ok());
      if (!st.ok()) return peaks;
      EXPECT_EQ(st->block_cache_capacity_bytes, block_cache_bytes);
      peaks.Note(*st);
    }
  }
  ExpectConsistent(s);
  std::printf(
      "budgets %.0f MiB cache, %.0f MiB memtables: peaks %.1f MiB cache, %.1f MiB memtables, %.1f MiB table "
      "readers\n",
      block_cache_bytes / 1048576.0, memtable_bytes / 1048576.0, peaks.block_cache / 1048576.0,
      peaks.memtables / 1048576.0, peaks.table_readers / 1048576.0);
  return peaks;
}

constexpr int kEntries = 400;

TEST(Memory, TheCacheAndTheMemtablesStayWithinTheirBudgetsHoweverMuchIsWritten) {
  const std::uint64_t cache = 8ull << 20, memtables = 4ull << 20;
  const Peaks bounded = Churn(cache, memtables, kEntries);
  EXPECT_GT(bounded.memtables, 0u);
  EXPECT_GT(bounded.block_cache, 0u);
  // The memtables a flush is still writing count beside the new ones, so
  // they may pass the budget by up to about the budget again.
  const std::uint64_t memtable_bound = 2 * memtables;
  EXPECT_LE(bounded.memtables, memtable_bound);
  EXPECT_LE(bounded.block_cache, cache + (2ull << 20));  // its capacity is not strict
  // The same writes with budgets that never bind: the memtables pass the
  // bound above, so the budget is what held them.
  const Peaks unbounded = Churn(512ull << 20, 256ull << 20, kEntries);
  EXPECT_GT(unbounded.memtables, memtable_bound);
}

TEST(Memory, MemtablesLargerThanTheirCacheAreRefusedAtOpen) {
  StoreOptions o = CodecStoreOptions();
  o.block_cache_bytes = 8ull << 20;
  o.memtable_bytes = 16ull << 20;
  auto env = NewMemEnv();
  o.env = env.get();
  o.path = "/store";
  auto s = LocalStore::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.status().IsInvalidArgument()) << s.status().ToString();
  EXPECT_NE(s.status().message().find("memtable_bytes"), std::string::npos) << s.status().ToString();
}

}  // namespace
}  // namespace primecache

// Disk space: publishes that never commit give their bytes back without a
// restart (in the background after an abort, and all of them at Compact),
// and the bound on uncommitted bytes refuses clearly and recovers.
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "statestore/test_hooks.h"
#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

// Every byte of every file under dir, as the file system reports it, but the
// disk reserve's (a fixed file kept for a full disk, no stored data).
std::uint64_t DiskBytes(const std::string& dir) {
  std::uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != "DISK-RESERVE") n += e.file_size();
  }
  return n;
}

std::string RandomChunk(std::mt19937_64& rng, std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(&s[i], &v, 8);
  }
  return s;
}

// Publishers that each stage `chunks` random chunks of `chunk_bytes` in one
// layer, interleaved (as concurrent clients would); between rounds, a small
// entry is committed when `commit_between` (from another segment: the
// publishers hold theirs).
std::vector<std::unique_ptr<Publisher>> StageAbandoned(LocalStore& s, int publishers, int chunks,
                                                       std::size_t chunk_bytes, bool commit_between) {
  std::mt19937_64 rng(7);
  std::vector<std::unique_ptr<Publisher>> pubs;
  for (int p = 0; p < publishers; ++p) {
    auto pub = s.BeginPublish(Request(Conversation(100, 500 + p)));
    EXPECT_TRUE(pub.ok()) << pub.status().ToString();
    if (!pub.ok()) return pubs;
    EXPECT_TRUE(pub->publisher->BeginLayer("never validated: the publish is abandoned", chunks).ok());
    pubs.push_back(std::move(pub->publisher));
  }
  for (int i = 0; i < chunks; ++i) {
    for (auto& p : pubs) EXPECT_TRUE(p->AddChunk(RandomChunk(rng, chunk_bytes)).ok());
    if (commit_between && i % 4 == 0) MustPublish(s, Conversation(300, 900 + i));
  }
  return pubs;
}

// Waits (up to 30 s) for the directory to shrink to at most `limit` bytes.
std::uint64_t WaitForDiskAtMost(const std::string& dir, std::uint64_t limit) {
  std::uint64_t now = DiskBytes(dir);
  for (int i = 0; i < 300 && now > limit; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    now = DiskBytes(dir);
  }
  return now;
}

constexpr std::uint64_t kSlack = 2u << 20;  // OPTIONS files, logs, small tables

// A store on a temporary directory holding one small entry that every test
// keeps, and the directory's bytes then.
struct OneEntryStore {
  TempDir dir;
  std::string path = dir.path + "/store";
  std::unique_ptr<LocalStore> store;
  std::vector<std::uint32_t> tokens = Conversation(300, 1);
  EntryId kept = 0;
  std::uint64_t before = 0;

  void Open() {
    StoreOptions o = CodecStoreOptions();
    o.path = path;
    auto opened = LocalStore::Open(o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store = std::move(opened).value();
    kept = MustPublish(*store, tokens);
    before = DiskBytes(path);
  }
  // The directory shrinks back to about `before` and the kept entry reads back.
  void ExpectReclaimed(std::uint64_t peak) {
    const std::uint64_t after = WaitForDiskAtMost(path, before + kSlack);
    EXPECT_LE(after, before + kSlack) << "before " << before << ", peak " << peak << ", after " << after;
    std::printf("[ info     ] disk: %llu before, %llu at the peak, %llu after\n",
                static_cast<unsigned long long>(before), static_cast<unsigned long long>(peak),
                static_cast<unsigned long long>(after));
    auto back = store->FetchAll(kept);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameLayers(*back, MakeLayers(tokens));
    ExpectConsistent(*store);
  }
};

TEST(Space, AbandonedPublishesAreReclaimedWithoutRestartOrCompact) {
  OneEntryStore w;
  ASSERT_NO_FATAL_FAILURE(w.Open());
  LocalStore& s = *w.store;

  // 4 x 24 MiB staged: mostly past the WAL, flushed to blob files.
  auto pubs = StageAbandoned(s, 4, 24, 1u << 20, /*commit_between=*/false);
  ASSERT_EQ(pubs.size(), 4u);
  EXPECT_EQ(s.Stat()->staged_bytes, 96ull << 20);
  const std::uint64_t staged = DiskBytes(w.path);
  EXPECT_GT(staged, w.before + (32u << 20)) << "the staged bytes reached the disk";
  // Aborted, or dropped as a closed connection drops its publisher.
  pubs[0]->Abort();
  pubs[1]->Abort();
  pubs.clear();
  EXPECT_EQ(s.Stat()->staged_bytes, 0u);
  w.ExpectReclaimed(staged);
}

TEST(Space, RemovedAndEvictedEntriesAreReclaimedWithoutRestartOrCompact) {
  OneEntryStore w;
  ASSERT_NO_FATAL_FAILURE(w.Open());
  LocalStore& s = *w.store;

  // Entries of 2 x 2000 rows x 2048 floats (~32 MiB each) in 1 MiB chunks.
  TestModel big;
  big.width = 2048;
  big.index_head_dim = 0;
  big.chunk_bytes = 1u << 20;
  std::vector<EntryId> gone;
  for (std::uint64_t i = 0; i < 3; ++i) gone.push_back(MustPublish(s, Conversation(2000, 50 + i), 1, "", big));
  const std::uint64_t full = DiskBytes(w.path);
  EXPECT_GT(full, w.before + (64u << 20)) << "the entries reached the disk";
  // Two removed, the third evicted by a byte budget that only the small
  // entry fits.
  ASSERT_TRUE(s.Delete(gone[0]).ok());
  ASSERT_TRUE(s.Delete(gone[1]).ok());
  ASSERT_TRUE(s.FetchAll(w.kept).ok());  // now the most recent
  ASSERT_TRUE(s.SetByteBudget(s.Stat()->stored_bytes - 1).ok());
  EXPECT_FALSE(s.Describe(gone[2]).ok()) << "evicted";
  w.ExpectReclaimed(full);
}

// Removed entries whose chunks share a segment with kept ones: only
// Compact reclaims here (the background reclaim is off), by rewriting the
// segment around the live chunks.
TEST(Space, CompactReclaimsDeadChunksSharingSegmentsWithLiveOnes) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  o.reclaim_after_bytes = std::numeric_limits<std::uint64_t>::max();  // only Compact reclaims here
  auto opened = LocalStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  TestModel big;
  big.width = 512;
  big.index_head_dim = 0;
  big.chunk_bytes = 256u << 10;
  std::vector<EntryId> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(MustPublish(s, Conversation(1500, 60 + i), 1, "", big));
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(s.Delete(ids[i]).ok());
  const std::uint64_t removed = DiskBytes(o.path);
  ASSERT_TRUE(s.Compact().ok());
  const std::uint64_t compacted = DiskBytes(o.path);
  const auto st = s.Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries, 4u);
  EXPECT_LE(compacted, st->stored_bytes + kSlack) << "one Compact leaves no dead chunk: " << removed << " -> "
                                                  << compacted << " bytes, " << st->stored_bytes << " stored";
  for (int i = 1; i < 8; i += 2) {
    auto back = s.FetchAll(ids[i]);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameLayers(*back, MakeLayers(Conversation(1500, 60 + i), big));
  }
  ExpectConsistent(s);
}

// An aborted publish's bytes are cut from its segment at once.
TEST(Space, AnAbortGivesItsBytesBackAtOnce) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  o.reclaim_after_bytes = std::numeric_limits<std::uint64_t>::max();
  auto opened = LocalStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  MustPublish(s, Conversation(300, 1));
  const std::uint64_t before = DiskBytes(o.path);
  auto pubs = StageAbandoned(s, 3, 8, 1u << 20, /*commit_between=*/true);
  EXPECT_GT(DiskBytes(o.path), before + (16u << 20));
  for (auto& p : pubs) p->Abort();
  EXPECT_LE(DiskBytes(o.path), before + kSlack + 2 * LayerBytesSize(MakeLayers(Conversation(300, 900))));
  ExpectConsistent(s);
}

TEST(Space, TheBoundOnUncommittedBytesRefusesAndRecovers) {
  const auto tokens = Conversation(300, 3);
  const auto layers = MakeLayers(tokens);
  const std::uint64_t entry = LayerBytesSize(layers);
  StoreOptions o = CodecStoreOptions();
  o.max_staged_bytes = entry + 3000;
  MemStore m(o);
  LocalStore& s = *m.store;

  // One publish holds its staged bytes until it commits.
  auto first = s.BeginPublish(Request(tokens));
  ASSERT_TRUE(first.ok());
  for (const auto& l : layers) ASSERT_TRUE(first->publisher->AddLayer(l).ok());
  EXPECT_EQ(s.Stat()->staged_bytes, entry);

  // A second one is refused once the total would pass the bound.
  auto second = s.BeginPublish(Request(Conversation(50, 4)));
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->publisher->BeginLayer("h", 2).ok());
  ASSERT_TRUE(second->publisher->AddChunk(std::string(2000, 'a')).ok());
  Status refused = second->publisher->AddChunk(std::string(2000, 'b'));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("uncommitted"), std::string::npos) << refused.ToString();
  EXPECT_FALSE(second->publisher->AddChunk(std::string(10, 'c')).ok()) << "a refused publish stays failed";
  EXPECT_EQ(s.Stat()->staged_bytes, entry + 2000);

  // Abort and commit give the bytes back.
  second->publisher->Abort();
  EXPECT_EQ(s.Stat()->staged_bytes, entry);
  auto committed = first->publisher->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_EQ(s.Stat()->staged_bytes, 0u);

  // Then a publish of the whole bound's worth goes through.
  const auto other = Conversation(300, 5);
  auto again = s.Publish(Request(other), MakeLayers(other));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(s.Stat()->staged_bytes, 0u);
  ExpectConsistent(s);
}

// Verify holds segment gc off while it runs: a segment the reclaimer drops
// under a running Verify was once reported as a missing file.
// One round: 24 entries deleted one by one while Verify runs in a loop.
// Returns the number of Verify runs.
int VerifyWhileDeleting(int round) {
  StoreOptions o = CodecStoreOptions();
  o.reclaim_after_bytes = 0;  // the reclaimer runs after every delete
  MemStore m(o);
  TestModel small;
  small.chunk_bytes = 4096;
  std::vector<EntryId> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(MustPublish(*m.store, Conversation(600, 700 + i), 1, "", small));
  std::atomic<bool> done{false};
  std::thread deleter([&] {
    for (EntryId id : ids) {
      EXPECT_TRUE(m.store->Delete(id).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    done = true;
  });
  int runs = 0;
  bool clean = true;
  while (clean && (!done.load() || runs < 3)) {
    auto v = m.store->CheckStore({.read_chunks = true});
    clean = v.ok() && v->problems.empty();
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    if (v.ok()) {
      for (const auto& p : v->problems) ADD_FAILURE() << "round " << round << ", verify run " << runs << ": " << p;
    }
    ++runs;
  }
  deleter.join();
  ExpectConsistent(*m.store);
  return runs;
}

TEST(Space, VerifyDuringSegmentGcFindsNothingWrong) {
  int runs = 0;
  for (int round = 0; round < 6 && !HasFailure(); ++round) runs += VerifyWhileDeleting(round);
  std::printf("[ info     ] %d verify runs during the deletes\n", runs);
}

// Each eviction scans the recency records from the oldest; every eviction
// deletes one there, so without the reclaim's rewrite of those records the
// scan would skip every record evicted since the last flush and compaction,
// ever more of them (publish throughput fell over a soak: docs/RELIABILITY.md).
TEST(Space, EvictionScansStayShortHoweverLongTheStoreKeepsEvicting) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  o.reclaim_after_bytes = 64u << 10;
  auto hooks = std::make_shared<statestore_internal::TestHooks>();
  hooks->victim_scan_max_skipped = std::make_shared<std::atomic<std::uint64_t>>(0);
  auto opened = statestore_internal::OpenWithHooks(o, hooks);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  MustPublish(s, Conversation(100, 1));
  ASSERT_TRUE(s.SetByteBudget(16 * s.Stat()->stored_bytes).ok());  // about 16 entries
  constexpr int kPublishes = 1200;
  std::uint64_t early = 0;
  for (int i = 0; i < kPublishes; ++i) {
    MustPublish(s, Conversation(100, 100 + i));
    if (i == 200) early = hooks->victim_scan_max_skipped->exchange(0);
  }
  const std::uint64_t late = hooks->victim_scan_max_skipped->load();
  const std::uint64_t evictions = s.Stat()->evictions;
  std::printf(
      "[ info     ] %llu evictions; most deleted records one scan skipped: %llu in the first 200 publishes, "
      "%llu after\n",
      static_cast<unsigned long long>(evictions), static_cast<unsigned long long>(early),
      static_cast<unsigned long long>(late));
  EXPECT_GT(evictions, static_cast<std::uint64_t>(kPublishes) - 100);
  EXPECT_LE(late, 200u) << "an eviction's scan skipped the records of ever more evictions before it";
  ExpectConsistent(s);
}

}  // namespace
}  // namespace primecache

// Segment files: a torn tail is cut at open; a segment deleted or truncated
// behind the store's back gives a clear kCorruption naming it and
// quarantines the entries that need it (never a wrong restore); compaction
// rewrites and unlinks segments while fetches keep reading leased entries
// bit-exactly.
#include <atomic>
#include <filesystem>
#include <thread>

#include "segment_util.h"
#include "statestore/segments.h"
#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)
namespace si = statestore_internal;

const TestModel kModel = [] {
  TestModel m;
  m.chunk_bytes = 2048;
  return m;
}();

std::string SegmentPath(const std::string& store, std::uint64_t id) {
  return store + "/segments/" + si::SegmentFileName(id);
}

std::vector<std::string> SegmentNames(Env* env, const std::string& store) {
  auto names = env->GetChildren(store + "/segments");
  EXPECT_TRUE(names.ok());
  return names.ok() ? *names : std::vector<std::string>{};
}

TEST(Segments, ATornTailIsCutAtOpen) {
  MemStore m;
  const auto t = Conversation(500, 1);
  const EntryId id = MustPublish(*m.store, t, 1, "", kModel);
  m.store.reset();
  const std::string file = SegmentPath(m.options.path, 1);
  const std::uint64_t committed = *m.env->GetFileSize(file);
  {
    // What a publish that never committed leaves: frames past the committed length.
    auto f = m.env->NewAppendableFile(file);
    ASSERT_TRUE(f.ok());
    const std::string junk(10000, 'j');
    ASSERT_TRUE((*f)->Append(std::as_bytes(std::span(junk.data(), junk.size()))).ok());
  }
  ASSERT_EQ(*m.env->GetFileSize(file), committed + 10000);
  m.Reopen();
  EXPECT_EQ(*m.env->GetFileSize(file), committed) << "the tail is cut";
  auto back = m.store->FetchAll(id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, MakeLayers(t, kModel));
  // The segment goes on taking appends after the cut.
  const auto t2 = Conversation(300, 2);
  const EntryId id2 = MustPublish(*m.store, t2, 1, "", kModel);
  m.Reopen();
  ExpectSameLayers(*m.store->FetchAll(id2), MakeLayers(t2, kModel));
  ExpectSameLayers(*m.store->FetchAll(id), MakeLayers(t, kModel));
  ExpectConsistent(*m.store);
}

TEST(Segments, AnUnrecordedSegmentIsRemovedAtOpen) {
  MemStore m;
  MustPublish(*m.store, Conversation(200, 3), 1, "", kModel);
  m.store.reset();
  const std::string stray = SegmentPath(m.options.path, 7);
  ASSERT_TRUE(WriteFileAtomically(m.env.get(), stray, si::EncodeSegmentHeader(7) + "never committed").ok());
  m.Reopen();
  EXPECT_FALSE(m.env->FileExists(stray));
  ExpectConsistent(*m.store);
}

// Damage behind the store's back, before it opens: the entry fails with a
// kCorruption naming the segment, is quarantined, Verify reports the
// segment; a new publish of the same chunks heals the store.
void ExpectDamagedSegment(MemStore& m, const std::vector<std::uint32_t>& t, EntryId id, const std::string& what) {
  auto v = m.store->CheckStore({});
  ASSERT_TRUE(v.ok());
  bool reported = false;
  for (const auto& p : v->problems) reported |= p.find("segment 0000000000000001") != std::string::npos;
  EXPECT_TRUE(reported) << "Verify names the damaged segment";
  auto back = m.store->FetchAll(id);
  ASSERT_TRUE(back.status().IsCorruption()) << back.status().ToString();
  EXPECT_NE(back.status().message().find("segment 0000000000000001"), std::string::npos) << back.status().ToString();
  EXPECT_NE(back.status().message().find(what), std::string::npos) << back.status().ToString();
  auto info = m.store->Describe(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info.state, EntryState::kQuarantined);
  EXPECT_TRUE(m.store->FetchAll(id).status().IsNotFound()) << "a quarantined entry is never served";
  auto again = m.store->Publish(Request(t), MakeLayers(t, kModel));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto healed = m.store->FetchAll(again->id);
  ASSERT_TRUE(healed.ok()) << healed.status().ToString();
  ExpectSameLayers(*healed, MakeLayers(t, kModel));
}

TEST(Segments, ADeletedSegmentIsACorruptionAndQuarantines) {
  MemStore m;
  const auto t = Conversation(400, 4);
  const EntryId id = MustPublish(*m.store, t, 1, "", kModel);
  m.store.reset();
  ASSERT_TRUE(m.env->RemoveFile(SegmentPath(m.options.path, 1)).ok());
  m.Reopen();
  ExpectDamagedSegment(m, t, id, "missing");
}

TEST(Segments, ATruncatedSegmentIsACorruptionAndQuarantines) {
  MemStore m;
  const auto t = Conversation(400, 5);
  const EntryId id = MustPublish(*m.store, t, 1, "", kModel);
  m.store.reset();
  const std::string file = SegmentPath(m.options.path, 1);
  ASSERT_TRUE(m.env->TruncateFile(file, *m.env->GetFileSize(file) / 2).ok());
  m.Reopen();
  ExpectDamagedSegment(m, t, id, "committed");
}

// Cut while the store runs (its file already open): the short read is a
// corruption, never bytes from elsewhere.
TEST(Segments, ASegmentTruncatedWhileOpenIsACorruption) {
  MemStore m;
  const auto t = Conversation(400, 6);
  const EntryId id = MustPublish(*m.store, t, 1, "", kModel);
  ASSERT_TRUE(m.store->FetchAll(id).ok());
  const std::string file = SegmentPath(m.options.path, 1);
  ASSERT_TRUE(m.env->TruncateFile(file, *m.env->GetFileSize(file) / 2).ok());
  auto back = m.store->FetchAll(id);
  ASSERT_TRUE(back.status().IsCorruption()) << back.status().ToString();
  EXPECT_NE(back.status().message().find("truncated"), std::string::npos) << back.status().ToString();
  EXPECT_EQ(m.store->Describe(id)->info.state, EntryState::kQuarantined);
}

// Fetching threads hold leases on kept entries and read them over and over
// while the main thread deletes their neighbours and compacts: every
// segment is rewritten and its file unlinked under the readers, whose
// bytes never move.
TEST(Segments, CompactionUnderConcurrentFetches) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  o.reclaim_after_bytes = std::numeric_limits<std::uint64_t>::max();  // only Compact rewrites here
  auto opened = LocalStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  std::vector<std::vector<std::uint32_t>> kept_tokens;
  std::vector<EntryId> kept;
  for (int i = 0; i < 4; ++i) {
    kept_tokens.push_back(Conversation(600, 100 + i));
    kept.push_back(MustPublish(s, kept_tokens.back(), 1, "", kModel));
    MustPublish(s, Conversation(600, 200 + i), 1, "", kModel);  // a neighbour, removed below
  }
  std::atomic<bool> stop{false};
  std::atomic<int> fetches{0}, failures{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      for (int n = 0; !stop.load(); ++n) {
        const std::size_t k = static_cast<std::size_t>(r + n) % kept.size();
        auto lease = s.AcquireLease(kept[k]);
        auto back = s.FetchAll(kept[k]);
        if (!lease.ok() || !back.ok() || back->size() != MakeLayers(kept_tokens[k], kModel).size()) {
          ++failures;
          continue;
        }
        auto want = MakeLayers(kept_tokens[k], kModel);
        for (std::size_t l = 0; l < want.size(); ++l) failures += (*back)[l].chunks == want[l].chunks ? 0 : 1;
        ++fetches;
      }
    });
  }
  std::set<std::string> seen_segments;
  const auto first = SegmentNames(Env::Default(), o.path);
  for (int round = 0; round < 6; ++round) {
    for (const auto& name : SegmentNames(Env::Default(), o.path)) seen_segments.insert(name);
    ListOptions lo;
    lo.limit = 1000;
    auto page = s.List(lo);
    ASSERT_TRUE(page.ok());
    const ListPage entries = std::move(page).value();
    for (const auto& e : entries.entries) {
      if (std::find(kept.begin(), kept.end(), e.id) == kept.end()) {
        ASSERT_TRUE(s.Delete(e.id).ok());
      }
    }
    ASSERT_TRUE(s.Compact().ok());
    MustPublish(s, Conversation(600, 300 + round), 1, "", kModel);  // more dead bytes for the next round
  }
  stop.store(true);
  for (auto& t : readers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(fetches.load(), 10);
  std::set<std::string> now;
  for (const auto& name : SegmentNames(Env::Default(), o.path)) now.insert(name);
  for (const auto& name : first) EXPECT_EQ(now.count(name), 0u) << name << " was never rewritten";
  EXPECT_GE(seen_segments.size(), 4u) << "segments were rewritten round after round";
  ExpectConsistent(s);
}

// With direct_reads the segment files are read past the page cache (O_DIRECT
// on the POSIX Env, over the aligned range around each chunk): entries come
// back bit-exactly, chunks split in parts included, and gc reads through it
// too; a flipped byte is still caught.
TEST(Segments, DirectReadsReturnTheSameBytes) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  TestModel big;
  big.width = 512;
  big.chunk_bytes = 3u << 20;  // parts on the pool
  const auto a = Conversation(2500, 7), b = Conversation(600, 8);
  EntryId ia = 0, ib = 0;
  {
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ia = MustPublish(**s, a, 1, "", big);
    ib = MustPublish(**s, b, 1, "", kModel);
    MustPublish(**s, Conversation(300, 9), 1, "", kModel);
  }
  o.direct_reads = true;
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectSameLayers(*(*s)->FetchAll(ia), MakeLayers(a, big));
  ExpectSameLayers(*(*s)->FetchAll(ib), MakeLayers(b, kModel));
  ASSERT_TRUE((*s)->Delete(ib).ok());
  ASSERT_TRUE((*s)->Compact().ok());  // gc reads frame headers and chunks directly
  ExpectSameLayers(*(*s)->FetchAll(ia), MakeLayers(a, big));
  ExpectConsistent(**s);
}

}  // namespace
}  // namespace primecache

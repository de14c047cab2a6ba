// A real full disk: a small tmpfs mounted by the test (root only; skipped
// where mounting is not allowed; FaultInjectionEnv covers the same path in
// fault_test.cc). The store fills it, fails clearly while reads go on, and
// once a file is removed the same running store publishes again.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <cstring>

#include "store_test_util.h"
#include "tests/support/tmpfs.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

using testing::Tmpfs;

// Writes `path` until the file system is full, then gives `keep_free` back.
void FillUp(const std::string& path, off_t keep_free) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const std::string block(1 << 16, 'x');
  off_t size = 0;
  for (;;) {
    const ssize_t n = ::write(fd, block.data(), block.size());
    if (n <= 0) break;
    size += n;
  }
  EXPECT_EQ(errno, ENOSPC);
  ASSERT_EQ(::ftruncate(fd, size > keep_free ? size - keep_free : 0), 0);
  ::close(fd);
}

TEST(FullDisk, OnATmpfsTheRunningStoreRecoversOnceSpaceIsFreed) {
  Tmpfs fs(16);
  PRIMECACHE_TMPFS_OR_SKIP(fs);
  StoreOptions o = CodecStoreOptions();
  o.path = fs.path() + "/store";
  auto opened = LocalStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  const auto first = Conversation(600, 1);
  const EntryId kept = MustPublish(s, first);

  const std::string ballast = fs.path() + "/ballast";
  FillUp(ballast, 256 << 10);
  Status failed;
  for (int i = 0; i < 60 && failed.ok(); ++i) {
    const auto t = Conversation(900, 100 + i);
    failed = s.Publish(Request(t), MakeLayers(t)).status();
  }
  ASSERT_EQ(failed.code(), StatusCode::kResourceExhausted) << failed.ToString();

  // Full: refused clearly; reads go on.
  const auto next = Conversation(900, 7);
  auto refused = s.Publish(Request(next), MakeLayers(next));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  auto back = s.FetchAll(kept);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, MakeLayers(first));
  EXPECT_FALSE(s.Stat()->write_error.empty());

  // Space comes back: the same store publishes again.
  ASSERT_EQ(::unlink(ballast.c_str()), 0);
  auto again = s.Publish(Request(next), MakeLayers(next));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(s.Stat()->write_error.empty());
  ExpectConsistent(s);
  ASSERT_TRUE(s.Compact().ok());

  opened->reset();
  auto reopened = LocalStore::Open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  auto durable = (*reopened)->FetchAll(again->id);
  ASSERT_TRUE(durable.ok()) << durable.status().ToString();
  ExpectSameLayers(*durable, MakeLayers(next));
  ExpectConsistent(**reopened);
}


// Bytes in the files of `dir` (the segments), as the disk holds them.
std::uint64_t DirBytes(const std::string& dir) {
  std::uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) total += e.file_size();
  return total;
}

// Stages chunks of one publish until the disk is full, then aborts it.
void FillWithAbortedPublish(LocalStore& s) {
  const auto tokens = Conversation(64, 9);
  auto layers = MakeLayers(tokens);
  auto pub = s.BeginPublish(Request(tokens));
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  ASSERT_TRUE(pub->publisher->BeginLayer(layers[0].header, 64).ok());
  const std::string chunk(1 << 20, 'z');
  Status st;
  for (int i = 0; i < 64 && st.ok(); ++i) st = pub->publisher->AddChunk(chunk + std::to_string(i));
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  pub->publisher->Abort();
}

// An aborted publish that met a full disk gives its bytes back at once (the
// segment that failed a write is cut to its committed length and never
// written again), so the running store publishes and compacts again with no
// restart.
TEST(FullDisk, AnAbortedPublishThatFilledTheDiskGivesItsBytesBack) {
  Tmpfs fs(32);
  PRIMECACHE_TMPFS_OR_SKIP(fs);
  StoreOptions o = CodecStoreOptions();
  o.path = fs.path() + "/store";
  auto opened = LocalStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  const auto first = Conversation(600, 1);
  const EntryId kept = MustPublish(s, first);
  const std::uint64_t before = DirBytes(o.path + "/segments");

  FillWithAbortedPublish(s);
  EXPECT_LE(DirBytes(o.path + "/segments"), before + (64u << 10)) << "the aborted publish's bytes stayed";

  const auto next = Conversation(900, 7);
  auto again = s.Publish(Request(next), MakeLayers(next));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(s.Compact().ok());
  auto back = s.FetchAll(kept);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, MakeLayers(first));
  ExpectConsistent(s);
}

// Compaction cuts the tail of an aborted publish whose cut failed at the
// abort (the disk frozen just then), once the disk works again.
TEST(FullDisk, CompactionCutsATailTheAbortCouldNotCut) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  auto hooks = std::make_shared<statestore_internal::TestHooks>();
  hooks->freeze_io = std::make_shared<std::atomic<bool>>(false);
  auto opened = statestore_internal::OpenWithHooks(o, hooks);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  MustPublish(s, Conversation(600, 1));
  const std::uint64_t before = DirBytes(o.path + "/segments");

  const auto tokens = Conversation(64, 9);
  auto layers = MakeLayers(tokens);
  auto pub = s.BeginPublish(Request(tokens));
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  ASSERT_TRUE(pub->publisher->BeginLayer(layers[0].header, 4).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pub->publisher->AddChunk(std::string(1 << 20, 'a' + i)).ok());
  hooks->freeze_io->store(true);
  pub->publisher->Abort();
  hooks->freeze_io->store(false);
  ASSERT_GE(DirBytes(o.path + "/segments"), before + (4u << 20)) << "the frozen abort cut its tail after all";

  ASSERT_TRUE(s.Compact().ok());
  EXPECT_LE(DirBytes(o.path + "/segments"), before) << "compaction kept the aborted publish's tail";
  ExpectConsistent(s);
  const auto next = Conversation(900, 7);
  auto again = s.Publish(Request(next), MakeLayers(next));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
}

// A store whose disk is full opens (the reserve it keeps is given back so
// that RocksDB can open), serves reads, refuses writes clearly, and writes
// again once space is freed, with no restart.
TEST(FullDisk, AStoreOpensOnAFullDiskAndServesReads) {
  Tmpfs fs(32);
  PRIMECACHE_TMPFS_OR_SKIP(fs);
  StoreOptions o = CodecStoreOptions();
  o.path = fs.path() + "/store";
  const auto first = Conversation(600, 1);
  EntryId kept = 0;
  {
    auto opened = LocalStore::Open(o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    kept = MustPublish(**opened, first);
  }
  const std::string ballast = fs.path() + "/ballast";
  FillUp(ballast, 0);
  auto opened = LocalStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  LocalStore& s = **opened;
  auto back = s.FetchAll(kept);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, MakeLayers(first));

  FillUp(ballast + "2", 0);  // whatever the open gave back is taken too
  const auto next = Conversation(900, 7);
  auto refused = s.Publish(Request(next), MakeLayers(next));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();

  ASSERT_EQ(::unlink(ballast.c_str()), 0);
  ASSERT_EQ(::unlink((ballast + "2").c_str()), 0);
  auto again = s.Publish(Request(next), MakeLayers(next));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectConsistent(s);
}

}  // namespace
}  // namespace primecache

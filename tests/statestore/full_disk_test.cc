// A real full disk: a small tmpfs mounted by the test (root only; skipped
// where mounting is not allowed; FaultInjectionEnv covers the same path in
// fault_test.cc). The store fills it, fails clearly while reads go on, and
// once a file is removed the same running store publishes again.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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
  auto opened = Store::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& s = **opened;
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
  auto reopened = Store::Open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  auto durable = (*reopened)->FetchAll(again->id);
  ASSERT_TRUE(durable.ok()) << durable.status().ToString();
  ExpectSameLayers(*durable, MakeLayers(next));
  ExpectConsistent(**reopened);
}

}  // namespace
}  // namespace primecache

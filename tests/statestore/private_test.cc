// The store is private to its user: every directory 0700 and every file 0600
// (RocksDB's own files included) after a publish, a compaction and a reopen,
// whatever the umask; a store left open to others is made private at open.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>

#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

// Sets the process umask for the scope (gtest runs one test at a time).
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t m) : old_(::umask(m)) {}
  ~ScopedUmask() { ::umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

// Every directory is 0700 and every file 0600, `root` included.
void ExpectPrivate(const std::string& root, const std::string& when) {
  SCOPED_TRACE(when);
  EXPECT_EQ(ModeOf(root) & 07777, 0700u) << root;
  std::size_t files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    const mode_t m = ModeOf(e.path());
    if (S_ISDIR(m)) {
      EXPECT_EQ(m & 07777, 0700u) << e.path();
    } else {
      EXPECT_TRUE(S_ISREG(m)) << e.path();
      EXPECT_EQ(m & 07777, 0600u) << e.path();
      ++files;
    }
  }
  EXPECT_GT(files, 5u) << "RocksDB's files are there to check";
}

void CheckUnderUmask(mode_t mask) {
  ScopedUmask scoped(mask);
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/data/store";  // both levels created by the store
  {
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const auto tokens = Conversation(300, 1);
    MustPublish(**s, tokens);
    ExpectPrivate(dir.path + "/data", "after a publish");
    ASSERT_TRUE((*s)->Compact().ok());
    ExpectPrivate(dir.path + "/data", "after a compaction");
  }
  ExpectPrivate(dir.path + "/data", "after a close");
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  MustPublish(**s, Conversation(200, 2));
  ExpectPrivate(dir.path + "/data", "after a reopen and a publish");
}

TEST(Private, EveryFileIsTheOwnersUnderUmask022) {
  CheckUnderUmask(022);
}

TEST(Private, EveryFileIsTheOwnersUnderUmask000) {
  CheckUnderUmask(0);
}

TEST(Private, AStoreLeftOpenToOthersIsMadePrivateAtOpen) {
  ScopedUmask scoped(0);
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  {
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok());
    MustPublish(**s, Conversation(300, 1));
  }
  // As an older primecache left it: 0755 directories, 0644 files.
  ASSERT_EQ(::chmod(o.path.c_str(), 0755), 0);
  for (const auto& e : std::filesystem::recursive_directory_iterator(o.path))
    ASSERT_EQ(::chmod(e.path().c_str(), e.is_directory() ? 0755 : 0644), 0);
  ASSERT_EQ(ModeOf(o.path + "/CURRENT") & 0777, 0644u);
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectPrivate(o.path, "after opening a 0755/0644 store");
  // Read-only (a look at a stopped daemon's store) changes nothing.
  s->reset();
  ASSERT_EQ(::chmod(o.path.c_str(), 0750), 0);
  StoreOptions ro = o;
  ro.read_only = true;
  auto r = LocalStore::Open(ro);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ModeOf(o.path) & 0777, 0750u);
}

// RestrictToOwner: group and other bits go; owner bits stay; links and
// sockets are neither changed nor followed; non-recursive stops at the top.
TEST(Private, RestrictToOwnerLeavesLinksAndSocketsAlone) {
  ScopedUmask scoped(0);
  TempDir dir;
  TempDir outside;
  const std::string d = dir.path + "/d";
  ASSERT_EQ(::mkdir(d.c_str(), 0775), 0);
  ASSERT_EQ(::mkdir((d + "/sub").c_str(), 0777), 0);
  for (const char* f : {"/a", "/sub/b"}) {
    FILE* fp = std::fopen((d + f).c_str(), "w");
    ASSERT_NE(fp, nullptr);
    std::fclose(fp);
    ASSERT_EQ(::chmod((d + f).c_str(), 0754), 0);
  }
  const std::string target = outside.path + "/target";
  FILE* fp = std::fopen(target.c_str(), "w");
  ASSERT_NE(fp, nullptr);
  std::fclose(fp);
  ASSERT_EQ(::chmod(target.c_str(), 0644), 0);
  ASSERT_EQ(::chmod(outside.path.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(target.c_str(), (d + "/link").c_str()), 0);
  ASSERT_EQ(::symlink(outside.path.c_str(), (d + "/dirlink").c_str()), 0);
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = d + "/s.sock";
  ASSERT_LT(sock_path.size(), sizeof addr.sun_path);
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock_path.c_str());
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::chmod(sock_path.c_str(), 0660), 0);

  auto top = RestrictToOwner(Env::Default(), d, /*recursive=*/false);
  ASSERT_TRUE(top.ok()) << top.status().ToString();
  ASSERT_EQ(top->size(), 1u);
  EXPECT_EQ((*top)[0].old_permissions, 0775u);
  EXPECT_EQ(ModeOf(d + "/a") & 0777, 0754u) << "not recursive: below stays";

  auto all = RestrictToOwner(Env::Default(), d);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->size(), 3u) << DescribeTightened(*all);
  EXPECT_EQ(ModeOf(d) & 0777, 0700u);
  EXPECT_EQ(ModeOf(d + "/sub") & 0777, 0700u);
  EXPECT_EQ(ModeOf(d + "/a") & 0777, 0700u);
  EXPECT_EQ(ModeOf(d + "/sub/b") & 0777, 0700u);
  EXPECT_EQ(ModeOf(target) & 0777, 0644u) << "a link is not followed";
  EXPECT_EQ(ModeOf(outside.path) & 0777, 0755u) << "a link to a directory is not followed";
  EXPECT_EQ(ModeOf(sock_path) & 0777, 0660u) << "a socket keeps its mode";
  ::close(sock);

  // The in-memory Env keeps no permissions: nothing to do.
  auto mem = NewMemEnv();
  ASSERT_TRUE(mem->CreateDir("/m").ok());
  auto none = RestrictToOwner(mem.get(), "/m");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace primecache

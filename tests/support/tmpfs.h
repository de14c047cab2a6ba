// A small tmpfs mounted by a test that needs a real full disk (root or
// CAP_SYS_ADMIN). Where mounting is not allowed the test skips, except on CI
// (CI=true, which runs as root): there a tmpfs that cannot be mounted is a
// failure, so that a full-disk test cannot drop out of the suite unnoticed.
#pragma once

#include <string>

namespace primecache::testing {

// A tmpfs of `mib` MiB, mounted (nosuid, nodev, mode 0700) on a fresh
// temporary directory or on a given empty one, unmounted (and the fresh
// directory removed) when it goes. mounted() false: the mount failed and
// error() says why. Not thread-safe; one owner.
class Tmpfs {
 public:
  // On a fresh directory under TMPDIR (or /tmp).
  explicit Tmpfs(int mib);
  // On `dir`, an existing empty directory the caller owns.
  Tmpfs(std::string dir, int mib);
  ~Tmpfs();
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }  // empty when mounted
  const std::string& path() const { return path_; }

  // Whether a test must fail, not skip, when mounted() is false: CI=true.
  static bool Required();
  // The reason to give for that skip or failure, in words.
  std::string Why() const;

 private:
  void Mount(int mib);

  std::string path_;
  bool owns_dir_ = false;
  bool mounted_ = false;
  std::string error_;
};

// Writes `path` until its file system is full (a disk filled by someone
// else); the file stays for the caller to remove.
void FillFileSystem(const std::string& path);

}  // namespace primecache::testing

// In a gtest test, after `Tmpfs fs(...)`: skips where mounting is not allowed,
// fails instead under CI=true (Tmpfs::Required).
#define PRIMECACHE_TMPFS_OR_SKIP(fs)                                 \
  do {                                                               \
    if (!(fs).mounted()) {                                           \
      if (::primecache::testing::Tmpfs::Required()) FAIL() << (fs).Why(); \
      GTEST_SKIP() << (fs).Why();                                    \
    }                                                                \
  } while (0)

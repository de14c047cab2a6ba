#include "tests/support/tmpfs.h"

#include <sys/mount.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

namespace primecache::testing {

Tmpfs::Tmpfs(int mib) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/pctmpfs-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    error_ = std::string("mkdtemp: ") + std::strerror(errno);
    return;
  }
  path_ = buf.data();
  owns_dir_ = true;
  Mount(mib);
}

Tmpfs::Tmpfs(std::string dir, int mib) : path_(std::move(dir)) { Mount(mib); }

void Tmpfs::Mount(int mib) {
  const std::string opts = "size=" + std::to_string(mib) + "m,mode=0700";
  if (::mount("tmpfs", path_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
    error_ = std::strerror(errno);
  } else {
    mounted_ = true;
  }
}

Tmpfs::~Tmpfs() {
  if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  if (owns_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

bool Tmpfs::Required() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "true") == 0;
}

std::string Tmpfs::Why() const {
  std::string why = "cannot mount a tmpfs at " + path_ + " (" + error_ + ")";
  if (Required()) why += "; CI=true: a full-disk test must run on CI (as root), not skip";
  return why;
}

void FillFileSystem(const std::string& path) {
  std::ofstream filler(path, std::ios::binary);
  const std::string block(1 << 12, 'f');
  while (filler.write(block.data(), static_cast<std::streamsize>(block.size()))) {
  }
}

}  // namespace primecache::testing

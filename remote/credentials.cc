#include "remote/credentials.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>

#include "core/errno_text.h"

namespace primecache::remote {
namespace {

std::string Octal(mode_t mode) {
  std::array<char, 8> buf{};
  std::snprintf(buf.data(), buf.size(), "%04o", static_cast<unsigned>(mode & 07777));
  return buf.data();
}

Status Oversized(const std::string& path) {
  return Status::InvalidArgument("the remote password file " + path + " is over " +
                                 std::to_string(kMaxPasswordFileBytes) + " bytes: not a password file");
}

// The first line of the file at `path`, checked as LoadRedisAuth says.
Result<std::string> ReadPasswordFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::FailedPrecondition(ErrnoText("cannot open the remote password file " + path));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status::IOError(ErrnoText("cannot stat the remote password file " + path));
  if (!S_ISREG(st.st_mode)) {
    return Status::FailedPrecondition("the remote password file " + path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    return Status::FailedPrecondition("the remote password file " + path +
                                      " may be read or written by others (mode " + Octal(st.st_mode) +
                                      "): chmod 600 it");
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxPasswordFileBytes) return Oversized(path);
  std::string text(kMaxPasswordFileBytes + 1, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(ErrnoText("cannot read the remote password file " + path));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxPasswordFileBytes) return Oversized(path);  // grew since the fstat
  text.resize(got);
  text = text.substr(0, text.find('\n'));
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) return Status::InvalidArgument("the remote password file " + path + " holds no password");
  return text;
}

std::string FromEnv(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read at start, before any thread
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace

Result<RedisAuth> LoadRedisAuth(const RedisAuthSource& source) {
  RedisAuth auth;
  auth.user = source.user.empty() ? FromEnv(kRemoteUserEnv) : source.user;
  if (!source.password_file.empty()) {
    PC_ASSIGN_OR_RETURN(auth.password, ReadPasswordFile(source.password_file));
  } else {
    auth.password = FromEnv(kRemotePasswordEnv);
  }
  if (!auth.user.empty() && auth.password.empty()) {
    return Status::InvalidArgument("remote user " + auth.user +
                                   " has no password: give --remote-password-file or $" + kRemotePasswordEnv);
  }
  return auth;
}

}  // namespace primecache::remote

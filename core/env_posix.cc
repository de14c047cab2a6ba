// The POSIX Env: plain open/pread/write/fsync/rename on the local file system.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/errno_text.h"
#include "primecache/internal/env.h"

namespace primecache {
namespace {

// Everything primecache creates is its user's alone (see env.h).
constexpr mode_t kFileMode = 0600;
constexpr mode_t kDirMode = 0700;

Status ErrnoStatus(std::string_view what, const std::string& path, int err) {
  std::string msg = ErrnoText(std::string(what) + " " + path, err);
  if (err == ENOENT) return Status::NotFound(std::move(msg));
  if (err == ENOSPC || err == EDQUOT) return Status::ResourceExhausted(std::move(msg));
  return Status::IOError(std::move(msg));
}

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { ::close(fd_); }

  Status Read(std::span<std::byte> dst, std::size_t* read) override {
    std::size_t done = 0;
    while (done < dst.size()) {
      ssize_t n = ::read(fd_, dst.data() + done, dst.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        *read = done;
        return ErrnoStatus("read", path_, errno);
      }
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    *read = done;
    return Status::Ok();
  }

  Status Skip(std::uint64_t n) override {
    if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) return ErrnoStatus("seek", path_, errno);
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_;
};

// A read-only shared mapping of the first `size` bytes of `fd` (served from
// the page cache, also for a file opened with O_DIRECT).
Result<MappedRegion> MapFile(int fd, const std::string& path, std::uint64_t size) {
  if (size == 0) return Status::InvalidArgument("map of 0 bytes of " + path);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus("mmap", path, errno);
  MappedRegion m;
  m.data = static_cast<const std::byte*>(p);
  m.size = size;
  m.id = NextMappingId();
  m.owner = std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  return m;
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Result<MappedRegion> Map(std::uint64_t size) const override { return MapFile(fd_, path_, size); }

  Status Read(std::uint64_t offset, std::span<std::byte> dst, std::size_t* read) const override {
    std::size_t done = 0;
    while (done < dst.size()) {
      ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        *read = done;
        return ErrnoStatus("pread", path_, errno);
      }
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    *read = done;
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_;
};

// A file opened with O_DIRECT: reads bypass the page cache and must be
// aligned (alignment()); a short read is the end of the file.
class PosixDirectFile final : public RandomAccessFile {
 public:
  PosixDirectFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixDirectFile() override { ::close(fd_); }

  Status Read(std::uint64_t offset, std::span<std::byte> dst, std::size_t* read) const override {
    *read = 0;
    for (;;) {
      ssize_t n = ::pread(fd_, dst.data(), dst.size(), static_cast<off_t>(offset));
      if (n >= 0) {
        *read = static_cast<std::size_t>(n);
        return Status::Ok();
      }
      if (errno != EINTR) return ErrnoStatus("pread (O_DIRECT)", path_, errno);
    }
  }
  std::size_t alignment() const override { return kDirectAlignment; }
  // Reads bypass the page cache; a mapping uses it (pages there already
  // are served without a read).
  Result<MappedRegion> Map(std::uint64_t size) const override { return MapFile(fd_, path_, size); }

  static constexpr std::size_t kDirectAlignment = 4096;

 private:
  std::string path_;
  int fd_;
};

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status Append(std::span<const std::byte> data) override {
    if (fd_ < 0) return Status::FailedPrecondition("append to closed file " + path_);
    std::size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("write", path_, errno);
      }
      done += static_cast<std::size_t>(n);
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (fd_ < 0) return Status::FailedPrecondition("sync of closed file " + path_);
    if (::fdatasync(fd_) != 0) return ErrnoStatus("fdatasync", path_, errno);
    return Status::Ok();
  }

  Status StartWriteback(std::uint64_t offset, std::uint64_t n) override {
    if (fd_ < 0) return Status::FailedPrecondition("writeback of closed file " + path_);
    if (::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE) != 0) {
      return ErrnoStatus("sync_file_range", path_, errno);
    }
    return Status::Ok();
  }

  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return ErrnoStatus("close", path_, errno);
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open", path, errno);
    return std::unique_ptr<SequentialFile>(new PosixSequentialFile(path, fd));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open", path, errno);
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewDirectRandomAccessFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0 && errno == EINVAL) return NewRandomAccessFile(path);  // a file system without O_DIRECT (tmpfs)
    if (fd < 0) return ErrnoStatus("open (O_DIRECT)", path, errno);
    return std::unique_ptr<RandomAccessFile>(new PosixDirectFile(path, fd));
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, kFileMode);
    if (fd < 0) return ErrnoStatus("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, kFileMode);
    if (fd < 0) return ErrnoStatus("open for append", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus("opendir", dir, errno);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      std::string_view name(e->d_name);
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<std::uint64_t> GetFileSize(const std::string& path) override {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("stat", path, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus("unlink", path, errno);
    return Status::Ok();
  }

  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), kDirMode) != 0 && errno != EEXIST) return ErrnoStatus("mkdir", path, errno);
    return Status::Ok();
  }

  Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return ErrnoStatus("rmdir", path, errno);
    return Status::Ok();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus("rename to " + to + " from", from, errno);
    return Status::Ok();
  }

  Result<FileMode> GetFileMode(const std::string& path) override {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus("lstat", path, errno);
    FileMode m;
    m.kind = S_ISREG(st.st_mode)   ? FileMode::Kind::kFile
             : S_ISDIR(st.st_mode) ? FileMode::Kind::kDirectory
                                   : FileMode::Kind::kOther;
    m.permissions = static_cast<std::uint32_t>(st.st_mode & 0777);
    return m;
  }

  Status SetPermissions(const std::string& path, std::uint32_t permissions) override {
    // O_NOFOLLOW: a symbolic link planted in place of the path is refused.
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ErrnoStatus("open for chmod", path, errno);
    int rc = ::fchmod(fd, static_cast<mode_t>(permissions & 0777));
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus("chmod", path, err);
    return Status::Ok();
  }

  bool IsResident(const MappedRegion& m, std::uint64_t offset, std::uint64_t length) override {
    if (length == 0) return true;
    if (offset > m.size || length > m.size - offset) return false;
    static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t first = offset / page * page, end = offset + length;
    std::vector<unsigned char> in((end - first + page - 1) / page);
    if (::mincore(const_cast<std::byte*>(m.data) + first, end - first, in.data()) != 0) return false;
    return std::all_of(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
  }

  Status TruncateFile(const std::string& path, std::uint64_t size) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("stat", path, errno);
    if (static_cast<std::uint64_t>(st.st_size) < size) {
      return Status::InvalidArgument("truncating " + path + " to " + std::to_string(size) + " bytes would grow it");
    }
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) return ErrnoStatus("truncate", path, errno);
    return Status::Ok();
  }

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open directory", dir, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus("fsync directory", dir, err);
    return Status::Ok();
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv();  // never destroyed: outlives every user
  return env;
}

}  // namespace primecache

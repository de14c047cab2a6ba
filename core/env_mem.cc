// An in-memory Env: a map from path to shared file contents, plus a set of
// directories. Paths are used as given (no normalisation beyond trailing '/').
#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "primecache/internal/env.h"

namespace primecache {
namespace {

struct MemFile {
  std::mutex mu;
  std::string data;
};

std::string Normalize(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

class MemSequentialFile final : public SequentialFile {
 public:
  explicit MemSequentialFile(std::shared_ptr<MemFile> f) : f_(std::move(f)) {}
  Status Read(std::span<std::byte> dst, std::size_t* read) override {
    std::lock_guard lock(f_->mu);
    std::size_t avail = pos_ < f_->data.size() ? f_->data.size() - pos_ : 0;
    std::size_t n = std::min(avail, dst.size());
    std::copy_n(reinterpret_cast<const std::byte*>(f_->data.data()) + pos_, n, dst.data());
    pos_ += n;
    *read = n;
    return Status::Ok();
  }
  Status Skip(std::uint64_t n) override {
    pos_ += n;
    return Status::Ok();
  }

 private:
  std::shared_ptr<MemFile> f_;
  std::uint64_t pos_ = 0;
};

class MemRandomAccessFile final : public RandomAccessFile {
 public:
  explicit MemRandomAccessFile(std::shared_ptr<MemFile> f) : f_(std::move(f)) {}
  Status Read(std::uint64_t offset, std::span<std::byte> dst, std::size_t* read) const override {
    std::lock_guard lock(f_->mu);
    std::size_t avail = offset < f_->data.size() ? f_->data.size() - offset : 0;
    std::size_t n = std::min(avail, dst.size());
    std::copy_n(reinterpret_cast<const std::byte*>(f_->data.data()) + offset, n, dst.data());
    *read = n;
    return Status::Ok();
  }
  // A snapshot of the first `size` bytes: the file's buffer may move as it
  // grows, and a mapping never changes.
  Result<MappedRegion> Map(std::uint64_t size) const override {
    std::lock_guard lock(f_->mu);
    if (size == 0 || size > f_->data.size()) return Status::InvalidArgument("map past the end of a memory file");
    auto copy = std::make_shared<const std::string>(f_->data.substr(0, size));
    MappedRegion m;
    m.data = reinterpret_cast<const std::byte*>(copy->data());
    m.size = size;
    m.id = NextMappingId();
    m.owner = std::move(copy);
    return m;
  }

 private:
  std::shared_ptr<MemFile> f_;
};

class MemWritableFile final : public WritableFile {
 public:
  explicit MemWritableFile(std::shared_ptr<MemFile> f) : f_(std::move(f)) {}
  Status Append(std::span<const std::byte> data) override {
    if (closed_) return Status::FailedPrecondition("append to closed file");
    std::lock_guard lock(f_->mu);
    f_->data.append(reinterpret_cast<const char*>(data.data()), data.size());
    return Status::Ok();
  }
  Status Sync() override {
    if (closed_) return Status::FailedPrecondition("sync of closed file");
    return Status::Ok();
  }
  Status Close() override {
    closed_ = true;
    return Status::Ok();
  }

 private:
  std::shared_ptr<MemFile> f_;
  bool closed_ = false;
};

class MemEnv final : public Env {
 public:
  MemEnv() { dirs_.insert("/"); dirs_.insert("."); }

  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    PC_ASSIGN_OR_RETURN(auto f, Find(path));
    return std::unique_ptr<SequentialFile>(new MemSequentialFile(std::move(f)));
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    PC_ASSIGN_OR_RETURN(auto f, Find(path));
    return std::unique_ptr<RandomAccessFile>(new MemRandomAccessFile(std::move(f)));
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return Open(path, /*truncate=*/true);
  }
  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override {
    return Open(path, /*truncate=*/false);
  }

  bool FileExists(const std::string& raw) override {
    std::string path = Normalize(raw);
    std::lock_guard lock(mu_);
    return files_.count(path) != 0 || dirs_.count(path) != 0;
  }

  Result<std::vector<std::string>> GetChildren(const std::string& raw) override {
    std::string dir = Normalize(raw);
    std::lock_guard lock(mu_);
    if (dirs_.count(dir) == 0) return Status::NotFound("no directory " + dir);
    std::string prefix = dir == "/" ? "/" : dir + "/";
    std::set<std::string> names;
    auto collect = [&](const std::string& p) {
      if (p.size() > prefix.size() && p.compare(0, prefix.size(), prefix) == 0) {
        std::string rest = p.substr(prefix.size());
        if (rest.find('/') == std::string::npos) names.insert(rest);
      }
    };
    for (const auto& [p, f] : files_) collect(p);
    for (const auto& p : dirs_) collect(p);
    return std::vector<std::string>(names.begin(), names.end());
  }

  Result<std::uint64_t> GetFileSize(const std::string& path) override {
    PC_ASSIGN_OR_RETURN(auto f, Find(path));
    std::lock_guard lock(f->mu);
    return static_cast<std::uint64_t>(f->data.size());
  }

  Status TruncateFile(const std::string& path, std::uint64_t size) override {
    PC_ASSIGN_OR_RETURN(auto f, Find(path));
    std::lock_guard lock(f->mu);
    if (f->data.size() < size) return Status::InvalidArgument("truncating " + path + " would grow it");
    f->data.resize(size);
    return Status::Ok();
  }

  Status RemoveFile(const std::string& raw) override {
    std::string path = Normalize(raw);
    std::lock_guard lock(mu_);
    if (files_.erase(path) == 0) return Status::NotFound("no file " + path);
    return Status::Ok();
  }

  Status CreateDir(const std::string& raw) override {
    std::string path = Normalize(raw);
    std::lock_guard lock(mu_);
    if (files_.count(path) != 0) return Status::AlreadyExists(path + " is a file");
    if (dirs_.count(DirName(path)) == 0) return Status::NotFound("no parent directory for " + path);
    dirs_.insert(path);
    return Status::Ok();
  }

  Status RemoveDir(const std::string& raw) override {
    std::string path = Normalize(raw);
    std::lock_guard lock(mu_);
    if (dirs_.count(path) == 0) return Status::NotFound("no directory " + path);
    std::string prefix = path + "/";
    for (const auto& [p, f] : files_) {
      if (p.compare(0, prefix.size(), prefix) == 0) return Status::IOError("directory not empty: " + path);
    }
    for (const auto& d : dirs_) {
      if (d.compare(0, prefix.size(), prefix) == 0) return Status::IOError("directory not empty: " + path);
    }
    dirs_.erase(path);
    return Status::Ok();
  }

  Status RenameFile(const std::string& raw_from, const std::string& raw_to) override {
    std::string from = Normalize(raw_from), to = Normalize(raw_to);
    std::lock_guard lock(mu_);
    auto it = files_.find(from);
    if (it == files_.end()) return Status::NotFound("no file " + from);
    if (dirs_.count(DirName(to)) == 0) return Status::NotFound("no directory for " + to);
    auto f = it->second;
    files_.erase(it);
    files_[to] = std::move(f);
    return Status::Ok();
  }

  Status SyncDir(const std::string& raw) override {
    std::string dir = Normalize(raw);
    std::lock_guard lock(mu_);
    if (dirs_.count(dir) == 0) return Status::NotFound("no directory " + dir);
    return Status::Ok();
  }

 private:
  Result<std::shared_ptr<MemFile>> Find(const std::string& raw) {
    std::string path = Normalize(raw);
    std::lock_guard lock(mu_);
    auto it = files_.find(path);
    if (it == files_.end()) return Status::NotFound("no file " + path);
    return it->second;
  }

  Result<std::unique_ptr<WritableFile>> Open(const std::string& raw, bool truncate) {
    std::string path = Normalize(raw);
    std::lock_guard lock(mu_);
    if (dirs_.count(path) != 0) return Status::IOError(path + " is a directory");
    if (dirs_.count(DirName(path)) == 0) return Status::NotFound("no directory for " + path);
    auto& slot = files_[path];
    if (!slot || truncate) slot = std::make_shared<MemFile>();
    return std::unique_ptr<WritableFile>(new MemWritableFile(slot));
  }

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<MemFile>> files_;
  std::set<std::string> dirs_;
};

}  // namespace

std::unique_ptr<Env> NewMemEnv() { return std::make_unique<MemEnv>(); }

}  // namespace primecache

#include "statestore/rocks_env.h"

#include <spdlog/spdlog.h>

#include <rocksdb/system_clock.h>
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <set>

#include "core/mutex.h"
#include "statestore/kill_point.h"
#include "statestore/test_hooks.h"

namespace primecache::statestore_internal {
namespace {

using rocksdb::FileOptions;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

IOStatus ToIO(const Status& s) {
  if (s.ok()) return IOStatus::OK();
  switch (s.code()) {
    case StatusCode::kNotFound:
      return IOStatus::PathNotFound(s.message());
    case StatusCode::kResourceExhausted:
      return IOStatus::NoSpace(s.message());
    default:
      return IOStatus::IOError(s.message());
  }
}

IOStatus Frozen(const std::string& what) {
  return IOStatus::IOError("disk frozen (simulated power loss): " + what);
}

std::span<const std::byte> AsSpan(const Slice& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class SeqFile final : public rocksdb::FSSequentialFile {
 public:
  explicit SeqFile(std::unique_ptr<SequentialFile> f) : f_(std::move(f)) {}
  IOStatus Read(size_t n, const IOOptions&, Slice* result, char* scratch, IODebugContext*) override {
    std::size_t got = 0;
    Status s = f_->Read({reinterpret_cast<std::byte*>(scratch), n}, &got);
    *result = Slice(scratch, got);
    return ToIO(s);
  }
  IOStatus Skip(uint64_t n) override { return ToIO(f_->Skip(n)); }

 private:
  std::unique_ptr<SequentialFile> f_;
};

class RandFile final : public rocksdb::FSRandomAccessFile {
 public:
  explicit RandFile(std::unique_ptr<RandomAccessFile> f) : f_(std::move(f)) {}
  IOStatus Read(uint64_t offset, size_t n, const IOOptions&, Slice* result, char* scratch,
                IODebugContext*) const override {
    std::size_t got = 0;
    Status s = f_->Read(offset, {reinterpret_cast<std::byte*>(scratch), n}, &got);
    *result = Slice(scratch, got);
    return ToIO(s);
  }

 private:
  std::unique_ptr<RandomAccessFile> f_;
};

class WFile final : public rocksdb::FSWritableFile {
 public:
  WFile(std::string path, std::unique_ptr<WritableFile> f, std::uint64_t size, const FileOptions& o,
        FreezeHook freezer)
      : rocksdb::FSWritableFile(o),
        path_(std::move(path)),
        f_(std::move(f)),
        size_(size),
        freezer_(std::move(freezer)) {}
  ~WFile() override {
    if (f_ != nullptr) {
      Status ignored = f_->Close();
      (void)ignored;
    }
  }

  IOStatus Append(const Slice& data, const IOOptions&, IODebugContext*) override {
    TEST_KILL_POINT("fs.append");
    if (freezer_.Stop()) return Frozen("append " + path_);
    Status s = f_->Append(AsSpan(data));
    if (s.ok()) size_ += data.size();
    return ToIO(s);
  }
  IOStatus Truncate(uint64_t size, const IOOptions&, IODebugContext*) override {
    if (size == size_) return IOStatus::OK();
    return IOStatus::NotSupported("truncate through primecache::Env");
  }
  IOStatus Close(const IOOptions&, IODebugContext*) override {
    if (f_ == nullptr) return IOStatus::OK();
    Status s = f_->Close();
    f_.reset();
    return ToIO(s);
  }
  IOStatus Flush(const IOOptions&, IODebugContext*) override { return IOStatus::OK(); }
  IOStatus Sync(const IOOptions&, IODebugContext*) override {
    TEST_KILL_POINT("fs.sync");
    if (freezer_.Stop()) return Frozen("sync " + path_);
    if (f_ == nullptr) return IOStatus::IOError("sync of closed file " + path_);
    return ToIO(f_->Sync());
  }
  IOStatus Fsync(const IOOptions& o, IODebugContext* d) override { return Sync(o, d); }
  uint64_t GetFileSize(const IOOptions&, IODebugContext*) override { return size_; }
  bool IsSyncThreadSafe() const override { return false; }

 private:
  std::string path_;
  std::unique_ptr<WritableFile> f_;
  std::uint64_t size_ = 0;
  FreezeHook freezer_;
};

class Dir final : public rocksdb::FSDirectory {
 public:
  Dir(Env* env, std::string path, FreezeHook freezer)
      : env_(env), path_(std::move(path)), freezer_(std::move(freezer)) {}
  IOStatus Fsync(const IOOptions&, IODebugContext*) override {
    TEST_KILL_POINT("fs.dirsync");
    if (freezer_.Stop()) return Frozen("sync directory " + path_);
    return ToIO(env_->SyncDir(path_));
  }
  IOStatus Close(const IOOptions&, IODebugContext*) override { return IOStatus::OK(); }

 private:
  Env* env_;
  std::string path_;
  FreezeHook freezer_;
};

// Locks held in this process, by path: a second open of one store in the
// same process fails as it would across processes.
struct LockTable {
  Mutex mu;
  std::set<std::string> held GUARDED_BY(mu);
};
LockTable& Locks() {
  static LockTable* t = new LockTable();  // never deleted
  return *t;
}

class EnvLock final : public rocksdb::FileLock {
 public:
  EnvLock(std::string path, rocksdb::FileLock* posix) : path(std::move(path)), posix(posix) {}
  std::string path;
  rocksdb::FileLock* posix;
};

class EnvFileSystem final : public rocksdb::FileSystem {
 public:
  EnvFileSystem(Env* env, EnvFileSystemOptions o)
      : env_(env), o_(std::move(o)), freezer_{o_.frozen, o_.freeze_countdown} {}

  static const char* kClassName() { return "PrimecacheEnvFileSystem"; }
  const char* Name() const override { return kClassName(); }

  bool IsFrozen() const { return freezer_.Stop(); }
  // Locks are per file system: the Env's address qualifies the path.
  std::string LockName(const std::string& f) const {
    return std::to_string(reinterpret_cast<std::uintptr_t>(env_)) + ":" + f;
  }

  IOStatus NewSequentialFile(const std::string& f, const FileOptions&,
                             std::unique_ptr<rocksdb::FSSequentialFile>* r, IODebugContext*) override {
    auto file = env_->NewSequentialFile(f);
    if (!file.ok()) return ToIO(file.status());
    *r = std::make_unique<SeqFile>(std::move(file).value());
    return IOStatus::OK();
  }
  IOStatus NewRandomAccessFile(const std::string& f, const FileOptions&,
                               std::unique_ptr<rocksdb::FSRandomAccessFile>* r, IODebugContext*) override {
    auto file = env_->NewRandomAccessFile(f);
    if (!file.ok()) return ToIO(file.status());
    *r = std::make_unique<RandFile>(std::move(file).value());
    return IOStatus::OK();
  }
  IOStatus NewWritableFile(const std::string& f, const FileOptions& o,
                           std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext*) override {
    TEST_KILL_POINT("fs.create");
    if (IsFrozen()) return Frozen("create " + f);
    auto file = env_->NewWritableFile(f);
    if (!file.ok()) return ToIO(file.status());
    *r = std::make_unique<WFile>(f, std::move(file).value(), 0, o, freezer_);
    return IOStatus::OK();
  }
  IOStatus ReopenWritableFile(const std::string& f, const FileOptions& o,
                              std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext*) override {
    TEST_KILL_POINT("fs.create");
    if (IsFrozen()) return Frozen("reopen " + f);
    std::uint64_t size = 0;
    if (env_->FileExists(f)) {
      auto sz = env_->GetFileSize(f);
      if (!sz.ok()) return ToIO(sz.status());
      size = *sz;
    }
    auto file = env_->NewAppendableFile(f);
    if (!file.ok()) return ToIO(file.status());
    *r = std::make_unique<WFile>(f, std::move(file).value(), size, o, freezer_);
    return IOStatus::OK();
  }
  IOStatus ReuseWritableFile(const std::string& f, const std::string& old, const FileOptions& o,
                             std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext* d) override {
    IOStatus s = RenameFile(old, f, IOOptions(), d);
    if (!s.ok()) return s;
    return NewWritableFile(f, o, r, d);
  }
  IOStatus NewDirectory(const std::string& name, const IOOptions&, std::unique_ptr<rocksdb::FSDirectory>* r,
                        IODebugContext*) override {
    *r = std::make_unique<Dir>(env_, name, freezer_);
    return IOStatus::OK();
  }
  IOStatus FileExists(const std::string& f, const IOOptions&, IODebugContext*) override {
    return env_->FileExists(f) ? IOStatus::OK() : IOStatus::NotFound(f);
  }
  IOStatus GetChildren(const std::string& dir, const IOOptions&, std::vector<std::string>* r,
                       IODebugContext*) override {
    auto c = env_->GetChildren(dir);
    if (!c.ok()) return ToIO(c.status());
    *r = std::move(c).value();
    return IOStatus::OK();
  }
  IOStatus GetChildrenFileAttributes(const std::string& dir, const IOOptions& o,
                                     std::vector<rocksdb::FileAttributes>* r, IODebugContext* d) override {
    std::vector<std::string> names;
    IOStatus s = GetChildren(dir, o, &names, d);
    if (!s.ok()) return s;
    r->clear();
    for (auto& n : names) {
      auto sz = env_->GetFileSize(dir + "/" + n);
      if (!sz.ok()) continue;  // a directory, or gone meanwhile
      r->push_back({n, *sz});
    }
    return IOStatus::OK();
  }
  IOStatus DeleteFile(const std::string& f, const IOOptions&, IODebugContext*) override {
    TEST_KILL_POINT("fs.delete");
    if (IsFrozen()) return Frozen("delete " + f);
    return ToIO(env_->RemoveFile(f));
  }
  IOStatus CreateDir(const std::string& d, const IOOptions&, IODebugContext*) override {
    if (IsFrozen()) return Frozen("mkdir " + d);
    return ToIO(env_->CreateDir(d));
  }
  IOStatus CreateDirIfMissing(const std::string& d, const IOOptions& o, IODebugContext* g) override {
    return CreateDir(d, o, g);
  }
  IOStatus DeleteDir(const std::string& d, const IOOptions&, IODebugContext*) override {
    if (IsFrozen()) return Frozen("rmdir " + d);
    return ToIO(env_->RemoveDir(d));
  }
  IOStatus GetFileSize(const std::string& f, const IOOptions&, uint64_t* size, IODebugContext*) override {
    auto s = env_->GetFileSize(f);
    if (!s.ok()) return ToIO(s.status());
    *size = *s;
    return IOStatus::OK();
  }
  IOStatus GetFileModificationTime(const std::string& f, const IOOptions&, uint64_t* t,
                                   IODebugContext*) override {
    if (!env_->FileExists(f)) return IOStatus::PathNotFound(f);
    *t = 0;  // the Env keeps no times; RocksDB only uses them for WAL TTLs, which are off
    return IOStatus::OK();
  }
  IOStatus RenameFile(const std::string& from, const std::string& to, const IOOptions&,
                      IODebugContext*) override {
    TEST_KILL_POINT("fs.rename");
    if (IsFrozen()) return Frozen("rename " + from);
    return ToIO(env_->RenameFile(from, to));
  }
  IOStatus LockFile(const std::string& f, const IOOptions& o, rocksdb::FileLock** lock,
                    IODebugContext* d) override {
    const std::string held = LockName(f);
    {
      MutexLock g(&Locks().mu);
      if (!Locks().held.insert(held).second) {
        return IOStatus::IOError("lock " + f + ": already held by this process (the store is open)");
      }
    }
    // The file is created through the Env (so it is private to our user,
    // as RocksDB's own LockFile would create it 0644) before it is locked.
    IOStatus s = env_->FileExists(f) ? IOStatus::OK() : CreateEmpty(f);
    rocksdb::FileLock* posix = nullptr;
    if (s.ok() && o_.posix_locks) {
      s = rocksdb::FileSystem::Default()->LockFile(f, o, &posix, d);
      if (!s.ok())
        s = IOStatus::IOError("lock " + f + " (is another process using the store?): " + s.ToString());
    }
    if (!s.ok()) {
      MutexLock g(&Locks().mu);
      Locks().held.erase(held);
      return s;
    }
    *lock = new EnvLock(held, posix);
    return IOStatus::OK();
  }
  IOStatus CreateEmpty(const std::string& f) {
    if (IsFrozen()) return Frozen("create " + f);
    auto file = env_->NewWritableFile(f);
    if (!file.ok()) return ToIO(file.status());
    return ToIO((*file)->Close());
  }
  IOStatus UnlockFile(rocksdb::FileLock* lock, const IOOptions& o, IODebugContext* d) override {
    auto* l = static_cast<EnvLock*>(lock);
    IOStatus s;
    if (l->posix != nullptr) s = rocksdb::FileSystem::Default()->UnlockFile(l->posix, o, d);
    {
      MutexLock g(&Locks().mu);
      Locks().held.erase(l->path);
    }
    delete l;
    return s;
  }
  IOStatus GetTestDirectory(const IOOptions&, std::string* path, IODebugContext*) override {
    *path = "/tmp";
    return IOStatus::OK();
  }
  IOStatus NewLogger(const std::string&, const IOOptions&, std::shared_ptr<rocksdb::Logger>* result,
                     IODebugContext*) override {
    *result = NewSpdlogRocksLogger();
    return IOStatus::OK();
  }
  IOStatus GetAbsolutePath(const std::string& db_path, const IOOptions&, std::string* out,
                           IODebugContext*) override {
    if (!db_path.empty() && db_path[0] == '/') {
      *out = db_path;
      return IOStatus::OK();
    }
    char buf[4096];
    if (::getcwd(buf, sizeof buf) == nullptr) return IOStatus::IOError("getcwd failed");
    *out = std::string(buf) + "/" + db_path;
    return IOStatus::OK();
  }
  IOStatus IsDirectory(const std::string& path, const IOOptions&, bool* is_dir, IODebugContext*) override {
    if (!env_->FileExists(path)) return IOStatus::PathNotFound(path);
    *is_dir = env_->GetChildren(path).ok();
    return IOStatus::OK();
  }

 private:
  Env* env_;
  EnvFileSystemOptions o_;
  FreezeHook freezer_;
};

class SpdlogRocksLogger final : public rocksdb::Logger {
 public:
  SpdlogRocksLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::DEBUG_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    spdlog::level::level_enum l = spdlog::level::debug;
    switch (level) {
      case rocksdb::InfoLogLevel::DEBUG_LEVEL:
        l = spdlog::level::trace;
        break;
      case rocksdb::InfoLogLevel::INFO_LEVEL:
      case rocksdb::InfoLogLevel::HEADER_LEVEL:
        l = spdlog::level::debug;
        break;
      case rocksdb::InfoLogLevel::WARN_LEVEL:
        l = spdlog::level::warn;
        break;
      default:
        l = spdlog::level::err;
        break;
    }
    if (!spdlog::should_log(l)) return;
    char buf[1024];
    std::vsnprintf(buf, sizeof buf, format, ap);
    spdlog::log(l, "rocksdb: {}", buf);
  }
};

class ShortSleepClock final : public rocksdb::SystemClockWrapper {
 public:
  explicit ShortSleepClock(const std::shared_ptr<rocksdb::SystemClock>& t) : rocksdb::SystemClockWrapper(t) {}
  const char* Name() const override { return "PrimecacheShortSleepClock"; }
  void SleepForMicroseconds(int micros) override { target_->SleepForMicroseconds(std::min(micros, 1000)); }
};

class ShortSleepEnv final : public rocksdb::EnvWrapper {
 public:
  explicit ShortSleepEnv(std::unique_ptr<rocksdb::Env> t) : rocksdb::EnvWrapper(std::move(t)) {
    system_clock_ = std::make_shared<ShortSleepClock>(system_clock_);
  }
  const char* Name() const override { return "PrimecacheShortSleepEnv"; }
  void SleepForMicroseconds(int micros) override { target()->SleepForMicroseconds(std::min(micros, 1000)); }
};

}  // namespace

std::unique_ptr<rocksdb::Env> NewRocksEnv(const std::shared_ptr<rocksdb::FileSystem>& fs, bool short_sleeps) {
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  if (short_sleeps) env = std::make_unique<ShortSleepEnv>(std::move(env));
  return env;
}

std::shared_ptr<rocksdb::FileSystem> NewEnvFileSystem(Env* env, EnvFileSystemOptions options) {
  return std::make_shared<EnvFileSystem>(env, std::move(options));
}

std::shared_ptr<rocksdb::Logger> NewSpdlogRocksLogger() {
  return std::make_shared<SpdlogRocksLogger>();
}

Status FromRocks(const rocksdb::Status& s, std::string_view context) {
  if (s.ok()) return Status::Ok();
  std::string msg(context);
  msg += ": ";
  msg += s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) return Status::Corruption(std::move(msg));
  if (s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit)
    return Status::ResourceExhausted(std::move(msg));
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(msg));
  if (s.IsNotSupported()) return Status::NotSupported(std::move(msg));
  if (s.IsBusy() || s.IsTryAgain()) return Status::Unavailable(std::move(msg));
  if (s.IsAborted()) return Status::Aborted(std::move(msg));
  return Status::IOError(std::move(msg));
}

}  // namespace primecache::statestore_internal

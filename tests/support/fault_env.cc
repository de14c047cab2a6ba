// FaultInjectionEnv: an Env wrapper that counts, fails and "crashes".
#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/fault_env.h"

namespace primecache {
namespace {

std::string_view OpName(FaultOp op) {
  switch (op) {
    case FaultOp::kRead: return "read";
    case FaultOp::kWrite: return "write";
    case FaultOp::kSync: return "sync";
    case FaultOp::kRename: return "rename";
  }
  return "?";
}

// What the wrapper knows of one file written through it.
struct FileInfo {
  std::uint64_t size = 0;    // bytes appended so far
  std::uint64_t synced = 0;  // bytes known durable
};

// A directory change not yet made durable by SyncDir.
struct DirOp {
  enum Kind { kCreate, kRename } kind;
  std::string dir;  // the directory whose sync makes this durable
  std::string from, to;
  std::optional<std::string> overwritten;  // durable content `to` had before a rename
};

}  // namespace

struct FaultInjectionEnv::State {
  Env* base;
  std::mutex mu;
  std::array<std::uint64_t, kFaultOpCount> counts{};
  std::array<std::uint64_t, kFaultOpCount> fail_at{};  // 0: no fault armed
  std::uint64_t fail_sync_after_at = 0;                // FailNthSyncAfterIt's sync; 0: none
  std::optional<std::string> corrupt_next;  // CorruptNextWrite's path part
  std::optional<std::string> corrupt_read;  // CorruptNextRead's path part
  std::optional<std::string> page_cache;    // MapAsPageCache's path part
  // The live mappings made as the Env's own copies: path -> their bytes.
  std::multimap<std::string, std::weak_ptr<std::string>> copies;

  // Whether this read of `path` is the one to corrupt (then disarmed).
  bool TakeCorruptRead(const std::string& path) {
    std::lock_guard lock(mu);
    if (!corrupt_read || path.find(*corrupt_read) == std::string::npos) return false;
    corrupt_read.reset();
    return true;
  }
  std::optional<std::uint64_t> space_limit;
  std::optional<std::uint64_t> disk_size;
  std::uint64_t bytes_written = 0;
  std::map<std::string, std::shared_ptr<FileInfo>> files;
  std::vector<DirOp> pending;

  std::uint64_t LiveBytesLocked() const {
    std::uint64_t n = 0;
    for (const auto& [path, info] : files) n += info->size;
    return n;
  }

  // Counts one operation; returns the injected error when it is the armed one.
  Status Tick(FaultOp op, const std::string& what) {
    std::lock_guard lock(mu);
    return TickLocked(op, what);
  }
  Status TickLocked(FaultOp op, const std::string& what) {
    auto i = static_cast<std::size_t>(op);
    ++counts[i];
    if (fail_at[i] != 0 && counts[i] == fail_at[i]) {
      fail_at[i] = 0;
      return Status::IOError("injected fault: " + std::string(OpName(op)) + " #" +
                             std::to_string(counts[i]) + " on " + what);
    }
    return Status::Ok();
  }
  // After a sync that took effect: the error FailNthSyncAfterIt armed for it.
  Status AfterSyncLocked(const std::string& what) {
    const std::uint64_t n = counts[static_cast<std::size_t>(FaultOp::kSync)];
    if (fail_sync_after_at == 0 || n != fail_sync_after_at) return Status::Ok();
    fail_sync_after_at = 0;
    return Status::IOError("injected fault: sync #" + std::to_string(n) + " on " + what +
                           " reported an error after it took effect");
  }
};

namespace {

using State = FaultInjectionEnv::State;

class FaultSequentialFile final : public SequentialFile {
 public:
  FaultSequentialFile(std::shared_ptr<State> st, std::string path, std::unique_ptr<SequentialFile> f)
      : st_(std::move(st)), path_(std::move(path)), f_(std::move(f)) {}
  Status Read(std::span<std::byte> dst, std::size_t* read) override {
    *read = 0;
    PC_RETURN_IF_ERROR(st_->Tick(FaultOp::kRead, path_));
    return f_->Read(dst, read);
  }
  Status Skip(std::uint64_t n) override { return f_->Skip(n); }

 private:
  std::shared_ptr<State> st_;
  std::string path_;
  std::unique_ptr<SequentialFile> f_;
};

class FaultRandomAccessFile final : public RandomAccessFile {
 public:
  FaultRandomAccessFile(std::shared_ptr<State> st, std::string path, std::unique_ptr<RandomAccessFile> f)
      : st_(std::move(st)), path_(std::move(path)), f_(std::move(f)) {}
  Status Read(std::uint64_t offset, std::span<std::byte> dst, std::size_t* read) const override {
    *read = 0;
    PC_RETURN_IF_ERROR(st_->Tick(FaultOp::kRead, path_));
    PC_RETURN_IF_ERROR(f_->Read(offset, dst, read));
    if (*read != 0 && st_->TakeCorruptRead(path_)) dst[*read - 1] ^= std::byte{0x20};
    return Status::Ok();
  }
  Result<MappedRegion> Map(std::uint64_t size) const override {
    PC_RETURN_IF_ERROR(st_->Tick(FaultOp::kRead, path_));
    PC_ASSIGN_OR_RETURN(MappedRegion m, f_->Map(size));
    std::lock_guard lock(st_->mu);
    if (!st_->page_cache || path_.find(*st_->page_cache) == std::string::npos) return m;
    // The Env's own bytes, which ReadBackMappedPages may change in place.
    auto copy = std::make_shared<std::string>(reinterpret_cast<const char*>(m.data), m.size);
    st_->copies.emplace(path_, copy);
    m.data = reinterpret_cast<const std::byte*>(copy->data());
    m.owner = std::move(copy);
    return m;
  }
  std::size_t alignment() const override { return f_->alignment(); }

 private:
  std::shared_ptr<State> st_;
  std::string path_;
  std::unique_ptr<RandomAccessFile> f_;
};

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(std::shared_ptr<State> st, std::string path, std::shared_ptr<FileInfo> info,
                    std::unique_ptr<WritableFile> f)
      : st_(std::move(st)), path_(std::move(path)), info_(std::move(info)), f_(std::move(f)) {}

  Status Append(std::span<const std::byte> data) override {
    std::lock_guard lock(st_->mu);
    PC_RETURN_IF_ERROR(st_->TickLocked(FaultOp::kWrite, path_));
    if ((st_->space_limit && st_->bytes_written + data.size() > *st_->space_limit) ||
        (st_->disk_size && st_->LiveBytesLocked() + data.size() > *st_->disk_size)) {
      return Status::ResourceExhausted("no space left on device (injected) writing " + path_);
    }
    if (st_->corrupt_next && !data.empty() && path_.find(*st_->corrupt_next) != std::string::npos) {
      st_->corrupt_next.reset();
      std::vector<std::byte> flipped(data.begin(), data.end());
      flipped.back() ^= std::byte{0x20};
      PC_RETURN_IF_ERROR(f_->Append(flipped));
    } else {
      PC_RETURN_IF_ERROR(f_->Append(data));
    }
    st_->bytes_written += data.size();
    info_->size += data.size();
    return Status::Ok();
  }

  Status Sync() override {
    std::lock_guard lock(st_->mu);
    PC_RETURN_IF_ERROR(st_->TickLocked(FaultOp::kSync, path_));
    PC_RETURN_IF_ERROR(f_->Sync());
    info_->synced = info_->size;
    return st_->AfterSyncLocked(path_);
  }

  Status StartWriteback(std::uint64_t offset, std::uint64_t n) override {
    return f_->StartWriteback(offset, n);  // not a durability point: nothing to track
  }
  Status Close() override { return f_->Close(); }

 private:
  std::shared_ptr<State> st_;
  std::string path_;
  std::shared_ptr<FileInfo> info_;
  std::unique_ptr<WritableFile> f_;
};

// Replaces a file's content with its first `keep` bytes, through the base Env.
Status CutFile(Env* base, const std::string& path, std::uint64_t keep) {
  PC_ASSIGN_OR_RETURN(std::string data, ReadFileToString(base, path));
  if (data.size() <= keep) return Status::Ok();
  data.resize(keep);
  PC_ASSIGN_OR_RETURN(auto f, base->NewWritableFile(path));
  PC_RETURN_IF_ERROR(f->Append({reinterpret_cast<const std::byte*>(data.data()), data.size()}));
  PC_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

Status WriteWhole(Env* base, const std::string& path, const std::string& data) {
  PC_ASSIGN_OR_RETURN(auto f, base->NewWritableFile(path));
  PC_RETURN_IF_ERROR(f->Append({reinterpret_cast<const std::byte*>(data.data()), data.size()}));
  PC_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

}  // namespace

FaultInjectionEnv::FaultInjectionEnv(Env* base) : state_(std::make_shared<State>()) { state_->base = base; }
FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::FailNth(FaultOp op, std::uint64_t n) {
  std::lock_guard lock(state_->mu);
  auto i = static_cast<std::size_t>(op);
  state_->fail_at[i] = n == 0 ? 0 : state_->counts[i] + n;
}

void FaultInjectionEnv::FailNthSyncAfterIt(std::uint64_t n) {
  std::lock_guard lock(state_->mu);
  state_->fail_sync_after_at = n == 0 ? 0 : state_->counts[static_cast<std::size_t>(FaultOp::kSync)] + n;
}

void FaultInjectionEnv::CorruptNextWrite(std::string path_part) {
  std::lock_guard lock(state_->mu);
  state_->corrupt_next = std::move(path_part);
}

void FaultInjectionEnv::CorruptNextRead(std::string path_part) {
  std::lock_guard lock(state_->mu);
  state_->corrupt_read = std::move(path_part);
}

void FaultInjectionEnv::MapAsPageCache(std::string path_part) {
  std::lock_guard lock(state_->mu);
  state_->page_cache = std::move(path_part);
}

Status FaultInjectionEnv::ReadBackMappedPages(const std::string& path_part) {
  std::lock_guard lock(state_->mu);
  for (auto it = state_->copies.begin(); it != state_->copies.end();) {
    auto copy = it->second.lock();
    if (!copy) {
      it = state_->copies.erase(it);
      continue;
    }
    if (it->first.find(path_part) != std::string::npos) {
      PC_ASSIGN_OR_RETURN(std::string now, ReadFileToString(state_->base, it->first));
      // Byte by byte, only where they differ: holders may be reading the
      // bytes that stay the same meanwhile.
      for (std::size_t i = 0; i < copy->size() && i < now.size(); ++i) {
        if ((*copy)[i] != now[i]) (*copy)[i] = now[i];
      }
    }
    ++it;
  }
  return Status::Ok();
}

void FaultInjectionEnv::ClearFaults() {
  std::lock_guard lock(state_->mu);
  state_->fail_at = {};
  state_->fail_sync_after_at = 0;
  state_->corrupt_next.reset();
  state_->corrupt_read.reset();
  state_->page_cache.reset();
}

void FaultInjectionEnv::SetSpaceLimit(std::uint64_t bytes) {
  std::lock_guard lock(state_->mu);
  state_->space_limit = bytes;
}

void FaultInjectionEnv::ClearSpaceLimit() {
  std::lock_guard lock(state_->mu);
  state_->space_limit.reset();
}

void FaultInjectionEnv::SetDiskSize(std::uint64_t bytes) {
  std::lock_guard lock(state_->mu);
  state_->disk_size = bytes;
}

void FaultInjectionEnv::ClearDiskSize() {
  std::lock_guard lock(state_->mu);
  state_->disk_size.reset();
}

std::uint64_t FaultInjectionEnv::LiveBytes() const {
  std::lock_guard lock(state_->mu);
  return state_->LiveBytesLocked();
}

std::uint64_t FaultInjectionEnv::OpCount(FaultOp op) const {
  std::lock_guard lock(state_->mu);
  return state_->counts[static_cast<std::size_t>(op)];
}

std::uint64_t FaultInjectionEnv::BytesWritten() const {
  std::lock_guard lock(state_->mu);
  return state_->bytes_written;
}

Status FaultInjectionEnv::SimulateCrash() {
  std::lock_guard lock(state_->mu);
  Env* base = state_->base;
  // Undo directory changes that were never synced, newest first.
  for (auto it = state_->pending.rbegin(); it != state_->pending.rend(); ++it) {
    if (it->kind == DirOp::kCreate) {
      if (base->FileExists(it->to)) PC_RETURN_IF_ERROR(base->RemoveFile(it->to));
      state_->files.erase(it->to);
    } else {
      if (base->FileExists(it->to)) {
        PC_RETURN_IF_ERROR(base->RenameFile(it->to, it->from));
        auto f = state_->files.find(it->to);
        if (f != state_->files.end()) {
          state_->files[it->from] = f->second;
          state_->files.erase(f);
        }
      }
      if (it->overwritten) PC_RETURN_IF_ERROR(WriteWhole(base, it->to, *it->overwritten));
    }
  }
  state_->pending.clear();
  // Cut every surviving file back to what was synced.
  for (auto& [path, info] : state_->files) {
    if (base->FileExists(path)) PC_RETURN_IF_ERROR(CutFile(base, path, info->synced));
    info->size = info->synced;
  }
  return Status::Ok();
}

Result<std::unique_ptr<SequentialFile>> FaultInjectionEnv::NewSequentialFile(const std::string& path) {
  PC_ASSIGN_OR_RETURN(auto f, state_->base->NewSequentialFile(path));
  return std::unique_ptr<SequentialFile>(new FaultSequentialFile(state_, path, std::move(f)));
}

Result<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewRandomAccessFile(const std::string& path) {
  PC_ASSIGN_OR_RETURN(auto f, state_->base->NewRandomAccessFile(path));
  return std::unique_ptr<RandomAccessFile>(new FaultRandomAccessFile(state_, path, std::move(f)));
}

Result<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewDirectRandomAccessFile(const std::string& path) {
  PC_ASSIGN_OR_RETURN(auto f, state_->base->NewDirectRandomAccessFile(path));
  return std::unique_ptr<RandomAccessFile>(new FaultRandomAccessFile(state_, path, std::move(f)));
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  std::lock_guard lock(state_->mu);
  bool existed = state_->base->FileExists(path);
  PC_ASSIGN_OR_RETURN(auto f, state_->base->NewWritableFile(path));
  auto info = std::make_shared<FileInfo>();  // truncated: nothing is left to keep
  state_->files[path] = info;
  if (!existed) state_->pending.push_back({DirOp::kCreate, DirName(path), "", path, std::nullopt});
  return std::unique_ptr<WritableFile>(new FaultWritableFile(state_, path, std::move(info), std::move(f)));
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewAppendableFile(const std::string& path) {
  std::lock_guard lock(state_->mu);
  bool existed = state_->base->FileExists(path);
  PC_ASSIGN_OR_RETURN(auto f, state_->base->NewAppendableFile(path));
  auto& info = state_->files[path];
  if (!info) {
    info = std::make_shared<FileInfo>();
    if (existed) {
      PC_ASSIGN_OR_RETURN(std::uint64_t size, state_->base->GetFileSize(path));
      info->size = info->synced = size;  // what was there before we saw it counts as durable
    }
  }
  if (!existed) state_->pending.push_back({DirOp::kCreate, DirName(path), "", path, std::nullopt});
  return std::unique_ptr<WritableFile>(new FaultWritableFile(state_, path, info, std::move(f)));
}

bool FaultInjectionEnv::FileExists(const std::string& path) { return state_->base->FileExists(path); }

Result<std::vector<std::string>> FaultInjectionEnv::GetChildren(const std::string& dir) {
  return state_->base->GetChildren(dir);
}

Result<std::uint64_t> FaultInjectionEnv::GetFileSize(const std::string& path) {
  return state_->base->GetFileSize(path);
}

Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  std::lock_guard lock(state_->mu);
  PC_RETURN_IF_ERROR(state_->base->RemoveFile(path));
  state_->files.erase(path);
  return Status::Ok();
}

Result<FileMode> FaultInjectionEnv::GetFileMode(const std::string& path) {
  return state_->base->GetFileMode(path);
}
Status FaultInjectionEnv::SetPermissions(const std::string& path, std::uint32_t permissions) {
  return state_->base->SetPermissions(path, permissions);
}

bool FaultInjectionEnv::IsResident(const MappedRegion& mapping, std::uint64_t offset, std::uint64_t length) {
  return state_->base->IsResident(mapping, offset, length);
}

Status FaultInjectionEnv::TruncateFile(const std::string& path, std::uint64_t size) {
  std::lock_guard lock(state_->mu);
  PC_RETURN_IF_ERROR(state_->TickLocked(FaultOp::kWrite, path));
  PC_RETURN_IF_ERROR(state_->base->TruncateFile(path, size));
  auto it = state_->files.find(path);
  if (it != state_->files.end()) {
    it->second->size = std::min(it->second->size, size);
    it->second->synced = std::min(it->second->synced, size);
  }
  return Status::Ok();
}

Status FaultInjectionEnv::CreateDir(const std::string& path) { return state_->base->CreateDir(path); }
Status FaultInjectionEnv::RemoveDir(const std::string& path) { return state_->base->RemoveDir(path); }

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  std::lock_guard lock(state_->mu);
  PC_RETURN_IF_ERROR(state_->TickLocked(FaultOp::kRename, from + " -> " + to));
  std::optional<std::string> overwritten;
  if (state_->base->FileExists(to)) {
    PC_ASSIGN_OR_RETURN(std::string old, ReadFileToString(state_->base, to));
    auto known = state_->files.find(to);
    if (known != state_->files.end() && old.size() > known->second->synced) old.resize(known->second->synced);
    overwritten = std::move(old);
  }
  PC_RETURN_IF_ERROR(state_->base->RenameFile(from, to));
  auto f = state_->files.find(from);
  if (f != state_->files.end()) {
    state_->files[to] = f->second;
    state_->files.erase(f);
  } else {
    state_->files.erase(to);
  }
  state_->pending.push_back({DirOp::kRename, DirName(to), from, to, std::move(overwritten)});
  return Status::Ok();
}

Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  std::lock_guard lock(state_->mu);
  PC_RETURN_IF_ERROR(state_->TickLocked(FaultOp::kSync, dir));
  PC_RETURN_IF_ERROR(state_->base->SyncDir(dir));
  std::string d = DirName(dir + "/x");  // the same normalisation DirName gives entries
  std::erase_if(state_->pending, [&](const DirOp& op) { return op.dir == d; });
  return state_->AfterSyncLocked(dir);
}

}  // namespace primecache

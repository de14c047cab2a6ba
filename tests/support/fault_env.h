// FaultInjectionEnv: an Env for tests that fails chosen operations, runs out
// of space, corrupts a write or a read, and forgets unsynced writes as a power
// loss would. Test machinery, kept with the tests (library
// primecache_test_support), as LevelDB and RocksDB keep their fault-injection
// Envs; nothing that ships links it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "primecache/internal/env.h"
#include "primecache/status.h"

namespace primecache {

// The operations a FaultInjectionEnv counts and can fail.
enum class FaultOp : std::uint8_t { kRead = 0, kWrite, kSync, kRename };
inline constexpr int kFaultOpCount = 4;

// Wraps another Env and injects faults:
//  - FailNth(op, n): the n-th operation of that kind from now (1-based) fails
//    with kIOError and has no effect;
//  - FailNthSyncAfterIt(n): the n-th sync from now (of a file or a
//    directory) takes effect and then fails with kIOError, as an fsync whose
//    data reached the disk though it reported an error: the caller cannot
//    tell a write that failed from one that is durable;
//  - SetSpaceLimit(bytes): appends that would take the bytes written through
//    this Env past the limit fail with kResourceExhausted ("no space left");
//  - SetDiskSize(bytes): a disk of that size: appends fail the same way when
//    the files written through this Env that still exist would take more,
//    so removing files frees space again;
//  - CorruptNextWrite(part): the next append to a file whose path contains
//    `part` stores its data with the last byte flipped and succeeds (a disk,
//    or a writer of the memory it came from, that stored other bytes than
//    the caller checked);
//  - CorruptNextRead(part): the next positional read of such a file returns
//    its bytes with the last one flipped (a transient fault: the file is
//    intact and a second read is right);
//  - MapAsPageCache(part): mappings of files whose path contains `part`
//    made from now on are the Env's own copies of the file's bytes, standing
//    for the page cache; ReadBackMappedPages(part) then refreshes every live
//    one from the file's bytes as they are now, as pages dropped from the
//    page cache and read again from a disk that holds other bytes show
//    through every mapping of the file (the mapping's bytes change under its
//    holders; only bytes that differ are written);
//  - SimulateCrash(): the machine loses power. Every file written through
//    this Env is cut back to its last synced length, and directory entries
//    created or renamed since their directory's last SyncDir are undone
//    (removals are taken as durable at once).
// Counts of every operation are kept, so a test can first count a workload's
// operations and then fail each one in turn.
// Thread-safety: all methods may be called from many threads.
class FaultInjectionEnv : public Env {
 public:
  explicit FaultInjectionEnv(Env* base);
  ~FaultInjectionEnv() override;

  void FailNth(FaultOp op, std::uint64_t n);
  void FailNthSyncAfterIt(std::uint64_t n);
  void CorruptNextWrite(std::string path_part);
  void CorruptNextRead(std::string path_part);
  void MapAsPageCache(std::string path_part);
  Status ReadBackMappedPages(const std::string& path_part);
  void ClearFaults();
  void SetSpaceLimit(std::uint64_t bytes);
  void ClearSpaceLimit();
  void SetDiskSize(std::uint64_t bytes);
  void ClearDiskSize();
  // The bytes of the files written through this Env that still exist.
  std::uint64_t LiveBytes() const;
  std::uint64_t OpCount(FaultOp op) const;
  std::uint64_t BytesWritten() const;
  Status SimulateCrash();

  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  Result<std::unique_ptr<RandomAccessFile>> NewDirectRandomAccessFile(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  bool FileExists(const std::string& path) override;
  Result<std::vector<std::string>> GetChildren(const std::string& dir) override;
  Result<std::uint64_t> GetFileSize(const std::string& path) override;
  Status RemoveFile(const std::string& path) override;
  Status CreateDir(const std::string& path) override;
  Status RemoveDir(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  Result<FileMode> GetFileMode(const std::string& path) override;
  Status SetPermissions(const std::string& path, std::uint32_t permissions) override;
  // Counted and failed as a write; the file's synced length shrinks with it.
  Status TruncateFile(const std::string& path, std::uint64_t size) override;
  bool IsResident(const MappedRegion& mapping, std::uint64_t offset, std::uint64_t length) override;

  struct State;  // shared with the file wrappers; defined in the .cc

 private:
  std::shared_ptr<State> state_;
};

}  // namespace primecache

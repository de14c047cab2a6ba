// Env: the seam through which primecache touches the file system.
//
// Every file and directory operation of the store, the codecs' file container
// and the tools goes through an Env, so tests can swap the real file system for
// an in-memory one (NewMemEnv) or wrap either in an Env of their own that
// fails chosen operations, runs out of space, or forgets unsynced writes as a
// power loss would.
//
// Files are private to the process's user: the POSIX Env creates every file
// 0600 and every directory 0700 (a umask can only take more away), so what
// primecache writes (the store, RocksDB's own files included, exports) is
// never readable by other local users.
//
// Thread-safety: Env implementations are safe to call from many threads at
// once. A file object is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/status.h"

namespace primecache {

// A file read front to back.
// Read-only mapped bytes of a file; unmapped when the last holder of `owner`
// lets go. `id` is unique among mappings alive at once (a process-wide
// counter), so a table of mappings can be keyed by it.
struct MappedRegion {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  std::uint64_t id = 0;
  std::shared_ptr<const void> owner;
  // Which file it maps, unique in the process (0: not said). A longer
  // mapping of a file that grew has a new id but the same `file`, so that
  // what is counted per file (a device registration budget) counts it once.
  std::uint64_t file = 0;
};

// A mapping's pages held pinned in memory (registered with a device driver,
// say) while `hold` is held: they can be neither dropped nor read back from
// the disk meanwhile. `serial` is unique to one pinning of one mapping: a
// mapping unpinned and pinned again gets another. Empty (serial 0): not
// pinned.
struct MappingPin {
  std::uint64_t serial = 0;
  std::shared_ptr<const void> hold;
};

class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to dst.size() bytes; *read < dst.size() only at end of file.
  virtual Status Read(std::span<std::byte> dst, std::size_t* read) = 0;
  virtual Status Skip(std::uint64_t n) = 0;
};

// A file read at arbitrary offsets. Read is safe from many threads at once.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to dst.size() bytes at offset; *read < dst.size() only at end of file.
  virtual Status Read(std::uint64_t offset, std::span<std::byte> dst, std::size_t* read) const = 0;
  // Maps the file's first `size` bytes read-only (they must exist). The
  // mapping outlives the file object while its owner is held. kNotSupported
  // where an Env cannot map.
  virtual Result<MappedRegion> Map(std::uint64_t size) const;
  // 0: any offset, length and buffer will do. Else (a file opened for direct
  // I/O) every Read's offset, length and buffer address must be multiples.
  virtual std::size_t alignment() const { return 0; }
};

// A fresh id for a MappedRegion (process-wide, from 1).
std::uint64_t NextMappingId();

// A file written by appending. Data is durable only once Sync returns OK, and
// a new file's name only once its directory has been synced (Env::SyncDir).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::span<const std::byte> data) = 0;
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
  // Starts writing [offset, offset + n) of what was appended back to the
  // disk without waiting, so that a later Sync has less left to do. Not a
  // durability point; a no-op where an Env has nothing to start.
  virtual Status StartWriteback(std::uint64_t offset, std::uint64_t n) {
    (void)offset, (void)n;
    return Status::Ok();
  }
};

// What a path is, and its permission bits (0777), as lstat sees it.
struct FileMode {
  enum class Kind : std::uint8_t { kFile, kDirectory, kOther };  // kOther: links, sockets, devices
  Kind kind = Kind::kOther;
  std::uint32_t permissions = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  virtual Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) = 0;
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) = 0;
  // Opened for reads that bypass the page cache (O_DIRECT) where the Env and
  // the file system can; else as NewRandomAccessFile. See alignment().
  virtual Result<std::unique_ptr<RandomAccessFile>> NewDirectRandomAccessFile(const std::string& path) {
    return NewRandomAccessFile(path);
  }
  // Creates the file, or truncates it when it exists.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Opens for appending, creating it when it does not exist.
  virtual Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) = 0;

  virtual bool FileExists(const std::string& path) = 0;
  // Names (not paths) of the entries of dir, without "." and "..", sorted.
  virtual Result<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual Result<std::uint64_t> GetFileSize(const std::string& path) = 0;
  virtual Status RemoveFile(const std::string& path) = 0;
  // Creates one directory; OK when it exists already.
  virtual Status CreateDir(const std::string& path) = 0;
  virtual Status RemoveDir(const std::string& path) = 0;
  // Atomically replaces `to` with `from`.
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames) durable.
  virtual Status SyncDir(const std::string& dir) = 0;

  // The kind and permissions of a path, not following a final symbolic
  // link. kNotSupported where the Env keeps no permissions (the in-memory
  // Env: nobody else can see it).
  virtual Result<FileMode> GetFileMode(const std::string& path);
  // Sets a file's or directory's permission bits (0777).
  virtual Status SetPermissions(const std::string& path, std::uint32_t permissions);
  // Cuts a file to its first `size` bytes (a longer size is refused). A file
  // open for appending goes on appending at the new end. Durable once the
  // file is synced. kNotSupported where an Env cannot.
  virtual Status TruncateFile(const std::string& path, std::uint64_t size);
  // Whether [offset, offset + length) of a mapping is in memory now, so that
  // reading it will not wait for a disk (POSIX: mincore). The default says
  // yes: an Env whose files are memory.
  virtual bool IsResident(const MappedRegion& mapping, std::uint64_t offset, std::uint64_t length);

  // The process-wide POSIX Env. Never deleted.
  static Env* Default();
};

// An Env that keeps everything in memory; a fresh, empty file system.
std::unique_ptr<Env> NewMemEnv();

// The directory part of a path ("a/b" -> "a", "b" -> ".", "/b" -> "/").
std::string DirName(std::string_view path);

// Creates path and any missing parents.
Status CreateDirs(Env* env, const std::string& path);

// Reads a whole file.
Result<std::string> ReadFileToString(Env* env, const std::string& path);

// A path whose group or other permission bits were taken away.
struct TightenedPath {
  std::string path;
  std::uint32_t old_permissions = 0;
  std::uint32_t new_permissions = 0;
};

// Makes `path` and, when it is a directory and `recursive`, every file and
// directory under it private to the owner: their group and other bits are
// cleared (0755 -> 0700, 0644 -> 0600). Symbolic links and special files
// (sockets) are left as they are and never followed; at most 16 directory
// levels are walked. Returns what changed (nothing on an Env that keeps no
// permissions).
Result<std::vector<TightenedPath>> RestrictToOwner(Env* env, const std::string& path, bool recursive = true);
// For a log line: "2 paths: /d 0755 -> 0700, /d/f 0644 -> 0600" (the first few).
std::string DescribeTightened(const std::vector<TightenedPath>& changed);

// The default data directory of primecache's tools and daemon:
// $XDG_DATA_HOME/primecache, else $HOME/.local/share/primecache.
Result<std::string> DefaultDataDir();

// Writes a whole file so that after a crash the path holds either its old
// content or `data`, never a torn mix: temp file, sync, rename, sync directory.
Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data);

}  // namespace primecache

// Segment files: where a schema-3 store keeps its chunk bytes.
//
// `<store>/segments/<16 hex digits>.seg` is append-only: a 32-byte header,
// then frames, each a 40-byte header and the chunk's bytes (no padding).
// Byte layouts: docs/format-store.md ("Segment files"). A segment's durable
// length is recorded in the segments column family; bytes past it are the
// torn tail of publishes that never committed, cut at the next open.
//
// Every file access goes through primecache::Env.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "primecache/checksum.h"
#include "primecache/internal/env.h"
#include "primecache/status.h"
#include "statestore/test_hooks.h"

namespace primecache::statestore_internal {

inline constexpr std::uint64_t kSegmentHeaderBytes = 32;
inline constexpr std::uint64_t kFrameHeaderBytes = 40;
inline constexpr const char* kSegmentDir = "segments";

// The bytes a chunk of `size` takes in a segment (frame header included).
inline std::uint64_t FrameBytes(std::uint64_t size) {
  return kFrameHeaderBytes + size;
}

std::string SegmentFileName(std::uint64_t id);  // "000000000000002a.seg"
// The id a segment file name stands for; nullopt when it is no segment name.
std::optional<std::uint64_t> SegmentIdFromName(std::string_view name);
std::string SegmentHex(std::uint64_t id);  // the 16 hex digits, for messages

std::string EncodeSegmentHeader(std::uint64_t id);
Status CheckSegmentHeader(std::string_view bytes, std::uint64_t id);

struct FrameHeader {
  Hash128 hash;
  std::uint64_t size = 0;
};
std::string EncodeFrameHeader(const FrameHeader& f);
// Refuses a wrong magic, a bad checksum and a size past max_size.
Result<FrameHeader> DecodeFrameHeader(std::string_view bytes, std::uint64_t max_size);

// Reads [offset, offset + dst.size()) of a file into dst. A file opened for
// direct I/O (alignment() > 0) is read over the aligned range around it
// into an aligned buffer, then copied out. *read < dst.size() only at the
// end of the file.
Status ReadAt(const RandomAccessFile& f, std::uint64_t offset, std::span<std::byte> dst, std::size_t* read);

// One segment being appended to. Frames are gathered in a buffer and written
// in large appends, and writeback of every 8 MiB written is started at once
// (so the disk works while more arrives); Sync writes what is buffered and
// makes it durable (fdatasync). A failed write or sync leaves the writer broken: its file is
// never appended to again in this process (the next open cuts what follows
// the committed length).
// Thread-safety: used by one thread at a time (it is handed out exclusively).
class SegmentWriter {
 public:
  // A new segment file (header written, directory synced); fails when the
  // file exists. `freeze` (tests): a frozen disk fails every write.
  static Result<std::unique_ptr<SegmentWriter>> Create(Env* env, const std::string& dir, std::uint64_t id,
                                                       FreezeHook freeze);
  // An existing segment whose durable length is `committed` (already cut to it).
  static Result<std::unique_ptr<SegmentWriter>> Reopen(Env* env, const std::string& dir, std::uint64_t id,
                                                       std::uint64_t committed,
                                                       FreezeHook freeze);
  ~SegmentWriter();

  std::uint64_t id() const { return id_; }
  std::uint64_t end() const { return end_; }  // the offset after the last byte appended
  std::uint64_t committed() const { return committed_; }
  bool broken() const { return broken_; }
  bool fresh() const { return fresh_; }  // created in this process, never committed

  // Appends one frame; returns the offset of the chunk's bytes.
  Result<std::uint64_t> Append(const Hash128& hash, std::span<const std::byte> bytes);
  // Writes what is buffered (not a durability point).
  Status WriteOut() { return FlushBuffer(); }
  // Writes what is buffered and makes every appended byte durable.
  Status Sync();
  // Forgets what was appended since the last commit (an aborted publish):
  // the buffer is dropped and the file cut back to its committed length
  // (a fresh segment to its header), so the space comes back at once. Also
  // when the writer is broken (a write failed, say on a full disk): it is
  // cut all the same and stays broken.
  Status Rewind();
  // The metadata batch recording end() as the committed length was written.
  void MarkCommitted() {
    committed_ = end_;
    fresh_ = false;
  }
  Status Close();

 private:
  SegmentWriter(Env* env, std::string path, std::uint64_t id, std::unique_ptr<WritableFile> file,
                std::uint64_t end, FreezeHook freeze);
  Status Write(std::span<const std::byte> bytes);
  Status FlushBuffer();
  Status CutBroken(std::uint64_t keep);
  void Kick(std::uint64_t written);
  Status Frozen();

  Env* env_;
  std::string path_;
  std::uint64_t id_;
  std::unique_ptr<WritableFile> file_;
  std::uint64_t end_;
  std::uint64_t committed_;
  std::uint64_t kicked_ = 0;  // writeback started up to here
  std::string buf_;
  bool broken_ = false;
  bool fresh_ = false;
  FreezeHook freeze_;
};

}  // namespace primecache::statestore_internal

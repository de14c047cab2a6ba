#include "statestore/segments.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "statestore/format.h"
#include "statestore/kill_point.h"

namespace primecache::statestore_internal {
namespace {

constexpr std::uint64_t kSegmentMagic = 0x544E4D4745534350ull;  // "PCSEGMNT"
constexpr std::uint32_t kSegmentVersion = 1;
constexpr std::uint32_t kFrameMagic = 0x52464350;  // "PCFR"
// Frames up to this size are gathered in the buffer; larger chunks are
// written by themselves (already a large write).
constexpr std::size_t kBufferBytes = 1u << 20;
// Writeback is started after every this many bytes written.
constexpr std::uint64_t kKickBytes = 8u << 20;

std::uint64_t LE64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
std::uint32_t LE32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

}  // namespace

std::string SegmentHex(std::uint64_t id) {
  return HexDigits(id);
}

std::string SegmentFileName(std::uint64_t id) {
  return SegmentHex(id) + ".seg";
}

std::optional<std::uint64_t> SegmentIdFromName(std::string_view name) {
  if (name.size() != 20 || name.substr(16) != ".seg") return std::nullopt;
  std::uint64_t id = 0;
  for (char c : name.substr(0, 16)) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    id = (id << 4) | static_cast<std::uint64_t>(d);
  }
  if (id == 0) return std::nullopt;
  return id;
}

std::string EncodeSegmentHeader(std::uint64_t id) {
  std::string h;
  PutLE64(&h, kSegmentMagic);
  PutLE32(&h, kSegmentVersion);
  PutLE32(&h, 0);
  PutLE64(&h, id);
  PutLE64(&h, Checksum64(std::string_view(h)));
  return h;
}

Status CheckSegmentHeader(std::string_view b, std::uint64_t id) {
  const std::string what = "segment " + SegmentHex(id) + ": header ";
  if (b.size() != kSegmentHeaderBytes) return Status::Corruption(what + "is short");
  if (LE64(b.data()) != kSegmentMagic) return Status::Corruption(what + "has no segment magic");
  if (LE64(b.data() + 24) != Checksum64(b.substr(0, 24))) return Status::Corruption(what + "checksum mismatch");
  if (LE32(b.data() + 8) != kSegmentVersion) return Status::Corruption(what + "has an unknown version");
  if (LE64(b.data() + 16) != id) return Status::Corruption(what + "names another segment");
  return Status::Ok();
}

std::string EncodeFrameHeader(const FrameHeader& f) {
  std::string h;
  PutLE32(&h, kFrameMagic);
  PutLE32(&h, 0);
  PutLE64(&h, f.size);
  PutLE64(&h, f.hash.hi);
  PutLE64(&h, f.hash.lo);
  PutLE64(&h, Checksum64(std::string_view(h)));
  return h;
}

Result<FrameHeader> DecodeFrameHeader(std::string_view b, std::uint64_t max_size) {
  if (b.size() != kFrameHeaderBytes) return Status::Corruption("frame header is short");
  if (LE32(b.data()) != kFrameMagic) return Status::Corruption("frame header has no frame magic");
  if (LE64(b.data() + 32) != Checksum64(b.substr(0, 32))) return Status::Corruption("frame header checksum mismatch");
  FrameHeader f;
  f.size = LE64(b.data() + 8);
  f.hash.hi = LE64(b.data() + 16);
  f.hash.lo = LE64(b.data() + 24);
  if (LE32(b.data() + 4) != 0 || f.size == 0 || f.size > max_size) {
    return Status::Corruption("frame header out of range");
  }
  return f;
}

Status ReadAt(const RandomAccessFile& f, std::uint64_t offset, std::span<std::byte> dst, std::size_t* read) {
  const std::size_t a = f.alignment();
  if (a == 0) return f.Read(offset, dst, read);
  *read = 0;
  const std::uint64_t start = offset / a * a;
  const std::uint64_t end = (offset + dst.size() + a - 1) / a * a;
  const std::size_t len = static_cast<std::size_t>(end - start);
  std::unique_ptr<std::byte, decltype(&std::free)> buf(static_cast<std::byte*>(std::aligned_alloc(a, len)),
                                                       &std::free);
  if (buf == nullptr) return Status::ResourceExhausted("no memory for an aligned read of " + std::to_string(len));
  std::size_t n = 0;
  PC_RETURN_IF_ERROR(f.Read(start, std::span<std::byte>(buf.get(), len), &n));
  const std::uint64_t skip = offset - start;
  *read = n > skip ? std::min<std::size_t>(n - skip, dst.size()) : 0;
  std::memcpy(dst.data(), buf.get() + skip, *read);
  return Status::Ok();
}

// ---- SegmentWriter ------------------------------------------------------------------------

SegmentWriter::SegmentWriter(Env* env, std::string path, std::uint64_t id, std::unique_ptr<WritableFile> file,
                             std::uint64_t end, FreezeHook freeze)
    : env_(env),
      path_(std::move(path)),
      id_(id),
      file_(std::move(file)),
      end_(end),
      committed_(end),
      kicked_(end),
      freeze_(std::move(freeze)) {}

SegmentWriter::~SegmentWriter() {
  (void)Close();
}

Result<std::unique_ptr<SegmentWriter>> SegmentWriter::Create(Env* env, const std::string& dir, std::uint64_t id,
                                                             FreezeHook freeze) {
  if (freeze.Stop()) return Status::IOError("disk frozen (simulated power loss): create segment");
  const std::string path = dir + "/" + SegmentFileName(id);
  if (env->FileExists(path)) return Status::AlreadyExists("segment file " + path + " exists");
  // Opened for appending: after Rewind cuts it, writes go on at the new end.
  PC_ASSIGN_OR_RETURN(auto file, env->NewAppendableFile(path));
  std::unique_ptr<SegmentWriter> w(new SegmentWriter(env, path, id, std::move(file), 0, freeze));
  w->buf_ = EncodeSegmentHeader(id);
  w->end_ = w->buf_.size();
  w->committed_ = 0;  // nothing of it is recorded yet
  w->fresh_ = true;
  // The name must be durable before a commit records the segment.
  if (freeze.Stop()) return Status::IOError("disk frozen (simulated power loss): sync " + dir);
  PC_RETURN_IF_ERROR(env->SyncDir(dir).WithContext("create segment " + path));
  return w;
}

Result<std::unique_ptr<SegmentWriter>> SegmentWriter::Reopen(Env* env, const std::string& dir, std::uint64_t id,
                                                             std::uint64_t committed,
                                                             FreezeHook freeze) {
  const std::string path = dir + "/" + SegmentFileName(id);
  PC_ASSIGN_OR_RETURN(std::uint64_t size, env->GetFileSize(path));
  if (size != committed) {
    return Status::Internal("segment " + path + " holds " + std::to_string(size) + " bytes, not its committed " +
                            std::to_string(committed));
  }
  PC_ASSIGN_OR_RETURN(auto file, env->NewAppendableFile(path));
  return std::unique_ptr<SegmentWriter>(
      new SegmentWriter(env, path, id, std::move(file), committed, std::move(freeze)));
}

Status SegmentWriter::Frozen() {
  if (freeze_.Stop()) return Status::IOError("disk frozen (simulated power loss): " + path_);
  return Status::Ok();
}

Status SegmentWriter::Write(std::span<const std::byte> bytes) {
  Status s = Frozen();
  if (s.ok()) s = file_->Append(bytes);
  if (!s.ok()) broken_ = true;
  return s;
}

// Starts writeback of what was written since the last kick, every 8 MiB;
// `written` is the file's length after the last write. A failure only loses
// the head start (Sync still makes everything durable).
void SegmentWriter::Kick(std::uint64_t written) {
  if (written < kicked_ + kKickBytes) return;
  if (file_->StartWriteback(kicked_, written - kicked_).ok()) kicked_ = written;
}

Status SegmentWriter::FlushBuffer() {
  if (buf_.empty()) return Status::Ok();
  Status s = Write(AsBytes(buf_));
  buf_.clear();
  return s;
}

Result<std::uint64_t> SegmentWriter::Append(const Hash128& hash, std::span<const std::byte> bytes) {
  if (broken_) return Status::IOError("segment " + path_ + " failed an earlier write");
  buf_ += EncodeFrameHeader({hash, bytes.size()});
  const std::uint64_t at = end_ + kFrameHeaderBytes;
  TEST_KILL_POINT("segment.append");
  if (bytes.size() < kBufferBytes) {
    buf_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    end_ = at + bytes.size();
    if (buf_.size() >= kBufferBytes) {
      PC_RETURN_IF_ERROR(FlushBuffer().WithContext("append to segment"));
      Kick(end_);
    }
  } else {
    PC_RETURN_IF_ERROR(FlushBuffer().WithContext("append to segment"));
    PC_RETURN_IF_ERROR(Write(bytes).WithContext("append to segment"));
    end_ = at + bytes.size();
    Kick(end_);
  }
  return at;
}

Status SegmentWriter::Sync() {
  if (broken_) return Status::IOError("segment " + path_ + " failed an earlier write");
  PC_RETURN_IF_ERROR(FlushBuffer().WithContext("write segment"));
  TEST_KILL_POINT("segment.sync.before");
  Status s = Frozen();
  if (s.ok()) s = file_->Sync();
  if (!s.ok()) {
    broken_ = true;
    return s.WithContext("sync segment");
  }
  TEST_KILL_POINT("segment.sync.after");
  return Status::Ok();
}

Status SegmentWriter::Rewind() {
  const std::uint64_t keep = fresh_ ? kSegmentHeaderBytes : committed_;
  if (broken_) return CutBroken(keep);
  const std::uint64_t on_disk = end_ - buf_.size();
  end_ = keep;
  kicked_ = std::min(kicked_, keep);
  if (on_disk <= keep) {
    buf_.resize(keep - on_disk);  // what is kept and not yet written (a fresh segment's header)
    return Status::Ok();
  }
  buf_.clear();
  Status s = Frozen();
  if (s.ok()) s = env_->TruncateFile(path_, keep);
  if (!s.ok()) broken_ = true;
  return s;
}

// A failed write may have left any part of what was appended in the file
// (a full disk takes what fits): the file's own length says what to cut. The
// writer stays broken (never appended to again), so its position no longer
// matters. Cutting needs no new space, so it works on a full disk.
Status SegmentWriter::CutBroken(std::uint64_t keep) {
  buf_.clear();
  end_ = std::min(end_, keep);
  PC_RETURN_IF_ERROR(Frozen());
  PC_ASSIGN_OR_RETURN(std::uint64_t size, env_->GetFileSize(path_));
  if (size <= keep) return Status::Ok();
  return env_->TruncateFile(path_, keep).WithContext("cut the failed writes of segment " + path_);
}

Status SegmentWriter::Close() {
  if (file_ == nullptr) return Status::Ok();
  Status s = file_->Close();
  file_.reset();
  return s;
}

}  // namespace primecache::statestore_internal

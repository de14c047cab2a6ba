// RespReader: the replies of the tier's data path (GETs of chunk values, SETs
// of them) read from a connected socket by our own RESP2 parser, so that a
// bulk string's payload is received straight into the caller's buffer: no
// growing parse buffer, no second copy. hiredis keeps the rest (connecting,
// CLUSTER SLOTS, sets, SCAN); remote/redis_conn.h hands the socket over
// between the two only when neither holds unread bytes.
//
// Only what the data path meets is parsed: bulk strings, nil, simple
// strings, errors and integers. An array (or any other type) is refused.
// Every length read from the wire is bounded before use: a bulk over
// `max_bulk`, a line (status, error, integer, header) over kMaxRespLine, a
// length that is negative (other than nil's -1), signed, empty or not
// decimal is kCorruption; the peer closing mid-reply is kIOError, and so is
// a timeout (the socket's SO_RCVTIMEO). After any error the reader is
// broken: the socket is shut down and every later call fails at once, so a
// connection that lost its place in the stream is never read again.
//
// Bytes that arrive beyond the reply being read wait in a fixed buffer of
// kRespBufferBytes (allocated once); a payload takes from there what has
// already arrived (at most kRespHeaderRecv bytes) and recv()s the rest into
// its destination.
//
// Thread-safety: one thread at a time (the connection's borrower).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "primecache/status.h"

namespace primecache::remote {

inline constexpr std::size_t kRespBufferBytes = std::size_t{16} << 10;
inline constexpr std::size_t kMaxRespLine = 4096;
// What one recv() asks for while a header line or a trailer is wanted: a
// payload that follows then comes mostly straight into its destination
// (at most this much of it is copied from the buffer), while a run of small
// replies (a pipeline's +OKs) still comes in few calls.
inline constexpr std::size_t kRespHeaderRecv = 512;

// One reply of the data path.
struct RespReply {
  enum class Kind {
    kBulk,       // a bulk string whose payload filled the destination exactly
    kWrongSize,  // a bulk string of another length (at most max_bulk): read and dropped
    kNil,        // $-1
    kStatus,     // +text
    kError,      // -text
    kInteger,    // :n
  };
  Kind kind = Kind::kNil;
  std::uint64_t length = 0;  // kBulk, kWrongSize: the payload's length
  std::string text;          // kStatus, kError
  long long integer = 0;     // kInteger
};

class RespReader {
 public:
  // Reads from `fd` (not owned; a connected, blocking stream socket).
  explicit RespReader(int fd);
  RespReader(const RespReader&) = delete;
  RespReader& operator=(const RespReader&) = delete;

  // The next reply. A bulk string of exactly into.size() bytes lands in
  // `into`; one of another length up to `max_bulk` is drained (kWrongSize),
  // leaving `into` unspecified; one over `max_bulk` is kCorruption.
  Result<RespReply> Read(std::span<std::byte> into, std::uint64_t max_bulk);
  // Bytes received but not yet read (none between replies of a healthy stream).
  std::size_t buffered() const { return end_ - pos_; }
  bool broken() const { return broken_; }

 private:
  // Receives more into the buffer: at most `most` bytes.
  Status Fill(std::size_t most);
  Result<std::string_view> Line();
  Status Payload(std::span<std::byte> into);
  Status Drain(std::uint64_t n);
  Status Trailer();
  Result<RespReply> ReadOne(std::span<std::byte> into, std::uint64_t max_bulk);
  Status Fail(Status s);

  int fd_;
  std::unique_ptr<char[]> buf_;
  std::size_t pos_ = 0, end_ = 0;
  bool broken_ = false;
};

// Sends every byte of `iov` (sendmsg with MSG_NOSIGNAL, partial writes and
// IOV_MAX handled); kIOError on a failure or timeout (SO_SNDTIMEO). `iov` is
// modified as it is consumed.
Status SendAll(int fd, std::span<iovec> iov);

// A RESP command header: "*<argc>\r\n" is the caller's; this writes
// "$<len>\r\n" for an argument of `len` bytes into `out`.
void AppendBulkHeader(std::string& out, std::size_t len);

}  // namespace primecache::remote

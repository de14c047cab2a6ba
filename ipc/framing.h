// Cap'n Proto stream framing with limits, for the daemon and the client.
//
// On the wire a message is capnp's standard unpacked stream encoding:
//   u32 segment_count - 1, u32 size_in_words per segment, a u32 of padding
//   when the count is even, then the segments.
// FrameDecoder takes bytes as they arrive and yields whole messages, refusing
// a segment count, a message size or a table that exceeds the limits before
// anything is allocated for it. Encode turns a builder into iovecs without
// copying the segments.
#pragma once

#include <sys/uio.h>

#include <capnp/message.h>
#include <kj/array.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "primecache/status.h"

namespace primecache::ipc {

struct FrameLimits {
  std::size_t max_message_bytes = 64u << 20;  // whole frame, table included
  std::uint32_t max_segments = 64;
  int nesting_limit = 16;
  // Traversal budget per message, as a multiple of the message's own words
  // (plus a small constant); catches pointer-aliasing amplification.
  std::uint64_t traversal_factor = 4;
};

// One complete message, word-aligned.
class Frame {
 public:
  Frame(kj::Array<capnp::word> words, std::vector<std::uint32_t> segment_words);
  Frame(Frame&&) = default;
  Frame& operator=(Frame&&) = default;

  std::size_t total_bytes() const { return total_bytes_; }
  // A reader over the message with the limits applied. Reading a field may
  // throw kj::Exception on a malformed message: callers catch.
  std::unique_ptr<capnp::MessageReader> Reader(const FrameLimits& limits) const;

 private:
  kj::Array<capnp::word> words_;
  std::vector<kj::ArrayPtr<const capnp::word>> segments_;
  std::size_t total_bytes_ = 0;
};

class FrameDecoder {
 public:
  explicit FrameDecoder(FrameLimits limits, std::size_t stage_bytes = 64 << 10);

  // Where the next read should put bytes (never empty).
  std::span<std::byte> ReadBuffer();
  // n bytes were written into ReadBuffer(); complete frames are appended to
  // *out. A non-OK result means the stream is unusable (close it).
  Status Consume(std::size_t n, std::vector<Frame>* out);
  // Bytes of a partial frame held (0 between frames).
  std::size_t Pending() const;

 private:
  Status ParseStaged(std::vector<Frame>* out);
  // Makes the stage `bytes` long, keeping the bytes held.
  void GrowStage(std::size_t bytes);

  FrameLimits limits_;
  kj::Array<std::byte> stage_;
  std::size_t stage_pos_ = 0;  // first unparsed byte
  std::size_t stage_len_ = 0;  // bytes held
  // A frame too large for the stage is read straight into its own buffer.
  kj::Array<capnp::word> big_;
  std::vector<std::uint32_t> big_segments_;
  std::size_t big_filled_ = 0;  // bytes of big_ filled
};

// An encoded message ready to be written: the segment table plus the builder's
// segments (not copied). Keeps the builder alive.
class OutMessage {
 public:
  explicit OutMessage(std::unique_ptr<capnp::MessageBuilder> builder);
  std::size_t size() const { return size_; }
  const std::vector<iovec>& iov() const { return iov_; }

 private:
  std::unique_ptr<capnp::MessageBuilder> builder_;
  std::vector<std::uint32_t> table_;
  std::vector<iovec> iov_;
  std::size_t size_ = 0;
};

// The bytes of the message, contiguous (tests, the fuzzer's seeds).
std::vector<std::byte> Flatten(const OutMessage& msg);

}  // namespace primecache::ipc

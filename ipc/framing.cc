#include "ipc/framing.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace primecache::ipc {

namespace {

constexpr std::size_t kWord = sizeof(capnp::word);

std::uint32_t LoadU32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // capnp is little-endian; so are the hosts we build for
}

// Bytes of the segment table for `count` segments (padded to a word).
std::size_t TableBytes(std::uint64_t count) {
  std::size_t b = 4 + 4 * count;
  return (b + 7) & ~std::size_t{7};
}

}  // namespace

Frame::Frame(kj::Array<capnp::word> words, std::vector<std::uint32_t> segment_words)
    : words_(kj::mv(words)) {
  std::size_t off = 0;
  segments_.reserve(segment_words.size());
  for (std::uint32_t w : segment_words) {
    segments_.push_back(kj::arrayPtr(words_.begin() + off, w));
    off += w;
  }
  total_bytes_ = TableBytes(segment_words.size()) + off * kWord;
}

std::unique_ptr<capnp::MessageReader> Frame::Reader(const FrameLimits& limits) const {
  capnp::ReaderOptions opts;
  opts.nestingLimit = limits.nesting_limit;
  opts.traversalLimitInWords = words_.size() * limits.traversal_factor + 1024;
  return std::make_unique<capnp::SegmentArrayMessageReader>(
      kj::arrayPtr(segments_.data(), segments_.size()), opts);
}

FrameDecoder::FrameDecoder(FrameLimits limits, std::size_t stage_bytes)
    : limits_(limits),
      // kj::heapArray leaves bytes unset: only what recv writes is ever read,
      // and a connection should not pay for touching every page of a stage
      // it may never fill (a std::vector zero-fills them).
      stage_(kj::heapArray<std::byte>(std::max<std::size_t>(stage_bytes, 4096))) {}

void FrameDecoder::GrowStage(std::size_t bytes) {
  auto grown = kj::heapArray<std::byte>(bytes);
  std::memcpy(grown.begin(), stage_.begin(), stage_len_);
  stage_ = kj::mv(grown);
}

std::size_t FrameDecoder::Pending() const {
  if (big_.size() != 0) return TableBytes(big_segments_.size()) + big_filled_;
  return stage_len_ - stage_pos_;
}

std::span<std::byte> FrameDecoder::ReadBuffer() {
  if (big_.size() != 0) {
    auto* base = reinterpret_cast<std::byte*>(big_.begin());
    return {base + big_filled_, big_.size() * kWord - big_filled_};
  }
  if (stage_pos_ > 0) {
    std::memmove(stage_.begin(), stage_.begin() + stage_pos_, stage_len_ - stage_pos_);
    stage_len_ -= stage_pos_;
    stage_pos_ = 0;
  }
  return {stage_.begin() + stage_len_, stage_.size() - stage_len_};
}

Status FrameDecoder::Consume(std::size_t n, std::vector<Frame>* out) {
  if (big_.size() != 0) {
    big_filled_ += n;
    if (big_filled_ == big_.size() * kWord) {
      out->emplace_back(kj::mv(big_), std::move(big_segments_));
      big_ = nullptr;
      big_segments_.clear();
      big_filled_ = 0;
    }
    return Status::Ok();
  }
  stage_len_ += n;
  return ParseStaged(out);
}

Status FrameDecoder::ParseStaged(std::vector<Frame>* out) {
  for (;;) {
    const std::size_t avail = stage_len_ - stage_pos_;
    const std::byte* p = stage_.begin() + stage_pos_;
    if (avail < 4) return Status::Ok();
    const std::uint64_t count = std::uint64_t{LoadU32(p)} + 1;
    if (count > limits_.max_segments) {
      return Status::InvalidArgument("message has " + std::to_string(count) +
                                     " segments; the limit is " + std::to_string(limits_.max_segments));
    }
    const std::size_t table = TableBytes(count);
    if (table > limits_.max_message_bytes) return Status::InvalidArgument("segment table exceeds the message size limit");
    if (avail < table) {
      if (table > stage_.size()) GrowStage(table);  // bounded by max_segments
      return Status::Ok();
    }
    std::vector<std::uint32_t> sizes(count);
    std::uint64_t words = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      sizes[i] = LoadU32(p + 4 + 4 * i);
      words += sizes[i];
    }
    if (words == 0) return Status::InvalidArgument("message has no words");
    const std::uint64_t total = table + words * kWord;
    if (total > limits_.max_message_bytes) {
      return Status::InvalidArgument("message of " + std::to_string(total) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(limits_.max_message_bytes));
    }
    auto body = kj::heapArray<capnp::word>(words);
    auto* dst = reinterpret_cast<std::byte*>(body.begin());
    if (avail >= total) {
      std::memcpy(dst, p + table, words * kWord);
      stage_pos_ += total;
      out->emplace_back(kj::mv(body), std::move(sizes));
      continue;
    }
    if (total <= stage_.size()) return Status::Ok();  // wait; compaction makes room
    // Too large for the stage: continue it in its own buffer.
    const std::size_t have = avail - table;
    std::memcpy(dst, p + table, have);
    big_ = kj::mv(body);
    big_segments_ = std::move(sizes);
    big_filled_ = have;
    stage_pos_ = stage_len_ = 0;
    return Status::Ok();
  }
}

OutMessage::OutMessage(std::unique_ptr<capnp::MessageBuilder> builder) : builder_(std::move(builder)) {
  auto segs = builder_->getSegmentsForOutput();
  table_.assign((TableBytes(segs.size()) / 4), 0);
  table_[0] = static_cast<std::uint32_t>(segs.size() - 1);
  for (std::size_t i = 0; i < segs.size(); ++i) table_[i + 1] = static_cast<std::uint32_t>(segs[i].size());
  iov_.reserve(segs.size() + 1);
  iov_.push_back({table_.data(), table_.size() * 4});
  size_ = table_.size() * 4;
  for (auto s : segs) {
    iov_.push_back({const_cast<capnp::word*>(s.begin()), s.size() * kWord});
    size_ += s.size() * kWord;
  }
}

std::vector<std::byte> Flatten(const OutMessage& msg) {
  std::vector<std::byte> out;
  out.reserve(msg.size());
  for (const iovec& v : msg.iov()) {
    auto* b = static_cast<const std::byte*>(v.iov_base);
    out.insert(out.end(), b, b + v.iov_len);
  }
  return out;
}

}  // namespace primecache::ipc

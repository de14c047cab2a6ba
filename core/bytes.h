// Little-endian byte writing and bounds-checked reading for the codecs'
// formats (the codecs' layers and snapshots, the remote tier's manifests),
// plus overflow-checked arithmetic. Part of primecache_core.
//
// ByteReader never reads past its buffer: every read first checks that the
// bytes remain and otherwise returns Corruption naming the field, its offset
// and how many bytes were missing. Both classes are single-thread values.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "primecache/status.h"

namespace primecache {

static_assert(
    std::endian::native == std::endian::little,
    "primecache's formats are little-endian and read in place; a big-endian host needs byte swaps here");

// a * b and a + b, or false when the result does not fit 64 bits.
inline bool CheckedMul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool CheckedAdd(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// A string fit for an error message: printable ASCII kept, other bytes as
// \xNN, cut at 64 characters, in single quotes.
std::string Quote(std::string_view text);

// v as 16 lower-case hex digits with a 0x prefix.
std::string Hex64(std::uint64_t v);

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}

  void U8(std::uint8_t v) { Put(&v, 1); }
  void U16(std::uint16_t v) { Put(&v, 2); }
  void U32(std::uint32_t v) { Put(&v, 4); }
  void I32(std::int32_t v) { Put(&v, 4); }
  void U64(std::uint64_t v) { Put(&v, 8); }
  void Bytes(std::string_view b) { out_->append(b); }
  // Length-prefixed strings; the caller guarantees the length fits the prefix.
  void Str8(std::string_view s) {
    U8(static_cast<std::uint8_t>(s.size()));
    Bytes(s);
  }
  void Str16(std::string_view s) {
    U16(static_cast<std::uint16_t>(s.size()));
    Bytes(s);
  }
  std::size_t size() const { return out_->size(); }

 private:
  void Put(const void* p, std::size_t n) { out_->append(static_cast<const char*>(p), n); }
  std::string* out_;
};

class ByteReader {
 public:
  // base_offset is added to offsets in error messages (the buffer's position
  // within a larger one).
  explicit ByteReader(std::span<const std::byte> data, std::uint64_t base_offset = 0)
      : data_(data), base_(base_offset) {}

  Status U8(std::uint8_t* v, std::string_view field) { return Get(v, 1, field); }
  Status U16(std::uint16_t* v, std::string_view field) { return Get(v, 2, field); }
  Status U32(std::uint32_t* v, std::string_view field) { return Get(v, 4, field); }
  Status I32(std::int32_t* v, std::string_view field) { return Get(v, 4, field); }
  Status U64(std::uint64_t* v, std::string_view field) { return Get(v, 8, field); }
  // The next n bytes, in place.
  Status Bytes(std::uint64_t n, std::span<const std::byte>* out, std::string_view field);
  // A string with a u8 / u16 length prefix of at most max bytes.
  Status Str8(std::string* out, std::uint64_t max, std::string_view field);
  Status Str16(std::string* out, std::uint64_t max, std::string_view field);

  std::uint64_t offset() const { return base_ + pos_; }
  std::size_t remaining() const { return data_.size() - pos_; }

 private:
  Status Get(void* v, std::size_t n, std::string_view field);
  Status StrBody(std::uint64_t len, std::string* out, std::uint64_t max, std::string_view field);
  Status Truncated(std::uint64_t need, std::string_view field) const;

  std::span<const std::byte> data_;
  std::uint64_t base_ = 0;
  std::size_t pos_ = 0;
};

}  // namespace primecache

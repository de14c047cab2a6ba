// Checksums: XXH3-64 (libxxhash) over byte ranges, one-shot or streamed.
// Every stored or transmitted primecache byte is covered by one of these.
// Checksum64Stream is a value with no sharing; use one per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace primecache {

std::uint64_t Checksum64(std::span<const std::byte> data, std::uint64_t seed = 0);
inline std::uint64_t Checksum64(std::string_view data, std::uint64_t seed = 0) {
  return Checksum64(std::as_bytes(std::span(data.data(), data.size())), seed);
}

// The same checksum over data given in pieces.
class Checksum64Stream {
 public:
  explicit Checksum64Stream(std::uint64_t seed = 0);
  ~Checksum64Stream();
  Checksum64Stream(Checksum64Stream&&) noexcept;
  Checksum64Stream& operator=(Checksum64Stream&&) noexcept;

  void Update(std::span<const std::byte> data);
  void Update(std::string_view data) { Update(std::as_bytes(std::span(data.data(), data.size()))); }
  std::uint64_t Digest() const;  // may be called at any point; Update may continue after

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// 128-bit XXH3, for content addresses where 64 bits are too few.
struct Hash128 {
  std::uint64_t lo = 0, hi = 0;
  friend bool operator==(const Hash128&, const Hash128&) = default;
};
Hash128 Checksum128(std::span<const std::byte> data, std::uint64_t seed = 0);

// How checksums and digests are written wherever people or keys read them
// (messages, primecachectl, remote keys, file names): 16 lowercase hex
// digits, and for a Hash128 32, hi then lo.
std::string HexDigits(std::uint64_t v);
std::string HexDigits(const Hash128& h);

}  // namespace primecache

#include "primecache/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>

namespace primecache {

std::uint64_t Checksum64(std::span<const std::byte> data, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data.data(), data.size(), seed);
}

Hash128 Checksum128(std::span<const std::byte> data, std::uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(data.data(), data.size(), seed);
  return {h.low64, h.high64};
}

struct Checksum64Stream::Impl {
  XXH3_state_t state;
};

Checksum64Stream::Checksum64Stream(std::uint64_t seed) : impl_(std::make_unique<Impl>()) {
  XXH3_64bits_reset_withSeed(&impl_->state, seed);
}
Checksum64Stream::~Checksum64Stream() = default;
Checksum64Stream::Checksum64Stream(Checksum64Stream&&) noexcept = default;
Checksum64Stream& Checksum64Stream::operator=(Checksum64Stream&&) noexcept = default;

void Checksum64Stream::Update(std::span<const std::byte> data) {
  XXH3_64bits_update(&impl_->state, data.data(), data.size());
}

std::uint64_t Checksum64Stream::Digest() const { return XXH3_64bits_digest(&impl_->state); }

std::string HexDigits(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string HexDigits(const Hash128& h) {
  return HexDigits(h.hi) + HexDigits(h.lo);
}

}  // namespace primecache

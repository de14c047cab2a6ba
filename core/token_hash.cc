#include "core/token_hash.h"

#include <bit>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace primecache {
namespace {

static_assert(std::endian::native == std::endian::little, "tokens are hashed as little-endian u32");

class XxhTokenHasher final : public TokenHasher {
 public:
  std::uint32_t id() const override { return 1; }
  std::uint64_t Hash(std::span<const std::uint32_t> tokens, std::uint64_t seed) const override {
    return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), seed);
  }
  // One streaming pass; XXH3's streaming digest equals its one-shot hash.
  void HashPrefixes(std::span<const std::uint32_t> tokens, std::uint64_t seed,
                    std::span<const std::uint32_t> lengths, std::span<std::uint64_t> out) const override {
    XXH3_state_t state{};
    XXH3_64bits_reset_withSeed(&state, seed);
    std::size_t done = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      XXH3_64bits_update(&state, tokens.data() + done, (lengths[i] - done) * sizeof(std::uint32_t));
      done = lengths[i];
      out[i] = XXH3_64bits_digest(&state);
    }
  }
};

}  // namespace

const TokenHasher& DefaultTokenHasher() {
  static const XxhTokenHasher hasher;
  return hasher;
}

std::vector<std::uint64_t> ChainHashes(const TokenHasher& hasher, std::span<const std::uint32_t> tokens,
                                       std::uint32_t block, std::size_t levels) {
  std::vector<std::uint64_t> h(levels + 1);
  h[0] = kChainSeed;
  for (std::size_t k = 0; k < levels; ++k) h[k + 1] = hasher.Hash(tokens.subspan(k * block, block), h[k]);
  return h;
}

BoundaryPlace PlaceOf(const TokenHasher& hasher, std::span<const std::uint32_t> tokens, std::uint32_t block) {
  BoundaryPlace p;
  p.level = (tokens.size() - 1) / block;
  auto h = ChainHashes(hasher, tokens, block, p.level);
  p.node_hash = h.back();
  p.exact_hash = hasher.Hash(tokens.subspan(p.level * block), p.node_hash);
  return p;
}

}  // namespace primecache

// Token hashing for the prefix index: the local store's (statestore) and the
// remote tier's key layout (remote/tier.cc) hash boundaries alike.
//
// The index chains block hashes: h_0 = kChainSeed and
// h_{k+1} = Hash(tokens[kB, (k+1)B), seed = h_k); the hash of a boundary of
// length L is Hash(tokens[aB, L), seed = h_a) with a = (L - 1) / B, which is
// h_{a+1} when L is a multiple of B. Tokens are hashed as little-endian u32.
// Hashes only find candidates; stored tokens confirm every hit, so a hasher
// may collide at will (tests use one that always does).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace primecache {

inline constexpr std::uint64_t kChainSeed = 0x9E3779B97F4A7C15ull;

class TokenHasher {
 public:
  virtual ~TokenHasher() = default;
  // Recorded in the store; opening with another hasher is refused.
  virtual std::uint32_t id() const = 0;
  virtual std::uint64_t Hash(std::span<const std::uint32_t> tokens, std::uint64_t seed) const = 0;
  // out[i] = Hash(tokens.first(lengths[i]), seed) for ascending lengths, each
  // at most tokens.size(); a hasher may share the work between them.
  virtual void HashPrefixes(std::span<const std::uint32_t> tokens, std::uint64_t seed,
                            std::span<const std::uint32_t> lengths, std::span<std::uint64_t> out) const {
    for (std::size_t i = 0; i < lengths.size(); ++i) out[i] = Hash(tokens.first(lengths[i]), seed);
  }
};

// XXH3-64 over the tokens' bytes, seeded (id 1).
const TokenHasher& DefaultTokenHasher();

// The chain h_0 .. h_levels over tokens (levels * B <= tokens.size()).
std::vector<std::uint64_t> ChainHashes(const TokenHasher& hasher, std::span<const std::uint32_t> tokens,
                                       std::uint32_t block, std::size_t levels);

// Where a boundary of length L >= 1 hangs in the index.
struct BoundaryPlace {
  std::uint64_t level = 0;       // a = (L - 1) / B
  std::uint64_t node_hash = 0;   // h_a
  std::uint64_t exact_hash = 0;  // hash of tokens[aB, L) seeded with h_a
};
BoundaryPlace PlaceOf(const TokenHasher& hasher, std::span<const std::uint32_t> tokens, std::uint32_t block);

}  // namespace primecache

// What the lookup and branch-point tests share: token hashers that collide
// on purpose (hashes only find candidates; stored tokens must settle every
// answer) and a tiny model whose entries cost almost nothing to publish.
#pragma once

#include <cstdint>
#include <span>

#include "core/token_hash.h"
#include "store_test_util.h"

namespace primecache::store_test {

// Every hash is the same: every node, every boundary of a length and every
// pass record of a level collide.
class CollidingHasher final : public TokenHasher {
 public:
  std::uint32_t id() const override { return 0xC0111DE; }
  std::uint64_t Hash(std::span<const std::uint32_t>, std::uint64_t) const override { return 42; }
};

// A hash of 2 bits: many collisions, but not all.
class WeakHasher final : public TokenHasher {
 public:
  std::uint32_t id() const override { return 0x3EA4; }
  std::uint64_t Hash(std::span<const std::uint32_t> t, std::uint64_t seed) const override {
    std::uint64_t x = seed;
    for (auto v : t) x = x * 31 + v;
    return x & 3;
  }
};

// One latent layer two floats wide and one tiny recurrent layer.
inline const TestModel kTiny = [] {
  TestModel m;
  m.latent_layers = 1;
  m.recurrent_layers = 1;
  m.width = 2;
  m.index_head_dim = 0;
  m.heads = 1;
  m.head_dim = 2;
  m.kernel = 2;
  m.chunk_bytes = 4096;
  return m;
}();

}  // namespace primecache::store_test

// NodeFilter: which prefix-index records exist, in memory (the store keeps
// one for node records and one for exact records).
//
// A lookup of Q tokens has Q/B + 1 candidate nodes, and almost all of them
// are absent; a node on the path may list many boundary lengths, most of
// which the query does not share. Asking RocksDB about each costs a bloom
// probe per level of the LSM, at random places. The filter answers "absent"
// from one compact hash table instead, so RocksDB is asked only about
// records that exist (and the rare 64-bit fingerprint collision). It is exact
// about absence: a key is in it while its persisted record holds at least one
// slot or id. Fingerprints are 32 bits and counts add up across keys that
// share one, so absence stays exact while a table of a million keys takes
// 16 MiB. It is loaded from the index's keys at open (a scan of the index,
// never of chunk bytes) and kept in step by every committed batch.
//
// Thread-safety: Adjust and Reset under an exclusive lock of `mu`;
// MayContain under a shared one.
#pragma once

#include <cstdint>
#include <vector>

#include "core/mutex.h"

namespace primecache::statestore_internal {

class NodeFilter {
 public:
  static std::uint32_t Fingerprint(std::uint64_t scope, std::uint64_t level, std::uint64_t node_hash);

  // Adds delta to a fingerprint's count; at zero it is removed.
  void Adjust(std::uint32_t fp, std::int64_t delta) REQUIRES(mu);
  bool MayContain(std::uint32_t fp) const REQUIRES_SHARED(mu);
  void Reset() REQUIRES(mu);
  std::size_t size() const REQUIRES_SHARED(mu) { return used_; }

  mutable SharedMutex mu;

 private:
  struct Cell {
    std::uint32_t key = 0;  // 0: empty
    std::uint32_t count = 0;
  };
  std::size_t Find(std::uint32_t key) const
      REQUIRES_SHARED(mu);  // its cell, or the empty cell where it would go
  void Grow() REQUIRES(mu);

  std::vector<Cell> cells_ GUARDED_BY(mu) = std::vector<Cell>(1024);
  std::size_t used_ GUARDED_BY(mu) = 0;
};

}  // namespace primecache::statestore_internal

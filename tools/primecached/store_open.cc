#include "tools/primecached/store_open.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "primecache/internal/codec.h"
#include "primecache/internal/env.h"

namespace primecache::daemon {

std::uint64_t DefaultBlockCacheBytes(std::uint64_t capacity_bytes) {
  constexpr std::uint64_t kMin = 32ull << 20, kMax = 256ull << 20;
  return capacity_bytes == 0 ? kMax : std::clamp(capacity_bytes / 4, kMin, kMax);
}

Result<std::unique_ptr<LocalStore>> OpenStore(const StoreConfig& config) {
  // The data directory itself is made private (its sockets keep their own
  // modes); the store makes its own directory and files private.
  PC_ASSIGN_OR_RETURN(std::vector<TightenedPath> tightened,
                      RestrictToOwner(Env::Default(), config.data_dir, /*recursive=*/false));
  if (!tightened.empty()) {
    spdlog::warn("primecached: the data directory was open to other users; made private: {}",
                 DescribeTightened(tightened));
  }
  StoreOptions o;
  o.validator = CodecLayerValidator();
  o.path = config.data_dir + "/store";
  o.byte_budget = config.capacity_bytes;
  o.sync_commits = config.sync_commits;
  o.max_staged_bytes = config.max_staged_bytes;
  o.group_timeout_ms = config.group_timeout_ms;
  o.fetch_read_threads = config.read_threads;
  o.direct_reads = config.direct_reads;
  o.fetch_read_ahead_bytes = config.read_ahead_bytes;
  o.fetch_read_ahead = std::clamp<std::size_t>(config.read_ahead_bytes >> 17, 16, 1024);
  o.block_cache_bytes = config.block_cache_bytes;
  o.memtable_bytes = config.memtable_bytes;
  spdlog::info("primecached: metadata memory: a {} MiB block cache, {} MiB of memtables charged to it",
               o.block_cache_bytes >> 20, o.memtable_bytes >> 20);
  o.eviction = config.eviction;
  return LocalStore::Open(std::move(o));
}

}  // namespace primecache::daemon

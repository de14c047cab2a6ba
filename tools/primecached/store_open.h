// Opens the store the daemon serves (primecached, and the tests and the
// fuzzer that drive its sessions on a store of the same options).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "primecache/internal/statestore.h"
#include "primecache/status.h"

namespace primecache::daemon {

struct StoreConfig {
  std::string data_dir;
  std::uint64_t capacity_bytes = 0;  // 0: unlimited
  bool sync_commits = true;          // false only for throwaway stores (the fuzzer)
  // Chunk bytes all uncommitted publishes together may have written
  // (StoreOptions::max_staged_bytes; 0: no bound).
  std::uint64_t max_staged_bytes = 16ull << 30;
  // How long a group publish may wait for its missing ranks' parts
  // (StoreOptions::group_timeout_ms).
  std::uint64_t group_timeout_ms = 30'000;
  // Threads reading and checking chunks ahead of fetches, and whether they
  // read with O_DIRECT (StoreOptions::fetch_read_threads, direct_reads).
  std::size_t read_threads = 4;
  bool direct_reads = false;
  // How far a fetch reads ahead of its sink (StoreOptions::fetch_read_ahead_bytes;
  // the chunk count follows: one per 128 KiB, 16 to 1024).
  std::uint64_t read_ahead_bytes = 64ull << 20;
  // RocksDB's memory: its cache, and the memtables charged to it
  // (StoreOptions::block_cache_bytes, memtable_bytes).
  std::uint64_t block_cache_bytes = 256ull << 20;
  std::uint64_t memtable_bytes = 64ull << 20;
  // Eviction and admission (docs/protocol.md "Daemon options").
  EvictionOptions eviction;
};

// The block cache a store of this byte budget gets unless told (0: no
// budget): a quarter of it, 32 MiB to 256 MiB, since the metadata is a small
// share of what it describes.
std::uint64_t DefaultBlockCacheBytes(std::uint64_t capacity_bytes);

// The store the daemon serves, in data_dir/store (the data directory made
// private first), checking layers with the codecs' validator.
Result<std::unique_ptr<LocalStore>> OpenStore(const StoreConfig& config);

}  // namespace primecache::daemon

// Test-only knobs of a Store, given to OpenWithHooks (not part of the public
// API: include/primecache/internal/statestore.h knows nothing of them).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "primecache/internal/statestore.h"
#include "core/token_hash.h"

namespace primecache::statestore_internal {

// Chunks handed out in place (FetchSink::TakesMappedChunks) whose address
// a fetch checked, and those it did not check again because they had been
// checked under the sink's same pin.
struct MappedCheckCounts {
  std::atomic<std::uint64_t> checked{0}, skipped{0};
};

struct TestHooks {
  // Replaces the index's token hasher (e.g. one that always collides). The
  // store records the hasher's id and refuses to open with another.
  const TokenHasher* hasher = nullptr;
  // When set and true, every mutating file operation of RocksDB fails with no
  // effect: the disk is frozen as at a power loss, so a test can then
  // FaultInjectionEnv::SimulateCrash() and reopen.
  std::shared_ptr<std::atomic<bool>> freeze_io;
  // When set: every mutating file operation (create, append, sync, rename,
  // delete, directory sync) first decrements it, and the one that takes it
  // to zero sets freeze_io before it runs: a power loss at exactly that
  // operation. Start it at INT64_MAX to count a workload's operations.
  std::shared_ptr<std::atomic<std::int64_t>> freeze_countdown;
  // Caps RocksDB's back-off sleeps (a second after every failed flush).
  bool short_sleeps = false;
  // No background compactions (a test that plants damage in files decides
  // alone who reads them).
  bool no_compactions = false;
  // The chunk bytes one migration step copies before its batch (0: 64 MiB).
  std::uint64_t migrate_step_bytes = 0;
  // When set: counts the checks of mapped chunks done and skipped.
  std::shared_ptr<MappedCheckCounts> mapped_checks;
  // When set: raised to the most deleted records one eviction's scan of the
  // recency records skipped (RocksDB's perf context), so a test can see the
  // scans stay short however long the store has been evicting.
  std::shared_ptr<std::atomic<std::uint64_t>> victim_scan_max_skipped;
};

// The freeze of TestHooks::freeze_io and freeze_countdown, as the store's
// file writers (RocksDB's and the segments') apply it: a flag, and
// a countdown of mutating operations that sets it. Empty: no effect.
struct FreezeHook {
  std::shared_ptr<std::atomic<bool>> frozen;
  std::shared_ptr<std::atomic<std::int64_t>> countdown;
  // Called before each mutating operation; true when it must not happen.
  bool Stop() const {
    if (!frozen) return false;
    if (countdown && countdown->fetch_sub(1) == 1) frozen->store(true);
    return frozen->load();
  }
};

// LocalStore::Open with test knobs (null hooks: exactly LocalStore::Open).
Result<std::unique_ptr<LocalStore>> OpenWithHooks(StoreOptions options, std::shared_ptr<const TestHooks> hooks);

}  // namespace primecache::statestore_internal

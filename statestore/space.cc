// Disk space: the bound on uncommitted bytes, reclaiming the space of dropped
// chunks in the background, and the full compaction (segment rewriting
// itself: segment_gc.cc).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

// ---- uncommitted bytes ------------------------------------------------------------------

Status LocalStore::Impl::ReserveStaged(std::uint64_t bytes) {
  const std::uint64_t bound = opts.max_staged_bytes;
  std::uint64_t cur = staged_bytes.load();
  do {
    if (bound != 0 && (bytes > bound || cur > bound - bytes)) {
      return Status::ResourceExhausted("publishes not committed yet hold " + std::to_string(cur) +
                                       " bytes; " + std::to_string(bytes) +
                                       " more would pass the store's bound of " + std::to_string(bound) +
                                       " uncommitted bytes (commit or abort publishes first)");
    }
  } while (!staged_bytes.compare_exchange_weak(cur, cur + bytes));
  return Status::Ok();
}

void LocalStore::Impl::ReleaseStaged(std::uint64_t bytes) {
  staged_bytes.fetch_sub(std::min(bytes, staged_bytes.load()));
}

// ---- reclaiming dropped chunks ----------------------------------------------------------

void LocalStore::Impl::NoteDropped(std::uint64_t bytes) {
  if (opts.read_only) return;
  MutexLock g(&reclaim_mu);
  if (reclaim_stop) return;
  reclaim_pending += std::max<std::uint64_t>(bytes, 1);
  if (reclaim_pending < opts.reclaim_after_bytes) return;
  if (!reclaimer.joinable()) reclaimer = std::thread([this] { ReclaimLoop(); });
  reclaim_cv.Signal();
}

void LocalStore::Impl::ReclaimLoop() {
  MutexLock g(&reclaim_mu);
  for (;;) {
    reclaim_cv.Wait(&reclaim_mu, [&]() REQUIRES(reclaim_mu) {
      return reclaim_stop || reclaim_pending >= opts.reclaim_after_bytes;
    });
    if (reclaim_stop) return;
    const std::uint64_t pending = reclaim_pending;
    reclaim_pending = 0;
    g.Unlock();
    Status s = ReclaimNow();
    g.Lock();
    if (s.ok()) {
      ++reclaims;
      reclaim_cv.SignalAll();
      continue;
    }
    spdlog::warn("statestore {}: reclaiming the space of dropped chunks: {} (retried after the next drop)",
                 path, s.ToString());
    // Try again once more is dropped (or at the next Compact).
    reclaim_pending += pending;
    reclaim_cv.Wait(&reclaim_mu,
                    [&]() REQUIRES(reclaim_mu) { return reclaim_stop || reclaim_pending > pending; });
    if (reclaim_stop) return;
  }
}

// Segments that are at least half dead are rewritten and those with no live
// chunk deleted (segment_gc.cc).
Status LocalStore::Impl::ReclaimNow() {
  PC_RETURN_IF_ERROR(Recover());
  PC_RETURN_IF_ERROR(CollectSegments(/*all=*/false));
  return CompactRecency();
}

// Every eviction deletes the oldest age record, and every touch an older
// one, so the recency records gather tombstones at the front, where each
// eviction's scan starts (Txn::PickVictim): without this, the scan skips
// all of them and an eviction costs more the longer the store has evicted.
// The records are small (two per entry): rewriting them all is cheap.
Status LocalStore::Impl::CompactRecency() {
  rocksdb::CompactRangeOptions o;
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  return AfterWriteError(
      FromRocks(db->CompactRange(o, cf_lru, nullptr, nullptr), "compact the recency records"));
}

void LocalStore::Impl::StopReclaimer() {
  gc_cancel.store(true);
  {
    MutexLock g(&reclaim_mu);
    reclaim_stop = true;
  }
  reclaim_cv.SignalAll();
  if (!reclaimer.joinable()) return;
  reclaimer.join();
}

// ---- the disk reserve ------------------------------------------------------------------------

std::string LocalStore::Impl::ReservePath() const {
  return path + "/DISK-RESERVE";
}

bool LocalStore::Impl::GiveBackReserve() {
  const std::string file = ReservePath();
  if (opts.read_only || !env->FileExists(file)) return false;
  if (Status s = env->RemoveFile(file); !s.ok()) {
    spdlog::error("statestore {}: the disk is full and its reserve cannot be removed: {}", path, s.ToString());
    return false;
  }
  spdlog::warn("statestore {}: the disk is full: gave back the store's disk reserve so that it opens; reads go "
               "on, writes are refused until space is freed",
               path);
  return true;
}

void LocalStore::Impl::EnsureReserve() {
  const std::string file = ReservePath();
  if (opts.read_only || opts.disk_reserve_bytes == 0 || env->FileExists(file)) return;
  // Written, not fallocated: every Env and file system then really holds
  // the space (tmpfs and an fallocate-less Env alike).
  auto w = env->NewWritableFile(file);
  Status s = w.status();
  const std::vector<std::byte> zeros(1u << 20);
  for (std::uint64_t left = opts.disk_reserve_bytes; s.ok() && left > 0;) {
    const std::uint64_t n = std::min<std::uint64_t>(left, zeros.size());
    s = (*w)->Append(std::span(zeros.data(), n));
    left -= n;
  }
  if (s.ok()) s = (*w)->Sync();
  if (w.ok()) (void)(*w)->Close();
  if (s.ok()) return;
  (void)env->RemoveFile(file);
  spdlog::info("statestore {}: no room for the {}-byte disk reserve ({}); made at the next open or compaction "
               "with room",
               path, opts.disk_reserve_bytes, s.ToString());
}

// ---- Compact ----------------------------------------------------------------------------

Status LocalStore::Compact() {
  Impl& s = *impl_;
  PC_RETURN_IF_ERROR(s.Writable());
  PC_RETURN_IF_ERROR(s.Recover());
  PC_RETURN_IF_ERROR(s.CollectSegments(/*all=*/true));
  rocksdb::CompactRangeOptions o;
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  for (auto* cf : s.handles) {
    PC_RETURN_IF_ERROR(s.AfterWriteError(
        FromRocks(s.db->CompactRange(o, cf, nullptr, nullptr), "compact " + cf->GetName())));
  }
  s.EnsureReserve();
  return Status::Ok();
}

}  // namespace primecache

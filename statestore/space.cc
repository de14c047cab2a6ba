// Disk space: the bound on uncommitted bytes, reclaiming the space of dropped
// chunks in the background, and the full compaction.
#include <rocksdb/metadata.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

// ---- uncommitted bytes ------------------------------------------------------------------

Status Store::Impl::ReserveStaged(std::uint64_t bytes) {
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

void Store::Impl::ReleaseStaged(std::uint64_t bytes) {
  staged_bytes.fetch_sub(std::min(bytes, staged_bytes.load()));
}

// ---- reclaiming dropped chunks ----------------------------------------------------------

namespace {

// The blob files up to the newest one that holds dead chunks: the age cutoff
// that makes blob garbage collection take them all (0: no file holds any),
// and the live bytes it would rewrite to free the dead ones.
struct BlobGarbage {
  double cutoff = 0;
  std::uint64_t garbage_bytes = 0;
  std::uint64_t live_bytes = 0;
};

BlobGarbage FindBlobGarbage(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf) {
  rocksdb::ColumnFamilyMetaData meta;
  db->GetColumnFamilyMetaData(cf, &meta);
  std::vector<rocksdb::BlobMetaData> blobs = meta.blob_files;
  std::sort(blobs.begin(), blobs.end(),
            [](const auto& a, const auto& b) { return a.blob_file_number < b.blob_file_number; });
  std::size_t newest = 0;  // 1 + the index of the newest file with garbage
  for (std::size_t i = 0; i < blobs.size(); ++i) {
    if (blobs[i].garbage_blob_count > 0) newest = i + 1;
  }
  BlobGarbage g;
  if (newest == 0) return g;
  for (std::size_t i = 0; i < newest; ++i) {
    g.garbage_bytes += blobs[i].garbage_blob_bytes;
    g.live_bytes +=
        blobs[i].total_blob_bytes - std::min(blobs[i].garbage_blob_bytes, blobs[i].total_blob_bytes);
  }
  g.cutoff = static_cast<double>(newest) / static_cast<double>(blobs.size());
  return g;
}

}  // namespace

void Store::Impl::NoteDropped(std::uint64_t bytes) {
  if (opts.read_only) return;
  std::lock_guard g(reclaim_mu);
  if (reclaim_stop) return;
  reclaim_pending += std::max<std::uint64_t>(bytes, 1);
  if (reclaim_pending < opts.reclaim_after_bytes) return;
  if (!reclaimer.joinable()) reclaimer = std::thread([this] { ReclaimLoop(); });
  reclaim_cv.notify_one();
}

void Store::Impl::ReclaimLoop() {
  std::unique_lock g(reclaim_mu);
  for (;;) {
    reclaim_cv.wait(g, [&] { return reclaim_stop || reclaim_pending >= opts.reclaim_after_bytes; });
    if (reclaim_stop) return;
    const std::uint64_t pending = reclaim_pending;
    reclaim_pending = 0;
    g.unlock();
    Status s = ReclaimNow();
    g.lock();
    if (s.ok()) {
      ++reclaims;
      reclaim_cv.notify_all();
      continue;
    }
    spdlog::warn("statestore {}: reclaiming the space of dropped chunks: {} (retried after the next drop)",
                 path, s.ToString());
    // Try again once more is dropped (or at the next Compact).
    reclaim_pending += pending;
    reclaim_cv.wait(g, [&] { return reclaim_stop || reclaim_pending > pending; });
    if (reclaim_stop) return;
  }
}

// The deletions sit in a memtable until a flush, the log files holding the
// staged bytes until every column family is flushed, and the bytes in blob
// files until a compaction meets their deletions. Blob files left with no
// live chunk are then dropped whole. One that still holds live chunks (a
// flush mixed them) is garbage-collected here only when that rewrites fewer
// live bytes than it frees; otherwise that waits for blob garbage collection
// or Compact.
Status Store::Impl::ReclaimNow() {
  PC_RETURN_IF_ERROR(Recover());
  rocksdb::FlushOptions fo;
  fo.wait = true;
  fo.allow_write_stall = true;
  PC_RETURN_IF_ERROR(AfterWriteError(FromRocks(db->Flush(fo, handles), "flush dropped chunks")));
  rocksdb::CompactRangeOptions o;
  o.exclusive_manual_compaction = false;  // background compactions go on
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  o.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kDisable;
  // Cut short by StopReclaimer: nothing failed.
  auto compact = [&](const char* what) -> Status {
    rocksdb::Status r = db->CompactRange(o, cf_chunks, nullptr, nullptr);
    if (r.IsManualCompactionPaused()) return Status::Ok();
    return AfterWriteError(FromRocks(r, what));
  };
  PC_RETURN_IF_ERROR(compact("compact dropped chunks"));
  const BlobGarbage g = FindBlobGarbage(db, cf_chunks);
  if (g.cutoff == 0 || g.live_bytes > g.garbage_bytes) return Status::Ok();
  o.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  o.blob_garbage_collection_age_cutoff = g.cutoff;
  return compact("collect dropped chunks");
}

void Store::Impl::StopReclaimer() {
  {
    std::lock_guard g(reclaim_mu);
    reclaim_stop = true;
  }
  reclaim_cv.notify_all();
  if (!reclaimer.joinable()) return;
  // A reclaim under way is cut short rather than waited for (the next open
  // collects and compacts again).
  if (db != nullptr) db->DisableManualCompaction();
  reclaimer.join();
}

// ---- Compact ----------------------------------------------------------------------------

Status Store::Compact() {
  Impl& s = *impl_;
  PC_RETURN_IF_ERROR(s.Writable());
  PC_RETURN_IF_ERROR(s.Recover());
  PC_RETURN_IF_ERROR(s.CollectStaged());
  rocksdb::CompactRangeOptions o;
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  // First every record: deleted chunks lose their references, so RocksDB
  // learns which blob files hold dead chunks (and drops those that hold
  // nothing else).
  o.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kDisable;
  for (auto* cf : s.handles) {
    PC_RETURN_IF_ERROR(s.AfterWriteError(
        FromRocks(s.db->CompactRange(o, cf, nullptr, nullptr), "compact " + cf->GetName())));
  }
  // Then the live chunks of blob files that hold dead ones are moved out,
  // and those files go.
  const BlobGarbage g = FindBlobGarbage(s.db, s.cf_chunks);
  if (g.cutoff > 0) {
    o.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
    o.blob_garbage_collection_age_cutoff = g.cutoff;
    PC_RETURN_IF_ERROR(s.AfterWriteError(
        FromRocks(s.db->CompactRange(o, s.cf_chunks, nullptr, nullptr), "collect blob garbage")));
  }
  return Status::Ok();
}

}  // namespace primecache

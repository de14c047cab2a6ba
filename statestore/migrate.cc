// Migration of a schema 1 or 2 store (chunk bytes in RocksDB's chunks column
// family, as blob-file values or pieces) to schema 3 (chunk bytes in segment
// files), when the store is opened for writing.
//
// Crash-safe and resumable in steps: each step appends up to kStepBytes of
// chunks to a segment (each checked against its address), syncs it, then
// writes one synced batch with the chunks' new reference records (version 2,
// with their extents), the deletion of their old keys and the segment's
// record. A reference record of version 1 means "not migrated yet", so a
// migration cut short resumes where it stopped (the next open first cuts
// the segment's uncommitted tail). The last batch clears the chunks column
// family and sets the schema to 3.
#include <spdlog/spdlog.h>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"
#include "statestore/test_hooks.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

constexpr std::uint64_t kStepBytes = 64ull << 20;

std::uint64_t Pieces(const Params& p, std::uint64_t size) {
  return (size + p.piece_bytes - 1) / p.piece_bytes;
}

// Reads a chunk of the old layout; kCorruption when it is missing, of the
// wrong size or fails its address.
Status ReadOldChunk(LocalStore::Impl& s, const Hash128& h, std::uint64_t size, std::string* out) {
  out->clear();
  if (s.params.chunk_layout == kLayoutPieces) {
    for (std::uint64_t i = 0; i < Pieces(s.params, size); ++i) {
      std::string piece;
      rocksdb::Status r = s.db->Get(rocksdb::ReadOptions(), s.cf_chunks, PieceKey(h, static_cast<std::uint32_t>(i)), &piece);
      if (r.IsNotFound()) return Status::Corruption("chunk " + HashHex(h) + " piece " + std::to_string(i) + " is missing");
      PC_RETURN_IF_ERROR(FromRocks(r, "read chunk " + HashHex(h)));
      out->append(piece);
    }
  } else {
    rocksdb::Status r = s.db->Get(rocksdb::ReadOptions(), s.cf_chunks, ChunkKey(h), out);
    if (r.IsNotFound()) return Status::Corruption("chunk " + HashHex(h) + " is missing");
    PC_RETURN_IF_ERROR(FromRocks(r, "read chunk " + HashHex(h)));
  }
  if (out->size() != size) return Status::Corruption("chunk " + HashHex(h) + " has the wrong size");
  if (!(Checksum128(std::as_bytes(std::span(out->data(), out->size()))) == h)) {
    return Status::Corruption("chunk " + HashHex(h) + ": content does not match its address (XXH3-128)");
  }
  return Status::Ok();
}

void DeleteOldChunk(LocalStore::Impl& s, rocksdb::WriteBatch* b, const Hash128& h, std::uint64_t size) {
  if (s.params.chunk_layout == kLayoutPieces) {
    for (std::uint64_t i = 0; i < Pieces(s.params, size); ++i)
      b->Delete(s.cf_chunks, PieceKey(h, static_cast<std::uint32_t>(i)));
  } else {
    b->Delete(s.cf_chunks, ChunkKey(h));
  }
}

// One step of the migration: chunks appended to `w`, and their records.
struct Step {
  rocksdb::WriteBatch batch;
  std::uint64_t live = 0;   // frame bytes added to w's segment
  std::uint64_t bytes = 0;  // chunk bytes copied
  std::uint64_t chunks = 0;
};

// Syncs the segment, then commits the step's batch with the segment record.
Status CommitStep(LocalStore::Impl& s, SegmentWriter& w, Step& step) {
  if (step.batch.Count() == 0) return Status::Ok();
  PC_RETURN_IF_ERROR(w.Sync());
  SegmentRecord rec;
  {
    MutexLock wl(&s.write_mu);
    if (auto it = s.segments.find(w.id()); it != s.segments.end()) rec = it->second;
  }
  rec.committed = w.end();
  rec.live += step.live;
  rec.state = w.end() >= s.opts.segment_bytes ? SegmentState::kSealed : SegmentState::kOpen;
  step.batch.Put(s.cf_segments, IdKey(w.id()), EncodeSegment(rec));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  TEST_KILL_POINT("migrate.before_batch");
  PC_RETURN_IF_ERROR(s.Write(wo, &step.batch, "migrate chunks"));
  TEST_KILL_POINT("migrate.after_batch");
  {
    MutexLock wl(&s.write_mu);
    s.segments[w.id()] = rec;
  }
  w.MarkCommitted();
  step.batch.Clear();
  step.live = step.bytes = step.chunks = 0;
  return Status::Ok();
}

// Moves one chunk of the old layout into `w` (or marks it lost).
Status MigrateOne(LocalStore::Impl& s, SegmentWriter& w, std::string_view key, ChunkRefRecord rec, Step* step) {
  const Hash128 h = HashFromKey(key);
  if (rec.refs == 0) {  // a record of no reference: nothing to keep
    step->batch.Delete(s.cf_chunk_refs, key);
    DeleteOldChunk(s, &step->batch, h, rec.size);
    return Status::Ok();
  }
  std::string bytes;
  Status rs = ReadOldChunk(s, h, rec.size, &bytes);
  rec.placed = true;
  if (rs.IsCorruption()) {
    spdlog::error("statestore {}: migrating: {}; the entries that need it will be quarantined", s.path,
                  rs.ToString());
    rec.segment = 0;
    rec.offset = 0;
    rec.flags |= kChunkCorrupt;
  } else {
    PC_RETURN_IF_ERROR(rs);
    TEST_KILL_POINT("migrate.copy");
    PC_ASSIGN_OR_RETURN(rec.offset, w.Append(h, std::as_bytes(std::span(bytes.data(), bytes.size()))));
    rec.segment = w.id();
    step->live += FrameBytes(rec.size);
    step->bytes += rec.size;
  }
  step->batch.Put(s.cf_chunk_refs, key, EncodeChunkRef(rec));
  DeleteOldChunk(s, &step->batch, h, rec.size);
  ++step->chunks;
  return Status::Ok();
}

// The last batch: whatever is left in the chunks column family (collection
// records, leftovers of publishes that never committed) goes, and the
// schema becomes 3.
Status FinishMigration(LocalStore::Impl& s) {
  Params p = s.params;
  p.chunk_layout = kLayoutSegments;
  p.piece_bytes = 0;
  rocksdb::WriteBatch b;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(rocksdb::ReadOptions(), s.cf_chunks));
  for (it->SeekToFirst(); it->Valid(); it->Next()) b.Delete(s.cf_chunks, it->key());
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan the old chunks"));
  it.reset();
  b.Put(s.cf_meta, std::string(kMetaParamsKey), EncodeParams(p));
  b.Put(s.cf_meta, std::string(kMetaSchemaKey), EncodeSchema(kSchemaVersion));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  PC_RETURN_IF_ERROR(s.Write(wo, &b, "finish migration"));
  s.params = p;
  s.stored_schema = kSchemaVersion;
  rocksdb::CompactRangeOptions o;
  o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  o.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  o.blob_garbage_collection_age_cutoff = 1.0;
  return FromRocks(s.db->CompactRange(o, s.cf_chunks, nullptr, nullptr), "compact the old chunks");
}

}  // namespace

Status LocalStore::Impl::MigrateChunks() {
  spdlog::info("statestore {}: migrating schema {} to {}: chunk bytes move into segment files", path,
               stored_schema, kSchemaVersion);
  PC_ASSIGN_OR_RETURN(auto w, AcquireWriter());
  Step step;
  std::uint64_t chunks = 0, bytes = 0;
  const std::uint64_t step_bytes =
      hooks != nullptr && hooks->migrate_step_bytes > 0 ? hooks->migrate_step_bytes : kStepBytes;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_chunk_refs));
  Status s;
  for (it->SeekToFirst(); s.ok() && it->Valid(); it->Next()) {
    auto rec = DecodeChunkRef(it->value().ToStringView());
    if (!rec.ok() || it->key().size() != 16) {
      s = Status::Corruption("migrating: a malformed chunk reference record");
      break;
    }
    if (rec->placed) continue;  // migrated by an earlier, interrupted run
    chunks += 1;
    bytes += rec->size;
    s = MigrateOne(*this, *w, it->key().ToStringView(), *rec, &step);
    if (s.ok() && step.bytes >= step_bytes) s = CommitStep(*this, *w, step);
    if (s.ok() && w->end() >= opts.segment_bytes && w->committed() == w->end()) {
      ReleaseWriter(std::move(w), /*reuse=*/false);
      auto next = AcquireWriter();
      if (!next.ok()) return next.status();
      w = std::move(next).value();
    }
  }
  if (s.ok()) s = FromRocks(it->status(), "scan chunk references");
  if (s.ok()) s = CommitStep(*this, *w, step);
  ReleaseWriter(std::move(w), /*reuse=*/s.ok());
  PC_RETURN_IF_ERROR(s);
  PC_RETURN_IF_ERROR(FinishMigration(*this));
  spdlog::info("statestore {}: migrated {} chunks ({} bytes) into segment files; schema {}", path, chunks, bytes,
               kSchemaVersion);
  return Status::Ok();
}

}  // namespace primecache

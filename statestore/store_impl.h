// LocalStore::Impl: the state behind primecache::Store, and Txn, one metadata
// batch. Impl's methods live in one file per topic: store_open.cc (open,
// load, close), store.cc (metadata writes and write errors, scopes,
// counters, sightings, delete), publish.cc (staging and commit), read.cc
// (lookup, an entry's records, quarantine), fetch.cc (streaming reads),
// list.cc (describe, list), leases.cc, recency.cc (the recency clock,
// eviction), txn.cc (metadata batches), segment_store.cc (the segment pool,
// open segment files, recovery), segment_gc.cc (segment rewriting), space.cc
// (staged bytes, the reclaimer), migrate.cc (schema 1/2 -> 3), verify.cc.
//
// Invariant: every metadata change is one RocksDB batch, built and written
// under write_mu by a Txn, whose Commit then updates `counters`, `segments`,
// the scopes and the in-memory filters before write_mu is released: with
// write_mu free they equal what is committed. Chunk bytes are written
// outside write_mu, each publisher to a segment of its own; readers take no
// store lock but extent_mu (shared, briefly) and leaf locks.
//
// Thread-safety: what is set while the store opens (options, paths, params,
// the RocksDB handles, the pools) is only read afterwards. Every other field
// is atomic or says which mutex guards it. Lock order, outermost first (a
// thread holding one takes only those listed after it):
//   gc_mu      one segment rewrite at a time, and none during a Verify;
//   write_mu   every metadata batch (commit, delete, eviction, quarantine,
//              gc, touch flushes);
//   pool_mu    the writable segments not handed out (gc takes it under
//              write_mu);
//   extent_mu  shared while a fetch resolves chunk extents to open segment
//              files, exclusive while gc (under write_mu) repoints extents
//              and drops a file; never held with pool_mu;
//   files_mu   open segment files and their mappings;
//   node_filter.mu, then exact_filter.mu (a commit takes both);
//   leaf locks, under which no other is taken: scope_mu, stats_mu,
//   recover_mu, reclaim_mu, touch_mu, sight_mu, checked_mu,
//   LeaseTable::mu.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "core/worker_pool.h"
#include "primecache/internal/statestore.h"
#include "statestore/format.h"
#include "statestore/node_filter.h"
#include "statestore/segments.h"
#include "core/token_hash.h"

namespace primecache {

namespace statestore_internal {

struct Hash128Hasher {
  std::size_t operator()(const Hash128& h) const {
    return static_cast<std::size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull));
  }
};

// Where a chunk's bytes are: a segment and the offset of the bytes in it.
struct Extent {
  std::uint64_t segment = 0;
  std::uint64_t offset = 0;
};

std::uint64_t NowUnixMs();

class GroupTable;  // statestore/group.h
struct StagedPart;
class Txn;

struct TestHooks;  // statestore/test_hooks.h

// The pass records ('P', format.h) an entry of `scope` with these tokens
// leaves, one per whole kPassBlockTokens block (branch.cc).
std::vector<std::string> PassKeys(const TokenHasher& hasher, std::uint64_t scope,
                                  std::span<const std::uint32_t> tokens, std::uint64_t id);

}  // namespace statestore_internal

// Who holds a lease on which entry, and which entries are being removed
// (no lease may start on those). Shared with the leases, which may outlive
// the store.
struct LeaseTable final : Lease::Table {
  struct Slot {
    std::uint32_t count = 0;
    bool dying = false;
  };
  Mutex mu;
  std::unordered_map<EntryId, Slot> slots GUARDED_BY(mu);
  std::uint64_t active GUARDED_BY(mu) = 0;  // leases held

  bool TryAcquire(EntryId id) EXCLUDES(mu);  // false when the entry is being removed
  void Release(EntryId id) override EXCLUDES(mu);
  bool MarkDying(EntryId id) EXCLUDES(mu);  // false when leased
  void ClearDying(EntryId id) EXCLUDES(mu);
  bool Leased(EntryId id) EXCLUDES(mu);
};

struct LocalStore::Impl {
  using Counters = statestore_internal::Counters;
  using Params = statestore_internal::Params;

  // ---- set while opening, then only read: written only by Open and what it
  // calls (store_open.cc, migrate.cc's MigrateChunks, branch.cc's
  // BuildPassIndex) before the Store is handed out, and by ~Impl; no lock.
  StoreOptions opts;
  Env* env = nullptr;
  std::string path;
  Params params;
  const TokenHasher* hasher = nullptr;
  std::shared_ptr<const LayerValidator> validator;
  std::shared_ptr<std::atomic<bool>> frozen;
  std::shared_ptr<const statestore_internal::TestHooks> hooks;  // null outside tests

  std::shared_ptr<rocksdb::FileSystem> fs;
  std::unique_ptr<rocksdb::Env> rocks_env;
  std::shared_ptr<rocksdb::Cache> block_cache;
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::ColumnFamilyHandle* cf_meta = nullptr;
  rocksdb::ColumnFamilyHandle* cf_entries = nullptr;
  rocksdb::ColumnFamilyHandle* cf_manifests = nullptr;
  rocksdb::ColumnFamilyHandle* cf_tokens = nullptr;
  rocksdb::ColumnFamilyHandle* cf_chunks = nullptr;
  rocksdb::ColumnFamilyHandle* cf_chunk_refs = nullptr;
  rocksdb::ColumnFamilyHandle* cf_index = nullptr;
  rocksdb::ColumnFamilyHandle* cf_lru = nullptr;
  rocksdb::ColumnFamilyHandle* cf_quarantine = nullptr;
  rocksdb::ColumnFamilyHandle* cf_segments = nullptr;
  std::uint32_t stored_schema = 0;  // the schema found at open (kSchemaVersion once migrated)
  // Every live entry has its pass records (kMetaPassIndexKey), so branch
  // points reach all of them; false only in a read-only open of an older store.
  bool pass_index = false;

  // ---- the locks, outermost first (the order above, checked: see
  // core/thread_annotations.h). Leaf locks take none after them.
  Mutex gc_mu;
  Mutex write_mu ACQUIRED_AFTER(gc_mu);
  Mutex pool_mu ACQUIRED_AFTER(write_mu);
  SharedMutex extent_mu ACQUIRED_AFTER(write_mu);
  Mutex files_mu ACQUIRED_AFTER(extent_mu, pool_mu);
  // (node_filter.mu, then exact_filter.mu: members of NodeFilter, ordered
  // after files_mu by the comment only.)
  mutable SharedMutex scope_mu ACQUIRED_AFTER(files_mu);
  mutable Mutex stats_mu ACQUIRED_AFTER(files_mu);
  Mutex recover_mu ACQUIRED_AFTER(files_mu);
  Mutex reclaim_mu ACQUIRED_AFTER(files_mu);
  Mutex touch_mu ACQUIRED_AFTER(files_mu);
  Mutex sight_mu ACQUIRED_AFTER(files_mu);
  Mutex checked_mu ACQUIRED_AFTER(files_mu);

  // ---- the write path.
  Counters counters GUARDED_BY(write_mu);    // as last committed
  Counters stats_copy GUARDED_BY(stats_mu);  // counters for Stat()
  std::atomic<std::uint64_t> hits{0}, misses{0}, refusals{0};
  std::atomic<std::uint64_t> byte_budget{0};

  // ---- scopes: read under scope_mu shared; a commit (under write_mu) adds
  // them under scope_mu exclusive.
  std::unordered_map<std::string, std::uint64_t> scope_by_name GUARDED_BY(scope_mu);  // ScopeByNameKey -> id
  std::map<std::uint64_t, statestore_internal::ScopeRecord> scopes GUARDED_BY(scope_mu);

  // ---- segment_store.cc: segment files.
  std::string seg_dir;                                            // <path>/segments
  statestore_internal::FreezeHook freeze;                         // tests: the simulated power loss
  std::map<std::uint64_t, statestore_internal::SegmentRecord> segments GUARDED_BY(write_mu);  // as committed
  // Writable segments not handed out, and the ids of those handed out.
  std::vector<std::unique_ptr<statestore_internal::SegmentWriter>> idle_writers GUARDED_BY(pool_mu);
  std::set<std::uint64_t> busy_segments GUARDED_BY(pool_mu);
  // Closed segments an aborted publish could not cut back (the cut itself
  // failed): id -> the length to cut to (a fresh, unrecorded one's file is
  // removed instead). Segment gc retries the cut; the next open does it too.
  std::map<std::uint64_t, std::uint64_t> uncut_tails GUARDED_BY(pool_mu);
  std::atomic<std::uint64_t> next_segment{1};
  // A writable segment for one publisher (or gc, or migration) alone.
  Result<std::unique_ptr<statestore_internal::SegmentWriter>> AcquireWriter() EXCLUDES(pool_mu);
  // Back to the pool, or closed when broken, sealed or not to be reused.
  void ReleaseWriter(std::unique_ptr<statestore_internal::SegmentWriter> w, bool reuse) EXCLUDES(pool_mu);
  // Closes every idle writer, so that gc may rewrite their segments.
  void CloseIdleWriters() EXCLUDES(pool_mu);
  // Open segment files for reading, shared with the readers that resolved
  // an extent in them (a file gc unlinks stays readable to them).
  std::unordered_map<std::uint64_t, std::shared_ptr<RandomAccessFile>> open_files GUARDED_BY(files_mu);
  // id -> what is wrong with its file
  std::unordered_map<std::uint64_t, std::string> damaged_segments GUARDED_BY(files_mu);
  Result<std::shared_ptr<RandomAccessFile>> SegmentFile(std::uint64_t id) EXCLUDES(files_mu);
  void ForgetSegmentFile(std::uint64_t id) EXCLUDES(files_mu, checked_mu);
  // A read-only mapping of segment `id` covering at least its first `end`
  // bytes (the whole file as it is now), kept with the open file until gc
  // forgets the segment; holders keep their copy alive after that.
  std::unordered_map<std::uint64_t, MappedRegion> mappings GUARDED_BY(files_mu);
  Result<MappedRegion> SegmentMapping(std::uint64_t id, const RandomAccessFile& file, std::uint64_t end)
      EXCLUDES(files_mu);
  // Chunks whose address matched while a sink held their mapping pinned
  // (FetchSink::Pin, the serial of the pin held while it was checked): mapping id -> chunk offset -> pin number. Bounded
  // (cleared when it grows past a million chunks); a forgotten mapping's
  // entries go with it.
  std::unordered_map<std::uint64_t, std::unordered_map<std::uint64_t, std::uint64_t>> checked_pinned
      GUARDED_BY(checked_mu);
  std::size_t checked_pinned_count GUARDED_BY(checked_mu) = 0;
  bool CheckedWhilePinned(std::uint64_t mapping, std::uint64_t offset, std::uint64_t pin)
      EXCLUDES(checked_mu);
  void NoteCheckedWhilePinned(std::uint64_t mapping, std::uint64_t offset, std::uint64_t pin)
      EXCLUDES(checked_mu);
  // At open: cuts torn tails, deletes unrecorded files, notes missing or
  // short ones, and puts the open segments back in the pool.
  // Both under write_mu (Open takes it; RebuildDerived holds it).
  Status RecoverSegments() REQUIRES(write_mu);
  Status LoadSegments() REQUIRES(write_mu);
  Result<std::uint64_t> SegmentDiskBytes();
  // Sets the RocksDB memory fields of `st` (block cache, memtables, table readers).
  void AddRocksMemory(StoreStats* st) const;
  // Whether `bytes`, the chunk at extent `e`, match their address `h`;
  // kCorruption naming the chunk, its segment and offset when not.
  static Status CheckAddress(std::span<const std::byte> bytes, const Hash128& h, const statestore_internal::Extent& e);
  // Reads one chunk's bytes from its extent into `dst` (its size), checking
  // its address; kCorruption names the segment.
  Status ReadExtent(const std::shared_ptr<RandomAccessFile>& file, const statestore_internal::Extent& e, const Hash128& h,
                    std::span<std::byte> dst);

  std::shared_ptr<LeaseTable> leases = std::make_shared<LeaseTable>();  // locks its own mu

  // Reads ahead for fetches (null when StoreOptions::fetch_read_threads is 0).
  std::unique_ptr<WorkerPool> read_pool;

  // Recency: a logical clock; accesses are buffered and written in batches.
  std::atomic<std::uint64_t> clock{1};
  struct PendingTouch {
    std::uint64_t tick = 0;
    std::uint64_t hits = 0;
  };
  std::unordered_map<EntryId, PendingTouch> pending_touches GUARDED_BY(touch_mu);

  // Which index nodes and exact records exist (see node_filter.h); each is
  // guarded by its own mu (shared to ask, exclusive to change).
  statestore_internal::NodeFilter node_filter;   // 'N' keys, by slot total
  statestore_internal::NodeFilter exact_filter;  // 'X' keys, by id count
  Status LoadFilters();

  // Admission: sightings of boundaries, in memory, bounded.
  std::unordered_map<std::string, std::uint32_t> sightings GUARDED_BY(sight_mu);
  std::deque<std::string> sighting_order GUARDED_BY(sight_mu);  // oldest first
  // AdmissionPolicy::kReuse: lookups per (scope name, block-aligned prefix).
  std::unordered_map<std::uint64_t, std::uint32_t> prefix_sightings GUARDED_BY(sight_mu);
  std::deque<std::uint64_t> prefix_order GUARDED_BY(sight_mu);  // oldest first

  ~Impl();

  // LocalStore::Open and statestore_internal::OpenWithHooks.
  static Result<std::unique_ptr<LocalStore>> Open(StoreOptions options,
                                             std::shared_ptr<const statestore_internal::TestHooks> hooks);

  // ---- store_open.cc
  // Opens (creating or adopting) the RocksDB database, in steps: RocksDB's
  // file system and options; an existing store's schema and parameters,
  // read before anything is written (nullopt: none yet); the column
  // families; a new store's first records.
  Status OpenDb();
  rocksdb::DBOptions SetUpRocks();
  Result<std::optional<std::uint32_t>> AdoptStored(const rocksdb::DBOptions& dbo,
                                                   const std::vector<std::string>& existing);
  Status OpenColumnFamilies(const rocksdb::DBOptions& dbo, bool has_schema);
  Status InitialiseRecords();
  Status LoadState() REQUIRES(write_mu);
  Status CloseDb();

  // ---- store.cc
  rocksdb::WriteOptions CommitWriteOptions() const;
  // db->Write, once Recover() allows it; after a failure, AfterWriteError.
  Status Write(const rocksdb::WriteOptions& wo, rocksdb::WriteBatch* batch, std::string_view what);
  // After a failed write RocksDB takes no more writes until DB::Resume()
  // succeeds. A full disk (and any other error RocksDB can resume from) is
  // left as soon as Resume() can flush again: every later write, flush and
  // compaction first calls Recover(), which retries it. A fatal error (e.g. a WAL
  // write that failed for another reason than space) cannot be resumed:
  // writes are then refused with kUnavailable until the store is reopened.
  // Reads go on throughout.
  Status AfterWriteError(const Status& s) EXCLUDES(recover_mu);
  // OK when writes may go on; else why not (kResourceExhausted while the
  // disk stays full, kUnavailable otherwise).
  Status Recover() EXCLUDES(recover_mu);
  // kFailedPrecondition when the store was opened read-only.
  Status Writable() const;
  std::atomic<bool> stopped{false};  // RocksDB is in its error state
  // recover_mu serialises Resume() attempts.
  Status stop_cause GUARDED_BY(recover_mu);  // the write error that stopped it
  Status fatal GUARDED_BY(recover_mu);       // set when Resume() cannot help
  std::optional<std::uint64_t> FindScope(const Hash128& digest, std::string_view ns) const EXCLUDES(scope_mu);
  std::optional<statestore_internal::ScopeRecord> ScopeById(std::uint64_t id) const EXCLUDES(scope_mu);
  void PublishCounters(const Counters& c) EXCLUDES(stats_mu);
  std::uint64_t StoredBytes(const Counters& c) const { return c.chunk_bytes + c.meta_bytes; }
  Counters WithLiveStats(Counters c) const;

  // Sightings.
  static std::string SightingKey(const Hash128& model, std::string_view ns, std::uint64_t length,
                                 std::uint64_t exact_hash);
  void NoteSighting(const std::string& key) EXCLUDES(sight_mu);
  std::uint32_t Sightings(const std::string& key) EXCLUDES(sight_mu);
  // kReuse: the key of the prefix of `level` blocks of kSightingBlock tokens
  // whose chain hash (ChainHashes with that block) is `h`; a lookup notes
  // each of its query's whole-block prefixes (h_1..h_n, h[0] unused). The
  // block is finer than the index's, so that prompts of a few hundred
  // tokens are told apart.
  static constexpr std::uint32_t kSightingBlock = 64;
  static std::uint64_t PrefixSightingKey(const Hash128& model, std::string_view ns, std::uint64_t level,
                                         std::uint64_t h);
  void NotePrefixSightings(const Hash128& model, std::string_view ns, const std::vector<std::uint64_t>& h,
                           std::size_t levels) EXCLUDES(sight_mu);
  // kReuse: OK when an earlier lookup shared enough of the boundary; else kAborted saying why.
  Status AdmitReused(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> tokens);

  // ---- list.cc
  Result<EntryInfo> MakeInfo(EntryId id, const statestore_internal::EntrySummary& s, EntryState state);

  // ---- recency.cc (and Txn's eviction)
  void Touch(EntryId id, bool hit) EXCLUDES(touch_mu);
  Status FlushTouches() REQUIRES(write_mu);

  // ---- read.cc
  // kNotFound unless the entry record `record` of `id` is of namespace `ns`.
  Status CheckNamespace(EntryId id, std::string_view record, const std::string& ns) const;
  Status GetValue(rocksdb::ColumnFamilyHandle* cf, const std::string& key, std::string* value, bool* found,
                  const rocksdb::ReadOptions& ro = rocksdb::ReadOptions());
  // Whether the stored tokens of `id` equal `tokens`; quarantines an entry
  // whose token record is corrupt (and answers false).
  // (Under write_mu, pass quarantine = false: a corrupt record then only
  // answers false.)
  Result<bool> TokensMatch(EntryId id, std::span<const std::uint32_t> tokens, bool quarantine);
  // The longest stored boundary of `scope` whose tokens are a prefix of
  // `tokens` (the whole of them included) and which `usable` accepts. Reads
  // committed records only and quarantines nothing (for use under write_mu).
  // ---- branch.cc
  // The longest prefix of `tokens` that a live entry of `scope` shares token
  // for token, and at least `at_least` (the hit's length): from the pass
  // records, confirmed on the stored tokens of a few entries that pass the
  // deepest shared level.
  Result<std::uint64_t> BranchPoint(std::uint64_t scope, std::span<const std::uint32_t> tokens,
                                    std::uint64_t at_least);
  // At open: gives the entries of a store without pass records theirs (in
  // batches, then the marker), and notes whether the store has them.
  Status BuildPassIndex();

  Result<std::optional<EntryId>> LongestStoredPrefix(std::uint64_t scope, std::span<const std::uint32_t> tokens,
                                                     const std::function<bool(EntryId)>& usable);
  // The entry stored under exactly this identity, if any.
  Result<std::optional<EntryId>> FindIdentity(std::uint64_t scope, std::span<const std::uint32_t> tokens,
                                              const BoundaryPlace& place,
                                              bool quarantine);
  // The extent and open file of each chunk (by hash), resolved in one MultiGet
  // under extent_mu; a chunk that cannot be read gets its kCorruption.
  struct Located {
    statestore_internal::Extent extent;
    std::shared_ptr<RandomAccessFile> file;
    Status status;
  };
  Status LocateChunks(const std::vector<Hash128>& hashes, std::vector<Located>* out) EXCLUDES(extent_mu);
  void Quarantine(EntryId id, const std::string& reason, std::optional<Hash128> bad_chunk);
  // Removes an entry whose own records are unreadable, then rebuilds the
  // derived records.
  Status ForceRemove(EntryId id) REQUIRES(write_mu);

  // ---- publish.cc
  // Takes the publish's writer back after an abort (its bytes are dead space).
  void AbortPublish(std::unique_ptr<statestore_internal::SegmentWriter> w, std::uint64_t written_bytes);
  // Gives a part's bytes and staged budget back (an abort, or a refusal).
  void AbortPart(statestore_internal::StagedPart& part);
  Status Admit(const PublishRequest& req, const BoundaryPlace& place);
  Status CheckModel(const PublishRequest& req, std::span<const statestore_internal::StagedPart> parts);
  // Syncs a part's segment while its chunks are read back and checked.
  Status MakeDurable(statestore_internal::StagedPart& part);
  // The entry of these parts (one publisher's, or a group's in rank order)
  // in one batch, or every part given back: a failure, or an identity stored
  // meanwhile (existed).
  Result<PublishResult> CommitParts(const PublishRequest& req, const BoundaryPlace& place,
                                    std::span<statestore_internal::StagedPart> parts) EXCLUDES(write_mu);
  // The group publishes in progress (made at open, closed first at close).
  std::unique_ptr<statestore_internal::GroupTable> groups;
  // A failed segment write, with a full disk said in words (and shown by
  // Stat's write_error until a segment write succeeds again).
  Status AfterSegmentError(const Status& s) EXCLUDES(recover_mu);
  void SegmentWritesOk();
  std::atomic<bool> segment_full{false};
  Status segment_error GUARDED_BY(recover_mu);

  // The bound on uncommitted bytes (StoreOptions::max_staged_bytes).
  Status ReserveStaged(std::uint64_t bytes);
  void ReleaseStaged(std::uint64_t bytes);
  std::atomic<std::uint64_t> staged_bytes{0};

  // Reclaiming the space of dropped chunks: once reclaim_after_bytes were
  // dropped, the reclaimer thread rewrites the segments that are mostly dead
  // (segment_gc.cc).
  void NoteDropped(std::uint64_t bytes) EXCLUDES(reclaim_mu);
  void ReclaimLoop() EXCLUDES(reclaim_mu);
  Status ReclaimNow();
  Status CompactRecency();
  void StopReclaimer() EXCLUDES(reclaim_mu);
  // Started under reclaim_mu while !reclaim_stop; joined by StopReclaimer
  // once reclaim_stop is set (outside the lock, which the loop takes).
  std::thread reclaimer;
  CondVar reclaim_cv;  // waited on with reclaim_mu
  std::uint64_t reclaim_pending GUARDED_BY(reclaim_mu) = 0;
  bool reclaim_stop GUARDED_BY(reclaim_mu) = false;
  std::atomic<std::uint64_t> reclaims{0};  // completed (for tests)

  // ---- space.cc: the disk reserve (StoreOptions::disk_reserve_bytes)
  std::string ReservePath() const;
  // Removes the reserve at an open that found the disk full; true when there
  // was one to give back.
  bool GiveBackReserve();
  // Makes the reserve when it is missing and there is room; a failure only
  // leaves it for the next open or Compact.
  void EnsureReserve();

  // ---- segment_gc.cc
  std::atomic<bool> gc_cancel{false};  // the store is closing: a rewrite under way stops
  // Rewrites the segments with dead bytes (all: every one with any; else
  // those at least half dead) and deletes those with no live chunk.
  Status CollectSegments(bool all) EXCLUDES(gc_mu);
  // Cuts the tails in uncut_tails (those it cannot stay for the next try).
  Status CutAbortedTails();
  Status RewriteSegment(std::uint64_t id, const statestore_internal::SegmentRecord& rec);
  Status DropDeadSegment(std::uint64_t id);
  Status UnlinkSegment(std::uint64_t id);

  // ---- migrate.cc
  Status MigrateChunks();

  // ---- verify.cc
  Result<StoreCheckReport> CheckStore(bool read_chunks) EXCLUDES(gc_mu);
  // Recomputes what the entries imply (chunk references, the index, the
  // counters) and rewrites what disagrees. For damage that cannot be undone
  // entry by entry.
  Status RebuildDerived() REQUIRES(write_mu);
  Status RebuildRefs(std::map<std::string, statestore_internal::ChunkRefRecord>& want, rocksdb::WriteBatch* b)
      REQUIRES(write_mu);
  Status VerifySegments(const rocksdb::ReadOptions& ro, const std::map<std::uint64_t, std::uint64_t>& live,
                        const std::vector<std::pair<Hash128, statestore_internal::ChunkRefRecord>>& placed,
                        bool read_chunks, const std::function<void(std::string)>& problem);
};

namespace statestore_internal {

// What the in-memory filters count for an index value: the slot total of a
// node, the ids of an exact record (0 when absent or malformed).
std::uint64_t SlotTotal(const std::optional<std::string>& v, std::uint32_t block);
std::uint64_t IdCount(const std::optional<std::string>& v);

// One metadata batch, built under write_mu and written atomically.
class Txn {
 public:
  // Built with write_mu held, and used only while it is; from here on the
  // analysis knows that of this Txn (each method REQUIRES it).
  explicit Txn(LocalStore::Impl& s) REQUIRES(s.write_mu) ASSERT_CAPABILITY(s_.write_mu) : s_(s), c_(s.counters) {}
  ~Txn() REQUIRES(s_.write_mu);
  // The lock its methods need (for a function given a Txn: REQUIRES(t.mu())).
  Mutex& mu() const RETURN_CAPABILITY(s_.write_mu) { return s_.write_mu; }

  rocksdb::WriteBatch& batch() { return batch_; }
  Counters& counters() { return c_; }

  // Chunk references, read through this batch's own changes.
  Result<ChunkRefRecord*> Ref(const Hash128& h) REQUIRES(s_.write_mu);  // nullptr-free: refs == 0 when none
  // n more references by a publish that wrote the bytes at `wrote`, or found
  // them committed at `seen` when it began (bytes stay where they are until
  // gc drops their segment, so a chunk removed meanwhile is taken back).
  Status AddRefs(const Hash128& h, std::uint64_t size, std::uint64_t n, std::optional<Extent> wrote,
                 std::optional<Extent> seen) REQUIRES(s_.write_mu);
  Status DropRefs(const Hash128& h, std::uint64_t n) REQUIRES(s_.write_mu);
  // gc: moves a chunk's recorded extent (when it is still `from`).
  Status Repoint(const Hash128& h, const Extent& from, const Extent& to, bool* moved) REQUIRES(s_.write_mu);

  // Segment records, through this batch's changes; live bytes follow the
  // chunk records at Commit.
  void SetSegment(std::uint64_t id, std::uint64_t committed, SegmentState state) REQUIRES(s_.write_mu);
  void DropSegment(std::uint64_t id) REQUIRES(s_.write_mu);

  // Index values, read through this batch's own changes.
  Result<std::optional<std::string>> IndexValue(const std::string& key) REQUIRES(s_.write_mu);
  void SetIndexValue(const std::string& key, std::optional<std::string> value) REQUIRES(s_.write_mu);
  // The entry ids of an exact record and the slots of a node (empty when the
  // key holds nothing), as this transaction sees them.
  Result<std::vector<std::uint64_t>> ExactIds(const std::string& key) REQUIRES(s_.write_mu);
  Result<std::vector<NodeSlot>> NodeSlots(const std::string& key) REQUIRES(s_.write_mu);
  Status IndexAdd(std::uint64_t scope, std::uint64_t length, const BoundaryPlace& place, EntryId id)
      REQUIRES(s_.write_mu);
  Status IndexRemove(std::uint64_t scope, std::uint64_t length, const BoundaryPlace& place, EntryId id)
      REQUIRES(s_.write_mu);

  // Scope for (digest, ns), created in this batch when new; a descriptor is
  // added to a scope stored without one.
  Result<std::uint64_t> ScopeFor(const Hash128& model, std::string_view model_name, std::string_view ns,
                                 std::string_view descriptor) REQUIRES(s_.write_mu);

  // Deletes entry `id`'s pass records found by scanning its scope's (for an
  // entry whose tokens cannot be read).
  Status DeletePassRecordsByScan(std::uint64_t scope, EntryId id) REQUIRES(s_.write_mu);
  // Removes a live entry (references, index, records); false when it is not
  // there. With a reason, it goes to quarantine instead of away.
  Result<bool> RemoveEntry(EntryId id, const std::optional<std::string>& quarantine_reason)
      REQUIRES(s_.write_mu);
  // Deletes every record keyed by entry `id`: its entry, manifest and tokens
  // records and its recency (access and age) records. An unreadable access
  // record fails the batch, unless tolerate_bad_access (its age record,
  // which only that record locates, then stays: Verify reports it).
  Status DeleteEntryRecords(EntryId id, bool tolerate_bad_access) REQUIRES(s_.write_mu);
  // A quarantined entry's manifest was unreadable, so its references could
  // not be dropped one by one: the caller rebuilds them after the commit.
  bool needs_rebuild() const { return needs_rebuild_; }

  // Marks an entry as being removed (fails when leased); cleared at the end.
  bool MarkDying(EntryId id) REQUIRES(s_.write_mu);

  // Evicts until stored bytes fit the budget (protecting `keep`).
  Status EvictToBudget(std::uint64_t budget, std::optional<EntryId> keep, std::uint64_t* evicted)
      REQUIRES(s_.write_mu);

  // Writes everything: reference records, chunk deletions, index values,
  // counters. On success the store's counters and scopes take the new values.
  Status Commit(const rocksdb::WriteOptions& wo, const char* kill_before, const char* kill_after)
      REQUIRES(s_.write_mu);

 private:
  struct RefState {
    bool loaded_present = false;  // a record with references existed before this batch
    ChunkRefRecord loaded;
    ChunkRefRecord rec;
  };
  Status ApplySegments() REQUIRES(s_.write_mu);
  bool SegmentLive(std::uint64_t id) const REQUIRES(s_.write_mu);
  Result<std::optional<EntryId>> PickVictim(std::optional<EntryId> keep) REQUIRES(s_.write_mu);
  Result<double> ExclusiveBytes(EntryId id, const EntrySummary& s) REQUIRES(s_.write_mu);
  Result<double> MarginalFlops(EntryId id, const EntrySummary& s) REQUIRES(s_.write_mu);

  LocalStore::Impl& s_;
  rocksdb::WriteBatch batch_;
  Counters c_;
  std::unordered_map<Hash128, RefState, Hash128Hasher> refs_;
  std::map<std::string, std::optional<std::string>> index_;
  std::map<std::string, std::uint64_t> filter_base_;  // each N/X key's filter count before this batch
  std::vector<EntryId> dying_;
  std::set<EntryId> removed_;  // removed in this batch, or not to be picked again by eviction
  // kMarginal's figures so far: an entry's stored parent (the longest shorter
  // boundary of its tokens) and the FLOPs it saves beyond it; good while that
  // parent is not removed. (The entry a publish's batch adds is not seen as
  // a parent: its records are not committed yet.)
  struct Marginal {
    std::optional<EntryId> parent;
    double flops = 0;
  };
  std::unordered_map<EntryId, Marginal> marginal_;
  std::vector<ScopeRecord> new_scopes_;  // created or rewritten in this batch
  std::map<std::uint64_t, std::optional<SegmentRecord>> segs_;  // changed segment records (nullopt: dropped)
  std::uint64_t dropped_bytes_ = 0;                              // chunk bytes that lost their last reference
  bool needs_rebuild_ = false;
};

}  // namespace statestore_internal
}  // namespace primecache

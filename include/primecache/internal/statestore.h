// statestore: the persistent store of prefix snapshots, on RocksDB.
//
// An entry is one boundary's snapshot: the encoded layers an engine captured
// after prefilling an exact token sequence, for one model fingerprint and one
// namespace (tenant). Its identity is (fingerprint digest, namespace, tokens);
// lookups never cross fingerprints or namespaces.
//
//  - Publish streams the encoded layers of one boundary in, chunk by chunk,
//    appending the chunk bytes to the store's own segment files; Commit
//    syncs them, then writes the metadata in one atomic, synced RocksDB
//    batch: after a crash there is either no entry or a complete one, and
//    Commit returns only once the entry is durable. RocksDB holds metadata
//    only. Leftovers of crashed publishes are cut when the store is opened;
//    dead bytes are reclaimed by rewriting segments (gc).
//  - Lookup returns the longest stored boundary whose tokens are an exact
//    prefix of the query. Token blocks are hashed into a persisted index, so
//    the cost does not grow with the number of entries; hashes only find
//    candidates, and the stored tokens are compared before a hit is reported.
//  - Fetch streams the layers back and checks every chunk against its
//    content address (XXH3-128) before handing it out; a corrupt entry is
//    reported, never served, and moved to quarantine.
//  - Chunks are content-addressed and reference-counted, so the append-only
//    planes that K boundaries of one conversation share are stored once.
//  - A byte budget is kept by evicting entries (LRU, or a utility that weighs
//    recency against compute saved per stored byte); leased entries are never
//    evicted; admission can require a boundary to be seen N times first, or
//    (AdmissionPolicy::kReuse) a prefix of it to have been looked up before.
//
// Every file access, RocksDB's included, goes through primecache::Env.
// Byte layouts: docs/format-store.md.
//
// LocalStore implements the store interface (primecache/internal/store.h, where the
// operations' values are declared), with the extras only a local store has.
//
// Thread-safety: LocalStore is safe to use from many threads at once. A
// Publisher is used by one thread at a time; many publishers may run
// concurrently. Leases may be released from any thread. The store must
// outlive its publishers; leases may outlive the store (releasing them then
// does nothing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/entry.h"
#include "primecache/internal/env.h"
#include "primecache/internal/layer_validator.h"
#include "primecache/status.h"
#include "primecache/internal/store.h"

namespace primecache {

// The prefill estimate of ModelCost (primecache/entry.h):
// EstimatePrefillFlops(L) = L * flops_per_token
//                         + attention_layers * attention_flops_per_pair * L * (L + 1) / 2
// All zero: the estimate falls back to L.
double EstimatePrefillFlops(const ModelCost& cost, std::uint64_t tokens);

enum class EvictionPolicy : std::uint8_t {
  kLru = 0,      // least recently used first
  kUtility = 1,  // Marconi-style: recency + alpha * (FLOPs saved / bytes freed), lowest first
  // As kUtility, but an entry is credited only with the FLOPs it saves beyond
  // the longest shorter boundary of its own tokens that is also stored (the
  // prefill a hit on that one would still need): of one conversation's
  // boundaries, the ones that add little over an older stored one go first.
  kMarginal = 2,
};

// Which new boundaries a publish may store.
enum class AdmissionPolicy : std::uint8_t {
  kAll = 0,  // every one (after admit_after_sightings misses, when that is > 1)
  // Only a boundary likely to be reached again: one whose prefix of at least
  // admit_reuse_share of its tokens (counted in whole blocks of 64 tokens)
  // was also looked up by an earlier request, i.e. by at least two lookups
  // counting the publisher's own (its conversation goes on, or it shares a
  // prefix with others). One-off prompts that share nothing with anything
  // are not stored. Lookups note their query's prefixes of whole 64-token
  // blocks in memory (the latest sighting_capacity * 4 of them).
  // Lookups that do not record (LookupOptions::record false) note nothing.
  kReuse = 1,
};

// Which entries a byte budget keeps: what a publish may store (admission)
// and what goes first when space is short (eviction). One value from the
// daemon's flags and config file, through the benches, to the store.
struct EvictionOptions {
  EvictionPolicy policy = EvictionPolicy::kLru;
  double utility_alpha = 1.0;       // kUtility, kMarginal: weight of compute-per-byte against recency
  std::size_t utility_window = 64;  // kUtility, kMarginal: oldest evictable entries compared per eviction
  AdmissionPolicy admission = AdmissionPolicy::kAll;
  std::uint32_t admit_after_sightings = 1;   // >1: a boundary is stored only once lookups missed it this often
  std::size_t sighting_capacity = 1u << 16;  // boundaries whose sightings are remembered (in memory)
  double admit_reuse_share = 0.25;  // kReuse: the share of a boundary an earlier lookup must have shared

  friend bool operator==(const EvictionOptions&, const EvictionOptions&) = default;
};

// The names the daemon's --eviction and --admission take: "lru" | "utility"
// | "marginal"; "all" | "seen-twice" | "reuse" (seen-twice sets
// admit_after_sightings to 2, the others 1). kInvalidArgument naming the
// choices otherwise; `options` is then unchanged.
Status ParseEvictionPolicy(std::string_view name, EvictionOptions* options);
Status ParseAdmission(std::string_view name, EvictionOptions* options);
std::string_view EvictionPolicyName(EvictionPolicy policy);
std::string_view AdmissionName(const EvictionOptions& options);

struct StoreOptions {
  std::string path;    // the store's directory; empty: DefaultDataDir() + "/store"
  Env* env = nullptr;  // nullptr: Env::Default(); must outlive the store
  bool create_if_missing = true;
  // Opens an existing store for reading only (RocksDB's read-only mode: no
  // lock taken, nothing written, not even recency, hit counts or a
  // quarantine). Publish, Delete, SetByteBudget and Compact answer
  // kFailedPrecondition. For inspecting the store of a stopped daemon. A
  // store of an older schema is refused (kFailedPrecondition naming
  // `primecachectl migrate`); opened for writing, it is migrated.
  bool read_only = false;

  std::uint64_t byte_budget = 0;  // stored_bytes kept at or below this; 0: unlimited
  EvictionOptions eviction;

  // Creation-time format choices, recorded in the store; an existing store
  // keeps its own.
  std::uint32_t block_tokens = 256;  // tokens per hashed index block

  // The largest chunk a publish may add: 1..StoreLimits::kMaxChunkBytes.
  std::uint64_t max_chunk_bytes = StoreLimits::kDefaultMaxChunkBytes;
  // A segment file is sealed (never appended to again) once a commit takes
  // it past this many bytes; concurrent publishers write different segments.
  std::uint64_t segment_bytes = 256ull << 20;
  // RocksDB's memory (docs/operations.md "Memory"): one LRU cache of this
  // many bytes holds the metadata tables' blocks, their indexes and filters,
  // and is charged for the memtables, which are flushed once they pass
  // memtable_bytes (and are then at most a little over it while the flush
  // runs). Together they bound what the store's RocksDB holds, whatever the
  // store's size or churn.
  std::uint64_t block_cache_bytes = 256ull << 20;
  std::uint64_t memtable_bytes = 64ull << 20;
  // Fetch reads chunks ahead of the sink, in parallel on a pool of this many
  // threads shared by every fetch (0: one chunk at a time, on the caller's
  // thread), at most fetch_read_ahead chunks and, past the first,
  // fetch_read_ahead_bytes bytes ahead.
  std::size_t fetch_read_threads = 4;
  std::size_t fetch_read_ahead = 16;
  std::uint64_t fetch_read_ahead_bytes = 8ull << 20;
  // Segment files are read with O_DIRECT (past the page cache: for data that
  // is not cached), over the aligned range around each chunk into an
  // aligned buffer, then copied out. Where the file system has no O_DIRECT,
  // buffered reads.
  bool direct_reads = false;
  // false: commits are not synced (for building throwaway stores in benchmarks only).
  bool sync_commits = true;

  // The most chunk bytes all uncommitted publishes together may have written
  // (0: no bound). A chunk that would pass it is refused with
  // kResourceExhausted and fails its publish; commits and aborts give their
  // bytes back.
  std::uint64_t max_staged_bytes = 8ull << 30;
  // Once aborted publishes, removals and evictions have dropped this many
  // chunk bytes, the store rewrites its segments that are at least half
  // dead in the background (and deletes those with no live chunk), so that
  // their space comes back within seconds (0: after every drop).
  std::uint64_t reclaim_after_bytes = 16ull << 20;
  // A file of this many bytes kept in the store's directory (DISK-RESERVE)
  // for a full disk: an open that finds no room for RocksDB's new files
  // removes it and opens with its space (reads go on; writes are refused
  // until space is freed, and then resume); it is made again at an open or a
  // Compact that has room. 0: none.
  std::uint64_t disk_reserve_bytes = 4ull << 20;

  // A group publish (PublishGroup) whose parts have not all committed this
  // long after its first part began is aborted, and its parts' bytes given
  // back.
  std::uint64_t group_timeout_ms = 30'000;

  // Checks every layer at commit (required: Open refuses a store without one).
  // The codecs library supplies the validator of its encoded layers,
  // CodecLayerValidator() in primecache/internal/codec.h.
  std::shared_ptr<const LayerValidator> validator;
};

class LocalStore final : public Store {
 public:
  static Result<std::unique_ptr<LocalStore>> Open(StoreOptions options);
  ~LocalStore() override;
  LocalStore(const LocalStore&) = delete;
  LocalStore& operator=(const LocalStore&) = delete;

  const std::string& path() const;

  // Starts a publish: a publisher, or (publisher null) the id of the entry
  // already stored under this identity (admission does not apply to it; a
  // descriptor its scope lacks is kept). kAborted: not admitted yet (seen
  // fewer times than admit_after_sightings, or kReuse's share not met);
  // kInvalidArgument: a request over a StoreLimits bound or malformed.
  Result<PublishStart> BeginPublish(PublishRequest request) override;

  // The longest stored boundary whose tokens are a prefix of `tokens`, or
  // none; the hit carries the entry's layer count and sizes.
  Result<std::optional<LookupHit>> Lookup(const Hash128& model, std::string_view ns,
                                          std::span<const std::uint32_t> tokens,
                                          const LookupOptions& options = {}) override;
  // The entry stored for exactly this identity, or none.
  Result<std::optional<EntryId>> FindExact(const Hash128& model, std::string_view ns,
                                           std::span<const std::uint32_t> tokens);
  // Counts a sighting of a boundary for admission (as a missed lookup does).
  void RecordSighting(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> tokens);

  // Streams layers (all when `layers` is empty; else those, in that order).
  // The sink is called on this thread, in order, while the next chunks are
  // read (and checked) ahead on the store's read pool. kCorruption: a check
  // failed; the entry is quarantined. kNotFound: no such live entry (or,
  // with options.ns, none of that namespace). The fetch holds a lease on the
  // entry while it runs.
  Status Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
               const FetchOptions& options = {}) override;

  Result<Lease> AcquireLease(EntryId id);

  // Removes a live or quarantined entry. kUnavailable while leased.
  Status Delete(EntryId id) override;
  // A live entry with its stored tokens and, with options.layer_headers, its
  // serialized layer headers in layer order, from its manifest (no chunk is
  // read; kCorruption when the manifest is unreadable: reported, not
  // quarantined, which Fetch or CheckStore does); or a quarantined entry,
  // without tokens (with options.ns: kNotFound).
  Result<EntryDetail> Describe(EntryId id, const DescribeOptions& options = {}) override;
  // A page of entries; with ns and no model, of every model's entries of
  // that namespace (the page may then come back short while more follow).
  // Live entries carry their tokens unless omit_tokens; quarantined ones none.
  Result<ListPage> List(const ListOptions& options) override;
  Result<StoreStats> Stat() override;

  // Changes the budget and evicts down to it.
  Status SetByteBudget(std::uint64_t bytes) override;

  // Rewrites every segment file that holds dead chunk bytes (its live
  // chunks, checked against their addresses, go to a new segment; the old
  // file is deleted) and compacts every column family, so that every dead
  // byte is reclaimed; returns when done.
  Status Compact() override;

  // Cross-checks everything the store records: every manifest against the
  // chunk reference counts, the index, the recency records and the counters;
  // with read_chunks, every chunk's bytes against its address. Reads one
  // consistent snapshot, so writers go on meanwhile. The problems found, in
  // words (empty: consistent). Read-only, the chunks of publishes a writer
  // has not collected yet are not counted as problems.
  Result<StoreCheckReport> CheckStore(const CheckStoreOptions& options = {}) override;

  struct Impl;

 private:
  explicit LocalStore(std::unique_ptr<Impl> impl);
  // A lease on live entry `id`, with its entry record (encoded) in *record;
  // kNotFound when it is being removed or gone.
  Result<Lease> LeaseLive(EntryId id, std::string* record);
  // The hit for live entry `id` matched at `length`, sized from its record,
  // with a lease in *lease when not null; nullopt when it went meanwhile.
  Result<std::optional<LookupHit>> HitFor(EntryId id, std::uint64_t length, Lease* lease);
  // EntryInfo of a live or quarantined entry, without tokens.
  Result<EntryInfo> Info(EntryId id);
  // The stored tokens of a live entry.
  Result<std::vector<std::uint32_t>> Tokens(EntryId id);
  // The serialized layer headers of a live entry, in layer order.
  Result<std::vector<std::string>> LayerHeaders(EntryId id);
  std::unique_ptr<Impl> impl_;
};

}  // namespace primecache

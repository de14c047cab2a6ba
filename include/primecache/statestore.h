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
// Thread-safety: Store is safe to use from many threads at once. A Publisher
// is used by one thread at a time; many publishers may run concurrently.
// Leases may be released from any thread. Store must outlive its publishers;
// leases may outlive the store (releasing them then does nothing).
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
#include "primecache/env.h"
#include "primecache/layer_validator.h"
#include "primecache/status.h"

namespace primecache {

// The prefill estimate of ModelCost (primecache/entry.h):
// EstimatePrefillFlops(L) = L * flops_per_token
//                         + attention_layers * attention_flops_per_pair * L * (L + 1) / 2
// All zero: the estimate falls back to L.
double EstimatePrefillFlops(const ModelCost& cost, std::uint64_t tokens);

// The boundary a publish stores. The model is named by the digest of its
// fingerprint (ModelFingerprint::Digest() in primecache/snapshot.h: the
// architecture, state-plan geometry, weights and codec versions); the name
// (e.g. the architecture) is only shown by List and Describe.
struct PublishRequest {
  Hash128 model;
  std::string model_name;             // at most 1024 bytes
  // The model's canonical fingerprint encoding (EncodeFingerprint in
  // primecache/snapshot.h), at most 64 KiB; may be empty. When given, its
  // Checksum128 must be `model`; it is kept once per (model, namespace) and
  // lets an entry be exported with its whole fingerprint.
  std::string model_descriptor;
  std::string ns;                     // namespace; may be empty; at most 1024 bytes
  std::vector<std::uint32_t> tokens;  // the boundary's exact tokens; its length is tokens.size() >= 1
  ModelCost cost;
};

// One encoded layer as [codecs] produces it: the serialized layer header and
// its chunks' bytes, in the header's chunk order.
struct LayerBytes {
  std::string header;
  std::vector<std::string> chunks;
};

// One publish in progress. Layers arrive in order: BeginLayer(header), its
// chunks with AddChunk, EndLayer; Commit checks every layer (see
// LayerValidator) and makes the entry durable in one atomic write. Abort, or
// destroying an uncommitted publisher, forgets the staged bytes.
class Publisher {
 public:
  virtual ~Publisher() = default;
  virtual Status BeginLayer(std::string_view header) = 0;
  virtual Status AddChunk(std::span<const std::byte> bytes) = 0;
  Status AddChunk(std::string_view bytes) {
    return AddChunk(std::as_bytes(std::span(bytes.data(), bytes.size())));
  }
  virtual Status EndLayer() = 0;
  Status AddLayer(const LayerBytes& layer);
  // Returns once the entry is durable. A publisher commits at most once.
  virtual Result<PublishResult> Commit() = 0;
  virtual void Abort() = 0;
};

// A lease keeps an entry from eviction and deletion while it is held
// (fetches take one for their duration). Move-only; released on destruction.
class Lease {
 public:
  Lease() = default;
  ~Lease();
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  bool held() const { return table_ != nullptr; }
  EntryId id() const { return id_; }
  void Release();

  struct Table;  // internal

 private:
  friend class Store;
  Lease(std::shared_ptr<Table> table, EntryId id) : table_(std::move(table)), id_(id) {}
  std::shared_ptr<Table> table_;
  EntryId id_ = 0;
};

struct LookupOptions {
  bool record = true;  // count the hit or miss, refresh recency, note a miss as a sighting
  // Not null: a hit is returned with a lease on it already held here.
  Lease* lease = nullptr;
  // Not null: receives the query's shared length (its branch point): the
  // longest prefix of the query that a live entry of the same model and
  // namespace shares token for token, boundary there or not; at least the
  // hit's length, 0 when no entry shares a token. Found from the entries'
  // pass records (one per whole 64-token block) and confirmed, to the exact
  // token, on the stored tokens of up to four entries sharing the deepest block.
  std::uint64_t* shared_tokens = nullptr;
};

struct FetchOptions {
  // Set: serve only an entry of this namespace; another's is kNotFound, as if
  // absent. Checked on the entry record the fetch reads for its lease anyway
  // (the daemon's tenant check, without a Describe of its own).
  std::optional<std::string> ns;
};

// Receives a fetched entry. Only bytes whose checksum matched are handed
// out; if Fetch returns an error, what was received must be discarded.
//
// A sink may also say where each chunk is to be read to (ChunkBuffer), so
// that a fetch reads straight into the caller's memory (a shared region, a
// registered buffer) and copies nothing itself.
class FetchSink {
 public:
  virtual ~FetchSink() = default;
  virtual Status OnLayer(std::uint32_t layer, std::string_view header, std::uint32_t chunk_count) = 0;
  // `bytes` is what ChunkBuffer gave for this chunk when it gave a buffer.
  virtual Status OnChunk(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes) = 0;

  // Where chunk `chunk` of `layer` (`size` bytes) is to be read to. Called on
  // the fetching thread, in the order chunks are handed out, before the chunk
  // is read (possibly ahead of OnChunk for earlier chunks). Answers:
  //  - a span of exactly `size` bytes: the store reads the chunk into it and
  //    checks its address there; it stays the sink's memory, untouched by the
  //    store once OnChunk for it returned (or Fetch returned).
  //  - an empty span: the store reads into a buffer of its own (the default).
  //  - nullopt: no room now; asked again after the next OnChunk. Only when
  //    `may_wait` is false; with it true (every earlier chunk was handed
  //    out) the sink waits for room or fails.
  virtual Result<std::optional<std::span<std::byte>>> ChunkBuffer(std::uint32_t layer, std::uint32_t chunk,
                                                                  std::uint64_t size, bool may_wait) {
    (void)layer, (void)chunk, (void)size, (void)may_wait;
    return std::optional<std::span<std::byte>>(std::span<std::byte>());
  }

  // Whether chunks resident in the page cache may be handed out where they
  // lie (OnMappedChunk) instead of being read into a buffer. Default false.
  virtual bool TakesMappedChunks() const { return false; }
  // A chunk handed out in place: `bytes` lie inside `mapping` and matched
  // their address. The sink may keep `mapping` (its owner) as long as it
  // likes; the bytes never change. Default: OnChunk(layer, chunk, bytes).
  virtual Status OnMappedChunk(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes,
                               const MappedRegion& mapping) {
    (void)mapping;
    return OnChunk(layer, chunk, bytes);
  }
  // Pins the pages of `mapping` (the daemon registers it with the device
  // driver for its copies) and says under which pin. Called on the fetching
  // thread before a chunk of `mapping` is checked; the store holds the pin
  // until OnMappedChunk for that chunk returned, so the bytes checked are
  // the bytes handed out. A chunk whose address matched over bytes pinned
  // as N is not checked again while `mapping` is still pinned as N: pinned
  // pages cannot be dropped and read back from the disk, and the store
  // never writes committed bytes (as a block cache serves blocks checked
  // when they were read from the file). The check comes after the pin, not
  // before: pages read back between a check and a later pin would be handed
  // out unchecked, and every later fetch under that pin would skip them.
  // An empty pin (the default) or an error: the chunk is checked, and
  // handed out all the same (OnMappedChunk).
  virtual Result<MappingPin> Pin(const MappedRegion& mapping) {
    (void)mapping;
    return MappingPin{};
  }
};

struct ListOptions {
  std::optional<Hash128> model;   // only this fingerprint
  std::optional<std::string> ns;  // only this namespace
  EntryState state = EntryState::kLive;
  std::string page_token;   // from the previous page; empty: the first
  std::size_t limit = 100;  // 1..1000
};

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

  std::uint64_t max_chunk_bytes = 64ull << 20;
  // A segment file is sealed (never appended to again) once a commit takes
  // it past this many bytes; concurrent publishers write different segments.
  std::uint64_t segment_bytes = 256ull << 20;
  std::uint64_t block_cache_bytes = 256ull << 20;
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

  // Checks every layer at commit (required: Open refuses a store without one).
  // The codecs library supplies the validator of its encoded layers,
  // CodecLayerValidator() in primecache/codec.h.
  std::shared_ptr<const LayerValidator> validator;
};

class Store {
 public:
  static Result<std::unique_ptr<Store>> Open(StoreOptions options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& path() const;

  // Starts a publish. kAlreadyExists: this identity is stored (FindExact
  // gives its id); kAborted: not admitted yet (seen fewer times than
  // admit_after_sightings); kInvalidArgument: a malformed request.
  Result<std::unique_ptr<Publisher>> BeginPublish(PublishRequest request);
  // BeginPublish for a caller that takes an existing identity as success:
  // either a publisher, or (publisher null) the id of the entry already
  // stored under this identity. The errors are BeginPublish's but kAlreadyExists.
  struct PublishStart {
    std::unique_ptr<Publisher> publisher;
    std::optional<EntryId> existing;
  };
  Result<PublishStart> StartPublish(PublishRequest request);
  // BeginPublish, every layer, Commit. An existing identity is not an error:
  // the result says existed.
  Result<PublishResult> Publish(PublishRequest request, std::span<const LayerBytes> layers);

  // The longest stored boundary whose tokens are a prefix of `tokens`, or
  // none; the hit carries the entry's layer count and sizes.
  Result<std::optional<LookupHit>> Lookup(const Hash128& model, std::string_view ns,
                                          std::span<const std::uint32_t> tokens,
                                          const LookupOptions& options = {});
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
               const FetchOptions& options = {});
  Result<std::vector<LayerBytes>> FetchAll(EntryId id);
  // The stored tokens of a live entry.
  Result<std::vector<std::uint32_t>> Tokens(EntryId id);
  // The serialized layer headers of a live entry, in layer order, from its
  // manifest (no chunk is read). kCorruption: the manifest is unreadable
  // (reported, not quarantined: Fetch or Verify does that).
  Result<std::vector<std::string>> LayerHeaders(EntryId id);

  Result<Lease> AcquireLease(EntryId id);

  // Removes a live or quarantined entry. kUnavailable while leased.
  Status Delete(EntryId id);
  Result<EntryInfo> Describe(EntryId id);
  Result<ListPage> List(const ListOptions& options);
  Result<StoreStats> Stat();

  // Changes the budget and evicts down to it.
  Status SetByteBudget(std::uint64_t bytes);

  // Rewrites every segment file that holds dead chunk bytes (its live
  // chunks, checked against their addresses, go to a new segment; the old
  // file is deleted) and compacts every column family, so that every dead
  // byte is reclaimed; returns when done.
  Status Compact();

  // Cross-checks everything the store records: every manifest against the
  // chunk reference counts, the index, the recency records and the counters;
  // with read_chunks, every chunk's bytes against its address. Reads one
  // consistent snapshot, so writers go on meanwhile. The problems found, in
  // words (empty: consistent). Read-only, the chunks of publishes a writer
  // has not collected yet are not counted as problems.
  using StoreCheckReport = primecache::StoreCheckReport;
  Result<StoreCheckReport> CheckStore(bool read_chunks);

  struct Impl;

 private:
  explicit Store(std::unique_ptr<Impl> impl);
  // A lease on live entry `id`, with its entry record (encoded) in *record;
  // kNotFound when it is being removed or gone.
  Result<Lease> LeaseLive(EntryId id, std::string* record);
  // The hit for live entry `id` matched at `length`, sized from its record,
  // with a lease in *lease when not null; nullopt when it went meanwhile.
  Result<std::optional<LookupHit>> HitFor(EntryId id, std::uint64_t length, Lease* lease);
  std::unique_ptr<Impl> impl_;
};

}  // namespace primecache

// The store interface: the one set of operations, names and option values
// that every layer speaks about stored boundaries.
//
// Like LevelDB's abstract DB with DBImpl behind it: Store is abstract;
//  - LocalStore (primecache/internal/statestore.h) is the persistent store on RocksDB
//    and segment files, in this process;
//  - StoreWrapper forwards every call to a Store it wraps (RocksDB's
//    StackableDB), so that a store can be layered over a store: the remote
//    tier (remote/tiered_store.h) is a StoreWrapper over the local store;
//  - the daemon's sessions call a Store directly, and the client library
//    (primecache/client.h) and primecachectl name each operation as here and
//    pass these option values.
//
// An entry is one boundary's snapshot: the encoded layers an engine captured
// after prefilling an exact token sequence, for one model fingerprint and one
// namespace (tenant). Its identity is (model digest, namespace, tokens);
// lookups never cross fingerprints or namespaces.
//
// Every limit an implementation enforces on what it is given is declared
// once, in StoreLimits below, and cited where it is checked.
//
// Thread-safety: every Store method may be called from many threads at once.
// A Publisher is used by one thread at a time; many may run concurrently.
// A Store outlives its publishers; leases may outlive the store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/entry.h"
#include "primecache/internal/env.h"
#include "primecache/status.h"

namespace primecache {

// The bounds a store holds what it is given to. One declaration each; the
// store, the daemon's decoder, the remote tier and the client check against
// these names.
struct StoreLimits {
  static constexpr std::size_t kMaxModelNameBytes = 1024;
  static constexpr std::size_t kMaxNamespaceBytes = 1024;
  static constexpr std::size_t kMaxDescriptorBytes = 64u << 10;  // a model descriptor
  static constexpr std::uint32_t kMaxLayers = 1u << 16;          // layers of one entry
  static constexpr std::uint64_t kMaxChunkBytes = 1ull << 30;    // the largest max_chunk_bytes
  static constexpr std::uint64_t kDefaultMaxChunkBytes = 64ull << 20;
  static constexpr std::size_t kMaxListLimit = 1000;  // entries of one List page
  static constexpr std::uint64_t kMaxTokens = 1ull << 22;  // tokens of one boundary or query
  static constexpr std::uint32_t kMaxGroupRanks = 1024;    // ranks of one group publish
};


// The boundary a publish stores. The model is named by the digest of its
// fingerprint (ModelFingerprint::Digest() in primecache/internal/snapshot.h); the name
// is only shown by List and Describe.
struct PublishRequest {
  Hash128 model;
  std::string model_name;  // at most kMaxModelNameBytes
  // The model's canonical fingerprint encoding, at most kMaxDescriptorBytes;
  // may be empty. When given, its Checksum128 must be `model`.
  std::string model_descriptor;
  std::string ns;                     // at most kMaxNamespaceBytes; may be empty
  std::vector<std::uint32_t> tokens;  // the boundary's exact tokens, 1..kMaxTokens
  ModelCost cost;
  std::optional<PublishGroup> group;  // set: this is one rank's part of a group publish
  // >1 (without group): the layers are a whole tensor-parallel entry of this
  // many parts, in the order a group publish writes (an entry brought from
  // the remote tier); at most StoreLimits::kMaxGroupRanks.
  std::uint32_t ranks = 1;
  // The entry's rank count: the group's, else `ranks`.
  std::uint32_t EntryRanks() const { return group ? group->ranks : ranks; }
};

// One encoded layer as the codecs produce it: its serialized header and its
// chunks' bytes, in the header's chunk order.
struct LayerBytes {
  std::string header;
  std::vector<std::string> chunks;
};

// One publish in progress: per layer, BeginLayer(header, chunk_count), that
// many AddChunk calls, EndLayer; then Commit, which validates every layer and
// makes the entry durable in one atomic write (kInvalidArgument when a layer
// did not get the chunks it announced). Abort, or destroying an uncommitted
// publisher, leaves nothing behind. One thread at a time. A group part's
// Commit makes its own bytes durable and hands them to the group: the
// result says group_pending until the last part's Commit writes the entry.
class Publisher {
 public:
  virtual ~Publisher() = default;
  virtual Status BeginLayer(std::string_view header, std::uint32_t chunk_count) = 0;
  // `bytes` may lie in a client's shared region: passed on, never kept.
  virtual Status AddChunk(std::span<const std::byte> bytes) = 0;
  virtual Status EndLayer() = 0;
  // Returns once the entry is durable. A publisher commits at most once.
  virtual Result<PublishResult> Commit() = 0;
  virtual void Abort() = 0;

  Status AddChunk(std::string_view bytes) { return AddChunk(std::as_bytes(std::span(bytes.data(), bytes.size()))); }
  // BeginLayer, every chunk, EndLayer.
  Status AddLayer(const LayerBytes& layer);
};

// What BeginPublish gives: a publisher, or (publisher null) the id of the
// entry already stored under the request's identity (nothing to send).
struct PublishStart {
  std::unique_ptr<Publisher> publisher;
  std::optional<EntryId> existing;
};

// A lease keeps an entry from eviction and deletion while it is held.
// Move-only; released on destruction; may outlive its store.
class Lease {
 public:
  // The implementation's lease table (LocalStore's: statestore/store_impl.h).
  struct Table {
    virtual ~Table() = default;
    virtual void Release(EntryId id) = 0;
  };

  Lease() = default;
  Lease(std::shared_ptr<Table> table, EntryId id) : table_(std::move(table)), id_(id) {}
  ~Lease();
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  bool held() const { return table_ != nullptr; }
  EntryId id() const { return id_; }
  void Release();

 private:
  std::shared_ptr<Table> table_;
  EntryId id_ = 0;
};

struct LookupOptions {
  bool record = true;  // count the hit or miss, refresh recency, note a miss as a sighting
  Lease* lease = nullptr;  // not null: a hit comes back leased here
  // Not null: receives the query's shared length (its branch point): the
  // longest prefix of the query a live entry of the same model and namespace
  // shares token for token, at least the hit's length, 0 when none.
  std::uint64_t* shared_tokens = nullptr;
};

// DescribeOptions and ListOptions, the values of Describe and List, are
// declared with the entry types they ask for (primecache/entry.h), which the
// client library installs.

struct FetchOptions {
  // Set: serve only an entry of this namespace; any other is kNotFound.
  std::optional<std::string> ns;
};

struct CheckStoreOptions {
  bool read_chunks = false;  // also every chunk's bytes against its address
};

// Receives a fetched entry. Only bytes whose checksum matched are handed
// out; if Fetch returns an error, what was received must be discarded.
//
// A sink may also say where each chunk is to be read to (ChunkBuffer), so
// that a fetch reads straight into the caller's memory (a shared region, a
// registered buffer) and copies nothing itself. The buffer, mapping and pin
// hooks are LocalStore's zero-copy paths; a wrapper passes them through, and
// a store that has none never calls them.
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
                                                                  std::uint64_t size, bool may_wait);

  // Whether chunks resident in the page cache may be handed out where they
  // lie (OnMappedChunk) instead of being read into a buffer. Default false.
  virtual bool TakesMappedChunks() const { return false; }
  // A chunk handed out in place: `bytes` lie inside `mapping` and matched
  // their address. The sink may keep `mapping` (its owner) as long as it
  // likes; the bytes never change. Default: OnChunk(layer, chunk, bytes).
  virtual Status OnMappedChunk(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes,
                               const MappedRegion& mapping);
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
  virtual Result<MappingPin> Pin(const MappedRegion& mapping);
};

// The store. Errors: kNotFound (no such live entry, or another namespace's),
// kInvalidArgument (a request over a StoreLimits bound or malformed),
// kFailedPrecondition (a change to a read-only store), kUnavailable (an
// entry leased while deleted), kCorruption (stored bytes failed a check; the
// entry is quarantined), kResourceExhausted (a staging or budget limit).
class Store {
 public:
  virtual ~Store() = default;

  // Starts a publish. kAborted: not admitted (yet).
  virtual Result<PublishStart> BeginPublish(PublishRequest request) = 0;
  // The longest stored boundary whose tokens prefix `tokens`, or nullopt.
  virtual Result<std::optional<LookupHit>> Lookup(const Hash128& model, std::string_view ns,
                                                  std::span<const std::uint32_t> tokens,
                                                  const LookupOptions& options = {}) = 0;
  // One entry with its tokens (none for a quarantined one) and, when asked,
  // its layer headers.
  virtual Result<EntryDetail> Describe(EntryId id, const DescribeOptions& options = {}) = 0;
  // Streams layers (empty: all; else those, in that order), checked, on this
  // thread, leased for the fetch's duration.
  virtual Status Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
                       const FetchOptions& options = {}) = 0;
  virtual Status Delete(EntryId id) = 0;
  virtual Result<ListPage> List(const ListOptions& options) = 0;
  virtual Result<StoreStats> Stat() = 0;
  // Changes the byte budget (0: unlimited) and evicts down to it.
  virtual Status SetByteBudget(std::uint64_t bytes) = 0;
  // Cross-checks everything the store records.
  virtual Result<StoreCheckReport> CheckStore(const CheckStoreOptions& options = {}) = 0;
  // Reclaims every dead byte now; returns when done.
  virtual Status Compact() = 0;

  // Built on the operations above, the same for every store:
  // BeginPublish, every layer, Commit (an existing identity: existed).
  Result<PublishResult> Publish(PublishRequest request, std::span<const LayerBytes> layers);
  // Reads every chunk of one entry through its checks (a failure quarantines it).
  Result<EntryCheckReport> CheckEntry(EntryId id, const FetchOptions& options = {});
  // Every layer, in memory.
  Result<std::vector<LayerBytes>> FetchAll(EntryId id, const FetchOptions& options = {});
};

// Forwards every operation to the store it wraps; a layered store overrides
// what it adds to.
class StoreWrapper : public Store {
 public:
  explicit StoreWrapper(std::unique_ptr<Store> target) : target_(std::move(target)) {}
  Store& target() { return *target_; }

  Result<PublishStart> BeginPublish(PublishRequest request) override;
  Result<std::optional<LookupHit>> Lookup(const Hash128& model, std::string_view ns,
                                          std::span<const std::uint32_t> tokens,
                                          const LookupOptions& options = {}) override;
  Result<EntryDetail> Describe(EntryId id, const DescribeOptions& options = {}) override;
  Status Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
               const FetchOptions& options = {}) override;
  Status Delete(EntryId id) override;
  Result<ListPage> List(const ListOptions& options) override;
  Result<StoreStats> Stat() override;
  Status SetByteBudget(std::uint64_t bytes) override;
  Result<StoreCheckReport> CheckStore(const CheckStoreOptions& options = {}) override;
  Status Compact() override;

 private:
  std::unique_ptr<Store> target_;
};

}  // namespace primecache

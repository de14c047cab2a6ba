// The store operations the daemon serves, as the IPC layer sees them.
//
// The server speaks only to this interface; ipc/statestore_backend.cc adapts
// it to the real store (primecache/statestore.h). Every method may be called
// from many worker threads at once; none is ever called on the event-loop
// thread. A PublishSink is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/status.h"

namespace primecache::ipc {

struct BoundaryKey {
  Hash128 digest;
  std::string model_name;
  std::string descriptor;  // the canonical fingerprint encoding; may be empty
  std::string ns;
  std::vector<std::uint32_t> tokens;
};

struct EntrySummary {
  std::uint64_t entry = 0;
  BoundaryKey boundary;
  std::uint32_t layer_count = 0;
  std::uint64_t bytes = 0;      // stored (encoded) bytes
  std::uint64_t raw_bytes = 0;  // bytes before encoding, when known
  std::uint64_t created_unix_ms = 0;
  std::uint64_t last_access = 0;  // logical clock; larger is more recent
  std::uint64_t hits = 0;
  std::uint64_t length = 0;  // boundary length (tokens may be left out)
  bool quarantined = false;
  std::string reason;  // why it was quarantined
};

// An entry with, when asked, its serialized layer headers.
struct EntryDetail {
  EntrySummary summary;
  std::vector<std::string> layer_headers;
};

// What a store-wide consistency check found.
struct StoreReport {
  std::uint64_t entries = 0;
  std::uint64_t chunks = 0;
  std::vector<std::string> problems;  // empty: consistent; the first 1000
  std::uint64_t problem_count = 0;    // all of them
};

struct LookupHit {
  std::uint64_t entry = 0;
  std::uint32_t length = 0;  // matched boundary length in tokens
  std::uint32_t layer_count = 0;
  std::uint64_t bytes = 0;
};

struct StoreStats {
  std::uint64_t entries = 0;
  std::uint64_t bytes_stored = 0;
  std::uint64_t bytes_raw = 0;
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;
  std::uint64_t capacity_bytes = 0;
  std::uint64_t quarantined = 0;
  std::uint64_t chunks = 0;
  std::uint64_t bytes_logical = 0;
  std::uint64_t dedup_saved_bytes = 0;
  std::uint64_t admission_refusals = 0;
  std::uint64_t active_leases = 0;
  std::uint64_t disk_bytes = 0;
};

struct ListFilter {
  std::optional<Hash128> digest;
  std::optional<std::string> ns;  // nullopt: every namespace
  std::string page_token;  // empty: the first page
  std::uint32_t page_size = 100;
  bool quarantined = false;  // quarantined entries instead of live ones (without tokens)
  bool omit_tokens = false;  // leave tokens out
};

struct ListPage {
  std::vector<EntrySummary> entries;
  std::string next_page_token;  // empty: no more
};

struct Committed {
  std::uint64_t entry = 0;
  bool existed = false;  // the identity was stored already
};

// One open publish: layers in order, each a header then its chunks.
class PublishSink {
 public:
  virtual ~PublishSink() = default;
  virtual Status BeginLayer(std::uint32_t layer, std::span<const std::byte> header,
                            std::uint32_t chunk_count) = 0;
  virtual Status AddChunk(std::span<const std::byte> bytes) = 0;
  // Durable on OK.
  virtual Result<Committed> Commit() = 0;
  // Leaves nothing behind. Also what the destructor does for an open publish.
  virtual void Abort() = 0;
};

// Receives a fetch's layers in the order asked for. A non-OK return stops the
// fetch and becomes its result.
class FetchVisitor {
 public:
  virtual ~FetchVisitor() = default;
  virtual Status OnLayer(std::uint32_t layer, std::span<const std::byte> header,
                         std::uint32_t chunk_count) = 0;
  virtual Status OnChunk(std::uint32_t layer, std::uint32_t index,
                         std::span<const std::byte> bytes) = 0;
};

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  virtual Result<std::unique_ptr<PublishSink>> BeginPublish(const BoundaryKey& boundary,
                                                            std::uint32_t layer_count) = 0;
  // Longest stored boundary of (digest, ns) whose tokens prefix `tokens`;
  // nullopt on a miss.
  virtual Result<std::optional<LookupHit>> Lookup(const Hash128& digest, const std::string& ns,
                                                  std::span<const std::uint32_t> tokens) = 0;
  // The entry's description (namespace checks before a fetch or delete).
  virtual Result<EntrySummary> Describe(std::uint64_t entry) = 0;
  // A live entry with its tokens, or a quarantined one; with layer_headers,
  // a live entry's layer headers too.
  virtual Result<EntryDetail> Inspect(std::uint64_t entry, bool layer_headers) = 0;
  // Streams the layers (empty: all) with checksums re-checked.
  virtual Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers,
                       FetchVisitor* visitor) = 0;
  virtual Status Delete(std::uint64_t entry) = 0;
  virtual Result<ListPage> List(const ListFilter& filter) = 0;
  virtual Result<StoreStats> Stat() = 0;
  // Changes the byte budget (0: unlimited), evicting down to it.
  virtual Status SetCapacity(std::uint64_t bytes) = 0;
  // Cross-checks the store's records; with read_chunks, every chunk's bytes.
  virtual Result<StoreReport> VerifyStore(bool read_chunks) = 0;
  // Compacts now, reclaiming the space of deleted entries; returns when done.
  virtual Status Compact() = 0;
};

}  // namespace primecache::ipc

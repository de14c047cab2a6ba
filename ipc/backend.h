// The store operations the daemon serves, as the IPC layer sees them.
//
// The server speaks only to this interface; ipc/store_factory.cc adapts it to
// the real store (primecache/statestore.h). The values it passes are the
// store's own (primecache/entry.h), written on the wire by ipc/wire.cc. Every
// method may be called from many worker threads at once; none is ever called
// on the event-loop thread. A PublishSink is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/entry.h"
#include "primecache/statestore.h"
#include "primecache/status.h"

namespace primecache::ipc {

struct ListFilter {
  std::optional<Hash128> digest;
  std::optional<std::string> ns;  // nullopt: every namespace
  std::string page_token;  // empty: the first page
  std::uint32_t page_size = 100;
  bool quarantined = false;  // quarantined entries instead of live ones (without tokens)
  bool omit_tokens = false;  // leave tokens out
};

// One open publish: layers in order, each a header then its chunks.
class PublishSink {
 public:
  virtual ~PublishSink() = default;
  virtual Status BeginLayer(std::uint32_t layer, std::span<const std::byte> header,
                            std::uint32_t chunk_count) = 0;
  // `bytes` may lie in a client's shared region: passed on, never copied here.
  virtual Status AddChunk(std::span<const std::byte> bytes) = 0;
  // Durable on OK.
  virtual Result<PublishResult> Commit() = 0;
  // Leaves nothing behind. Also what the destructor does for an open publish.
  virtual void Abort() = 0;
};

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  virtual Result<std::unique_ptr<PublishSink>> BeginPublish(const PublishRequest& request,
                                                            std::uint32_t layer_count) = 0;
  // Longest stored boundary of (digest, ns) whose tokens prefix `tokens`,
  // sized from the entry's record; nullopt on a miss. `shared_tokens`, when
  // not null, receives the query's shared length (LookupOptions::shared_tokens).
  virtual Result<std::optional<LookupHit>> Lookup(const Hash128& digest, const std::string& ns,
                                                  std::span<const std::uint32_t> tokens,
                                                  std::uint64_t* shared_tokens = nullptr) = 0;
  // One entry, described once: a live one with its tokens (and, with
  // layer_headers, its layer headers), or a quarantined one. With `ns` only
  // a live entry of that namespace; anything else is kNotFound.
  virtual Result<EntryDetail> Describe(std::uint64_t entry, const std::optional<std::string>& ns,
                                       bool layer_headers) = 0;
  // Streams the layers (empty: all) with checksums re-checked, leased for
  // its duration (Store::Fetch; options.ns is the tenant check).
  virtual Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, const FetchOptions& options,
                       FetchSink& sink) = 0;
  virtual Status Delete(std::uint64_t entry) = 0;
  virtual Result<ListPage> List(const ListFilter& filter) = 0;
  virtual Result<StoreStats> Stat() = 0;
  // Changes the byte budget (0: unlimited), evicting down to it.
  virtual Status SetByteBudget(std::uint64_t bytes) = 0;
  // Cross-checks the store's records; with read_chunks, every chunk's bytes.
  virtual Result<StoreCheckReport> CheckStore(bool read_chunks) = 0;
  // Compacts now, reclaiming the space of deleted entries; returns when done.
  virtual Status Compact() = 0;
  // The remote tier's counters; nullopt for a store without one.
  virtual std::optional<RemoteStats> RemoteCounters() const { return std::nullopt; }
};

}  // namespace primecache::ipc

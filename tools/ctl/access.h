// How primecachectl reaches a store: through the running daemon's admin
// socket, or, when no daemon runs, by opening the data dir's store directly
// and read-only. Commands are written once against StoreAccess.
//
// Invariant: a read-only access (writable() false) refuses every change with
// kFailedPrecondition and changes nothing on disk (no recency, no
// quarantine). Thread-safety: one thread at a time.
#pragma once

#include <chrono>
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
#include "primecache/snapshot_file.h"
#include "primecache/statestore.h"
#include "primecache/status.h"

namespace primecache::ctl {

// Receives a fetched entry, layer by layer; a non-OK return stops the fetch.
struct FetchHandlers {
  std::function<Status(std::uint32_t layer, std::string_view header, std::uint32_t chunks)> on_layer;
  std::function<Status(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes)> on_chunk;
};

class StoreAccess {
 public:
  virtual ~StoreAccess() = default;
  // Where the store is, for people: "primecached (SOCKET)" or "STORE (read-only)".
  virtual std::string where() const = 0;
  virtual bool writable() const = 0;
  // Through the daemon (its own figures in Stat) or the store opened directly.
  virtual bool through_daemon() const = 0;

  // Every entry of every namespace (live, or quarantined ones), without tokens.
  virtual Result<std::vector<EntryInfo>> List(bool quarantined) = 0;
  // One entry with its tokens; with headers, its serialized layer headers.
  virtual Result<EntryInfo> Describe(std::uint64_t id, std::vector<std::string>* headers) = 0;
  // Streams every layer; every chunk has passed its content-address check.
  virtual Status Fetch(std::uint64_t id, const FetchHandlers& handlers) = 0;
  // The longest stored boundary of (model, ns) that prefixes `tokens`, and
  // the query's shared length (LookupOptions::shared_tokens). Through the
  // daemon it counts as a lookup (hits, misses, recency); read-only, nothing
  // is recorded.
  virtual Result<std::optional<LookupHit>> Lookup(const Hash128& model, const std::string& ns,
                                                  std::span<const std::uint32_t> tokens,
                                                  std::uint64_t* shared_tokens) = 0;
  // The store's totals; through the daemon, its own figures too (zero otherwise).
  virtual Result<DaemonStats> Stat() = 0;
  virtual Result<StoreCheckReport> CheckStore(bool read_chunks) = 0;

  // Changes (refused when read-only).
  virtual Status Delete(std::uint64_t id) = 0;
  virtual Status Compact() = 0;
  virtual Result<PublishResult> Import(const EncodedSnapshot& snapshot, const std::string& ns) = 0;
};

struct AccessOptions {
  std::string data_dir;      // the daemon's data dir (its store is data_dir/store)
  std::string admin_socket;  // empty: data_dir/primecached-admin.sock
  bool offline = false;      // never contact the daemon
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

// Connects to the daemon's admin socket; when no daemon answers there (or
// with offline) opens data_dir/store read-only. `fell_back` says which.
// kUnavailable: neither is possible.
Result<std::unique_ptr<StoreAccess>> OpenAccess(const AccessOptions& options, bool* fell_back);

// OK when no daemon answers at the admin socket; kFailedPrecondition when
// one does (a command that needs the store to itself was asked for).
Status EnsureNoDaemon(const AccessOptions& o);

}  // namespace primecache::ctl

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
#include "primecache/snapshot_file.h"
#include "primecache/statestore.h"
#include "primecache/status.h"

namespace primecache::ctl {

// One stored boundary as the CLI shows it.
struct Entry {
  std::uint64_t id = 0;
  Hash128 model;
  std::string model_name;
  std::string descriptor;  // the canonical fingerprint encoding; empty when the store has none
  std::string ns;
  std::uint64_t length = 0;
  std::uint32_t layers = 0;
  std::uint64_t stored_bytes = 0;  // its chunk bytes, shared ones included
  std::uint64_t raw_bytes = 0;
  std::uint64_t created_unix_ms = 0;
  std::uint64_t last_access = 0;  // the store's logical clock
  std::uint64_t hits = 0;
  bool quarantined = false;
  std::string reason;
  std::vector<std::uint32_t> tokens;  // filled by Describe for a live entry
};

// The store's totals, and through the daemon its connection figures.
struct Stats : StoreStats {
  std::optional<std::uint32_t> connections, publishes_in_flight;
  std::optional<std::uint64_t> uncommitted_bytes;
};

struct StoreCheck {
  std::uint64_t entries = 0, chunks = 0;
  std::vector<std::string> problems;
  std::uint64_t problem_count = 0;
};

struct Imported {
  std::uint64_t entry = 0;
  bool existed = false;
};

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

  // Every entry of every namespace (live, or quarantined ones).
  virtual Result<std::vector<Entry>> List(bool quarantined) = 0;
  // One entry with its tokens; with headers, its serialized layer headers.
  virtual Result<Entry> Describe(std::uint64_t id, std::vector<std::string>* headers) = 0;
  // Streams every layer; every chunk has passed its content-address check.
  virtual Status Fetch(std::uint64_t id, const FetchHandlers& handlers) = 0;
  virtual Result<Stats> Stat() = 0;
  virtual Result<StoreCheck> CheckStore(bool read_chunks) = 0;

  // Changes (refused when read-only).
  virtual Status Delete(std::uint64_t id) = 0;
  virtual Status Compact() = 0;
  virtual Result<Imported> Import(const EncodedSnapshot& snapshot, const std::string& ns) = 0;
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

// How primecachectl reaches a store: a primecache::Store (primecache/internal/store.h)
// that is the running daemon's (client::DaemonStore over its admin socket)
// or, when no daemon runs, the data dir's LocalStore opened read-only.
// Commands are written once against Store, its names and option values.
//
// Invariant: a read-only target (writable() false) is refused every change
// with kFailedPrecondition and changes nothing on disk (no recency, no
// quarantine). Thread-safety: one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/internal/daemon_store.h"
#include "primecache/entry.h"
#include "primecache/internal/statestore.h"
#include "primecache/status.h"
#include "primecache/internal/store.h"

namespace primecache::ctl {

struct Target {
  std::unique_ptr<Store> store;
  // Where the store is, for people: "primecached (SOCKET)" or "STORE (read-only)".
  std::string where;
  // Exactly one is set: the store is the daemon's (whose own figures only it
  // answers: DaemonStat), or the local one, read-only.
  client::DaemonStore* daemon = nullptr;
  LocalStore* local = nullptr;

  bool writable() const { return daemon != nullptr; }
  // kFailedPrecondition for `what` (a command) on a read-only target.
  Status ReadOnly(const std::string& what) const;
};

// Every entry of every namespace (live, or quarantined ones), without tokens.
Result<std::vector<EntryInfo>> ListAll(Store& store, EntryState state);
// The store's totals; through the daemon, its own figures too (zero otherwise).
Result<DaemonStats> StatOf(const Target& target);

// Receives a fetched entry, layer by layer; a non-OK return stops the fetch.
struct FetchHandlers {
  std::function<Status(std::uint32_t layer, std::string_view header, std::uint32_t chunks)> on_layer;
  std::function<Status(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes)> on_chunk;
};
// Streams every layer of `id`; every chunk has passed its content-address check.
Status FetchWith(Store& store, EntryId id, const FetchHandlers& handlers);

struct AccessOptions {
  std::string data_dir;      // the daemon's data dir (its store is data_dir/store)
  std::string admin_socket;  // empty: data_dir/primecached-admin.sock
  bool offline = false;      // never contact the daemon
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

// Connects to the daemon's admin socket; when no daemon answers there (or
// with offline) opens data_dir/store read-only. `fell_back` says which.
// kUnavailable: neither is possible.
Result<Target> OpenTarget(const AccessOptions& options, bool* fell_back);

// OK when no daemon answers at the admin socket; kFailedPrecondition when
// one does (a command that needs the store to itself was asked for).
Status EnsureNoDaemon(const AccessOptions& o);

}  // namespace primecache::ctl

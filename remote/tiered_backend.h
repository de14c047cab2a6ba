// The daemon's store with the remote tier behind it: a StoreBackend that
// serves everything from the local store it wraps, and
//  - after a local publish commits, queues the entry for the cluster
//    (write-behind: a bounded queue drained by one thread, which reads the
//    entry back from the local store, checked, and puts it; when the queue
//    is full the entry is dropped and counted);
//  - on a lookup whose local hit does not cover the query, asks the cluster
//    for a longer boundary; a remote hit is fetched and checked (RemoteTier),
//    decoded and checked layer by layer, published into the local store
//    (whose layer validator checks every layer, and all of them against the
//    model's plan), and then served as a local hit; an entry that fails
//    those checks is refused, counted and removed from the cluster. Remote failures only count: the
//    lookup answers from the local store as if the tier were absent.
// The namespace and fingerprint rules hold remotely as locally: an entry is
// looked up, stored and fetched under its exact (model digest, namespace).
//
// Thread-safety: as StoreBackend (every method from many threads at once).
#pragma once

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "ipc/backend.h"
#include "remote/tier.h"

namespace primecache::remote {

struct TieredOptions {
  std::size_t queue_entries = 64;  // write-behind entries waiting at most
  // A query the cluster could not extend is not asked again for this long
  // (0: always asked); at most miss_cache_entries such queries are kept
  // (remote/miss_cache.h).
  std::chrono::milliseconds miss_ttl{1000};
  std::size_t miss_cache_entries = 65536;
  // Namespaces that use the tier; empty: every namespace.
  std::set<std::string> namespaces;
};

struct TieredStats {
  std::uint64_t remote_hits = 0;     // lookups served by an entry brought from the cluster
  std::uint64_t remote_misses = 0;   // lookups the cluster could not extend
  std::uint64_t remote_misses_cached = 0;  // lookups not asked: the query missed within miss_ttl
  std::uint64_t remote_errors = 0;   // cluster or import failures (the lookup or put went on without it)
  // Remote entries whose layers failed the local checks: not decodable to
  // what their headers declare, or not the plan of their model. Never kept;
  // removed from the cluster and not asked for again within miss_ttl.
  std::uint64_t remote_refused = 0;
  std::uint64_t imported_bytes = 0;  // chunk bytes brought from the cluster
  std::uint64_t queued = 0, put = 0, dropped = 0;  // write-behind entries
  std::uint64_t put_bytes = 0;
};

class TieredBackend;

std::unique_ptr<TieredBackend> NewTieredBackend(std::unique_ptr<ipc::StoreBackend> local,
                                                std::shared_ptr<RemoteTier> tier, TieredOptions options);

class TieredBackend : public ipc::StoreBackend {
 public:
  virtual TieredStats tiered_stats() const = 0;
  // Waits until the write-behind queue is empty (tests, shutdown).
  virtual void Drain() = 0;
};

}  // namespace primecache::remote

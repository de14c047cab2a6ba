// The daemon's store with the remote tier behind it: a store that wraps a
// store (StoreWrapper, primecache/internal/store.h), serving everything from the
// local store it wraps, and
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
// Thread-safety: as Store (every method from many threads at once).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "primecache/entry.h"
#include "primecache/internal/store.h"
#include "remote/miss_cache.h"
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

class TieredStore final : public StoreWrapper {
 public:
  TieredStore(std::unique_ptr<Store> local, std::shared_ptr<RemoteTier> tier, TieredOptions options);
  ~TieredStore() override;

  // Wraps the local publish so that, once committed, its entry is queued
  // for the cluster (a namespace the tier serves only).
  Result<PublishStart> BeginPublish(PublishRequest request) override;
  // The local hit, extended from the cluster when it does not cover the
  // query. The shared length is the local store's: the cluster keeps no
  // pass records.
  Result<std::optional<LookupHit>> Lookup(const Hash128& model, std::string_view ns,
                                          std::span<const std::uint32_t> tokens,
                                          const LookupOptions& options = {}) override;

  TieredStats tiered_stats() const;
  // The daemon's remote figures (DaemonStats::remote), from tiered_stats and
  // the tier's and cluster client's own.
  RemoteStats remote_stats() const;
  // Waits until the write-behind queue is empty (tests, shutdown).
  void Drain();

  // A committed local entry, for the cluster; dropped when the queue is full.
  void Enqueue(EntryId id, const PublishRequest& request);

 private:
  struct Job {
    EntryId id;
    PublishRequest request;
  };
  bool Uses(std::string_view ns) const;
  Status Import(const Hash128& digest, const std::string& ns, std::span<const std::uint32_t> tokens,
                const RemoteHit& hit);
  // The lookup went to the cluster and did not come back with a longer entry.
  void Refused(const Status& s, const Hash128& digest, const std::string& ns, std::span<const std::uint32_t> tokens,
               std::uint64_t remote_length, const Hash128& query, MissCache::Clock::time_point now);
  void PutOne(const Job& job);
  void Loop();
  void Count(std::uint64_t TieredStats::*field, std::uint64_t n);
  // Counts a failed cluster call (remote_errors) and logs it: a refusal of
  // the tier's credentials or of its ACL (kFailedPrecondition) as a warning
  // at most once every kRefusalWarnEvery, as it says what to fix; anything
  // else at debug level (a sick cluster is the breaker's and the metrics').
  void RemoteError(const Status& s, std::string_view what);
  static constexpr std::chrono::seconds kRefusalWarnEvery{60};

  std::shared_ptr<RemoteTier> tier_;
  const TieredOptions options_;
  MissCache misses_;

  mutable std::mutex stats_mu_;
  TieredStats stats_;  // guarded by stats_mu_
  std::optional<std::chrono::steady_clock::time_point> last_refusal_warning_;  // guarded by stats_mu_
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Job> queue_;  // guarded by mu_
  bool busy_ = false;      // guarded by mu_: the worker is putting a job
  bool stopping_ = false;  // guarded by mu_
  std::thread worker_;     // last: started once everything above exists
};

}  // namespace primecache::remote

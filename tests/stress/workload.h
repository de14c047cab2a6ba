// The paths the crash and power-loss loops drive (docs/RELIABILITY.md): what
// their workers publish, fetch and delete, against the real daemon through a
// client connection or against the store in this process (one Target
// interface over both), and the one check of what survived a crash.
//
//  - plain: publishers of varied entries (RandomSpec);
//  - branch: requests that share stems, published as PrefixCache publishes
//    a request's boundaries (serving/prefix_cache_publish.cc): the branch
//    point the lookup reports, checkpoints, the prompt's end and the
//    generation's end, each a prefix of the next;
//  - group: tensor-parallel group publishes, every rank its own part
//    (through the daemon each rank is a process of its own: group_loop.cc);
//  - gc: publishes under a small byte budget (evictions), deletions and
//    compactions (segment gc) while fetchers read acknowledged entries.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/stress/stress_util.h"

namespace primecache::stress {

enum class Path { kPlain, kBranch, kGroup, kGc };
const char* PathName(Path p);
// "plain", "branch", "group", "gc"; nullopt for anything else.
std::optional<Path> ParsePath(const std::string& name);

// One stored entry, as a listing shows it.
struct Stored {
  std::uint64_t id = 0;
  std::vector<std::uint32_t> tokens;
  std::uint32_t ranks = 1;
};

// The operations the workers and the checks need, over a daemon connection
// or the store itself. One thread at a time.
class Target {
 public:
  virtual ~Target() = default;
  // abandon: every layer sent, then aborted instead of committed.
  virtual Result<PublishResult> Publish(const std::vector<std::uint32_t>& tokens,
                                        const std::vector<LayerData>& layers,
                                        const std::optional<PublishGroup>& group, bool abandon) = 0;
  virtual Result<std::optional<LookupHit>> Lookup(const std::vector<std::uint32_t>& tokens,
                                                  std::uint64_t* shared_tokens) = 0;
  // The digest (LayersDigest) of every layer of the entry, fetched.
  virtual Result<std::uint64_t> FetchDigest(std::uint64_t entry) = 0;
  virtual Status Delete(std::uint64_t entry) = 0;
  virtual Status Compact() = 0;
  virtual Result<std::vector<Stored>> ListAll() = 0;
  // The store's evictions since it was made (a durable counter).
  virtual Result<std::uint64_t> Evictions() = 0;
};
std::unique_ptr<Target> ClientTarget(std::unique_ptr<client::Client> c);
std::unique_ptr<Target> StoreTarget(LocalStore& store);

// Every rank's part of a tensor-parallel entry of `spec` (even layers
// latent, rank 0's whole; odd layers recurrent, kGroupHeads heads sliced
// among the ranks), in rank order. ranks must divide kGroupHeads.
inline constexpr std::uint32_t kGroupHeads = 12;
std::vector<std::vector<LayerData>> GroupParts(const EntrySpec& spec, std::uint32_t ranks);
// The entry's layers as the store keeps them: the parts in rank order.
std::vector<LayerData> Concat(const std::vector<std::vector<LayerData>>& parts);

// What the workers count while they run.
struct WorkTally {
  std::atomic<std::uint64_t> attempted{0}, acked{0}, errors{0};
  std::atomic<std::uint64_t> fetches{0}, fetch_misses{0}, wrong_bytes{0}, deletes{0}, compactions{0};
  std::atomic<std::uint64_t> groups_abandoned{0};
  // gc path: publishes refused because the budget was held by entries in use.
  std::atomic<std::uint64_t> budget_refusals{0};
};

// Requests' token sequences whose lookups the branch check repeats.
class Queries {
 public:
  void Add(std::vector<std::uint32_t> q);
  std::vector<std::vector<std::uint32_t>> Snapshot() const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<std::uint32_t>> queries_;
};

// One iteration's workers: what they share.
struct Work {
  Path path = Path::kPlain;
  const char* who = "";  // "crash" or "power", for the log lines
  std::uint64_t seed = 0;
  int iteration = 0;
  int epoch = 0;  // the store's generation: the branch path's stems are the epoch's
  Registry* reg = nullptr;
  Queries* queries = nullptr;
  AckLog* log = nullptr;
  WorkTally* tally = nullptr;
  std::atomic<std::uint32_t>* next_seed = nullptr;
  const std::atomic<bool>* stop = nullptr;                 // the kill or power loss came
  std::function<std::unique_ptr<Target>()> connect;        // a data connection (or the store)
  std::function<std::unique_ptr<Target>()> connect_admin;  // may delete and compact
};

// Starts `n` workers of the path (gc adds a deleter and two fetchers; group
// runs in this process: ranks as threads); they stop at *w.stop or at their
// first failure (an error unless *w.stop is set).
std::vector<std::thread> StartWorkers(const Work& w, int n);

// The store after a crash against what was attempted and acknowledged.
struct CheckTally {
  std::uint64_t acked_checked = 0, lost = 0, torn = 0, unacked_present = 0;
  std::uint64_t lookups_checked = 0, evicted_allowance = 0;
  std::uint64_t evicted_back = 0;  // found gone by a fetch, present and whole after the crash
};
void CheckSurvivors(Target& t, Path path, const Registry& reg, const Queries& queries, const char* who,
                    int it, std::set<std::uint64_t>* unacked_seen, CheckTally* c);

// Records an acknowledgement in the ack log.
void RecordAck(AckLog& log, int it, const std::string& what, std::uint64_t entry, std::uint64_t digest);

// What a crash or power-loss loop keeps from iteration to iteration: the ack
// log, what was attempted and acknowledged, and the tallies. One per loop.
// Thread-safety: an iteration's workers reach it through Work (Registry,
// Queries, AckLog and WorkTally lock or count atomically); the rest, and
// NewEpoch, are the loop thread's, between iterations.
class LoopBook {
 public:
  LoopBook(Path path, const char* who, std::uint64_t seed, const std::string& ack_log)
      : path(path), who(who), seed(seed), log(ack_log) {}

  // Iteration `it`'s Work, the workers stopping at *stop; the caller sets
  // connect and connect_admin.
  Work WorkFor(int it, const std::atomic<bool>* stop);
  // The store after a crash against the book (CheckSurvivors).
  void CheckSurvivors(Target& t, int it);
  // A fresh store: what the last one held is forgotten.
  void NewEpoch();
  // The path's own figures for the RESULT line (" name=value..."; empty for plain).
  std::string PathFigures() const;
  // Every 50 iterations, a progress line.
  void Progress(int done, double seconds) const;

  const Path path;
  const char* const who;  // "crash" or "power", for the log lines
  const std::uint64_t seed;
  AckLog log;
  Registry reg;
  Queries queries;
  WorkTally work;
  CheckTally check;
  std::atomic<std::uint32_t> next_seed{1};
  std::set<std::uint64_t> unacked_seen;
  int epoch = 0;
};

}  // namespace primecache::stress

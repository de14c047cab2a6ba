// The daemon's fetch pool (internal to the server): fetches run on its
// threads within a budget of places, and a fetch that waits for its client
// gives its place back while it waits (docs/protocol.md, "Fetch budget").
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "ipc/session.h"

namespace primecache::ipc {

// Runs posted jobs (fetches) in order of posting, at most `places` at once.
// A job that waits for its client inside a ClientWait (window space the
// client has not released, a socket it does not read) is parked: it gives
// its place back for the wait, so the next job starts meanwhile on another
// thread, and takes a place again before it produces more (Settle). So a
// client that stalls holds threads, not places: others' fetches keep their
// pace however many stalled ones there are, up to `max_parked` parked at
// once; past that a wait keeps its place, as it would in a fixed pool.
// Threads are made as they are needed, `places + max_parked` at most, and
// kept until Shutdown. With `counters`, every change of its figures is
// stored there too (ServerCounters' fetch_pool_*, for the metrics); they
// outlive the pool. Thread-safe.
class FetchPool : public Executor {
 public:
  FetchPool(std::size_t places, std::size_t max_parked, ServerCounters* counters = nullptr);
  ~FetchPool() override;
  FetchPool(const FetchPool&) = delete;
  FetchPool& operator=(const FetchPool&) = delete;

  void Post(std::function<void()> job) override EXCLUDES(mu_);
  // Runs every job queued (and those they post), then joins the threads.
  void Shutdown() EXCLUDES(mu_);

  struct Figures {
    std::size_t running = 0;  // jobs holding a place
    std::size_t parked = 0;   // jobs without one (waiting for their client, or about to take one)
    std::size_t queued = 0;   // jobs not started
    std::size_t threads = 0;
    std::uint64_t parks = 0;  // waits for a client parked, since the start
    // Waits for a client that kept their place: max_parked were parked.
    std::uint64_t parks_refused = 0;
  };
  Figures figures() const EXCLUDES(mu_);

  // Called by the fetching thread where it holds no lock and is about to
  // produce: a job that came back from a wait without a place waits here
  // for one. Nothing on a thread that is not a FetchPool's, or holds its place.
  static void Settle();

 private:
  friend class ClientWait;
  // The calling thread's job gives its place back (parked). False: it is
  // not this pool's, holds none, or max_parked are parked (it keeps it).
  bool Park() EXCLUDES(mu_);
  // The parked job takes a place back if one is free now; else it stays
  // parked until Settle.
  void Unpark() EXCLUDES(mu_);
  // Waits for a free place and takes it (ahead of jobs not started).
  void Resume() EXCLUDES(mu_);
  void Loop() EXCLUDES(mu_);
  // A thread more, when more jobs could start (queued, and places free for
  // them) than threads are idle.
  void MaybeSpawnLocked() REQUIRES(mu_);
  // Stores the figures into counters_ (when set), after every change.
  void PublishLocked() REQUIRES(mu_);
  Figures FiguresLocked() const REQUIRES(mu_);

  const std::size_t places_, max_parked_;
  ServerCounters* const counters_;  // set at construction; may be null
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  std::size_t running_ GUARDED_BY(mu_) = 0;
  std::size_t parked_ GUARDED_BY(mu_) = 0;
  std::size_t resuming_ GUARDED_BY(mu_) = 0;  // parked jobs waiting for a place in Resume
  std::size_t idle_ GUARDED_BY(mu_) = 0;      // threads waiting for a job
  std::size_t thread_count_ GUARDED_BY(mu_) = 0;
  std::uint64_t parks_ GUARDED_BY(mu_) = 0;
  std::uint64_t parks_refused_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ GUARDED_BY(mu_);  // joined by Shutdown
};

// A wait for the client of the fetch the calling thread runs: its place in
// the fetch pool is given back for the scope (FetchPool::Park), taken back
// at its end if one is free, else at the thread's next FetchPool::Settle.
// Nothing on a thread that is not a fetch pool's.
class ClientWait {
 public:
  ClientWait();
  ~ClientWait();
  ClientWait(const ClientWait&) = delete;
  ClientWait& operator=(const ClientWait&) = delete;

 private:
  FetchPool* parked_ = nullptr;
};

}  // namespace primecache::ipc

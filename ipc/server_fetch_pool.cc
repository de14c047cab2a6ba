#include "ipc/server_fetch_pool.h"

#include <algorithm>
#include <utility>

namespace primecache::ipc {

namespace {

// The job the calling thread runs, as its pool sees it.
enum class Hold { kNone, kPlace, kParked };
struct ThreadState {
  FetchPool* pool = nullptr;  // set on the pool's threads
  Hold hold = Hold::kNone;
};
thread_local ThreadState tls;

}  // namespace

FetchPool::FetchPool(std::size_t places, std::size_t max_parked, ServerCounters* counters)
    : places_(std::max<std::size_t>(places, 1)), max_parked_(max_parked), counters_(counters) {}

FetchPool::~FetchPool() { Shutdown(); }

void FetchPool::Post(std::function<void()> job) {
  {
    MutexLock l(&mu_);
    jobs_.push_back(std::move(job));
    MaybeSpawnLocked();
    PublishLocked();
  }
  cv_.SignalAll();
}

void FetchPool::MaybeSpawnLocked() {
  // The jobs that could start now, each on a thread of its own: an idle
  // thread serves one; past those, a new thread (one per job posted or
  // place freed, which is each call).
  if (running_ >= places_ || thread_count_ >= places_ + max_parked_) return;
  if (idle_ >= std::min(jobs_.size(), places_ - running_)) return;
  ++thread_count_;
  ++idle_;  // until it takes its first job
  threads_.emplace_back([this] { Loop(); });
}

void FetchPool::Shutdown() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  // Jobs still running may start threads meanwhile: joined in turn.
  for (;;) {
    std::vector<std::thread> threads;
    {
      MutexLock l(&mu_);
      threads.swap(threads_);
    }
    if (threads.empty()) return;
    for (auto& t : threads) t.join();
  }
}

void FetchPool::Loop() {
  tls.pool = this;
  MutexLock l(&mu_);
  for (;;) {
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) {
      return (!jobs_.empty() && running_ < places_ && resuming_ == 0) || (stopping_ && jobs_.empty());
    });
    if (jobs_.empty()) break;  // stopping, nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    --idle_;
    ++running_;
    tls.hold = Hold::kPlace;
    PublishLocked();
    l.Unlock();
    job();
    job = nullptr;  // what it holds goes before the pool's lock is taken
    l.Lock();
    if (tls.hold == Hold::kPlace) {
      --running_;
    } else {
      --parked_;
    }
    tls.hold = Hold::kNone;
    ++idle_;
    PublishLocked();
    cv_.SignalAll();  // a place is free: for a parked job, or the next one
  }
  --idle_;
  --thread_count_;
  PublishLocked();
}

bool FetchPool::Park() {
  if (tls.pool != this || tls.hold != Hold::kPlace) return false;
  {
    MutexLock l(&mu_);
    if (parked_ >= max_parked_) {
      ++parks_refused_;
      PublishLocked();
      return false;
    }
    --running_;
    ++parked_;
    ++parks_;
    tls.hold = Hold::kParked;
    MaybeSpawnLocked();
    PublishLocked();
  }
  cv_.SignalAll();
  return true;
}

void FetchPool::Unpark() {
  MutexLock l(&mu_);
  if (running_ >= places_) return;  // Settle takes one
  --parked_;
  ++running_;
  tls.hold = Hold::kPlace;
  PublishLocked();
}

void FetchPool::Resume() {
  MutexLock l(&mu_);
  ++resuming_;
  cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return running_ < places_; });
  --resuming_;
  --parked_;
  ++running_;
  tls.hold = Hold::kPlace;
  PublishLocked();
}

void FetchPool::Settle() {
  if (tls.pool != nullptr && tls.hold == Hold::kParked) tls.pool->Resume();
}

FetchPool::Figures FetchPool::figures() const {
  MutexLock l(&mu_);
  return FiguresLocked();
}

FetchPool::Figures FetchPool::FiguresLocked() const {
  Figures f;
  f.running = running_;
  f.parked = parked_;
  f.queued = jobs_.size();
  f.threads = thread_count_;
  f.parks = parks_;
  f.parks_refused = parks_refused_;
  return f;
}

void FetchPool::PublishLocked() {
  if (counters_ == nullptr) return;
  const Figures f = FiguresLocked();
  constexpr auto kOrder = std::memory_order_relaxed;
  counters_->fetch_pool_running.store(f.running, kOrder);
  counters_->fetch_pool_parked.store(f.parked, kOrder);
  counters_->fetch_pool_queued.store(f.queued, kOrder);
  counters_->fetch_pool_threads.store(f.threads, kOrder);
  counters_->fetch_pool_parks.store(f.parks, kOrder);
  counters_->fetch_pool_parks_refused.store(f.parks_refused, kOrder);
}

ClientWait::ClientWait() {
  if (tls.pool != nullptr && tls.pool->Park()) parked_ = tls.pool;
}

ClientWait::~ClientWait() {
  if (parked_ != nullptr) parked_->Unpark();
}

}  // namespace primecache::ipc

// A fixed set of threads running posted jobs in order of posting (FIFO; with
// several threads, jobs overlap). Shutdown (or destruction) runs every job
// queued, those that running jobs post meanwhile included, then joins; a job
// posted after the threads have exited never runs.
// Thread-safety: Post may be called from any thread, jobs included.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace primecache {

class WorkerPool {
 public:
  explicit WorkerPool(std::size_t threads) {
    for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~WorkerPool() { Shutdown(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  std::size_t size() const { return threads_.size(); }

  void Post(std::function<void()> job) EXCLUDES(mu_) {
    {
      MutexLock l(&mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.Signal();
  }

  void Shutdown() EXCLUDES(mu_) {
    {
      MutexLock l(&mu_);
      if (stopping_ && threads_.empty()) return;
      stopping_ = true;
    }
    cv_.SignalAll();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        MutexLock l(&mu_);
        cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  // Started by the constructor, joined and cleared by the first Shutdown
  // (the owner's thread).
  std::vector<std::thread> threads_;
};

}  // namespace primecache

// A fixed set of threads running posted jobs in order of posting (FIFO; with
// several threads, jobs overlap). Shutdown (or destruction) runs every job
// queued, those that running jobs post meanwhile included, then joins; a job
// posted after the threads have exited never runs.
// Thread-safety: Post may be called from any thread, jobs included.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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

  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  void Shutdown() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_ && threads_.empty()) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace primecache

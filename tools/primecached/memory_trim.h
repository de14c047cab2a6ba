// Gives the allocator's free pages back to the system every period
// (malloc_trim). glibc keeps what the daemon's many threads free in its
// arenas, in pieces between live blocks that free() alone never returns, so
// under churn the resident set would grow by them (docs/operations.md,
// "Memory"). Thread-safety: construct and destroy from one thread; the trim
// runs on a thread of its own.
#pragma once

#include <chrono>
#include <thread>

#include "core/mutex.h"

namespace primecache::daemon {

class MemoryTrimmer {
 public:
  // Period 0: never trims (and starts no thread).
  explicit MemoryTrimmer(std::chrono::seconds period);
  ~MemoryTrimmer();
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

 private:
  void Run();

  const std::chrono::seconds period_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace primecache::daemon

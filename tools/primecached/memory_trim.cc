#include "tools/primecached/memory_trim.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

namespace primecache::daemon {

MemoryTrimmer::MemoryTrimmer(std::chrono::seconds period) : period_(period) {
  if (period_.count() > 0) thread_ = std::thread([this] { Run(); });
}

MemoryTrimmer::~MemoryTrimmer() {
  {
    MutexLock g(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void MemoryTrimmer::Run() {
  MutexLock g(&mu_);
  while (!cv_.WaitFor(&mu_, period_, [this]() REQUIRES(mu_) { return stop_; })) {
    const std::size_t kept_before = mallinfo2().fordblks;
    const auto t0 = std::chrono::steady_clock::now();
    malloc_trim(0);
    const std::size_t kept_after = mallinfo2().fordblks;
    spdlog::debug(
        "primecached: trimmed the allocator in {} us ({} bytes free in its arenas before, {} after)",
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count(),
        kept_before, kept_after);
  }
}

}  // namespace primecache::daemon

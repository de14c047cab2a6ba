// A histogram of observations (durations in seconds, say) in fixed buckets,
// recorded lock-free by any number of threads and read while they record.
//
// Invariants: the bucket bounds are finite, strictly increasing, and fixed at
// construction; an observation lands in the first bucket whose bound is >= it
// (the last, implicit bucket is +Inf). Observe is a few relaxed atomic adds;
// Snapshot reads each count once, so a snapshot taken during observations may
// miss the newest ones (its count is the sum of its buckets, never torn
// between them; its sum may lag its buckets by the observations in flight).
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace primecache::ipc {

// What a histogram held when read: counts per bucket (not cumulative), the
// last one past every bound (+Inf), and the sum of the observations.
struct HistogramData {
  std::vector<double> bounds;
  std::vector<std::uint64_t> counts;  // bounds.size() + 1
  double sum = 0;
  std::uint64_t count() const;
};

class Histogram {
 public:
  // `bounds`: finite and strictly increasing (checked; a bad list aborts, as
  // it is a constant of the program).
  explicit Histogram(std::span<const double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);
  void Observe(std::chrono::steady_clock::duration d) {
    Observe(std::chrono::duration<double>(d).count());
  }
  HistogramData Snapshot() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
};

// Bucket bounds in seconds for the daemon's request durations: 100 us to
// 60 s, about three to a decade (a small entry from the page cache takes
// well under a millisecond, a GLM-5-class one from disk seconds).
std::span<const double> RequestSecondsBuckets();

}  // namespace primecache::ipc

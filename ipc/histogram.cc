#include "ipc/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace primecache::ipc {

std::uint64_t HistogramData::count() const {
  std::uint64_t n = 0;
  for (std::uint64_t c : counts) n += c;
  return n;
}

Histogram::Histogram(std::span<const double> bounds)
    : bounds_(bounds.begin(), bounds.end()), counts_(new std::atomic<std::uint64_t>[bounds.size() + 1]) {
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      std::fprintf(stderr, "Histogram: bucket bounds must be finite and strictly increasing\n");
      std::abort();
    }
  }
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) {
    // No bound is >= NaN: it counts in +Inf and stays out of the sum.
    counts_[bounds_.size()].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  counts_[static_cast<std::size_t>(at - bounds_.begin())].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

HistogramData Histogram::Snapshot() const {
  HistogramData d;
  d.bounds = bounds_;
  d.counts.resize(bounds_.size() + 1);
  for (std::size_t i = 0; i <= bounds_.size(); ++i) d.counts[i] = counts_[i].load(std::memory_order_relaxed);
  d.sum = sum_.load(std::memory_order_relaxed);
  return d;
}

std::span<const double> RequestSecondsBuckets() {
  static constexpr double kBounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                       0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return kBounds;
}

}  // namespace primecache::ipc

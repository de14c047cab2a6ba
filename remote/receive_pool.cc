#include "remote/receive_pool.h"

namespace primecache::remote {

std::string ReceivePool::Take(std::size_t size) {
  std::string out;
  {
    MutexLock l(&mu_);
    // The smallest kept buffer that holds `size`, if it wastes at most half.
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first / 2 <= size) {
      out = std::move(it->second);
      stats_.kept_bytes -= it->first;
      free_.erase(it);
      ++stats_.reused;
    } else {
      ++stats_.allocated;
    }
  }
  // Within its capacity: no allocation; bytes past its old size are zeroed
  // (none when the chunks of a size keep their size, as an entry's do).
  out.resize(size);
  return out;
}

void ReceivePool::Give(std::string&& buffer) {
  const std::size_t capacity = buffer.capacity();
  if (buffer.empty()) return;
  if (capacity > max_bytes_) return;
  std::vector<std::string> drop;  // freed outside the lock
  MutexLock l(&mu_);
  // Full: buffers of other capacities make room (the chunk size of the
  // fetches changed); those of this one are as good as this.
  for (auto it = free_.begin(); stats_.kept_bytes + capacity > max_bytes_ && it != free_.end();) {
    if (it->first == capacity) {
      ++it;
      continue;
    }
    stats_.kept_bytes -= it->first;
    drop.push_back(std::move(it->second));
    it = free_.erase(it);
  }
  if (stats_.kept_bytes + capacity > max_bytes_) {
    drop.push_back(std::move(buffer));
    return;
  }
  stats_.kept_bytes += capacity;
  free_.emplace(capacity, std::move(buffer));
}

void ReceivePool::Give(std::vector<LayerBytes>& layers) {
  for (LayerBytes& l : layers) {
    for (std::string& c : l.chunks) Give(std::move(c));
    l.chunks.clear();
  }
}

ReceivePoolStats ReceivePool::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

}  // namespace primecache::remote

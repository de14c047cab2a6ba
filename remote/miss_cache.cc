#include "remote/miss_cache.h"

#include <array>

#include "primecache/internal/codec.h"

namespace primecache::remote {

Hash128 MissCache::KeyOf(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> tokens) {
  const Hash128 t = Checksum128(std::as_bytes(tokens));
  const Hash128 n = Checksum128(AsBytes(ns));
  const std::array<std::uint64_t, 6> parts = {model.lo, model.hi, n.lo, n.hi, t.lo, t.hi};
  return Checksum128(std::as_bytes(std::span(parts)));
}

bool MissCache::Contains(const Hash128& key, Clock::time_point now) const {
  MutexLock l(&mu_);
  const auto it = added_.find(key);
  return it != added_.end() && now - it->second < ttl_;
}

void MissCache::Add(const Hash128& key, Clock::time_point now) {
  if (ttl_.count() <= 0 || capacity_ == 0) return;
  MutexLock l(&mu_);
  added_[key] = now;
  order_.emplace_back(key, now);
  while (order_.size() > capacity_) {
    const auto& [old, when] = order_.front();
    const auto it = added_.find(old);
    if (it != added_.end() && it->second == when) added_.erase(it);  // not re-added since
    order_.pop_front();
  }
}

std::size_t MissCache::size() const {
  MutexLock l(&mu_);
  return added_.size();
}

}  // namespace primecache::remote

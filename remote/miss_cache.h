// MissCache: the lookups the cluster recently could not extend, so that the
// same query asked again within `ttl` is answered locally without a round
// trip (a negative cache of remote misses). Bounded: at most `capacity`
// queries are remembered; the oldest are forgotten first. A query is keyed
// by a Checksum128 of its model digest, namespace and tokens, so a collision
// can only skip one remote lookup (a miss served locally), never serve data.
// An entry another host puts meanwhile is found once the ttl has passed.
//
// Thread-safety: every method may be called from any thread at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/mutex.h"
#include "primecache/checksum.h"

namespace primecache::remote {

class MissCache {
 public:
  using Clock = std::chrono::steady_clock;

  MissCache(std::chrono::milliseconds ttl, std::size_t capacity) : ttl_(ttl), capacity_(capacity) {}

  static Hash128 KeyOf(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> tokens);

  // Whether `key` was added less than ttl before `now`.
  bool Contains(const Hash128& key, Clock::time_point now) const;
  // Remembers a miss of `key` at `now` (nothing when ttl or capacity is 0).
  void Add(const Hash128& key, Clock::time_point now);
  std::size_t size() const;

 private:
  struct KeyHash {
    std::size_t operator()(const Hash128& h) const { return static_cast<std::size_t>(h.lo ^ (h.hi * 31)); }
  };
  const std::chrono::milliseconds ttl_;
  const std::size_t capacity_;
  mutable Mutex mu_;
  std::unordered_map<Hash128, Clock::time_point, KeyHash> added_ GUARDED_BY(mu_);
  // Every Add in order, at most capacity_ (a key added again appears twice;
  // the older record no longer matches added_ and only counts to the bound).
  std::deque<std::pair<Hash128, Clock::time_point>> order_ GUARDED_BY(mu_);
};

}  // namespace primecache::remote

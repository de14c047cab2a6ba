// The publish half of a connection's shared region: the allocator behind
// ReservedChunk (ipc/client_impl.h), and ReservedChunk itself.
#include "ipc/client_impl.h"

namespace primecache::client {

Result<std::uint64_t> ReservedChunk::Space::Take(std::uint64_t len, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (dead) return Status::Unavailable("connection to primecached lost");
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->second < len) continue;
      const std::uint64_t off = it->first;
      const std::uint64_t rest = it->second - len;
      free.erase(it);
      if (rest > 0) free[off + len] = rest;
      return off;
    }
    if (cv.wait_until(l, deadline) == std::cv_status::timeout) {
      return Status::DeadlineExceeded("no " + std::to_string(len) + " bytes of the shared region's publish half (" +
                                      std::to_string(limit) + " bytes) were freed within " +
                                      std::to_string(timeout.count()) + " ms");
    }
  }
}

void ReservedChunk::Space::Give(std::uint64_t off, std::uint64_t len) {
  if (len == 0) return;
  {
    std::lock_guard<std::mutex> l(mu);
    auto next = free.lower_bound(off);
    if (next != free.end() && off + len == next->first) {
      len += next->second;
      next = free.erase(next);
    }
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += len;
        len = 0;
      }
    }
    if (len > 0) free[off] = len;
  }
  cv.notify_all();
}

void ReservedChunk::Space::Kill() {
  {
    std::lock_guard<std::mutex> l(mu);
    dead = true;
  }
  cv.notify_all();
}

ReservedChunk::~ReservedChunk() { GiveBack(); }
ReservedChunk::ReservedChunk(ReservedChunk&& other) noexcept { *this = std::move(other); }
ReservedChunk& ReservedChunk::operator=(ReservedChunk&& other) noexcept {
  if (this == &other) return *this;
  GiveBack();
  space_ = std::move(other.space_);
  own_ = std::move(other.own_);
  bytes_ = std::exchange(other.bytes_, {});
  offset_ = std::exchange(other.offset_, 0);
  reserved_ = std::exchange(other.reserved_, 0);
  return *this;
}
void ReservedChunk::GiveBack() {
  if (space_) space_->Give(offset_, reserved_);
  space_.reset();
  own_.reset();
  bytes_ = {};
  offset_ = reserved_ = 0;
}

}  // namespace primecache::client

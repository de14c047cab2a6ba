// ReceivePool: the buffers the remote tier's fetches receive chunks into,
// kept for the next fetch instead of freed. A fetch of an entry is hundreds
// of MiB of chunk buffers that its caller (TieredStore::Import) publishes
// into the local store and then drops; freed, those pages go back to the
// kernel, and the next fetch pays for fresh ones (the kernel zeroes every
// page on first touch, which cost more than receiving into it). Kept here,
// the next fetch lands in pages already faulted in.
//
// A buffer is handed out with the bytes of whatever it held before (another
// entry's, another namespace's). That is safe only because a fetch never lets
// a chunk out before the reader has filled all of its bytes (a value of
// exactly the asked size, else kWrongSize) and its address (the checksum of
// those bytes) has been checked: a buffer whose fill failed or was short
// never leaves RemoteTier::Fetch, and goes back here.
//
// Bounded: at most `max_bytes` of capacity kept (0 keeps none); a buffer
// over the bound, or one that would waste more than half of itself on the
// size asked, is freed instead; when full, kept buffers of another capacity
// make room for a given one (the chunk size of the fetches changed).
//
// Thread-safety: every method may be called from any thread at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "primecache/internal/store.h"

namespace primecache::remote {

struct ReceivePoolStats {
  std::uint64_t reused = 0;        // buffers handed out from the pool
  std::uint64_t allocated = 0;     // buffers handed out new
  std::uint64_t kept_bytes = 0;    // capacity in the pool now
};

class ReceivePool {
 public:
  explicit ReceivePool(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  // A buffer of exactly `size` bytes, its contents unspecified.
  std::string Take(std::size_t size);
  // A buffer back (empty ones are dropped).
  void Give(std::string&& buffer);
  // Every chunk of `layers` back; the chunks are left empty.
  void Give(std::vector<LayerBytes>& layers);

  ReceivePoolStats stats() const;
  std::size_t max_bytes() const { return max_bytes_; }

 private:
  const std::size_t max_bytes_;
  mutable Mutex mu_;
  std::multimap<std::size_t, std::string> free_ GUARDED_BY(mu_);  // by capacity
  ReceivePoolStats stats_ GUARDED_BY(mu_);
};

}  // namespace primecache::remote

// Shared-memory regions: memfd-backed, mapped by the client and the daemon.
//
// The client creates the region (memfd, sized, sealed against shrinking and
// growing so the daemon can never fault on a truncated mapping), maps it, and
// sends the descriptor over the socket with SCM_RIGHTS. The daemon maps what it
// received after checking the seals and the size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "primecache/status.h"

namespace primecache::ipc {

class ShmRegion {
 public:
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  // A fresh, zeroed, sealed region of `size` bytes.
  static Result<std::unique_ptr<ShmRegion>> Create(std::size_t size, const std::string& name);
  // Maps a received descriptor (taking ownership of it), refusing one that is
  // not sealed against shrinking or is smaller than `size`.
  static Result<std::unique_ptr<ShmRegion>> Adopt(int fd, std::size_t size);

  std::byte* data() const { return base_; }
  std::size_t size() const { return size_; }
  int fd() const { return fd_; }

  // [offset, offset+length) inside the region, overflow-safe.
  bool Contains(std::uint64_t offset, std::uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

 private:
  ShmRegion(int fd, std::byte* base, std::size_t size) : fd_(fd), base_(base), size_(size) {}
  int fd_;
  std::byte* base_;
  std::size_t size_;
};

// Sends `bytes` on a connected Unix socket with one descriptor attached to the
// first byte (SCM_RIGHTS); blocking.
Status SendWithFd(int sock, std::span<const std::byte> bytes, int fd);

}  // namespace primecache::ipc

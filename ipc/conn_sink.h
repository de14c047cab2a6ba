// One connection's response queue: the write side of a daemon connection
// (internal to the server).
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "core/mutex.h"
#include "ipc/framing.h"
#include "ipc/session.h"

namespace primecache::ipc {

// Thread-safe response queue of one connection. Whoever sends (a worker or
// the loop) writes straight to the socket while nothing is queued ahead and
// the socket takes it; what the socket does not take waits here, and the
// loop writes it when the socket turns writable.
class ConnSink : public ResponseSink {
 public:
  ConnSink(std::uint64_t id, int fd, std::size_t bound, std::chrono::milliseconds stall,
           std::function<void(std::uint64_t)> notify)
      : id_(id), fd_(fd), bound_(bound), stall_(stall), notify_(std::move(notify)) {}

  void Send(std::unique_ptr<OutMessage> msg) override;
  bool WaitForRoom() override;
  bool Closed() const override;

  // Loop side: writes what the socket takes. False when the socket broke.
  bool Flush();
  bool Pending() const;
  void Close();

 private:
  // Writes what the socket takes now.
  void WriteLocked() REQUIRES(mu_);

  const std::uint64_t id_;
  const int fd_;
  const std::size_t bound_;
  const std::chrono::milliseconds stall_;
  std::function<void(std::uint64_t)> notify_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::unique_ptr<OutMessage>> wq_ GUARDED_BY(mu_);
  std::size_t wq_offset_ GUARDED_BY(mu_) = 0;  // bytes of wq_.front() already written
  std::size_t queued_ GUARDED_BY(mu_) = 0;     // unwritten bytes
  bool notified_ GUARDED_BY(mu_) = false;
  bool broken_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace primecache::ipc

#include "ipc/conn_sink.h"

#include "ipc/server_fetch_pool.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>

namespace primecache::ipc {

void ConnSink::Send(std::unique_ptr<OutMessage> msg) {
  bool wake = false;
  {
    MutexLock l(&mu_);
    if (closed_) return;
    queued_ += msg->size();
    wq_.push_back(std::move(msg));
    WriteLocked();
    // Left over (or the socket broke): the loop must take over.
    if ((!wq_.empty() || broken_) && !notified_) wake = notified_ = true;
  }
  if (wake) notify_(id_);
}

bool ConnSink::WaitForRoom() {
  // A fetch back from a wait for its client takes its place in the fetch
  // pool again before it produces more (no lock is held here).
  FetchPool::Settle();
  auto room = [this]() REQUIRES(mu_) { return closed_ || queued_ < bound_; };
  {
    MutexLock l(&mu_);
    if (room()) return !closed_;
  }
  bool ok = false;
  {
    // The client does not read: the fetch's place goes to others meanwhile.
    ClientWait waiting;
    MutexLock l(&mu_);
    ok = cv_.WaitFor(&mu_, stall_, room) && !closed_;
    if (!closed_ && queued_ >= bound_) {
      spdlog::warn("primecached: connection {} read nothing for {} ms; its fetch is aborted", id_, stall_.count());
    }
  }
  FetchPool::Settle();
  return ok;
}

bool ConnSink::Closed() const {
  MutexLock l(&mu_);
  return closed_;
}

bool ConnSink::Flush() {
  MutexLock l(&mu_);
  notified_ = false;
  WriteLocked();
  return !broken_;
}
bool ConnSink::Pending() const {
  MutexLock l(&mu_);
  return !wq_.empty();
}
void ConnSink::Close() {
  {
    MutexLock l(&mu_);
    closed_ = true;
    wq_.clear();
    queued_ = 0;
  }
  cv_.SignalAll();
}

void ConnSink::WriteLocked() {
  std::size_t written = 0;
  while (!wq_.empty() && !broken_) {
    iovec iov[IOV_MAX];
    int k = 0;
    std::size_t skip = wq_offset_;
    for (auto& m : wq_) {
      for (const iovec& v : m->iov()) {
        if (k == IOV_MAX) break;
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        iov[k++] = {static_cast<char*>(v.iov_base) + skip, v.iov_len - skip};
        skip = 0;
      }
      if (k == IOV_MAX) break;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(k);
    ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) broken_ = true;
      break;
    }
    std::size_t left = static_cast<std::size_t>(n);
    written += left;
    while (left > 0 && !wq_.empty()) {
      const std::size_t rest = wq_.front()->size() - wq_offset_;
      if (left >= rest) {
        left -= rest;
        wq_.pop_front();
        wq_offset_ = 0;
      } else {
        wq_offset_ += left;
        left = 0;
      }
    }
  }
  if (written > 0) {
    queued_ -= std::min(written, queued_);
    cv_.SignalAll();
  }
}

}  // namespace primecache::ipc

#include "ipc/server.h"

#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ipc/server_impl.h"
#include "ipc/wire.h"

// The server's loop: its lifetime, reading each connection's frames into
// its session, the deadlines, and shutdown. Listening and admission are in
// server_accept.cc, a connection's write side in conn_sink.cc.

namespace primecache::ipc {

namespace {

constexpr std::size_t kMaxFdsQueued = 4;

// Whether a request arrived that the loop has not read yet (then the
// connection is not idle, whatever its last read says).
bool HasUnreadBytes(int fd) {
  int n = 0;
  return ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

}  // namespace

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (!impl_) return;
  if (!impl_->stopped) {
    // Never ran (or Run failed early): release what Listen made.
    for (auto& l : impl_->listeners) {
      if (l->polling) uv_close(reinterpret_cast<uv_handle_t*>(&l->poll), nullptr);
      if (l->fd >= 0) close(l->fd);
      if (!l->path.empty()) unlink(l->path.c_str());
    }
    if (impl_->fetch_pool) impl_->fetch_pool->Shutdown();
    if (impl_->pool) impl_->pool->Shutdown();
    {
      MutexLock l(&impl_->notify_mu);
      impl_->async_closed = true;
    }
    uv_close(reinterpret_cast<uv_handle_t*>(&impl_->async), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&impl_->timer), nullptr);
    if (impl_->signals) {
      uv_close(reinterpret_cast<uv_handle_t*>(&impl_->sigterm), nullptr);
      uv_close(reinterpret_cast<uv_handle_t*>(&impl_->sigint), nullptr);
    }
    uv_run(&impl_->loop, UV_RUN_DEFAULT);
  }
  uv_loop_close(&impl_->loop);
}

Result<std::unique_ptr<Server>> Server::Create(Store* store, ServerOptions options) {
  if (options.socket_path.empty()) return Status::InvalidArgument("no socket path");
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  impl->opts = std::move(options);
  if (int rc = uv_loop_init(&impl->loop); rc != 0) return Status::Internal(std::string("uv_loop_init: ") + uv_strerror(rc));
  impl->async.data = impl.get();
  uv_async_init(&impl->loop, &impl->async, [](uv_async_t* a) { static_cast<Impl*>(a->data)->OnAsync(); });
  uv_timer_init(&impl->loop, &impl->timer);
  impl->timer.data = impl.get();
  impl->pool = std::make_unique<WorkerPool>(impl->opts.workers);
  impl->fetch_pool =
      std::make_unique<FetchPool>(impl->opts.fetch_workers, impl->opts.max_parked_fetches, &impl->counters);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::tcp_port() const { return impl_->tcp_port; }

const ServerCounters& Server::counters() const { return impl_->counters; }

Status Server::HandleSignals() {
  Impl* s = impl_.get();
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sigint);
  s->sigterm.data = s->sigint.data = s;
  auto cb = [](uv_signal_t* h, int signum) {
    spdlog::info("primecached: signal {}, shutting down", signum);
    static_cast<Impl*>(h->data)->BeginStop();
  };
  uv_signal_start(&s->sigterm, cb, SIGTERM);
  uv_signal_start(&s->sigint, cb, SIGINT);
  s->signals = true;
  return Status::Ok();
}

void Server::Stop() {
  MutexLock l(&impl_->notify_mu);
  if (impl_->async_closed) return;
  impl_->stop_requested = true;
  uv_async_send(&impl_->async);
}

Status Server::Run() {
  Impl* s = impl_.get();
  s->loop.data = s;
  uv_run(&s->loop, UV_RUN_DEFAULT);
  // The loop ends once every handle is closed (BeginStop). Now the workers
  // finish what was queued, the publish aborts included.
  s->fetch_pool->Shutdown();
  s->pool->Shutdown();
  s->stopped = true;
  return Status::Ok();
}

std::chrono::milliseconds Server::Impl::TickPeriod() const {
  // A quarter of the shortest deadline: each is kept to within 25% late.
  std::chrono::milliseconds shortest{4000};
  for (auto t : {opts.hello_timeout, opts.idle_timeout, opts.limits.publish_timeout}) {
    if (t.count() > 0) shortest = std::min(shortest, t);
  }
  return std::clamp(shortest / 4, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
}

void Server::Impl::OnTick() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<Conn*, std::string>> expired;
  for (auto& [id, c] : conns) {
    if (c->closing) continue;
    c->session->ExpireStalledPublishes(now);
    if (!c->session->hello_done()) {
      if (opts.hello_timeout.count() > 0 && now - c->accepted >= opts.hello_timeout) {
        expired.emplace_back(c, "no hello within " + std::to_string(opts.hello_timeout.count()) + " ms (--hello-timeout)");
      }
      continue;
    }
    if (opts.idle_timeout.count() > 0 && !c->session->Busy() &&
        now - std::max(c->last_read, c->session->last_answer()) >= opts.idle_timeout && !HasUnreadBytes(c->fd)) {
      expired.emplace_back(c, "idle for " + std::to_string(opts.idle_timeout.count()) + " ms (--idle-timeout)");
    }
  }
  for (auto& [c, why] : expired) {
    spdlog::info("primecached: connection {} (uid {}) closed: {}", c->id, c->uid, why);
    Expel(c, wire::ErrorCode::DEADLINE_EXCEEDED, "connection closed: " + why);
  }
}

void Server::Impl::Expel(Conn* c, wire::ErrorCode code, const std::string& why) {
  c->sink->Send(ErrorResponse(0, code, why));
  Flush(c);  // best effort: a peer that does not read never holds us up
  if (!c->closing) CloseConn(c);
}

void Server::Impl::UpdatePoll(Conn* c) {
  if (c->closing) return;
  int ev = 0;
  if (!c->close_after_flush && !c->session->InboundBlocked()) ev |= UV_READABLE;
  if (c->sink->Pending()) ev |= UV_WRITABLE;
  if (ev != c->events) {
    c->events = ev;
    if (ev == 0) {
      uv_poll_stop(&c->poll);
    } else {
      uv_poll_start(&c->poll, ev, [](uv_poll_t* p, int status, int events) {
        auto* conn = static_cast<Conn*>(p->data);
        static_cast<Impl*>(p->loop->data)->OnEvents(conn, status, events);
      });
    }
  }
}

void Server::Impl::OnEvents(Conn* c, int status, int events) {
  if (c->closing) return;
  if (status < 0) {
    CloseConn(c);
    return;
  }
  if ((events & UV_WRITABLE) != 0) {
    Flush(c);
    if (c->closing) return;
  }
  if ((events & UV_READABLE) != 0) ReadSome(c);
  if (!c->closing) UpdatePoll(c);
}

void Server::Impl::ReadSome(Conn* c) {
  std::vector<Frame> frames;
  // Bounded work per wake-up so one busy client cannot starve the others.
  for (int round = 0; round < 16 && !c->closing; ++round) {
    auto buf = c->decoder->ReadBuffer();
    iovec iov{buf.data(), buf.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsQueued)];
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      CloseConn(c);
      return;
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < k; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (c->fds.size() < kMaxFdsQueued) {
          c->fds.push_back(fd);
        } else {
          close(fd);
        }
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) spdlog::warn("primecached: connection {}: descriptors truncated", c->id);
    if (n == 0) {
      CloseConn(c);
      return;
    }
    c->last_read = std::chrono::steady_clock::now();
    Status s = c->decoder->Consume(static_cast<std::size_t>(n), &frames);
    for (auto& f : frames) {
      if (c->closing || c->close_after_flush) break;
      if (c->session->OnFrame(std::move(f), &c->fds) == Session::Connection::kClose) c->close_after_flush = true;
    }
    frames.clear();
    if (!s.ok()) {
      // The stream cannot be resynchronised: say why, then hang up.
      spdlog::info("primecached: connection {}: {}", c->id, s.ToString());
      c->sink->Send(ErrorResponse(0, wire::ErrorCode::PROTOCOL, s.message()));
      c->close_after_flush = true;
    }
    if (c->close_after_flush || c->session->InboundBlocked()) break;
  }
  if (c->close_after_flush && !c->closing) Flush(c);
}

void Server::Impl::Flush(Conn* c) {
  if (!c->sink->Flush()) {
    CloseConn(c);
    return;
  }
  if (c->close_after_flush && !c->sink->Pending()) CloseConn(c);
}

void Server::Impl::CloseConn(Conn* c) {
  if (c->closing) return;
  c->closing = true;
  c->session->OnClose();
  c->sink->Close();
  for (int fd : c->fds) close(fd);
  c->fds.clear();
  conns.erase(c->id);
  counters.connections.fetch_sub(1);
  if (c->admin) {
    --admin_conns;
  } else {
    --data_conns;
    auto it = conns_per_uid.find(c->uid);
    if (it != conns_per_uid.end() && --it->second == 0) conns_per_uid.erase(it);
  }
  uv_poll_stop(&c->poll);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->poll), [](uv_handle_t* h) {
    auto* conn = static_cast<Conn*>(h->data);
    close(conn->fd);
    delete conn;
  });
}

void Server::Impl::OnAsync() {
  std::vector<std::uint64_t> ids;
  bool stop = false;
  {
    MutexLock l(&notify_mu);
    ids.swap(dirty);
    stop = stop_requested;
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (std::uint64_t id : ids) {
    auto it = conns.find(id);
    if (it == conns.end()) continue;
    Conn* c = it->second;
    Flush(c);
    if (!c->closing) UpdatePoll(c);
  }
  if (stop) BeginStop();
}

void Server::Impl::BeginStop() {
  if (stopped) return;
  stopped = true;
  for (auto& l : listeners) {
    if (!l->path.empty()) unlink(l->path.c_str());
    uv_poll_stop(&l->poll);
    uv_close(reinterpret_cast<uv_handle_t*>(&l->poll), [](uv_handle_t* h) { close(static_cast<Listener*>(h->data)->fd); });
  }
  std::vector<Conn*> all;
  for (auto& [id, c] : conns) all.push_back(c);
  for (Conn* c : all) {
    Flush(c);  // best effort: what is already queued
    CloseConn(c);
  }
  {
    MutexLock l(&notify_mu);
    async_closed = true;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&async), nullptr);
  uv_timer_stop(&timer);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr);
  if (signals) {
    uv_close(reinterpret_cast<uv_handle_t*>(&sigterm), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&sigint), nullptr);
  }
}

}  // namespace primecache::ipc

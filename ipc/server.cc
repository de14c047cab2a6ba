#include "ipc/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/errno_text.h"
#include "core/worker_pool.h"
#include "ipc/wire.h"

namespace primecache::ipc {

namespace {


constexpr std::size_t kMaxFdsQueued = 4;

// The daemon's worker pools, as the sessions see them.
class WorkerPool : public Executor {
 public:
  explicit WorkerPool(std::size_t n) : pool_(n) {}
  void Post(std::function<void()> job) override { pool_.Post(std::move(job)); }
  void Shutdown() { pool_.Shutdown(); }

 private:
  primecache::WorkerPool pool_;
};

}  // namespace

// Thread-safe response queue of one connection. Whoever sends (a worker or
// the loop) writes straight to the socket while nothing is queued ahead and
// the socket takes it; what the socket does not take waits here, and the
// loop writes it when the socket turns writable.
class ConnSink : public ResponseSink {
 public:
  ConnSink(std::uint64_t id, int fd, std::size_t bound, std::chrono::milliseconds stall,
           std::function<void(std::uint64_t)> notify)
      : id_(id), fd_(fd), bound_(bound), stall_(stall), notify_(std::move(notify)) {}

  void Send(std::unique_ptr<OutMessage> msg) override {
    bool wake = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_) return;
      queued_ += msg->size();
      wq_.push_back(std::move(msg));
      WriteLocked();
      // Left over (or the socket broke): the loop must take over.
      if ((!wq_.empty() || broken_) && !notified_) wake = notified_ = true;
    }
    if (wake) notify_(id_);
  }

  bool WaitForRoom() override {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, stall_, [this] { return closed_ || queued_ < bound_; })) {
      spdlog::warn("primecached: connection {} read nothing for {} ms; its fetch is aborted", id_, stall_.count());
      return false;
    }
    return !closed_;
  }

  bool Closed() const override {
    std::lock_guard<std::mutex> l(mu_);
    return closed_;
  }

  // Loop side: writes what the socket takes. False when the socket broke.
  bool Flush() {
    std::lock_guard<std::mutex> l(mu_);
    notified_ = false;
    WriteLocked();
    return !broken_;
  }
  bool Pending() const {
    std::lock_guard<std::mutex> l(mu_);
    return !wq_.empty();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = true;
      wq_.clear();
      queued_ = 0;
    }
    cv_.notify_all();
  }

 private:
  void WriteLocked() {
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
      cv_.notify_all();
    }
  }

  const std::uint64_t id_;
  const int fd_;
  const std::size_t bound_;
  const std::chrono::milliseconds stall_;
  std::function<void(std::uint64_t)> notify_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<OutMessage>> wq_;
  std::size_t wq_offset_ = 0;  // bytes of wq_.front() already written
  std::size_t queued_ = 0;     // unwritten bytes
  bool notified_ = false;
  bool broken_ = false;
  bool closed_ = false;
};

struct Conn {
  std::uint64_t id = 0;
  int fd = -1;
  bool admin = false;  // accepted on the admin socket (counted apart)
  uid_t uid = static_cast<uid_t>(-1);
  std::chrono::steady_clock::time_point accepted, last_read;
  uv_poll_t poll{};
  int events = 0;
  bool closing = false;
  bool close_after_flush = false;
  std::unique_ptr<FrameDecoder> decoder;
  std::shared_ptr<ConnSink> sink;
  std::shared_ptr<Session> session;
  std::vector<int> fds;
};

struct Listener {
  int fd = -1;
  uv_poll_t poll{};
  bool admin = false;
  bool unix_socket = true;
  bool polling = false;
  std::string path;  // Unix socket file to remove at shutdown
};

struct Server::Impl {
  Store* store = nullptr;
  ServerOptions opts;
  uv_loop_t loop{};
  uv_async_t async{};
  uv_signal_t sigterm{}, sigint{};
  bool signals = false;
  std::unique_ptr<WorkerPool> pool;
  std::unique_ptr<WorkerPool> fetch_pool;
  ServerCounters counters;
  std::vector<std::unique_ptr<Listener>> listeners;
  std::unordered_map<std::uint64_t, Conn*> conns;
  std::size_t data_conns = 0, admin_conns = 0;
  std::unordered_map<uid_t, std::size_t> conns_per_uid;  // data connections
  uv_timer_t timer{};  // the deadlines (hello, idle, publish)
  std::chrono::steady_clock::time_point last_refusal_log{};
  std::size_t refusals_unlogged = 0;
  std::uint64_t next_id = 1;
  int tcp_port = -1;

  std::mutex notify_mu;
  std::vector<std::uint64_t> dirty;
  bool stop_requested = false;
  bool stopped = false;

  bool async_closed = false;

  void Notify(std::uint64_t id) {
    std::lock_guard<std::mutex> l(notify_mu);
    if (async_closed) return;
    dirty.push_back(id);
    uv_async_send(&async);
  }

  Status ListenUnix(const std::string& path, bool admin);
  Status ListenTcp(int port);
  void OnAccept(Listener* l);
  // Why a new connection from this peer is refused ("" if it is not).
  std::string AcceptRefusal(bool admin, uid_t uid) const;
  void LogRefusal(uid_t uid, const std::string& why);
  void Admit(int fd, const PeerInfo& peer);
  void OnTick();
  std::chrono::milliseconds TickPeriod() const;
  // Closes a connection after telling it why (an id-0 notice).
  void Expel(Conn* c, wire::ErrorCode code, const std::string& why);
  void OnEvents(Conn* c, int status, int events);
  void ReadSome(Conn* c);
  void Flush(Conn* c);
  void UpdatePoll(Conn* c);
  void CloseConn(Conn* c);
  void OnAsync();
  void BeginStop();
};

namespace {

template <typename T>
T* Data(uv_handle_t* h) {
  return static_cast<T*>(h->data);
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
      std::lock_guard<std::mutex> l(impl_->notify_mu);
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
  impl->fetch_pool = std::make_unique<WorkerPool>(impl->opts.fetch_workers);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::tcp_port() const { return impl_->tcp_port; }

const ServerCounters& Server::counters() const { return impl_->counters; }

Status Server::Impl::ListenUnix(const std::string& path, bool admin) {
  sockaddr_un addr{};
  const std::string tmp = path + "." + std::to_string(getpid()) + ".tmp";
  if (tmp.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path too long (" + std::to_string(path.size()) + " bytes): " + path);
  }
  // Another daemon serving there already?
  {
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un pa{};
    pa.sun_family = AF_UNIX;
    std::memcpy(pa.sun_path, path.c_str(), path.size() + 1);
    const bool live = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&pa), sizeof(pa)) == 0;
    if (probe >= 0) close(probe);
    if (live) return Status::AlreadyExists("a daemon is already serving " + path);
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(ErrnoText("socket"));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, tmp.c_str(), tmp.size() + 1);
  unlink(tmp.c_str());
  const mode_t old = umask(0177);  // the file is born 0600
  const int brc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (brc != 0) {
    Status s = Status::IOError(ErrnoText("bind " + tmp));
    close(fd);
    return s;
  }
  auto fail = [&](Status s) {
    close(fd);
    unlink(tmp.c_str());
    return s;
  };
  if (!admin && opts.socket_group.has_value()) {
    if (chown(tmp.c_str(), static_cast<uid_t>(-1), *opts.socket_group) != 0) return fail(Status::IOError(ErrnoText("chown socket")));
    if (chmod(tmp.c_str(), 0660) != 0) return fail(Status::IOError(ErrnoText("chmod socket")));
  }
  if (listen(fd, 256) != 0) return fail(Status::IOError(ErrnoText("listen")));
  // Appear at the real path only now that connections are accepted.
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail(Status::IOError(ErrnoText("rename socket to " + path)));
  auto l = std::make_unique<Listener>();
  l->fd = fd;
  l->admin = admin;
  l->path = path;
  listeners.push_back(std::move(l));
  return Status::Ok();
}

Status Server::Impl::ListenTcp(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(ErrnoText("socket"));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // loopback only, never a routable address
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 256) != 0) {
    Status s = Status::IOError(ErrnoText("bind/listen 127.0.0.1:" + std::to_string(port)));
    close(fd);
    return s;
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  tcp_port = ntohs(a.sin_port);
  auto l = std::make_unique<Listener>();
  l->fd = fd;
  l->unix_socket = false;
  listeners.push_back(std::move(l));
  return Status::Ok();
}

Status Server::Listen() {
  Impl* s = impl_.get();
  PC_RETURN_IF_ERROR(s->ListenUnix(s->opts.socket_path, false));
  if (!s->opts.admin_socket_path.empty()) PC_RETURN_IF_ERROR(s->ListenUnix(s->opts.admin_socket_path, true));
  if (s->opts.tcp_port >= 0) PC_RETURN_IF_ERROR(s->ListenTcp(s->opts.tcp_port));
  for (auto& l : s->listeners) {
    uv_poll_init(&s->loop, &l->poll, l->fd);
    l->polling = true;
    l->poll.data = l.get();
    uv_poll_start(&l->poll, UV_READABLE, [](uv_poll_t* p, int, int) {
      auto* lis = static_cast<Listener*>(p->data);
      auto* impl = static_cast<Impl*>(p->loop->data);
      impl->OnAccept(lis);
    });
  }
  s->loop.data = s;
  const auto period = static_cast<std::uint64_t>(s->TickPeriod().count());
  uv_timer_start(&s->timer, [](uv_timer_t* t) { static_cast<Impl*>(t->data)->OnTick(); }, period, period);
  return Status::Ok();
}

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
  std::lock_guard<std::mutex> l(impl_->notify_mu);
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

namespace {

// Tells a peer refused at accept why, if its socket takes the bytes now
// (it is never waited on), then closes it.
// Whether a request arrived that the loop has not read yet (then the
// connection is not idle, whatever its last read says).
bool HasUnreadBytes(int fd) {
  int n = 0;
  return ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

void RefuseAtAccept(int fd, const std::string& why) {
  auto flat = Flatten(*ErrorResponse(0, wire::ErrorCode::RESOURCE_EXHAUSTED, why));
  (void)send(fd, flat.data(), flat.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

}  // namespace

void Server::Impl::LogRefusal(uid_t uid, const std::string& why) {
  // A flood of refused connections makes one line a second, not one each.
  const auto now = std::chrono::steady_clock::now();
  if (now - last_refusal_log < std::chrono::seconds(1)) {
    ++refusals_unlogged;
    return;
  }
  last_refusal_log = now;
  if (refusals_unlogged == 0) {
    spdlog::warn("primecached: connection from uid {} refused: {}", uid, why);
  } else {
    spdlog::warn("primecached: connection from uid {} refused: {} ({} more refused in the last second)", uid, why,
                 refusals_unlogged);
  }
  refusals_unlogged = 0;
}

std::string Server::Impl::AcceptRefusal(bool admin, uid_t uid) const {
  if (admin) {
    if (admin_conns < opts.max_admin_connections) return "";
    return "the admin socket's connection limit (" + std::to_string(opts.max_admin_connections) +
           ", --max-admin-connections) is reached";
  }
  if (data_conns >= opts.max_connections) {
    return "the daemon's connection limit (" + std::to_string(opts.max_connections) +
           ", --max-connections) is reached";
  }
  if (opts.max_connections_per_uid == 0) return "";
  auto it = conns_per_uid.find(uid);
  if (it == conns_per_uid.end() || it->second < opts.max_connections_per_uid) return "";
  const std::string who =
      uid == static_cast<uid_t>(-1) ? "TCP peers (no uid) hold their" : "uid " + std::to_string(uid) + " holds its";
  return who + " limit of " + std::to_string(opts.max_connections_per_uid) +
         " connections (--max-connections-per-uid)";
}

void Server::Impl::OnAccept(Listener* l) {
  for (int i = 0; i < 64; ++i) {
    int fd = accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) spdlog::warn("accept: {}", std::strerror(errno));
      return;
    }
    PeerInfo peer;
    peer.local = l->unix_socket;
    peer.admin = l->admin;
    if (l->unix_socket) {
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        peer.uid = cred.uid;
        peer.pid = cred.pid;
      }
    } else {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    if (const std::string why = AcceptRefusal(l->admin, peer.uid); !why.empty()) {
      LogRefusal(peer.uid, why);
      RefuseAtAccept(fd, why);
      continue;
    }
    if (l->admin) {
      const bool ok = peer.uid == geteuid() || peer.uid == 0 ||
                      std::find(opts.admin_uids.begin(), opts.admin_uids.end(), peer.uid) != opts.admin_uids.end();
      if (!ok) {
        // Kept until its first request, which is answered with the refusal.
        spdlog::warn("primecached: admin connection from uid {} refused", peer.uid);
        peer.refused = "uid " + std::to_string(peer.uid) + " may not use the admin socket (allowed: uid " +
                       std::to_string(geteuid()) + ", root and --admin-uid)";
      }
    }
    if (!opts.tenants.empty()) {
      auto it = opts.tenants.find(peer.uid);
      peer.allowed_namespaces = it != opts.tenants.end() ? it->second : std::vector<std::string>{};
      if (peer.admin) peer.allowed_namespaces.reset();
    }
    Admit(fd, peer);
  }
}

void Server::Impl::Admit(int fd, const PeerInfo& peer) {
  if (opts.socket_buffer_bytes > 0) {
    // Fewer wake-ups per large chunk; the kernel caps it (net.core.wmem_max).
    int sz = static_cast<int>(opts.socket_buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  }
  auto* c = new Conn();
  c->id = next_id++;
  c->fd = fd;
  c->admin = peer.admin;
  c->uid = peer.uid;
  c->accepted = c->last_read = std::chrono::steady_clock::now();
  c->decoder = std::make_unique<FrameDecoder>(opts.limits.frame);
  c->sink = std::make_shared<ConnSink>(c->id, fd, opts.write_queue_bound, opts.stall_timeout, [this](std::uint64_t id) { Notify(id); });
  c->session =
      std::make_shared<Session>(store, pool.get(), fetch_pool.get(), c->sink, opts.limits, peer, &counters, opts.device_dma,
                                opts.remote_stats);
  const std::uint64_t cid = c->id;
  c->session->SetUnblockedCallback([this, cid] { Notify(cid); });
  conns[c->id] = c;
  counters.connections.fetch_add(1);
  if (c->admin) {
    ++admin_conns;
  } else {
    ++data_conns;
    ++conns_per_uid[c->uid];
  }
  uv_poll_init(&loop, &c->poll, fd);
  c->poll.data = c;
  c->events = UV_READABLE;
  uv_poll_start(&c->poll, c->events, [](uv_poll_t* p, int status, int events) {
    auto* conn = static_cast<Conn*>(p->data);
    static_cast<Impl*>(p->loop->data)->OnEvents(conn, status, events);
  });
  spdlog::debug("primecached: connection {} (uid {}, pid {}, admin {})", c->id, peer.uid, peer.pid, peer.admin);
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
    std::lock_guard<std::mutex> l(notify_mu);
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
    std::lock_guard<std::mutex> l(notify_mu);
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

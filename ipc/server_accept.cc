// Listening and admission: the Unix sockets (data and admin) and the
// loopback TCP port, each accepted connection's peer and its limits, and
// the refusals (said to the peer, logged at most once a second).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/errno_text.h"
#include "ipc/server_impl.h"
#include "ipc/wire.h"

namespace primecache::ipc {

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

namespace {

// Tells a peer refused at accept why, if its socket takes the bytes now
// (it is never waited on), then closes it.
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

}  // namespace primecache::ipc

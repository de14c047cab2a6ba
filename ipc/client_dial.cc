// Reaching the daemon: the socket (Unix or TCP), hello and the
// shared-memory handshake (Impl::Dial), reconnecting with the one retry
// policy (Impl::Get; Impl::Retry in ipc/client_impl.h), the device window
// attached again on every new connection, and the Client's own lifetime.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "core/errno_text.h"
#include "ipc/client_impl.h"

namespace primecache::client {

namespace {

// A stream socket of `family` connected to `addr`, or why not.
Result<int> Connected(int family, const sockaddr* addr, socklen_t len, const std::string& endpoint) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(ErrnoText("socket"));
  if (connect(fd, addr, len) != 0) {
    Status s = Status::Unavailable(ErrnoText("connect " + endpoint));
    close(fd);
    return s;
  }
  return fd;
}

Result<int> OpenSocket(const std::string& endpoint, std::chrono::milliseconds timeout) {
  int fd = -1;
  if (endpoint.rfind("tcp:", 0) == 0) {
    const std::string rest = endpoint.substr(4);
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos) return Status::InvalidArgument("tcp endpoint needs HOST:PORT: " + endpoint);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    int port = 0;
    try {
      port = std::stoi(rest.substr(colon + 1));
    } catch (...) {
      return Status::InvalidArgument("bad port in " + endpoint);
    }
    if (port <= 0 || port > 65535) return Status::InvalidArgument("bad port in " + endpoint);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET, rest.substr(0, colon).c_str(), &a.sin_addr) != 1) {
      return Status::InvalidArgument("bad IPv4 address in " + endpoint);
    }
    PC_ASSIGN_OR_RETURN(fd, Connected(AF_INET, reinterpret_cast<sockaddr*>(&a), sizeof(a), endpoint));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  } else {
    sockaddr_un a{};
    if (endpoint.empty() || endpoint.size() >= sizeof(a.sun_path)) {
      return Status::InvalidArgument("bad socket path '" + endpoint + "'");
    }
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, endpoint.c_str(), endpoint.size() + 1);
    PC_ASSIGN_OR_RETURN(fd, Connected(AF_UNIX, reinterpret_cast<sockaddr*>(&a), sizeof(a), endpoint));
  }
  int buf = 4 << 20;  // large chunks in fewer wake-ups; the kernel caps it
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

}  // namespace

Result<std::shared_ptr<Conn>> Client::Impl::Dial() {
  if (opts.shared_memory && opts.endpoint.rfind("tcp:", 0) == 0) {
    return Status::NotSupported("shared memory needs a Unix socket endpoint");
  }
  PC_ASSIGN_OR_RETURN(int fd, OpenSocket(opts.endpoint, opts.connect_timeout));
  auto c = std::make_shared<Conn>();
  c->fd = fd;
  Conn* raw = c.get();
  c->reader = std::thread([raw] { raw->ReadLoop(); });

  const std::uint64_t hid = NextId();
  auto hello = BuildRequest(hid, [&](wire::Request::Builder r) {
    auto h = r.initHello();
    h.setMinVersion(ipc::kMinProtocolVersion);
    h.setMaxVersion(ipc::kMaxProtocolVersion);
    h.setClient(opts.client_name);
    h.setNamespace(opts.ns);
    if (opts.tp_rank) h.setTpRank(*opts.tp_rank);
  });
  PC_ASSIGN_OR_RETURN(Frame hf, Call(c, hid, *hello));
  {
    auto rd = hf.Reader(c->limits);
    auto r = rd->getRoot<wire::Response>();
    if (r.which() != wire::Response::HELLO) return Status::Internal("hello answered with something else");
    auto h = r.getHello();
    c->info.version = h.getVersion();
    c->info.server = h.getServer();
    c->info.max_message_bytes = h.getMaxMessageBytes();
    c->info.max_chunk_bytes = h.getMaxChunkBytes();
    c->info.max_publishes_in_flight = h.getMaxPublishesInFlight();
    c->info.admin = h.getAdmin();
    c->info.device_copies = h.getDeviceCopies();
    c->info.fetch_by_query = h.getFetchByQuery();
    c->info.group_publish = h.getGroupPublish();
  }
  if (opts.shared_memory) {
    auto region = ipc::ShmRegion::Create(opts.shared_memory_bytes, "primecache-client");
    if (!region.ok()) return region.status();
    c->shm = std::shared_ptr<ipc::ShmRegion>(std::move(region).value());
    const std::uint64_t aid = NextId();
    auto attach = BuildRequest(aid, [&](wire::Request::Builder r) { r.initShmAttach().setSize(c->shm->size()); });
    auto p = std::make_shared<Pending>();
    c->Register(aid, p);
    auto flat = ipc::Flatten(*attach);
    {
      std::lock_guard<std::mutex> l(c->write_mu);
      Status s = ipc::SendWithFd(c->fd, flat, c->shm->fd());
      if (!s.ok()) return s;
    }
    std::unique_lock<std::mutex> l(p->mu);
    if (!p->cv.wait_for(l, opts.timeout, [&] { return p->done; })) {
      return Status::DeadlineExceeded("shared-memory handshake timed out");
    }
    if (!p->status.ok()) return p->status.WithContext("shared-memory handshake");
    c->space = std::make_shared<ReservedChunk::Space>(c->shm, c->shm->size() / 2);
  }
  return c;
}

Result<std::shared_ptr<Conn>> Client::Impl::Get() {
  std::lock_guard<std::mutex> l(mu);
  if (conn && !conn->dead) return conn;
  Status last = Status::Unavailable("not connected");
  for (int attempt = 0; attempt <= std::max(0, opts.reconnect_attempts); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(opts.reconnect_backoff);
    auto c = Dial();
    if (c.ok() && device_spec) {
      // A new connection (the daemon restarted?) gets the window again; one
      // the daemon now refuses leaves fetches on the host path.
      if (Status s = AttachDevice(*c, *device_spec); !s.ok() && !s.IsUnavailable()) device_spec.reset();
    }
    if (c.ok()) {
      conn = *c;
      info = conn->info;
      return conn;
    }
    last = c.status();
    if (!last.IsUnavailable()) break;  // a refusal, not an absence: do not insist
  }
  return last;
}

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() {
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    c = std::move(impl_->conn);
  }
  c.reset();
}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->opts = std::move(options);
  PC_ASSIGN_OR_RETURN(auto c, impl->Get());
  (void)c;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const ServerInfo& Client::server_info() const { return impl_->info; }

Status Client::Impl::AttachDevice(const std::shared_ptr<Conn>& c, const DeviceWindowSpec& spec) {
  const std::uint64_t id = NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) {
    auto a = r.initAttachDevice();
    a.setPciBusId(spec.pci_bus_id);
    a.setHandle(KjBytes(std::as_bytes(std::span(spec.handle.data(), spec.handle.size()))));
    a.setSize(spec.size);
  });
  auto reply = Call(c, id, *m);
  if (!reply.ok()) return reply.status();
  c->device_size = spec.size;
  return Status::Ok();
}

Status Client::AttachDeviceWindow(const DeviceWindowSpec& spec) {
  PC_RETURN_IF_ERROR(impl_->Retry([&]() -> Status {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    return impl_->AttachDevice(c, spec);
  }));
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->device_spec = spec;
  return Status::Ok();
}

SharedRegion Client::region() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (!impl_->conn || !impl_->conn->shm) return {};
  return {impl_->conn->shm->data(), impl_->conn->shm->size(), impl_->conn->shm->fd()};
}

bool Client::connected() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->conn && !impl_->conn->dead;
}

}  // namespace primecache::client

#include "primecache/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <thread>
#include <utility>

#include <kj/exception.h>

#include "core/errno_text.h"
#include "ipc/framing.h"
#include "ipc/shm.h"
#include "ipc/wire.h"

namespace primecache::client {

using ipc::BuildRequest;
using ipc::Frame;
using ipc::FrameDecoder;
using ipc::FrameLimits;
using ipc::OutMessage;
using Clock = std::chrono::steady_clock;

namespace {


kj::ArrayPtr<const kj::byte> KjBytes(std::span<const std::byte> b) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.data()), b.size());
}
std::span<const std::byte> Bytes(capnp::Data::Reader d) {
  return {reinterpret_cast<const std::byte*>(d.begin()), d.size()};
}

// One request waiting for its final response.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::optional<Frame> frame;  // the final response on success
  Clock::time_point last_activity = Clock::now();
  // Streamed (non-final) responses, on the reader thread.
  std::function<Status(wire::Response::Reader)> on_stream;
  // Runs on completion, on the reader thread (or the failing thread).
  std::function<void(const Status&)> on_done;
};

bool IsFinal(wire::Response::Which w) {
  return w != wire::Response::FETCH_LAYER && w != wire::Response::FETCH_CHUNK;
}

FrameLimits ClientLimits() {
  FrameLimits l;
  l.max_message_bytes = 256u << 20;  // trust the daemon more, still bounded
  l.max_segments = 512;
  l.nesting_limit = 32;
  return l;
}

}  // namespace

// The publish half of a connection's shared region, [0, limit): extents
// handed out for chunks (ReserveChunk) and given back in any order (a
// reservation dropped, a chunk acknowledged as stored). Free extents are kept
// coalesced; extents start and end on kAlign boundaries. Thread-safe.
struct ReservedChunk::Space {
  static constexpr std::uint64_t kAlign = 4096;
  static std::uint64_t Round(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  Space(std::shared_ptr<ipc::ShmRegion> r, std::uint64_t half) : region(std::move(r)), limit(half / kAlign * kAlign) {
    if (limit > 0) free[0] = limit;
  }

  // An extent of `len` (a multiple of kAlign) bytes, waiting up to `timeout`.
  Result<std::uint64_t> Take(std::uint64_t len, std::chrono::milliseconds timeout) {
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

  void Give(std::uint64_t off, std::uint64_t len) {
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

  void Kill() {
    {
      std::lock_guard<std::mutex> l(mu);
      dead = true;
    }
    cv.notify_all();
  }

  const std::shared_ptr<ipc::ShmRegion> region;  // keeps the mapping alive
  const std::uint64_t limit;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, std::uint64_t> free;  // offset -> length
  bool dead = false;
};

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

// The fetch window (the second half of a connection's region): one fetch at a
// time streams through it, and it stays taken after that fetch until every
// chunk it handed over (FetchCallbacks::on_chunk_held) is released, since
// the daemon would write the next fetch's chunks over them. A fetch that
// finds it taken streams inline. Thread-safe.
struct FetchWindow {
  std::mutex mu;
  bool busy = false;
  bool TryTake() {
    std::lock_guard<std::mutex> l(mu);
    return !std::exchange(busy, true);
  }
  void Free() {
    std::lock_guard<std::mutex> l(mu);
    busy = false;
  }
};

// One connection: a socket, its reader thread and its pending requests.
struct Conn {
  int fd = -1;
  std::thread reader;
  std::mutex write_mu;
  std::mutex mu;
  std::map<std::uint64_t, std::shared_ptr<Pending>> pending;
  std::atomic<bool> dead{false};
  Status death;
  std::string notice;  // the daemon's last id-0 error: why it may hang up
  ServerInfo info;
  std::shared_ptr<ipc::ShmRegion> shm;
  std::shared_ptr<ReservedChunk::Space> space;  // the publish half of shm
  std::shared_ptr<FetchWindow> window = std::make_shared<FetchWindow>();
  // The attached device window's size (0: none), set once attached, and its
  // use by one fetch at a time, like the shared one.
  std::atomic<std::uint64_t> device_size{0};
  std::shared_ptr<FetchWindow> device_window = std::make_shared<FetchWindow>();
  FrameLimits limits = ClientLimits();

  ~Conn() {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
    if (reader.joinable()) reader.join();
    if (fd >= 0) close(fd);
  }

  void Register(std::uint64_t id, std::shared_ptr<Pending> p) {
    std::lock_guard<std::mutex> l(mu);
    pending[id] = std::move(p);
  }
  void Forget(std::uint64_t id) {
    std::lock_guard<std::mutex> l(mu);
    pending.erase(id);
  }

  Status Send(const OutMessage& m) {
    std::lock_guard<std::mutex> l(write_mu);
    if (dead) return Status::Unavailable("connection to primecached lost");
    std::vector<iovec> iov = m.iov();
    std::size_t i = 0;
    while (i < iov.size()) {
      msghdr msg{};
      msg.msg_iov = iov.data() + i;
      msg.msg_iovlen = std::min<std::size_t>(iov.size() - i, IOV_MAX);
      ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::DeadlineExceeded("send to primecached timed out");
        return Status::Unavailable(ErrnoText("send to primecached"));
      }
      auto left = static_cast<std::size_t>(n);
      while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
      if (i < iov.size()) {
        iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
      }
    }
    return Status::Ok();
  }

  void Fail(const Status& s) {
    std::map<std::uint64_t, std::shared_ptr<Pending>> all;
    {
      std::lock_guard<std::mutex> l(mu);
      dead = true;
      death = s;
      all.swap(pending);
    }
    if (space) space->Kill();  // reservations waiting for room fail now
    for (auto& [id, p] : all) Complete(p, s, std::nullopt);
  }

  static void Complete(const std::shared_ptr<Pending>& p, Status s, std::optional<Frame> frame) {
    std::function<void(const Status&)> done;
    {
      std::lock_guard<std::mutex> l(p->mu);
      if (p->done) return;
      p->done = true;
      p->status = std::move(s);
      p->frame = std::move(frame);
      done = std::move(p->on_done);
    }
    p->cv.notify_all();
    if (done) done(p->status);
  }

  void ReadLoop() {
    FrameDecoder dec(limits, 256 << 10);
    std::vector<Frame> frames;
    for (;;) {
      auto buf = dec.ReadBuffer();
      ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::string why = n == 0 ? "primecached closed the connection" : ErrnoText("recv from primecached");
        {
          std::lock_guard<std::mutex> l(mu);
          if (!notice.empty()) why = "primecached closed the connection: " + notice;
        }
        Fail(Status::Unavailable(why));
        return;
      }
      Status s = dec.Consume(static_cast<std::size_t>(n), &frames);
      for (auto& f : frames) Handle(std::move(f));
      frames.clear();
      if (!s.ok()) {
        Fail(Status::Unavailable("unreadable reply from primecached: " + s.message()));
        shutdown(fd, SHUT_RDWR);
        return;
      }
    }
  }

  void Handle(Frame f) {
    std::shared_ptr<Pending> p;
    try {
      auto reader = f.Reader(limits);
      auto r = reader->getRoot<wire::Response>();
      const std::uint64_t id = r.getId();
      const auto which = r.which();
      {
        std::lock_guard<std::mutex> l(mu);
        auto it = pending.find(id);
        if (it == pending.end()) {
          // Timed out, or an id-0 notice (kept: it may explain a hang-up).
          if (id == 0 && which == wire::Response::ERROR) notice = r.getError().getMessage().cStr();
          return;
        }
        notice.clear();  // answers came after it: it did not end the connection
        p = it->second;
        if (IsFinal(which)) pending.erase(it);
      }
      if (!IsFinal(which)) {
        {
          std::lock_guard<std::mutex> l(p->mu);
          p->last_activity = Clock::now();
        }
        if (p->on_stream) {
          Status s = p->on_stream(r);
          if (!s.ok()) {
            // Stop the fetch; its final reply completes it.
            {
              std::lock_guard<std::mutex> l(p->mu);
              if (p->status.ok()) p->status = s;
              p->on_stream = nullptr;
            }
            auto cancel = BuildRequest(0, [id](wire::Request::Builder q) { q.initCancel().setTarget(id); });
            (void)Send(*cancel);
          }
        }
        return;
      }
      Status st;
      if (which == wire::Response::ERROR) {
        auto e = r.getError();
        st = ipc::FromWireError(e.getCode(), std::string(e.getMessage().cStr(), e.getMessage().size()));
      }
      {
        std::lock_guard<std::mutex> l(p->mu);
        if (!p->status.ok()) st = p->status;  // a callback's error wins
      }
      reader.reset();
      Complete(p, std::move(st), std::move(f));
    } catch (const kj::Exception& e) {
      if (p) Complete(p, Status::Internal(std::string("malformed reply: ") + e.getDescription().cStr()), std::nullopt);
    }
  }
};

namespace {
// The code of a call's outcome, whether it returns a Status or a Result.
StatusCode CodeOf(const Status& s) {
  return s.code();
}
template <typename T>
StatusCode CodeOf(const Result<T>& r) {
  return r.status().code();
}
}  // namespace

struct Client::Impl {
  ClientOptions opts;
  std::mutex mu;
  std::shared_ptr<Conn> conn;
  std::atomic<std::uint64_t> next_id{1};
  ServerInfo info;
  // The device window the engine attached; attached again on every new
  // connection.
  std::optional<DeviceWindowSpec> device_spec;

  // The connection (and its reader thread, which calls back into the slots
  // below) goes first.
  ~Impl() {
    std::shared_ptr<Conn> c;
    {
      std::lock_guard<std::mutex> l(mu);
      c = std::move(conn);
    }
    c.reset();
  }

  std::uint64_t NextId() { return next_id.fetch_add(1); }

  Result<std::shared_ptr<Conn>> Dial();
  // Sends attachDevice on `c`; on success the connection's fetches may use it.
  Status AttachDevice(const std::shared_ptr<Conn>& c, const DeviceWindowSpec& spec);
  Result<std::shared_ptr<Conn>> Get();
  // Sends a request and waits for its final reply (streamed ones go to on_stream).
  Result<Frame> Call(const std::shared_ptr<Conn>& c, std::uint64_t id, const OutMessage& m,
                     std::function<Status(wire::Response::Reader)> on_stream = nullptr);
  // The client's one retry policy. Get() reconnects (reconnect_attempts
  // tries, reconnect_backoff apart); on top of it an idempotent call is made
  // once more when it fails with `retry_on`: kUnavailable, a connection lost
  // before anything of the reply was seen; kAborted for a caller that can
  // drop what a fetch had delivered before its connection went (FetchLayers).
  template <typename F>
  auto Retry(F f, StatusCode retry_on = StatusCode::kUnavailable) -> decltype(f()) {
    auto r = f();
    if (CodeOf(r) == retry_on) r = f();
    return r;
  }
};

namespace {

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
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::IOError(ErrnoText("socket"));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      Status s = Status::Unavailable(ErrnoText("connect " + endpoint));
      close(fd);
      return s;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  } else {
    sockaddr_un a{};
    if (endpoint.empty() || endpoint.size() >= sizeof(a.sun_path)) {
      return Status::InvalidArgument("bad socket path '" + endpoint + "'");
    }
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, endpoint.c_str(), endpoint.size() + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::IOError(ErrnoText("socket"));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      Status s = Status::Unavailable(ErrnoText("connect " + endpoint));
      close(fd);
      return s;
    }
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

Result<Frame> Client::Impl::Call(const std::shared_ptr<Conn>& c, std::uint64_t id, const OutMessage& m,
                                 std::function<Status(wire::Response::Reader)> on_stream) {
  auto p = std::make_shared<Pending>();
  p->on_stream = std::move(on_stream);
  c->Register(id, p);
  if (c->dead) {
    c->Forget(id);
    std::lock_guard<std::mutex> l(c->mu);
    return c->death.ok() ? Status::Unavailable("connection to primecached lost") : c->death;
  }
  Status s = c->Send(m);
  if (!s.ok()) {
    if (!s.IsUnavailable()) {
      c->Forget(id);
      return s;
    }
    // The daemon hung up. The reader still reads what it sent first (a
    // notice saying why, say a connection limit) and then fails this call
    // with that reason; the wait below takes it.
    shutdown(c->fd, SHUT_RDWR);
  }
  std::unique_lock<std::mutex> l(p->mu);
  for (;;) {
    if (p->done) break;
    const auto deadline = p->last_activity + opts.timeout;
    if (p->cv.wait_until(l, deadline) == std::cv_status::timeout && !p->done &&
        Clock::now() >= p->last_activity + opts.timeout) {
      l.unlock();
      c->Forget(id);
      if (p->on_stream) {
        auto cancel = BuildRequest(0, [id](wire::Request::Builder q) { q.initCancel().setTarget(id); });
        (void)c->Send(*cancel);
      }
      return Status::DeadlineExceeded("no reply from primecached within " + std::to_string(opts.timeout.count()) +
                                      " ms");
    }
  }
  if (!p->status.ok()) return p->status;
  return std::move(*p->frame);
}

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

namespace {

void SetFingerprint(wire::Fingerprint::Builder fp, const ModelId& m) {
  fp.setDigestLo(m.digest.lo);
  fp.setDigestHi(m.digest.hi);
  fp.setName(m.name);
  fp.setDescriptor(kj::arrayPtr(reinterpret_cast<const kj::byte*>(m.descriptor.data()), m.descriptor.size()));
}

void SetTokens(wire::Boundary::Builder b, std::span<const std::uint32_t> tokens) {
  auto t = b.initTokens(static_cast<unsigned>(tokens.size()));
  for (unsigned i = 0; i < tokens.size(); ++i) t.set(i, tokens[i]);
  b.setLength(static_cast<std::uint32_t>(tokens.size()));
}

template <typename T>
Result<T> Expect(Result<Frame> f, const FrameLimits& lim, wire::Response::Which want,
                 const std::function<T(wire::Response::Reader)>& read) {
  if (!f.ok()) return f.status();
  try {
    auto rd = f->Reader(lim);
    auto r = rd->getRoot<wire::Response>();
    if (r.which() != want) return Status::Internal("unexpected reply kind " + std::to_string(static_cast<int>(r.which())));
    return read(r);
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("malformed reply: ") + e.getDescription().cStr());
  }
}

}  // namespace

Result<std::optional<LookupHit>> Client::Lookup(const ModelId& model, std::span<const std::uint32_t> tokens) {
  return Lookup(model, tokens, nullptr);
}

Result<std::optional<LookupHit>> Client::Lookup(const ModelId& model, std::span<const std::uint32_t> tokens,
                                                std::uint64_t* shared_tokens) {
  return impl_->Retry([&]() -> Result<std::optional<LookupHit>> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(
        id,
        [&](wire::Request::Builder r) {
          auto l = r.initLookup();
          l.setWantShared(shared_tokens != nullptr);
          auto q = l.initQuery();
          SetFingerprint(q.initFingerprint(), model);
          q.setNamespace(impl_->opts.ns);
          SetTokens(q, tokens);
        },
        tokens.size() / 2 + 64);
    return Expect<std::optional<LookupHit>>(
        impl_->Call(c, id, *m), c->limits, wire::Response::LOOKUP, [&](wire::Response::Reader r) {
          auto hit = ipc::ReadLookupHit(r.getLookup());
          if (shared_tokens != nullptr) {
            // An older daemon answers 0: the hit's length is then all that is known.
            *shared_tokens = std::clamp<std::uint64_t>(r.getLookup().getSharedTokens(), hit ? hit->length : 0,
                                                       tokens.size());
          }
          return hit;
        });
  });
}

// ---- publishing ---------------------------------------------------------------

namespace {
struct ShmPlace {
  std::uint64_t offset = 0, length = 0;
};
}  // namespace

struct PublishStream::State {
  std::shared_ptr<Client::Impl> impl_owner;  // the stream may outlive its Client
  Client::Impl* impl = nullptr;
  std::shared_ptr<Conn> conn;
  std::uint64_t publish = 0;
  std::uint32_t layer_count = 0;
  std::uint32_t layer = 0;  // layers begun
  std::uint32_t chunk = 0;  // chunks sent of the current layer
  bool open = true;
  // Replies to begin/layer/chunk arrive asynchronously; the first error sticks.
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  std::shared_ptr<std::condition_variable> cv = std::make_shared<std::condition_variable>();
  std::shared_ptr<Status> error = std::make_shared<Status>();
  std::shared_ptr<std::size_t> outstanding = std::make_shared<std::size_t>(0);

  Status Sticky() {
    std::lock_guard<std::mutex> l(*mu);
    return *error;
  }

  // Sends a request whose ack is only awaited at commit; `after` runs when it
  // is answered (frees a shared-memory slot).
  Status SendPipelined(std::uint64_t id, const OutMessage& m, std::function<void()> after = nullptr) {
    auto p = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> l(*mu);
      ++*outstanding;
    }
    p->on_done = [mu = mu, cv = cv, error = error, outstanding = outstanding, after](const Status& s) {
      if (after) after();
      std::lock_guard<std::mutex> l(*mu);
      if (!s.ok() && error->ok()) *error = s;
      --*outstanding;
      cv->notify_all();
    };
    conn->Register(id, p);
    Status s = conn->Send(m);
    if (!s.ok()) {
      conn->Forget(id);
      Conn::Complete(p, s, std::nullopt);
    }
    return s;
  }

  // Sends the next chunk of the current layer: `bytes` inline, or, with
  // `place`, the bytes at that place of the shared region. `after` runs once
  // the daemon answered it (or the connection died).
  Status SendChunk(std::span<const std::byte> bytes, std::function<void()> after,
                   std::optional<ShmPlace> place = std::nullopt) {
    if (layer == 0) {
      if (after) after();
      return Status::FailedPrecondition("a chunk before BeginLayer");
    }
    const std::uint64_t id = impl->NextId();
    auto m = BuildRequest(
        id,
        [&](wire::Request::Builder r) {
          auto c = r.initPublishChunk();
          c.setPublish(publish);
          c.setLayer(layer - 1);
          c.setIndex(chunk);
          if (place) {
            auto s = c.initData().initShm();
            s.setOffset(place->offset);
            s.setLength(place->length);
          } else {
            c.initData().setInline(KjBytes(bytes));
          }
        },
        ipc::WordsFor(bytes.size()));
    PC_RETURN_IF_ERROR(SendPipelined(id, *m, std::move(after)));
    ++chunk;
    return Status::Ok();
  }
};

PublishStream::PublishStream(std::unique_ptr<State> st) : st_(std::move(st)) {}
PublishStream::~PublishStream() {
  if (st_ && st_->open) (void)Abort();
}

Result<std::unique_ptr<PublishStream>> Client::BeginPublish(const ModelId& model, std::span<const std::uint32_t> tokens,
                                                            std::uint32_t layer_count) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  auto st = std::make_unique<PublishStream::State>();
  st->impl_owner = impl_;
  st->impl = impl_.get();
  st->conn = c;
  st->publish = impl_->NextId();
  st->layer_count = layer_count;
  auto m = BuildRequest(
      st->publish,
      [&](wire::Request::Builder r) {
        auto pb = r.initPublishBegin();
        pb.setLayerCount(layer_count);
        if (!(model.cost == ModelCost{})) {
          auto c = pb.initCost();
          c.setFlopsPerToken(model.cost.flops_per_token);
          c.setAttentionLayers(model.cost.attention_layers);
          c.setAttentionFlopsPerPair(model.cost.attention_flops_per_pair);
        }
        auto b = pb.initBoundary();
        SetFingerprint(b.initFingerprint(), model);
        b.setNamespace(impl_->opts.ns);
        SetTokens(b, tokens);
      },
      tokens.size() / 2 + 64);
  PC_RETURN_IF_ERROR(st->SendPipelined(st->publish, *m));
  return std::unique_ptr<PublishStream>(new PublishStream(std::move(st)));
}

Status PublishStream::BeginLayer(std::span<const std::byte> header, std::uint32_t chunk_count) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  const std::uint64_t id = st_->impl->NextId();
  const std::uint32_t layer = st_->layer;
  auto m = BuildRequest(
      id,
      [&](wire::Request::Builder r) {
        auto l = r.initPublishLayer();
        l.setPublish(st_->publish);
        l.setLayer(layer);
        l.setChunkCount(chunk_count);
        l.setHeader(KjBytes(header));
      },
      ipc::WordsFor(header.size()));
  PC_RETURN_IF_ERROR(st_->SendPipelined(id, *m));
  ++st_->layer;
  st_->chunk = 0;
  return Status::Ok();
}

Status PublishStream::AddChunk(std::span<const std::byte> bytes) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  const auto& space = st_->conn->space;
  if (space && !bytes.empty() && bytes.size() <= st_->conn->info.max_chunk_bytes &&
      ReservedChunk::Space::Round(bytes.size()) <= space->limit) {
    PC_ASSIGN_OR_RETURN(ReservedChunk chunk, ReserveChunk(bytes.size()));
    std::memcpy(chunk.bytes().data(), bytes.data(), bytes.size());
    return AddReservedChunk(std::move(chunk));
  }
  return st_->SendChunk(bytes, nullptr);
}

Result<ReservedChunk> PublishStream::ReserveChunk(std::size_t size) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  const std::uint64_t max_chunk = st_->conn->info.max_chunk_bytes;
  if (size == 0 || size > max_chunk) {
    return Status::InvalidArgument("chunk of " + std::to_string(size) + " bytes: the daemon takes 1.." +
                                   std::to_string(max_chunk));
  }
  ReservedChunk chunk;
  const auto& space = st_->conn->space;
  if (!space) {
    chunk.own_ = std::make_unique_for_overwrite<std::byte[]>(size);
    chunk.bytes_ = {chunk.own_.get(), size};
    return chunk;
  }
  const std::uint64_t len = ReservedChunk::Space::Round(size);
  if (len > space->limit) {
    return Status::InvalidArgument("chunk of " + std::to_string(size) + " bytes is larger than the publish half of " +
                                   "the shared region (" + std::to_string(space->limit) +
                                   " bytes; raise ClientOptions::shared_memory_bytes)");
  }
  PC_ASSIGN_OR_RETURN(std::uint64_t off, space->Take(len, st_->impl->opts.timeout));
  chunk.space_ = space;
  chunk.offset_ = off;
  chunk.reserved_ = len;
  chunk.bytes_ = {space->region->data() + off, size};
  return chunk;
}

Status PublishStream::AddReservedChunk(ReservedChunk chunk, std::size_t length) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  if (length > chunk.size()) {
    return Status::InvalidArgument("AddReservedChunk of " + std::to_string(length) + " bytes from a reservation of " +
                                   std::to_string(chunk.size()));
  }
  if (!chunk.space_ || length == 0) return st_->SendChunk(chunk.bytes().first(length), nullptr);
  if (chunk.space_ != st_->conn->space) {
    return Status::FailedPrecondition("the chunk was reserved on another connection (the daemon restarted?)");
  }
  // The tail past `length` goes back now; the rest once the daemon stored it.
  const std::uint64_t keep = ReservedChunk::Space::Round(length);
  chunk.space_->Give(chunk.offset_ + keep, chunk.reserved_ - keep);
  auto space = std::move(chunk.space_);
  const std::uint64_t off = chunk.offset_;
  chunk.GiveBack();  // owns nothing any more
  return st_->SendChunk({}, [space, off, keep] { space->Give(off, keep); }, ShmPlace{off, length});
}

Result<PublishResult> PublishStream::Commit() {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  st_->open = false;
  Client::Impl* impl = st_->impl;
  const std::uint64_t id = impl->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initPublishCommit().setPublish(st_->publish); });
  auto reply = impl->Call(st_->conn, id, *m);
  {
    // Every earlier ack has arrived before the commit's reply (one queue per
    // publish), unless the connection died; wait briefly for stragglers.
    std::unique_lock<std::mutex> l(*st_->mu);
    st_->cv->wait_for(l, impl->opts.timeout, [&] { return *st_->outstanding == 0; });
    if (!st_->error->ok()) return *st_->error;
  }
  return Expect<PublishResult>(std::move(reply), st_->conn->limits, wire::Response::PUBLISHED,
                               [](wire::Response::Reader r) { return ipc::ReadPublishResult(r.getPublished()); });
}

Status PublishStream::Abort() {
  if (!st_->open) return Status::Ok();
  st_->open = false;
  Client::Impl* impl = st_->impl;
  const std::uint64_t id = impl->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initPublishAbort().setPublish(st_->publish); });
  auto reply = impl->Call(st_->conn, id, *m);
  if (!reply.ok() && !reply.status().IsNotFound()) return reply.status();
  return Status::Ok();
}

Result<PublishResult> Client::Publish(const ModelId& model, std::span<const std::uint32_t> tokens,
                                      const std::vector<LayerData>& layers) {
  PC_ASSIGN_OR_RETURN(auto stream, BeginPublish(model, tokens, static_cast<std::uint32_t>(layers.size())));
  for (const auto& layer : layers) {
    PC_RETURN_IF_ERROR(stream->BeginLayer(layer.header, static_cast<std::uint32_t>(layer.chunks.size())));
    for (const auto& ch : layer.chunks) PC_RETURN_IF_ERROR(stream->AddChunk(ch));
  }
  return stream->Commit();
}

// ---- fetching -----------------------------------------------------------------

namespace {

// The chunks of one fetch handed over in one window (the shared one with
// on_chunk_held, or the device one): releases are sent in arrival order, each
// only once every chunk before it was released too, and the window is free
// for another fetch once the fetch ended and every chunk was released.
class HeldChunks : public std::enable_shared_from_this<HeldChunks> {
 public:
  // `region`: kept mapped while chunks in it are held (null for the device).
  HeldChunks(std::weak_ptr<Conn> conn, std::shared_ptr<ipc::ShmRegion> region, std::shared_ptr<FetchWindow> window,
             bool device)
      : conn_(std::move(conn)), region_(std::move(region)), window_(std::move(window)), device_(device) {}

  // The fetch has ended: the window is freed once every chunk is released.
  void EndFetch() {
    std::lock_guard<std::mutex> l(mu_);
    ended_ = true;
    if (queue_.empty()) window_->Free();
  }

  ChunkRelease Hold(std::uint64_t offset, std::uint64_t length) {
    std::lock_guard<std::mutex> l(mu_);
    const std::uint64_t seq = first_ + queue_.size();
    queue_.push_back({offset, length, false});
    // The closure keeps the mapping alive while the bytes are in use.
    auto self = shared_from_this();
    auto once = std::make_shared<std::atomic<bool>>(false);
    return [self, seq, once] {
      if (!once->exchange(true)) self->Release(seq);
    };
  }

 private:
  struct Held {
    std::uint64_t offset, length;
    bool done;
  };
  void Release(std::uint64_t seq) {
    std::lock_guard<std::mutex> l(mu_);
    queue_[seq - first_].done = true;
    auto conn = conn_.lock();
    while (!queue_.empty() && queue_.front().done) {
      if (conn) {
        auto rel = BuildRequest(0, [&](wire::Request::Builder q) {
          if (device_) {
            auto x = q.initDeviceRelease();
            x.setOffset(queue_.front().offset);
            x.setLength(queue_.front().length);
          } else {
            auto x = q.initShmRelease();
            x.setOffset(queue_.front().offset);
            x.setLength(queue_.front().length);
          }
        });
        (void)conn->Send(*rel);  // a lost connection has ended the fetch anyway
      }
      queue_.pop_front();
      ++first_;
    }
    if (ended_ && queue_.empty()) window_->Free();
  }

  std::mutex mu_;
  std::weak_ptr<Conn> conn_;
  std::shared_ptr<ipc::ShmRegion> region_;
  std::shared_ptr<FetchWindow> window_;
  const bool device_;
  bool ended_ = false;
  std::deque<Held> queue_;
  std::uint64_t first_ = 0;  // sequence number of queue_.front()
};

// However a fetch ends, its use of the window ends: at once, or, with chunks
// held, once they are released.
struct WindowUse {
  bool taken;
  FetchWindow* window;
  HeldChunks* held;
  ~WindowUse() {
    if (held != nullptr) {
      held->EndFetch();
    } else if (taken) {
      window->Free();
    }
  }
};

// A chunk the daemon copied into the device window: lent to on_device_chunk.
Status DeliverDeviceChunk(Conn& conn, HeldChunks* device, const FetchCallbacks& cb, wire::FetchChunk::Reader ch) {
  auto ref = ch.getData().getDevice();
  const std::uint64_t size = conn.device_size;
  if (device == nullptr || !cb.on_device_chunk) {
    return Status::Corruption("daemon sent a device chunk to a fetch without a device window");
  }
  if (ref.getOffset() > size || ref.getLength() > size - ref.getOffset()) {
    return Status::Corruption("daemon pointed outside the device window");
  }
  return cb.on_device_chunk(ch.getLayer(), ch.getIndex(), ref.getOffset(), ref.getLength(),
                            device->Hold(ref.getOffset(), ref.getLength()));
}

// Hands one fetched chunk to the callbacks: inline bytes, bytes in the
// region (released to the daemon after on_chunk, or when the holder of an
// on_chunk_held loan releases it), or bytes in the device window.
Status DeliverChunk(Conn& conn, HeldChunks* held, HeldChunks* device, const FetchCallbacks& cb,
                    wire::FetchChunk::Reader ch) {
  auto d = ch.getData();
  if (d.which() == wire::Payload::DEVICE) return DeliverDeviceChunk(conn, device, cb, ch);
  if (d.which() == wire::Payload::INLINE) {
    if (cb.on_chunk_held) {
      // The message's bytes go with the frame: the chunk gets a copy of its own.
      auto copy = std::make_shared<std::vector<std::byte>>(Bytes(d.getInline()).begin(), Bytes(d.getInline()).end());
      return cb.on_chunk_held(ch.getLayer(), ch.getIndex(), *copy, [copy]() mutable { copy.reset(); });
    }
    return cb.on_chunk ? cb.on_chunk(ch.getLayer(), ch.getIndex(), Bytes(d.getInline())) : Status::Ok();
  }
  if (d.which() != wire::Payload::SHM) return Status::Corruption("daemon sent a chunk of an unknown kind");
  auto ref = d.getShm();
  if (!conn.shm || !conn.shm->Contains(ref.getOffset(), ref.getLength())) {
    return Status::Corruption("daemon pointed outside the shared region");
  }
  std::span<const std::byte> bytes{conn.shm->data() + ref.getOffset(), static_cast<std::size_t>(ref.getLength())};
  if (cb.on_chunk_held && held != nullptr) {
    return cb.on_chunk_held(ch.getLayer(), ch.getIndex(), bytes, held->Hold(ref.getOffset(), ref.getLength()));
  }
  Status s = cb.on_chunk ? cb.on_chunk(ch.getLayer(), ch.getIndex(), bytes) : Status::Ok();
  auto rel = BuildRequest(0, [&](wire::Request::Builder q) {
    auto x = q.initShmRelease();
    x.setOffset(ref.getOffset());
    x.setLength(ref.getLength());
  });
  (void)conn.Send(*rel);
  return s;
}

}  // namespace

namespace {

// A fetch request: with the shared window (the region's second half) when
// `shm` is given, and the device window's first `device_bytes` when not 0.
std::unique_ptr<OutMessage> FetchRequest(std::uint64_t id, std::uint64_t entry, std::span<const std::uint32_t> layers,
                                         const ipc::ShmRegion* shm, std::uint64_t device_bytes) {
  return BuildRequest(id, [&](wire::Request::Builder r) {
    auto f = r.initFetch();
    f.setEntry(entry);
    auto l = f.initLayers(static_cast<unsigned>(layers.size()));
    for (unsigned i = 0; i < layers.size(); ++i) l.set(i, layers[i]);
    if (shm != nullptr) {
      const std::uint64_t half = shm->size() / 2;
      auto w = f.initShmWindow();
      w.setOffset(half);
      w.setLength(shm->size() - half);
    }
    if (device_bytes != 0) {
      auto w = f.initDeviceWindow();
      w.setOffset(0);
      w.setLength(device_bytes);
    }
  });
}

}  // namespace

Status Client::Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, const FetchCallbacks& cb) {
  auto once = [&]() -> Result<bool> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const bool use_shm = c->shm != nullptr && c->window->TryTake();
    const std::uint64_t device_bytes = cb.on_device_chunk ? c->device_size.load() : 0;
    const bool use_device = device_bytes != 0 && c->device_window->TryTake();
    std::shared_ptr<HeldChunks> held;
    std::shared_ptr<HeldChunks> device;
    if (use_shm && cb.on_chunk_held) held = std::make_shared<HeldChunks>(c, c->shm, c->window, false);
    if (use_device) device = std::make_shared<HeldChunks>(c, nullptr, c->device_window, true);
    const WindowUse guard{use_shm, c->window.get(), held.get()};
    const WindowUse device_guard{use_device, c->device_window.get(), device.get()};
    const std::uint64_t id = impl_->NextId();
    auto m = FetchRequest(id, entry, layers, use_shm ? c->shm.get() : nullptr, use_device ? device_bytes : 0);
    bool streamed = false;
    Conn* raw = c.get();
    auto reply = impl_->Call(c, id, *m, [&, raw](wire::Response::Reader r) -> Status {
      streamed = true;
      if (r.which() == wire::Response::FETCH_LAYER) {
        auto l = r.getFetchLayer();
        return cb.on_layer ? cb.on_layer(l.getLayer(), Bytes(l.getHeader()), l.getChunkCount()) : Status::Ok();
      }
      return DeliverChunk(*raw, held.get(), device.get(), cb, r.getFetchChunk());
    });
    if (!reply.ok()) {
      // Only a fetch that delivered nothing may be retried.
      if (streamed && reply.status().IsUnavailable()) return Status::Aborted(reply.status().message());
      return reply.status();
    }
    return true;
  };
  return impl_->Retry(once).status();
}

Result<std::vector<FetchedLayer>> Client::FetchLayers(std::uint64_t entry, std::span<const std::uint32_t> layers) {
  std::vector<FetchedLayer> out;
  FetchCallbacks cb;
  cb.on_layer = [&](std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) {
    FetchedLayer f;
    f.layer = layer;
    f.data.header.assign(header.begin(), header.end());
    f.data.chunks.reserve(chunks);
    out.push_back(std::move(f));
    return Status::Ok();
  };
  cb.on_chunk = [&](std::uint32_t layer, std::uint32_t, std::span<const std::byte> bytes) {
    if (out.empty() || out.back().layer != layer) return Status::Corruption("chunk of a layer that was not announced");
    out.back().data.chunks.emplace_back(bytes.begin(), bytes.end());
    return Status::Ok();
  };
  // A fetch cut off mid-stream starts over: what it delivered is dropped.
  return impl_->Retry(
      [&]() -> Result<std::vector<FetchedLayer>> {
        out.clear();
        PC_RETURN_IF_ERROR(Fetch(entry, layers, cb));
        return std::move(out);
      },
      StatusCode::kAborted);
}

// ---- the rest -------------------------------------------------------------------

Result<ListPage> Client::List(const ListOptions& options) {
  return impl_->Retry([&]() -> Result<ListPage> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [&](wire::Request::Builder r) {
      auto l = r.initList();
      if (options.model) {
        l.setDigestLo(options.model->lo);
        l.setDigestHi(options.model->hi);
      }
      l.setPageToken(KjBytes(std::as_bytes(std::span(options.page_token.data(), options.page_token.size()))));
      l.setPageSize(options.page_size);
      l.setAllNamespaces(options.all_namespaces);
      l.setQuarantined(options.quarantined);
      l.setOmitTokens(options.omit_tokens);
    });
    return Expect<ListPage>(impl_->Call(c, id, *m), c->limits, wire::Response::LIST,
                            [](wire::Response::Reader r) { return ipc::ReadListPage(r.getList()); });
  });
}

Result<DaemonStats> Client::Stat() {
  return impl_->Retry([&]() -> Result<DaemonStats> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [](wire::Request::Builder r) { r.setStat(); });
    return Expect<DaemonStats>(impl_->Call(c, id, *m), c->limits, wire::Response::STAT,
                               [](wire::Response::Reader r) { return ipc::ReadDaemonStats(r.getStat()); });
  });
}

Result<EntryCheckReport> Client::CheckEntry(std::uint64_t entry) {
  return impl_->Retry([&]() -> Result<EntryCheckReport> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initCheckEntry().setEntry(entry); });
    return Expect<EntryCheckReport>(impl_->Call(c, id, *m), c->limits, wire::Response::CHECK_ENTRY, [](wire::Response::Reader r) {
      auto v = r.getCheckEntry();
      return EntryCheckReport{v.getOk(), v.getMessage(), v.getLayers(), v.getBytes()};
    });
  });
}

Result<EntryDetail> Client::Describe(std::uint64_t entry, bool layer_headers) {
  return impl_->Retry([&]() -> Result<EntryDetail> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [&](wire::Request::Builder r) {
      auto d = r.initDescribe();
      d.setEntry(entry);
      d.setLayerHeaders(layer_headers);
    });
    return Expect<EntryDetail>(impl_->Call(c, id, *m), c->limits, wire::Response::DESCRIBE,
                               [](wire::Response::Reader r) { return ipc::ReadEntryDetail(r.getDescribe()); });
  });
}

Result<StoreCheckReport> Client::CheckStore(bool read_chunks) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initCheckStore().setReadChunks(read_chunks); });
  return Expect<StoreCheckReport>(impl_->Call(c, id, *m), c->limits, wire::Response::STORE_CHECK_REPORT,
                              [](wire::Response::Reader r) { return ipc::ReadStoreCheckReport(r.getStoreCheckReport()); });
}

Status Client::Compact() {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [](wire::Request::Builder r) { r.setCompact(); });
  auto reply = impl_->Call(c, id, *m);
  return reply.ok() ? Status::Ok() : reply.status();
}

Status Client::Delete(std::uint64_t entry) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initDelete().setEntry(entry); });
  auto reply = impl_->Call(c, id, *m);
  return reply.ok() ? Status::Ok() : reply.status();
}

Status Client::SetByteBudget(std::uint64_t bytes) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [bytes](wire::Request::Builder r) { r.initSetByteBudget().setBytes(bytes); });
  auto reply = impl_->Call(c, id, *m);
  return reply.ok() ? Status::Ok() : reply.status();
}

std::future<Result<std::optional<LookupHit>>> Client::LookupAsync(const ModelId& model, std::vector<std::uint32_t> tokens) {
  return std::async(std::launch::async,
                    [this, model, tokens = std::move(tokens)] { return Lookup(model, tokens); });
}

std::future<Result<PublishResult>> Client::PublishAsync(const ModelId& model, std::vector<std::uint32_t> tokens,
                                                        std::vector<LayerData> layers) {
  return std::async(std::launch::async, [this, model, tokens = std::move(tokens), layers = std::move(layers)] {
    return Publish(model, tokens, layers);
  });
}

std::future<Result<std::vector<FetchedLayer>>> Client::FetchLayersAsync(std::uint64_t entry,
                                                                        std::vector<std::uint32_t> layers) {
  return std::async(std::launch::async, [this, entry, layers = std::move(layers)] { return FetchLayers(entry, layers); });
}

std::future<Result<DaemonStats>> Client::StatAsync() {
  return std::async(std::launch::async, [this] { return Stat(); });
}

}  // namespace primecache::client

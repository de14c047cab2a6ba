// One connection to the daemon: writing requests, the reader thread that
// routes each response to its pending request, and Impl::Call, which sends
// a request and waits for its final reply.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "core/errno_text.h"
#include "ipc/client_impl.h"

namespace primecache::client {

Conn::~Conn() {
  if (fd >= 0) shutdown(fd, SHUT_RDWR);
  if (reader.joinable()) reader.join();
  if (fd >= 0) close(fd);
}

Status Conn::Send(const OutMessage& m) {
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

void Conn::Fail(const Status& s) {
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

void Conn::Complete(const std::shared_ptr<Pending>& p, Status s, std::optional<Frame> frame) {
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

void Conn::ReadLoop() {
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

void Conn::Handle(Frame f) {
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

}  // namespace primecache::client

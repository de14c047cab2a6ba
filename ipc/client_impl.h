// The client library's insides, shared by its files (internal; the API is
// include/primecache/client.h):
//   client_shm_space.cc  the publish half's allocator (ReservedChunk::Space)
//   client_conn.cc       a connection, its reader thread, and Impl::Call
//   client_dial.cc       dial, hello, the shared-memory handshake, reconnect
//   client_publish.cc    the publish stream
//   client_fetch.cc      fetch delivery (inline, shared and device windows)
//   client.cc            the other calls
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include <kj/exception.h>

#include "ipc/framing.h"
#include "ipc/shm.h"
#include "ipc/wire.h"
#include "primecache/client.h"

namespace primecache::client {

using ipc::BuildRequest;
using ipc::Frame;
using ipc::FrameDecoder;
using ipc::FrameLimits;
using ipc::OutMessage;
using Clock = std::chrono::steady_clock;

inline kj::ArrayPtr<const kj::byte> KjBytes(std::span<const std::byte> b) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.data()), b.size());
}
inline std::span<const std::byte> Bytes(capnp::Data::Reader d) {
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

inline bool IsFinal(wire::Response::Which w) {
  return w != wire::Response::FETCH_LAYER && w != wire::Response::FETCH_CHUNK && w != wire::Response::FETCH_HIT;
}

inline FrameLimits ClientLimits() {
  FrameLimits l;
  l.max_message_bytes = 256u << 20;  // trust the daemon more, still bounded
  l.max_segments = 512;
  l.nesting_limit = 32;
  return l;
}

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
  Result<std::uint64_t> Take(std::uint64_t len, std::chrono::milliseconds timeout);
  // Gives an extent back (coalesced with its free neighbours).
  void Give(std::uint64_t off, std::uint64_t len);
  // The connection died: every Take waiting, and every later one, fails.
  void Kill();

  const std::shared_ptr<ipc::ShmRegion> region;  // keeps the mapping alive
  const std::uint64_t limit;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, std::uint64_t> free;  // offset -> length
  bool dead = false;
};

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

  ~Conn();

  void Register(std::uint64_t id, std::shared_ptr<Pending> p) {
    std::lock_guard<std::mutex> l(mu);
    pending[id] = std::move(p);
  }
  void Forget(std::uint64_t id) {
    std::lock_guard<std::mutex> l(mu);
    pending.erase(id);
  }

  // Writes a whole message (under write_mu); Unavailable once dead.
  Status Send(const OutMessage& m);
  // The connection is lost: every pending request completes with `s`.
  void Fail(const Status& s);
  // Completes a request once (its waiter woken, its on_done run).
  static void Complete(const std::shared_ptr<Pending>& p, Status s, std::optional<Frame> frame);
  // The reader thread: frames in, each to Handle, until the socket ends.
  void ReadLoop();
  // Routes one response to its pending request.
  void Handle(Frame f);
};

// The code of a call's outcome, whether it returns a Status or a Result.
inline StatusCode CodeOf(const Status& s) {
  return s.code();
}
template <typename T>
StatusCode CodeOf(const Result<T>& r) {
  return r.status().code();
}

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

// Request fields every call writes the same way.
void SetFingerprint(wire::Fingerprint::Builder fp, const ModelId& m);
void SetTokens(wire::Boundary::Builder b, std::span<const std::uint32_t> tokens);

// A call's reply of kind `want`, read by `read`; the call's error, or
// Internal for a reply of another kind or one that cannot be read.
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


}  // namespace primecache::client

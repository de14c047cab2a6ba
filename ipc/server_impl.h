// The daemon server's insides, shared by its files (internal; the API is
// ipc/server.h): server.cc runs the loop (lifetime, reading, deadlines,
// shutdown), server_accept.cc listens, admits and refuses connections, and
// conn_sink.h/.cc is a connection's write side.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "core/worker_pool.h"
#include "ipc/conn_sink.h"
#include "ipc/server.h"
#include "ipc/server_fetch_pool.h"
#include "ipc/session.h"

namespace primecache::ipc {

// The daemon's worker pools, as the sessions see them.
class WorkerPool : public Executor {
 public:
  explicit WorkerPool(std::size_t n) : pool_(n) {}
  void Post(std::function<void()> job) override { pool_.Post(std::move(job)); }
  void Shutdown() { pool_.Shutdown(); }

 private:
  primecache::WorkerPool pool_;
};

// One accepted connection, owned by the loop (deleted when its poll handle
// closes).
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

// One listening socket: the data or admin Unix socket, or the TCP port.
struct Listener {
  int fd = -1;
  uv_poll_t poll{};
  bool admin = false;
  bool unix_socket = true;
  bool polling = false;
  std::string path;  // Unix socket file to remove at shutdown
};

// The loop's state; touched on the loop thread, except what notify_mu guards.
struct Server::Impl {
  Store* store = nullptr;
  ServerOptions opts;
  uv_loop_t loop{};
  uv_async_t async{};
  uv_signal_t sigterm{}, sigint{};
  bool signals = false;
  std::unique_ptr<WorkerPool> pool;
  std::unique_ptr<FetchPool> fetch_pool;
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

  // From other threads to the loop (Notify, Stop), through `async`.
  Mutex notify_mu;
  std::vector<std::uint64_t> dirty GUARDED_BY(notify_mu);
  bool stop_requested GUARDED_BY(notify_mu) = false;
  bool stopped = false;  // loop thread

  bool async_closed GUARDED_BY(notify_mu) = false;

  void Notify(std::uint64_t id) EXCLUDES(notify_mu) {
    MutexLock l(&notify_mu);
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

}  // namespace primecache::ipc

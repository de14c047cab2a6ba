// The daemon's server: a libuv event loop that accepts clients on a Unix
// socket (plus an optional admin socket and an optional loopback TCP port),
// reads framed requests, hands them to a Session each, and writes responses
// with bounded per-connection queues. Store work runs on a worker pool.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ipc/session.h"
#include "primecache/status.h"

namespace primecache::ipc {

struct ServerOptions {
  std::string socket_path;        // required
  std::string admin_socket_path;  // empty: no admin socket (destructive ops refused)
  std::optional<gid_t> socket_group;  // set: the socket is mode 0660 owned by this group
  int tcp_port = -1;              // >= 0: also listen on 127.0.0.1:port (0 picks one)
  std::vector<uid_t> admin_uids;  // besides the daemon's own uid and root
  // uid -> namespaces it may use; empty map: every peer may use any namespace.
  std::map<uid_t, std::vector<std::string>> tenants;
  SessionLimits limits;
  std::size_t workers = 4;         // short store work (lookup, publish, list, ...)
  // Fetches streaming at once (places of the fetch pool, ipc/server_fetch_pool.h);
  // a fetch waiting for its client (window space, a socket it does not
  // read) gives its place back, parked on a thread of its own: up to
  // max_parked_fetches at once, past which a wait keeps its place.
  std::size_t fetch_workers = 16;
  std::size_t max_parked_fetches = 256;
  // A fetch whose reader takes nothing for this long is aborted.
  std::chrono::milliseconds stall_timeout{60000};
  std::size_t write_queue_bound = 8u << 20;  // unwritten bytes per connection
  // Data connections (the socket and TCP), in all and per peer uid (TCP
  // peers, which have none, share one count); 0 per uid: no per-uid limit.
  std::size_t max_connections = 1024;
  std::size_t max_connections_per_uid = 256;
  // Admin-socket connections, counted apart: data clients never crowd out
  // an operator.
  std::size_t max_admin_connections = 16;
  // A connection that sends no hello within hello_timeout, or that has no
  // request being served and has sent nothing and been answered nothing for
  // idle_timeout, is closed (after an id-0 deadlineExceeded notice).
  // 0: never.
  std::chrono::milliseconds hello_timeout{10000};
  std::chrono::milliseconds idle_timeout{300000};
  std::size_t socket_buffer_bytes = 4u << 20;  // SO_SNDBUF asked for each connection (0: the kernel's)
  // Copies raw chunks into engines' exported device memory (attachDevice);
  // null: none (HelloReply.deviceCopies false). Outlives the server.
  DeviceDma* device_dma = nullptr;
  // The remote tier's figures for Stat (DaemonStats::remote); unset: the
  // daemon runs without one. Called from any worker.
  std::function<std::optional<RemoteStats>()> remote_stats;
};

class Server {
 public:
  ~Server();
  static Result<std::unique_ptr<Server>> Create(Store* store, ServerOptions options);

  // Binds and listens. Each socket path appears only once it accepts.
  Status Listen();
  // Stops on SIGTERM or SIGINT (call before Run).
  Status HandleSignals();
  // Serves until Stop (or a handled signal); then closes every connection,
  // aborts open publishes, drains the workers and removes the socket files.
  Status Run();
  // Thread-safe.
  void Stop();

  int tcp_port() const;
  // What the sessions count (read by the metrics endpoint from its thread;
  // every field is an atomic).
  const ServerCounters& counters() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace primecache::ipc

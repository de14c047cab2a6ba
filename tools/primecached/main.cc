// primecached: the primecache daemon. Serves the prefix-cache store to the
// engines of this host over a Unix socket (docs/protocol.md).
//
//   primecached [--config FILE] [--socket PATH] [--admin-socket PATH]
//               [--data-dir DIR] [--capacity BYTES] [--log-level LEVEL]
//               [--ready-fd FD] [--ready-file PATH] [--metrics-listen HOST:PORT] ...
//
// Readiness: the socket path appears only once the daemon accepts on it; a
// script may also pass --ready-fd (the daemon writes "ready\n" to it and
// closes it) or --ready-file (written atomically once serving); under systemd
// it sends READY=1 (service.h).
// SIGTERM/SIGINT: stop accepting, abort publishes in flight, close the store,
// remove the socket files, exit 0. SIGHUP: re-read the config file; the log
// level and the byte budget change at once (service.h).
// --config FILE: the flags as a JSON object (config.h, docs/operations.md).
#include <grp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <type_traits>

#include "core/errno_text.h"
#include "ipc/device_dma.h"
#include "ipc/metrics.h"
#include "ipc/metrics_http.h"
#include "ipc/server.h"
#include "primecache/internal/env.h"
#include "primecache/internal/logging.h"
#include "primecache/internal/statestore.h"
#include "remote/credentials.h"
#include "remote/tiered_store.h"
#include "tools/primecached/config.h"
#include "tools/primecached/memory_trim.h"
#include "tools/primecached/service.h"
#include "tools/primecached/store_open.h"

namespace {

using primecache::Result;
using primecache::Status;

// "123", "64K", "10M", "2G", "1T" (powers of 1024).
Result<std::uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return Status::InvalidArgument("empty size");
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (...) {
    return Status::InvalidArgument("bad size '" + text + "'");
  }
  std::string suffix = text.substr(pos);
  int shift = 0;
  if (suffix == "" || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "GiB") shift = 30;
  else if (suffix == "T" || suffix == "TiB") shift = 40;
  else return Status::InvalidArgument("bad size suffix in '" + text + "'");
  if (shift > 0 && v > (~0ull >> shift)) return Status::InvalidArgument("size overflows: " + text);
  return static_cast<std::uint64_t>(v) << shift;
}

struct Flags {
  std::string socket;
  std::string admin_socket;
  std::string data_dir;
  std::string capacity = "0";
  // Eviction and admission (docs/protocol.md, "Daemon options"); the
  // defaults are the ones docs/BENCHMARKS.md's eviction figures chose.
  std::string eviction = "lru";
  double utility_alpha = 1.0;
  std::size_t utility_window = 64;
  std::string admission = "all";
  double admit_reuse_share = 0.25;
  std::string log_level;
  std::string socket_group;
  int tcp_port = -1;
  int ready_fd = -1;
  std::string ready_file;
  std::size_t workers = 4;
  std::size_t fetch_workers = 16;
  std::size_t max_parked_fetches = 256;
  // Half the cores, 4 to 16: checking chunks' addresses is CPU work.
  std::size_t read_threads = std::clamp<std::size_t>(std::thread::hardware_concurrency() / 2, 4, 16);
  bool direct_reads = false;
  std::string read_ahead = "64M";
  std::string block_cache = "auto";
  std::string memtables = "auto";
  int trim_interval = 10;  // seconds between malloc_trim calls; 0: never
  std::uint32_t max_publishes = 4;
  std::string max_chunk = "4M";
  std::string write_queue = "8M";
  std::vector<unsigned> admin_uids;
  bool no_admin_socket = false;
  // Connection limits and deadlines (seconds; 0: never).
  std::size_t max_connections = 1024;
  std::size_t max_connections_per_uid = 256;
  std::size_t max_admin_connections = 16;
  double hello_timeout = 10;
  double idle_timeout = 300;
  double publish_timeout = 60;
  double group_timeout = 30;
  std::string max_uncommitted_per_connection = "4G";
  std::string max_uncommitted_total = "16G";
  // Copies of raw chunks into engines' device memory (docs/protocol.md).
  std::string device_copies = "auto";
  std::string device_register_budget = "8G";
  std::size_t copy_streams = primecache::ipc::DeviceDma::kDefaultMaxStreams;
  // The remote tier (docs/cluster.md): a Redis Cluster's seeds, empty: none.
  std::string remote;
  double remote_timeout = 1;      // seconds a cluster command may take
  std::size_t remote_queue = 64;  // entries waiting for write-behind at most
  double remote_miss_ttl = 1;     // seconds a query the cluster missed is not asked again
  std::string remote_receive_pool = "256M";  // fetched chunk buffers kept for the next fetch
  std::vector<std::string> remote_namespaces;  // empty: every namespace
  std::string remote_user;                     // empty: $PRIMECACHE_REMOTE_USER or the default user
  std::string remote_password_file;            // empty: $PRIMECACHE_REMOTE_PASSWORD or none
  std::vector<std::string> tenants;  // UID=NS[,NS...]: the namespaces a uid may use
  std::string log_format = "auto";   // auto, text or journal
  bool print_config = false;
  // The Prometheus endpoint (docs/metrics.md): HOST:PORT, empty: none.
  std::string metrics_listen;
  bool metrics_allow_non_loopback = false;
};

Status WriteReady(const Flags& f) {
  if (!f.ready_file.empty()) {
    PC_RETURN_IF_ERROR(primecache::WriteFileAtomically(primecache::Env::Default(), f.ready_file,
                                                       std::to_string(getpid()) + "\n"));
  }
  // The descriptor last: whoever waits on it finds the ready file there.
  if (f.ready_fd >= 0) {
    const char msg[] = "ready\n";
    if (write(f.ready_fd, msg, sizeof(msg) - 1) != static_cast<ssize_t>(sizeof(msg) - 1)) {
      return Status::IOError(primecache::ErrnoText("write --ready-fd"));
    }
    close(f.ready_fd);
  }
  return Status::Ok();
}

// The byte budget, eviction and admission (docs/protocol.md, "Eviction and admission").
void AddBudgetFlags(CLI::App* app, Flags* f) {
  app->add_option("--capacity", f->capacity, "store byte budget, e.g. 64G (0: unlimited)");
  app->add_option("--eviction", f->eviction,
                  "which entries go when the budget is reached: lru, utility (recency + FLOPs saved per byte), or "
                  "marginal (as utility, counting only the FLOPs saved beyond the longest shorter stored boundary)");
  app->add_option("--utility-alpha", f->utility_alpha, "utility, marginal: weight of FLOPs saved per byte against recency")
      ->check(CLI::Range(0.0, 1e6));
  app->add_option("--utility-window", f->utility_window, "utility, marginal: oldest entries compared per eviction")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--admission", f->admission,
                  "which boundaries are stored: all, seen-twice (after two missed lookups), or reuse (a prefix an "
                  "earlier lookup shared)");
  app->add_option("--admit-reuse-share", f->admit_reuse_share,
                  "reuse: share of a boundary's tokens an earlier lookup must have shared")
      ->check(CLI::Range(0.0, 1.0));
}

// The shared tier (docs/cluster.md) and the Prometheus endpoint (docs/metrics.md).
void AddRemoteAndMetricsFlags(CLI::App* app, Flags* f) {
  app->add_option("--remote", f->remote, "shared tier on a Redis Cluster: redis://host:port[,host:port...]");
  app->add_option("--remote-timeout", f->remote_timeout, "seconds one cluster command may take")
      ->check(CLI::Range(0.001, 600.0));
  app->add_option("--remote-queue", f->remote_queue, "committed entries waiting to be written to the cluster at most")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--remote-miss-ttl", f->remote_miss_ttl,
                  "seconds a lookup the cluster could not extend is not asked of it again (0: always ask)")
      ->check(CLI::Range(0.0, 3600.0));
  app->add_option("--remote-receive-pool", f->remote_receive_pool,
                  "bytes of fetched chunk buffers kept for the next remote fetch (default 256M; 0: none)");
  app->add_option("--remote-ns", f->remote_namespaces, "a namespace that uses the remote tier (repeat; default all)");
  app->add_option(
      "--remote-user", f->remote_user,
      "the cluster's ACL user the tier authenticates as (default $PRIMECACHE_REMOTE_USER, else the "
      "default user)");
  app->add_option(
      "--remote-password-file", f->remote_password_file,
      "file whose first line is the cluster's password, mode 0600 (default $PRIMECACHE_REMOTE_PASSWORD; "
      "never given on the command line)");
  app->add_option("--metrics-listen", f->metrics_listen,
                  "serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 127.0.0.1:9464 (0: any free port; "
                  "default: no endpoint)");
  app->add_flag("--metrics-allow-non-loopback", f->metrics_allow_non_loopback,
                "let --metrics-listen name an address beyond loopback (the endpoint has no authentication)");
}

// The daemon's memory (docs/operations.md "Memory").
void AddMemoryFlags(CLI::App* app, Flags* f) {
  app->add_option("--block-cache", f->block_cache,
                  "bytes of the store's metadata cache, which the memtables are charged to (default auto: a "
                  "quarter of --capacity, 32M to 256M; 256M without a capacity)");
  app->add_option("--memtables", f->memtables,
                  "bytes of unflushed metadata writes before a flush, at most --block-cache (default auto: a "
                  "quarter of the block cache)");
  app->add_option(
         "--trim-interval", f->trim_interval,
         "seconds between returns of the allocator's free pages to the system (0: never; default 10)")
      ->check(CLI::Range(0, 86400));
}

void AddFlags(CLI::App* app, Flags* f) {
  primecache::daemon::UseJsonConfig(app, "--config",
                                    "JSON config file: the long flags as keys (docs/operations.md); flags win");
  app->add_flag("--print-config", f->print_config, "print the settings given (flags and config) as a config, and exit")
      ->configurable(false);
  app->add_option("--tenant", f->tenants, "UID=NS[,NS...]: the namespaces this uid may use (repeat per uid)");
  app->add_option("--log-format", f->log_format,
                  "auto (journal when stderr is systemd's journal), text (with timestamps) or journal (<N> priority)")
      ->check(CLI::IsMember({"auto", "text", "journal"}));
  app->add_option("--socket", f->socket, "Unix socket path (default DATA_DIR/primecached.sock)");
  app->add_option("--admin-socket", f->admin_socket,
                 "admin socket for delete/compact (default DATA_DIR/primecached-admin.sock)");
  app->add_flag("--no-admin-socket", f->no_admin_socket, "serve no admin socket (destructive ops refused)");
  app->add_option("--data-dir", f->data_dir,
                  "store directory (default $XDG_DATA_HOME/primecache); made private (0700, files 0600) at start");
  AddBudgetFlags(app, f);
  AddMemoryFlags(app, f);
  app->add_option("--log-level", f->log_level, "trace|debug|info|warn|error|critical|off");
  app->add_option("--socket-group", f->socket_group, "group allowed on the socket (mode 0660 instead of 0600)");
  app->add_option("--tcp-port", f->tcp_port, "also listen on 127.0.0.1:PORT (0 picks one; no shared memory)");
  app->add_option("--ready-fd", f->ready_fd, "write 'ready' to this descriptor once serving")->configurable(false);
  app->add_option("--ready-file", f->ready_file, "write this file (our pid) once serving")->configurable(false);
  app->add_option("--workers", f->workers, "worker threads for store work")->check(CLI::Range(1, 256));
  app->add_option("--fetch-workers", f->fetch_workers,
                  "fetches streaming at once, over all clients, 8 of them at most per connection (default 16; a fetch "
                  "waiting for its client gives its place back; docs/protocol.md, \"Fetch budget\")")
      ->check(CLI::Range(1, 1024));
  app->add_option("--max-parked-fetches", f->max_parked_fetches,
                  "fetches waiting for their clients (window space not released, a socket not read) that give "
                  "their place back, each on a thread of its own, at once (default 256); past it a wait keeps its place")
      ->check(CLI::Range(0, 65536));
  app->add_option("--read-threads", f->read_threads,
                  "threads that read and check chunks ahead of fetches (0: each fetch reads on its own thread; "
                  "default: half the cores, 4 to 16)")
      ->check(CLI::Range(0, 256));
  app->add_flag("--direct-reads", f->direct_reads,
                "read chunks that are not in the page cache with O_DIRECT (for stores much larger than memory)");
  app->add_option("--read-ahead", f->read_ahead,
                  "bytes a fetch reads ahead of what it has sent (default 64M)");
  app->add_option("--max-publishes", f->max_publishes, "publishes in flight per client")->check(CLI::Range(1, 1024));
  app->add_option("--max-chunk", f->max_chunk, "largest chunk a message may carry, e.g. 4M");
  app->add_option("--write-queue", f->write_queue, "unwritten bytes per connection before fetches pause (default 8M)");
  app->add_option("--admin-uid", f->admin_uids, "uids allowed on the admin socket besides ours and root");
  app->add_option("--max-connections", f->max_connections, "data connections (socket and TCP) at once")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--max-connections-per-uid", f->max_connections_per_uid,
                  "data connections of one peer uid at once (0: no such limit)");
  app->add_option("--max-admin-connections", f->max_admin_connections,
                  "admin-socket connections at once (counted apart from data ones)")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--hello-timeout", f->hello_timeout, "seconds a new connection has to say hello (0: forever)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--idle-timeout", f->idle_timeout,
                  "seconds a connection with nothing in flight may stay silent (0: forever)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--publish-timeout", f->publish_timeout,
                  "seconds an open publish may receive nothing before it is aborted (0: forever)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--group-timeout", f->group_timeout,
                  "seconds a tensor-parallel group publish may wait for its missing ranks before it is aborted")
      ->check(CLI::PositiveNumber);
  app->add_option("--max-uncommitted-per-connection", f->max_uncommitted_per_connection,
                  "bytes of open (uncommitted) publishes per connection, e.g. 4G");
  app->add_option("--max-uncommitted-total", f->max_uncommitted_total,
                  "bytes of open (uncommitted) publishes over all connections, also the store's bound on "
                  "their staged chunks, e.g. 16G");
  app->add_option("--device-copies", f->device_copies,
                  "auto: copy raw chunks into engines' device memory when a CUDA device is there; off: never");
  app->add_option("--device-register-budget", f->device_register_budget,
                  "bytes of mapped store files kept registered with the device driver for those copies, over all "
                  "fetches (default 8G)");
  app->add_option("--copy-streams", f->copy_streams,
                  "CUDA streams per device that device copies go on (default 1: concurrent fetches take turns on it); "
                  "past it fetches share the least used")
      ->check(CLI::Range(1, 1024));
  AddRemoteAndMetricsFlags(app, f);
}

// The metrics endpoint when --metrics-listen asks for one (null otherwise);
// it reads the server's counters and the store from its own thread.
Result<std::unique_ptr<primecache::ipc::MetricsEndpoint>> StartMetrics(const Flags& f,
                                                                       const primecache::ipc::Server& server,
                                                                       primecache::Store& store,
                                                                       std::function<std::optional<primecache::RemoteStats>()> remote) {
  if (f.metrics_listen.empty()) return std::unique_ptr<primecache::ipc::MetricsEndpoint>();
  PC_ASSIGN_OR_RETURN(auto endpoint, primecache::ipc::MetricsEndpoint::Start(
                                         f.metrics_listen, f.metrics_allow_non_loopback,
                                         [&server, &store, remote] { return primecache::ipc::RenderMetrics(store, remote, server.counters()); }));
  spdlog::info("primecached: metrics on http://{}/metrics", endpoint->address());
  return endpoint;
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

// The store the sessions serve: the local one, wrapped with the remote tier
// when --remote names a cluster (whose figures then answer the daemon's
// Stat, through opts->remote_stats). The cluster need not be up: the client
// loads its slot map when it answers.
Result<std::unique_ptr<primecache::Store>> WithRemoteTier(const Flags& f, std::unique_ptr<primecache::Store> store,
                                                         primecache::ipc::ServerOptions* opts) {
  namespace remote = primecache::remote;
  if (f.remote.empty()) return store;
  remote::ClusterOptions co;
  PC_ASSIGN_OR_RETURN(co.seeds, remote::ParseRedisUrl(f.remote));
  PC_ASSIGN_OR_RETURN(co.auth, remote::LoadRedisAuth({f.remote_user, f.remote_password_file}));
  co.io_timeout = Millis(f.remote_timeout);
  co.connect_timeout = std::min(co.io_timeout, std::chrono::milliseconds(500));
  PC_ASSIGN_OR_RETURN(auto client, remote::ClusterClient::Open(co));
  if (Status s = client->Refresh(); s.code() == primecache::StatusCode::kFailedPrecondition) {
    spdlog::error("primecached: the remote tier's cluster refused us: {}; serving the local store alone",
                  s.message());
  } else if (!s.ok()) {
    spdlog::warn("primecached: remote tier not reachable yet: {}", s.message());
  }
  remote::TieredOptions to;
  to.queue_entries = f.remote_queue;
  to.miss_ttl = Millis(f.remote_miss_ttl);
  to.namespaces.insert(f.remote_namespaces.begin(), f.remote_namespaces.end());
  remote::RemoteTierOptions ro;
  PC_ASSIGN_OR_RETURN(ro.receive_pool_bytes, ParseBytes(f.remote_receive_pool));
  auto tier = std::make_shared<remote::RemoteTier>(std::shared_ptr<remote::ClusterClient>(std::move(client)), ro);
  spdlog::info("primecached: remote tier on {} as {} ({} namespaces)", f.remote,
               co.auth.empty() ? std::string("no user (no AUTH)") : co.auth.Who(),
               to.namespaces.empty() ? std::string("all") : std::to_string(to.namespaces.size()));
  auto tiered = std::make_unique<remote::TieredStore>(std::move(store), tier, to);
  const remote::TieredStore* stats = tiered.get();
  opts->remote_stats = [stats] { return std::optional<primecache::RemoteStats>(stats->remote_stats()); };
  return std::unique_ptr<primecache::Store>(std::move(tiered));
}

// The server's options from the flags (sizes parsed and checked).
Result<primecache::ipc::ServerOptions> ServerOptionsFrom(const Flags& f,
                                                         const std::map<uid_t, std::vector<std::string>>& tenants) {
  PC_ASSIGN_OR_RETURN(std::uint64_t max_chunk, ParseBytes(f.max_chunk));
  PC_ASSIGN_OR_RETURN(std::uint64_t write_queue, ParseBytes(f.write_queue));
  PC_ASSIGN_OR_RETURN(std::uint64_t per_conn, ParseBytes(f.max_uncommitted_per_connection));
  PC_ASSIGN_OR_RETURN(std::uint64_t total, ParseBytes(f.max_uncommitted_total));
  if (max_chunk == 0 || max_chunk > (256u << 20)) return Status::InvalidArgument("--max-chunk must be 1..256M");
  primecache::ipc::ServerOptions opts;
  opts.socket_path = f.socket;
  opts.admin_socket_path = f.admin_socket;
  opts.tcp_port = f.tcp_port;
  opts.workers = f.workers;
  opts.fetch_workers = f.fetch_workers;
  opts.max_parked_fetches = f.max_parked_fetches;
  opts.write_queue_bound = write_queue;
  opts.tenants = tenants;
  for (unsigned u : f.admin_uids) opts.admin_uids.push_back(static_cast<uid_t>(u));
  opts.max_connections = f.max_connections;
  opts.max_connections_per_uid = f.max_connections_per_uid;
  opts.max_admin_connections = f.max_admin_connections;
  opts.hello_timeout = Millis(f.hello_timeout);
  opts.idle_timeout = Millis(f.idle_timeout);
  opts.limits.publish_timeout = Millis(f.publish_timeout);
  opts.limits.max_uncommitted_bytes = per_conn;
  opts.limits.max_uncommitted_total_bytes = total;
  opts.limits.max_chunk_bytes = max_chunk;
  opts.limits.frame.max_message_bytes = max_chunk + opts.limits.max_header_bytes + (64u << 10);
  opts.limits.max_publishes_in_flight = f.max_publishes;
  if (!f.socket_group.empty()) {
    group* g = getgrnam(f.socket_group.c_str());
    if (g == nullptr) return Status::NotFound("no group '" + f.socket_group + "'");
    opts.socket_group = g->gr_gid;
  }
  return opts;
}

// The data dir is private (0700), so a group given the socket could not
// reach one inside it: refuse that at start rather than serve nobody.
Status CheckSocketGroup(const Flags& f) {
  if (f.socket_group.empty()) return Status::Ok();
  const auto dir = std::filesystem::path(f.data_dir).lexically_normal();
  const auto sock = std::filesystem::path(f.socket).lexically_normal();
  const auto rel = sock.lexically_relative(dir);
  if (rel.empty() || *rel.begin() == "..") return Status::Ok();
  return Status::InvalidArgument("--socket-group needs a --socket outside the data dir " + f.data_dir +
                                 ", which is private (0700): the group could not reach " + f.socket);
}

// The data dir and the sockets in it, where the flags leave them out.
Status DefaultPaths(Flags* f) {
  if (f->data_dir.empty()) {
    PC_ASSIGN_OR_RETURN(f->data_dir, primecache::DefaultDataDir());
  }
  if (f->socket.empty()) f->socket = f->data_dir + "/primecached.sock";
  if (f->admin_socket.empty() && !f->no_admin_socket) f->admin_socket = f->data_dir + "/primecached-admin.sock";
  if (f->no_admin_socket) f->admin_socket.clear();
  return Status::Ok();
}

// The daemon's DeviceDma (null: no device copies), as --device-copies says.
Result<std::unique_ptr<primecache::ipc::DeviceDma>> DeviceCopiesFrom(const Flags& f) {
  if (f.device_copies != "auto" && f.device_copies != "off") {
    return Status::InvalidArgument("--device-copies must be auto or off, not '" + f.device_copies + "'");
  }
  PC_ASSIGN_OR_RETURN(std::uint64_t budget, ParseBytes(f.device_register_budget));
  if (f.device_copies == "off") return std::unique_ptr<primecache::ipc::DeviceDma>();
  auto dma = primecache::ipc::DeviceDma::Create(budget, f.copy_streams);
  if (!dma.ok()) {
    spdlog::info("primecached: device copies off: {}", dma.status().message());
    return std::unique_ptr<primecache::ipc::DeviceDma>();
  }
  spdlog::info("primecached: device copies on (up to {} bytes of store files registered, {} copy streams a device)",
               budget, f.copy_streams);
  return std::move(dma).value();
}

int Fail(const Status& s) {
  spdlog::error("primecached: {}", s.ToString());
  return 1;
}

Status InitDaemonLogging(const Flags& f) {
  PC_RETURN_IF_ERROR(primecache::InitLogging(f.log_level));
  if (f.log_format == "journal" || (f.log_format == "auto" && primecache::daemon::StderrIsJournal())) {
    primecache::daemon::UseJournalLogFormat();
  }
  return Status::Ok();
}

// The store the flags describe (its capacity and staging bound parsed by the caller).
Result<primecache::daemon::StoreConfig> StoreConfigFrom(const Flags& f, std::uint64_t capacity,
                                                     std::uint64_t max_staged) {
  primecache::daemon::StoreConfig sc;
  sc.data_dir = f.data_dir;
  sc.capacity_bytes = capacity;
  sc.max_staged_bytes = max_staged;
  sc.group_timeout_ms = static_cast<std::uint64_t>(std::max<std::int64_t>(Millis(f.group_timeout).count(), 1));
  sc.read_threads = f.read_threads;
  sc.direct_reads = f.direct_reads;
  PC_ASSIGN_OR_RETURN(sc.read_ahead_bytes, ParseBytes(f.read_ahead));
  sc.block_cache_bytes = primecache::daemon::DefaultBlockCacheBytes(capacity);
  if (f.block_cache != "auto") {
    PC_ASSIGN_OR_RETURN(sc.block_cache_bytes, ParseBytes(f.block_cache));
  }
  sc.memtable_bytes = sc.block_cache_bytes / 4;
  if (f.memtables != "auto") {
    PC_ASSIGN_OR_RETURN(sc.memtable_bytes, ParseBytes(f.memtables));
  }
  PC_RETURN_IF_ERROR(primecache::ParseEvictionPolicy(f.eviction, &sc.eviction));
  PC_RETURN_IF_ERROR(primecache::ParseAdmission(f.admission, &sc.eviction));
  sc.eviction.utility_alpha = f.utility_alpha;
  sc.eviction.utility_window = f.utility_window;
  sc.eviction.admit_reuse_share = f.admit_reuse_share;
  return sc;
}

// What a reload compares: the settings `app` parsed into `f`.
Result<primecache::daemon::Settings> SettingsOf(const CLI::App& app, const Flags& f) {
  primecache::daemon::Settings s;
  PC_ASSIGN_OR_RETURN(s.log_level, primecache::ResolveLogLevel(f.log_level));
  PC_ASSIGN_OR_RETURN(s.capacity_bytes, ParseBytes(f.capacity));
  s.others = primecache::daemon::SettingsText(app, {"log_level", "capacity"});
  return s;
}

// SIGHUP: the command line parsed again, which reads the config file again;
// every setting is checked as at start, so a bad file changes nothing.
Result<primecache::daemon::Settings> Reread(int argc, char** argv) {
  CLI::App app;
  Flags f;
  AddFlags(&app, &f);
  try {
    app.parse(argc, argv);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(e.what());
  }
  PC_RETURN_IF_ERROR(primecache::daemon::CheckConfigKeys(app));
  PC_ASSIGN_OR_RETURN(auto tenants, primecache::daemon::ParseTenants(f.tenants));
  PC_ASSIGN_OR_RETURN(auto opts, ServerOptionsFrom(f, tenants));
  PC_ASSIGN_OR_RETURN(auto settings, SettingsOf(app, f));
  PC_RETURN_IF_ERROR(
      StoreConfigFrom(f, settings.capacity_bytes, opts.limits.max_uncommitted_total_bytes).status());
  return settings;
}

}  // namespace

int main(int argc, char** argv) {
  if (Status s = primecache::daemon::BlockServiceSignals(); !s.ok()) return Fail(s);
  CLI::App app{"primecached: the primecache daemon"};
  Flags f;
  AddFlags(&app, &f);
  CLI11_PARSE(app, argc, argv);
  (void)primecache::InitLogging("");  // stderr for what follows; the level comes below
  if (Status s = primecache::daemon::CheckConfigKeys(app); !s.ok()) return Fail(s);
  if (f.print_config) {
    std::fputs(app.config_to_str().c_str(), stdout);
    return 0;
  }
  auto tenants = primecache::daemon::ParseTenants(f.tenants);
  if (!tenants.ok()) return Fail(tenants.status());
  if (Status s = InitDaemonLogging(f); !s.ok()) return Fail(s);
  auto settings = SettingsOf(app, f);
  if (!settings.ok()) return Fail(settings.status());
  if (Status s = DefaultPaths(&f); !s.ok()) return Fail(s);

  auto opts = ServerOptionsFrom(f, *tenants);
  if (!opts.ok()) return Fail(opts.status());
  if (Status s = CheckSocketGroup(f); !s.ok()) return Fail(s);
  auto device_dma = DeviceCopiesFrom(f);
  if (!device_dma.ok()) return Fail(device_dma.status());
  opts->device_dma = device_dma->get();

  if (Status s = primecache::CreateDirs(primecache::Env::Default(), f.data_dir); !s.ok()) return Fail(s);

  auto sc = StoreConfigFrom(f, settings->capacity_bytes, opts->limits.max_uncommitted_total_bytes);
  if (!sc.ok()) return Fail(sc.status());
  auto local = primecache::daemon::OpenStore(*sc);
  if (!local.ok()) return Fail(local.status());
  auto store = WithRemoteTier(f, std::move(local).value(), &*opts);
  if (!store.ok()) return Fail(store.status());
  const auto remote_stats = opts->remote_stats;

  int rc = 0;
  {
    primecache::daemon::MemoryTrimmer trimmer{std::chrono::seconds(f.trim_interval)};
    auto server = primecache::ipc::Server::Create(store->get(), *std::move(opts));
    if (!server.ok()) return Fail(server.status());
    primecache::Store* backend = store->get();
    primecache::ipc::Server* srv = server->get();
    primecache::daemon::ServiceSignals signals(
        *std::move(settings), {.reread = [argc, argv] { return Reread(argc, argv); },
                               .set_capacity = [backend](std::uint64_t bytes) { return backend->SetByteBudget(bytes); },
                               .stop = [srv] { srv->Stop(); }});
    signals.Start();
    if (Status s = (*server)->Listen(); !s.ok()) return Fail(s);
    spdlog::info("primecached: serving {} (admin {}), data {}, pid {}", f.socket,
                 f.admin_socket.empty() ? "off" : f.admin_socket, f.data_dir, getpid());
    if ((*server)->tcp_port() >= 0) spdlog::info("primecached: also on 127.0.0.1:{}", (*server)->tcp_port());
    auto metrics = StartMetrics(f, **server, **store, remote_stats);  // goes before the server
    if (!metrics.ok()) return Fail(metrics.status());
    if (Status s = WriteReady(f); !s.ok()) {
      rc = Fail(s);
      (*server)->Stop();
    }
    primecache::daemon::NotifyReady("serving " + f.socket);
    if (Status s = (*server)->Run(); !s.ok()) rc = Fail(s);
    signals.Join();
  }  // the server (and its workers) go before the store
  store->reset();
  device_dma->reset();
  if (!f.ready_file.empty()) unlink(f.ready_file.c_str());
  spdlog::info("primecached: stopped");
  return rc;
}

// The two ways primecachectl reaches a store, and what commands share over it (see access.h).
#include "tools/ctl/access.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/errno_text.h"
#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/statestore.h"

namespace primecache::ctl {

Status Target::ReadOnly(const std::string& what) const {
  return Status::FailedPrecondition(what + " needs the running daemon; the store at " +
                                    (local != nullptr ? local->path() : where) + " is open read-only");
}

Result<std::vector<EntryInfo>> ListAll(Store& store, EntryState state) {
  std::vector<EntryInfo> out;
  ListOptions lo;
  lo.state = state;
  lo.omit_tokens = true;  // a page of long boundaries would be large; Describe gives them
  lo.limit = StoreLimits::kMaxListLimit;
  for (;;) {
    PC_ASSIGN_OR_RETURN(auto page, store.List(lo));
    for (auto& e : page.entries) out.push_back(std::move(e));
    if (page.next_page_token.empty()) break;
    lo.page_token = page.next_page_token;
  }
  return out;
}

Result<DaemonStats> StatOf(const Target& t) {
  if (t.daemon != nullptr) return t.daemon->DaemonStat();
  DaemonStats out;
  PC_ASSIGN_OR_RETURN(out.store, t.store->Stat());
  return out;
}

Status FetchWith(Store& store, EntryId id, const FetchHandlers& h) {
  struct Sink final : FetchSink {
    const FetchHandlers* h;
    Status OnLayer(std::uint32_t layer, std::string_view header, std::uint32_t chunks) override {
      return h->on_layer(layer, header, chunks);
    }
    Status OnChunk(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes) override {
      return h->on_chunk(layer, chunk, bytes);
    }
  } sink;
  sink.h = &h;
  return store.Fetch(id, {}, sink);
}

namespace {

// Whether a daemon listens at a Unix socket: OK when one accepts; kNotFound
// when none does (no socket file, or a stale one nobody listens on: the
// cases where reading the store directly is safe and meant); any other
// failure (no permission, a path too long) is an error to report.
Status ProbeDaemon(const std::string& path) {
  sockaddr_un a{};
  if (path.size() >= sizeof(a.sun_path)) return Status::InvalidArgument("socket path too long: " + path);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(ErrnoText("socket"));
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  const int err = errno;
  close(fd);
  if (rc == 0) return Status::Ok();
  if (err == ENOENT || err == ECONNREFUSED) {
    return Status::NotFound("no daemon listens at " + path + " (" + std::strerror(err) + ")");
  }
  return Status::Unavailable(ErrnoText("connect " + path, err));
}

}  // namespace

Status EnsureNoDaemon(const AccessOptions& o) {
  const std::string socket = o.admin_socket.empty() ? o.data_dir + "/primecached-admin.sock" : o.admin_socket;
  Status s = ProbeDaemon(socket);
  if (s.ok()) {
    return Status::FailedPrecondition("a daemon answers at " + socket +
                                      ": stop it first (it migrates its own store when it opens it)");
  }
  return s.IsNotFound() ? Status::Ok() : s;
}

Result<Target> OpenTarget(const AccessOptions& o, bool* fell_back) {
  *fell_back = false;
  const std::string socket = o.admin_socket.empty() ? o.data_dir + "/primecached-admin.sock" : o.admin_socket;
  Status daemon_status = Status::NotFound("--offline given");
  if (!o.offline) {
    daemon_status = ProbeDaemon(socket);
    if (daemon_status.ok()) {
      // A daemon is there: it is used, or its failure reported (reading its
      // store behind its back is for when it is stopped).
      client::ClientOptions co;
      co.endpoint = socket;
      co.client_name = "primecachectl";
      co.timeout = o.timeout;
      co.reconnect_attempts = 1;
      PC_ASSIGN_OR_RETURN(auto daemon, client::DaemonStore::Connect(co));
      if (!daemon->client().server_info().admin) {
        return Status::FailedPrecondition(socket + " is not primecached's admin socket (no admin rights there)");
      }
      Target t;
      t.where = "primecached (" + co.endpoint + ")";
      t.daemon = daemon.get();
      t.store = std::move(daemon);
      return t;
    }
    if (!daemon_status.IsNotFound()) return daemon_status;
  }
  StoreOptions so;
  so.validator = CodecLayerValidator();
  so.path = o.data_dir + "/store";
  so.read_only = true;
  so.create_if_missing = false;
  so.block_cache_bytes = 32ull << 20;
  so.memtable_bytes = 8ull << 20;
  auto store = LocalStore::Open(so);
  if (!store.ok()) {
    if (store.status().IsNotFound()) {
      return Status::Unavailable(daemon_status.message() + "; and no store at " + so.path);
    }
    return store.status();
  }
  *fell_back = !o.offline;
  spdlog::debug("primecachectl: daemon unavailable ({}); reading {} directly", daemon_status.message(), so.path);
  Target t;
  t.local = store->get();
  t.where = t.local->path() + " (read-only)";
  t.store = std::move(store).value();
  return t;
}

}  // namespace primecache::ctl

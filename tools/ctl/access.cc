// The two ways primecachectl reaches a store (see access.h).
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
#include "primecache/codec.h"
#include "primecache/statestore.h"

namespace primecache::ctl {

namespace {

// ---- through the daemon ----------------------------------------------------------

class DaemonAccess final : public StoreAccess {
 public:
  DaemonAccess(client::ClientOptions options, std::unique_ptr<client::Client> admin)
      : options_(std::move(options)), admin_(std::move(admin)) {}

  std::string where() const override { return "primecached (" + options_.endpoint + ")"; }
  bool writable() const override { return true; }
  bool through_daemon() const override { return true; }

  Result<std::vector<EntryInfo>> List(bool quarantined) override {
    std::vector<EntryInfo> out;
    client::ListOptions lo;
    lo.all_namespaces = true;
    lo.quarantined = quarantined;
    lo.omit_tokens = true;  // a page of long boundaries would be large; Describe gives them
    lo.page_size = 1000;
    for (;;) {
      PC_ASSIGN_OR_RETURN(auto page, admin_->List(lo));
      for (auto& e : page.entries) out.push_back(std::move(e));
      if (page.next_page_token.empty()) break;
      lo.page_token = page.next_page_token;
    }
    return out;
  }

  Result<EntryInfo> Describe(std::uint64_t id, std::vector<std::string>* headers) override {
    PC_ASSIGN_OR_RETURN(auto d, admin_->Describe(id, headers != nullptr));
    if (headers != nullptr) *headers = std::move(d.layer_headers);
    return std::move(d.info);
  }

  Status Fetch(std::uint64_t id, const FetchHandlers& h) override {
    client::FetchCallbacks cb;
    cb.on_layer = [&](std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) {
      return h.on_layer(layer, std::string_view(reinterpret_cast<const char*>(header.data()), header.size()), chunks);
    };
    cb.on_chunk = h.on_chunk;
    return admin_->Fetch(id, {}, cb);
  }

  Result<std::optional<LookupHit>> Lookup(const Hash128& model, const std::string& ns,
                                          std::span<const std::uint32_t> tokens,
                                          std::uint64_t* shared_tokens) override {
    // A lookup is in the namespace of its connection.
    client::ClientOptions o = options_;
    o.ns = ns;
    PC_ASSIGN_OR_RETURN(auto c, client::Client::Connect(o));
    return c->Lookup(client::ModelId{model, "", "", {}}, tokens, shared_tokens);
  }

  Result<DaemonStats> Stat() override { return admin_->Stat(); }
  Result<StoreCheckReport> CheckStore(bool read_chunks) override { return admin_->CheckStore(read_chunks); }

  Status Delete(std::uint64_t id) override { return admin_->Delete(id); }
  Status Compact() override { return admin_->Compact(); }

  Result<PublishResult> Import(const EncodedSnapshot& snap, const std::string& ns) override {
    // A publish lands in the namespace of its connection.
    client::ClientOptions o = options_;
    o.ns = ns;
    PC_ASSIGN_OR_RETURN(auto c, client::Client::Connect(o));
    const ModelFingerprint& fp = snap.header.fingerprint;
    client::ModelId model{fp.Digest(), fp.architecture, EncodeFingerprint(fp), {}};
    std::vector<client::LayerData> layers;
    layers.reserve(snap.layers.size());
    for (const EncodedLayer& l : snap.layers) {
      client::LayerData d;
      const std::string header = SerializeLayerHeader(l.header);
      auto hb = AsBytes(header);
      d.header.assign(hb.begin(), hb.end());
      for (const std::string& chunk : l.chunks) {
        auto cb = AsBytes(chunk);
        d.chunks.emplace_back(cb.begin(), cb.end());
      }
      layers.push_back(std::move(d));
    }
    return c->Publish(model, snap.header.tokens, layers);
  }

 private:
  client::ClientOptions options_;
  std::unique_ptr<client::Client> admin_;
};

// ---- the store itself, read-only --------------------------------------------------

class DirectAccess final : public StoreAccess {
 public:
  explicit DirectAccess(std::unique_ptr<Store> store) : store_(std::move(store)) {}

  std::string where() const override { return store_->path() + " (read-only)"; }
  bool writable() const override { return false; }
  bool through_daemon() const override { return false; }

  Result<std::vector<EntryInfo>> List(bool quarantined) override {
    std::vector<EntryInfo> out;
    ListOptions lo;
    lo.state = quarantined ? EntryState::kQuarantined : EntryState::kLive;
    lo.limit = 1000;
    for (;;) {
      PC_ASSIGN_OR_RETURN(auto page, store_->List(lo));
      for (auto& e : page.entries) out.push_back(std::move(e));
      if (page.next_page_token.empty()) break;
      lo.page_token = page.next_page_token;
    }
    return out;
  }

  Result<EntryInfo> Describe(std::uint64_t id, std::vector<std::string>* headers) override {
    PC_ASSIGN_OR_RETURN(EntryInfo e, store_->Describe(id));
    if (e.quarantined()) {
      if (headers != nullptr) headers->clear();
      return e;
    }
    PC_ASSIGN_OR_RETURN(e.tokens, store_->Tokens(id));
    if (headers != nullptr) {
      PC_ASSIGN_OR_RETURN(*headers, store_->LayerHeaders(id));
    }
    return e;
  }

  Status Fetch(std::uint64_t id, const FetchHandlers& h) override {
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
    return store_->Fetch(id, {}, sink);
  }

  Result<std::optional<LookupHit>> Lookup(const Hash128& model, const std::string& ns,
                                          std::span<const std::uint32_t> tokens,
                                          std::uint64_t* shared_tokens) override {
    LookupOptions lo;
    lo.record = false;  // read-only: no counters, no recency, no sightings
    lo.shared_tokens = shared_tokens;
    return store_->Lookup(model, ns, tokens, lo);
  }

  Result<DaemonStats> Stat() override {
    DaemonStats out;
    PC_ASSIGN_OR_RETURN(out.store, store_->Stat());
    return out;
  }

  Result<StoreCheckReport> CheckStore(bool read_chunks) override { return store_->CheckStore(read_chunks); }

  Status Delete(std::uint64_t) override { return ReadOnly("rm"); }
  Status Compact() override { return ReadOnly("compact"); }
  Result<PublishResult> Import(const EncodedSnapshot&, const std::string&) override { return ReadOnly("import"); }

 private:
  Status ReadOnly(const char* what) const {
    return Status::FailedPrecondition(std::string(what) + " needs the running daemon; the store at " +
                                      store_->path() + " is open read-only");
  }
  std::unique_ptr<Store> store_;
};

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

Result<std::unique_ptr<StoreAccess>> OpenAccess(const AccessOptions& o, bool* fell_back) {
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
      PC_ASSIGN_OR_RETURN(auto c, client::Client::Connect(co));
      if (!c->server_info().admin) {
        return Status::FailedPrecondition(socket + " is not primecached's admin socket (no admin rights there)");
      }
      return std::unique_ptr<StoreAccess>(new DaemonAccess(co, std::move(c)));
    }
    if (!daemon_status.IsNotFound()) return daemon_status;
  }
  StoreOptions so;
  so.validator = CodecLayerValidator();
  so.path = o.data_dir + "/store";
  so.read_only = true;
  so.create_if_missing = false;
  so.block_cache_bytes = 32ull << 20;
  auto store = Store::Open(so);
  if (!store.ok()) {
    if (store.status().IsNotFound()) {
      return Status::Unavailable(daemon_status.message() + "; and no store at " + so.path);
    }
    return store.status();
  }
  *fell_back = !o.offline;
  spdlog::debug("primecachectl: daemon unavailable ({}); reading {} directly", daemon_status.message(), so.path);
  return std::unique_ptr<StoreAccess>(new DirectAccess(std::move(store).value()));
}

}  // namespace primecache::ctl

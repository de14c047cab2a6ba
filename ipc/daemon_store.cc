// A Store over the daemon (primecache/internal/daemon_store.h).
#include "primecache/internal/daemon_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace primecache::client {
namespace {

std::vector<std::byte> Bytes(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

// Keeps the layers; Commit sends them in one publish (the wire wants the
// layer count first).
class DaemonPublisher final : public Publisher {
 public:
  DaemonPublisher(std::shared_ptr<Client> client, PublishRequest request)
      : client_(std::move(client)), request_(std::move(request)) {}

  Status BeginLayer(std::string_view header, std::uint32_t chunk_count) override {
    PC_RETURN_IF_ERROR(Usable());
    if (in_layer_) return Status::FailedPrecondition("BeginLayer inside a layer");
    LayerData& l = layers_.emplace_back();
    l.header = Bytes(header);
    l.chunks.reserve(chunk_count);
    announced_ = chunk_count;
    in_layer_ = true;
    return Status::Ok();
  }
  Status AddChunk(std::span<const std::byte> bytes) override {
    PC_RETURN_IF_ERROR(Usable());
    if (!in_layer_) return Status::FailedPrecondition("AddChunk outside a layer");
    if (layers_.back().chunks.size() >= announced_) return Short("got more");
    layers_.back().chunks.emplace_back(bytes.begin(), bytes.end());
    return Status::Ok();
  }
  Status EndLayer() override {
    PC_RETURN_IF_ERROR(Usable());
    if (!in_layer_) return Status::FailedPrecondition("EndLayer outside a layer");
    in_layer_ = false;
    if (layers_.back().chunks.size() != announced_) {
      return Short("got " + std::to_string(layers_.back().chunks.size()));
    }
    return Status::Ok();
  }
  Result<PublishResult> Commit() override {
    PC_RETURN_IF_ERROR(Usable());
    if (in_layer_) return Status::FailedPrecondition("Commit inside a layer");
    done_ = true;
    const ModelId model{request_.model, request_.model_name, request_.model_descriptor, request_.cost};
    return client_->Publish(model, request_.tokens, layers_);
  }
  void Abort() override {
    done_ = true;
    layers_.clear();
  }

 private:
  Status Usable() const { return done_ ? Status::FailedPrecondition("the publish is over") : Status::Ok(); }
  Status Short(const std::string& got) const {
    return Status::InvalidArgument("layer " + std::to_string(layers_.size() - 1) + " announced " +
                                   std::to_string(announced_) + " chunk(s); " + got);
  }

  std::shared_ptr<Client> client_;
  PublishRequest request_;
  std::vector<LayerData> layers_;
  std::uint32_t announced_ = 0;
  bool in_layer_ = false;
  bool done_ = false;
};

}  // namespace

DaemonStore::DaemonStore(ClientOptions options, std::unique_ptr<Client> client)
    : options_(std::move(options)), client_(std::move(client)) {}

Result<std::unique_ptr<DaemonStore>> DaemonStore::Connect(ClientOptions options) {
  PC_ASSIGN_OR_RETURN(auto c, Client::Connect(options));
  return std::make_unique<DaemonStore>(std::move(options), std::move(c));
}

Result<std::shared_ptr<Client>> DaemonStore::ClientFor(std::string_view ns) {
  if (ns == options_.ns) return client_;
  ClientOptions o = options_;
  o.ns = std::string(ns);
  PC_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
  return std::shared_ptr<Client>(std::move(c));
}

Result<DaemonStats> DaemonStore::DaemonStat() {
  return client_->Stat();
}

Result<PublishStart> DaemonStore::BeginPublish(PublishRequest request) {
  PC_ASSIGN_OR_RETURN(std::shared_ptr<Client> c, ClientFor(request.ns));
  return PublishStart{std::make_unique<DaemonPublisher>(std::move(c), std::move(request)), std::nullopt};
}

Result<std::optional<LookupHit>> DaemonStore::Lookup(const Hash128& model, std::string_view ns,
                                                     std::span<const std::uint32_t> tokens,
                                                     const LookupOptions& options) {
  if (options.lease != nullptr) return Status::InvalidArgument("a lease is the daemon's own: none is lent out");
  PC_ASSIGN_OR_RETURN(std::shared_ptr<Client> c, ClientFor(ns));
  return c->Lookup(ModelId{model, "", "", {}}, tokens, options.shared_tokens);
}

Result<EntryDetail> DaemonStore::Describe(EntryId id, const DescribeOptions& options) {
  return client_->Describe(id, options);
}

Status DaemonStore::Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
                          const FetchOptions& options) {
  if (options.ns) PC_RETURN_IF_ERROR(Describe(id, DescribeOptions{options.ns, false}).status());
  FetchCallbacks cb;
  cb.on_layer = [&](std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) {
    return sink.OnLayer(layer, std::string_view(reinterpret_cast<const char*>(header.data()), header.size()), chunks);
  };
  cb.on_chunk = [&](std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes) {
    return sink.OnChunk(layer, chunk, bytes);
  };
  return client_->Fetch(id, layers, cb);
}

Status DaemonStore::Delete(EntryId id) {
  return client_->Delete(id);
}

Result<ListPage> DaemonStore::List(const ListOptions& options) {
  return client_->List(options);
}

Result<StoreStats> DaemonStore::Stat() {
  PC_ASSIGN_OR_RETURN(DaemonStats d, client_->Stat());
  return d.store;
}

Status DaemonStore::SetByteBudget(std::uint64_t bytes) {
  return client_->SetByteBudget(bytes);
}

Result<StoreCheckReport> DaemonStore::CheckStore(const CheckStoreOptions& options) {
  return client_->CheckStore(options.read_chunks);
}

Status DaemonStore::Compact() {
  return client_->Compact();
}

}  // namespace primecache::client

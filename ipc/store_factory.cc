// The daemon's StoreBackend over a store (primecache/store.h), and the
// daemon's local store opened from its configuration.
#include "ipc/store_factory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "primecache/env.h"
#include "primecache/codec.h"
#include "primecache/statestore.h"

namespace primecache::ipc {

namespace {

std::string_view View(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Streams a publish into a Publisher. The store wants EndLayer between
// layers; the wire announces the next layer instead.
class StoreSink : public PublishSink {
 public:
  explicit StoreSink(std::unique_ptr<Publisher> p) : p_(std::move(p)) {}
  // The identity is stored already: the bytes that follow are dropped.
  explicit StoreSink(EntryId existing) { existing_.id = existing, existing_.existed = true; }
  ~StoreSink() override { Abort(); }

  Status BeginLayer(std::uint32_t, std::span<const std::byte> header, std::uint32_t chunk_count) override {
    if (!p_) return Status::Ok();
    if (in_layer_) PC_RETURN_IF_ERROR(p_->EndLayer());
    in_layer_ = true;
    return p_->BeginLayer(View(header), chunk_count);
  }
  Status AddChunk(std::span<const std::byte> bytes) override {
    if (!p_) return Status::Ok();
    return p_->AddChunk(bytes);
  }
  Result<PublishResult> Commit() override {
    if (!p_) return existing_;
    if (in_layer_) {
      in_layer_ = false;
      PC_RETURN_IF_ERROR(p_->EndLayer());
    }
    committed_ = true;
    return p_->Commit();
  }
  void Abort() override {
    if (p_ && !committed_) {
      p_->Abort();
      committed_ = true;
    }
  }

 private:
  std::unique_ptr<Publisher> p_;
  PublishResult existing_;
  bool in_layer_ = false;
  bool committed_ = false;
};

class StoreAdapter : public StoreBackend {
 public:
  StoreAdapter(std::unique_ptr<Store> store, std::function<std::optional<RemoteStats>()> remote_stats)
      : store_(std::move(store)), remote_stats_(std::move(remote_stats)) {}

  Result<std::unique_ptr<PublishSink>> BeginPublish(const PublishRequest& request, std::uint32_t) override {
    PC_ASSIGN_OR_RETURN(PublishStart start, store_->BeginPublish(request));
    if (start.existing) return std::unique_ptr<PublishSink>(new StoreSink(*start.existing));
    return std::unique_ptr<PublishSink>(new StoreSink(std::move(start.publisher)));
  }

  Result<std::optional<LookupHit>> Lookup(const Hash128& digest, const std::string& ns,
                                          std::span<const std::uint32_t> tokens,
                                          std::uint64_t* shared_tokens) override {
    LookupOptions o;
    o.shared_tokens = shared_tokens;
    return store_->Lookup(digest, ns, tokens, o);
  }

  Result<EntryDetail> Describe(std::uint64_t entry, const std::optional<std::string>& ns,
                               bool layer_headers) override {
    DescribeOptions o;
    o.ns = ns;
    o.layer_headers = layer_headers;
    return store_->Describe(entry, o);
  }

  Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, const FetchOptions& options,
               FetchSink& sink) override {
    return store_->Fetch(entry, layers, sink, options);
  }

  Status Delete(std::uint64_t entry) override { return store_->Delete(entry); }

  Result<ListPage> List(const ListFilter& f) override {
    primecache::ListOptions o;
    o.model = f.digest;
    o.ns = f.ns;
    o.page_token = f.page_token;
    o.limit = f.page_size;
    o.state = f.quarantined ? EntryState::kQuarantined : EntryState::kLive;
    o.omit_tokens = f.omit_tokens;
    return store_->List(o);
  }

  Result<StoreStats> Stat() override { return store_->Stat(); }

  Status SetByteBudget(std::uint64_t bytes) override { return store_->SetByteBudget(bytes); }

  Result<StoreCheckReport> CheckStore(bool read_chunks) override {
    CheckStoreOptions o;
    o.read_chunks = read_chunks;
    return store_->CheckStore(o);
  }

  Status Compact() override { return store_->Compact(); }

  std::optional<RemoteStats> RemoteCounters() const override {
    return remote_stats_ ? remote_stats_() : std::nullopt;
  }

 private:
  std::unique_ptr<Store> store_;
  std::function<std::optional<RemoteStats>()> remote_stats_;
};

}  // namespace

std::unique_ptr<StoreBackend> NewStoreBackend(std::unique_ptr<Store> store,
                                              std::function<std::optional<RemoteStats>()> remote_stats) {
  return std::make_unique<StoreAdapter>(std::move(store), std::move(remote_stats));
}

Result<std::unique_ptr<LocalStore>> OpenLocalStore(const StoreConfig& config) {
  // The data directory itself is made private (its sockets keep their own
  // modes); the store makes its own directory and files private.
  PC_ASSIGN_OR_RETURN(std::vector<TightenedPath> tightened,
                      RestrictToOwner(Env::Default(), config.data_dir, /*recursive=*/false));
  if (!tightened.empty()) {
    spdlog::warn("primecached: the data directory was open to other users; made private: {}",
                 DescribeTightened(tightened));
  }
  StoreOptions o;
  o.validator = CodecLayerValidator();
  o.path = config.data_dir + "/store";
  o.byte_budget = config.capacity_bytes;
  o.sync_commits = config.sync_commits;
  o.max_staged_bytes = config.max_staged_bytes;
  o.fetch_read_threads = config.read_threads;
  o.direct_reads = config.direct_reads;
  o.fetch_read_ahead_bytes = config.read_ahead_bytes;
  o.fetch_read_ahead = std::clamp<std::size_t>(config.read_ahead_bytes >> 17, 16, 1024);
  o.eviction = config.eviction;
  return LocalStore::Open(std::move(o));
}

Result<std::unique_ptr<StoreBackend>> OpenStore(const StoreConfig& config) {
  PC_ASSIGN_OR_RETURN(auto store, OpenLocalStore(config));
  return NewStoreBackend(std::move(store));
}

}  // namespace primecache::ipc

// The daemon's StoreBackend over the real store (primecache/statestore.h).
#include "ipc/store_factory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
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

// Streams a publish into a statestore Publisher. The store wants EndLayer
// between layers; the wire announces the next layer instead.
class StatestoreSink : public PublishSink {
 public:
  explicit StatestoreSink(std::unique_ptr<Publisher> p) : p_(std::move(p)) {}
  // The identity is stored already: the bytes that follow are dropped.
  explicit StatestoreSink(EntryId existing) { existing_.id = existing, existing_.existed = true; }
  ~StatestoreSink() override { Abort(); }

  Status BeginLayer(std::uint32_t, std::span<const std::byte> header, std::uint32_t) override {
    if (!p_) return Status::Ok();
    if (in_layer_) PC_RETURN_IF_ERROR(p_->EndLayer());
    in_layer_ = true;
    return p_->BeginLayer(View(header));
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

class StatestoreBackend : public StoreBackend {
 public:
  explicit StatestoreBackend(std::unique_ptr<Store> store) : store_(std::move(store)) {}

  Result<std::unique_ptr<PublishSink>> BeginPublish(const PublishRequest& request, std::uint32_t) override {
    PC_ASSIGN_OR_RETURN(Store::PublishStart start, store_->StartPublish(request));
    if (start.existing) return std::unique_ptr<PublishSink>(new StatestoreSink(*start.existing));
    return std::unique_ptr<PublishSink>(new StatestoreSink(std::move(start.publisher)));
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
    EntryDetail d;
    PC_ASSIGN_OR_RETURN(d.info, store_->Describe(entry));
    // Another tenant's entry, or a quarantined one off the admin socket, is
    // reported as absent.
    if (ns && (d.info.quarantined() || d.info.ns != *ns)) return Status::NotFound("no entry " + std::to_string(entry));
    if (d.info.quarantined()) return d;
    PC_ASSIGN_OR_RETURN(d.info.tokens, store_->Tokens(entry));
    if (layer_headers) {
      PC_ASSIGN_OR_RETURN(d.layer_headers, store_->LayerHeaders(entry));
    }
    return d;
  }

  Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, const FetchOptions& options,
               FetchSink& sink) override {
    return store_->Fetch(entry, layers, sink, options);
  }

  Status Delete(std::uint64_t entry) override { return store_->Delete(entry); }

  Result<ListPage> List(const ListFilter& f) override {
    primecache::ListOptions o;
    o.model = f.digest;
    // The store filters by namespace only within one model; across models
    // the namespace is filtered here (a page may then come back short).
    if (f.digest.has_value()) o.ns = f.ns;
    o.page_token = f.page_token;
    o.limit = f.page_size;
    o.state = f.quarantined ? EntryState::kQuarantined : EntryState::kLive;
    PC_ASSIGN_OR_RETURN(ListPage page, store_->List(o));
    std::erase_if(page.entries, [&](const EntryInfo& e) { return f.ns.has_value() && e.ns != *f.ns; });
    if (f.quarantined || f.omit_tokens) return page;
    std::vector<EntryInfo> kept;
    kept.reserve(page.entries.size());
    for (EntryInfo& e : page.entries) {
      auto toks = store_->Tokens(e.id);
      if (toks.status().IsNotFound()) continue;  // evicted while listing
      PC_RETURN_IF_ERROR(toks.status());
      e.tokens = std::move(toks).value();
      kept.push_back(std::move(e));
    }
    page.entries = std::move(kept);
    return page;
  }

  Result<StoreStats> Stat() override { return store_->Stat(); }

  Status SetByteBudget(std::uint64_t bytes) override { return store_->SetByteBudget(bytes); }

  Result<StoreCheckReport> CheckStore(bool read_chunks) override { return store_->CheckStore(read_chunks); }

  Status Compact() override { return store_->Compact(); }

 private:
  std::unique_ptr<Store> store_;
};

}  // namespace

Result<std::unique_ptr<StoreBackend>> OpenStore(const StoreConfig& config) {
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
  PC_ASSIGN_OR_RETURN(auto store, Store::Open(std::move(o)));
  return std::unique_ptr<StoreBackend>(new StatestoreBackend(std::move(store)));
}

}  // namespace primecache::ipc

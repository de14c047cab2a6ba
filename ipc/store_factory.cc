// The daemon's StoreBackend over the real store (primecache/statestore.h).
#include "ipc/store_factory.h"

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>
#include <utility>

#include "primecache/env.h"
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
  explicit StatestoreSink(EntryId existing) : existing_(existing) {}
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
  Result<Committed> Commit() override {
    if (!p_) return Committed{existing_, true};
    if (in_layer_) {
      in_layer_ = false;
      PC_RETURN_IF_ERROR(p_->EndLayer());
    }
    auto r = p_->Commit();
    committed_ = true;
    if (!r.ok()) return r.status();
    return Committed{r->id, r->existed};
  }
  void Abort() override {
    if (p_ && !committed_) {
      p_->Abort();
      committed_ = true;
    }
  }

 private:
  std::unique_ptr<Publisher> p_;
  EntryId existing_ = 0;
  bool in_layer_ = false;
  bool committed_ = false;
};

class VisitorSink : public FetchSink {
 public:
  explicit VisitorSink(FetchVisitor* v) : v_(v) {}
  Status OnLayer(std::uint32_t layer, std::string_view header, std::uint32_t chunk_count) override {
    return v_->OnLayer(layer, std::as_bytes(std::span(header.data(), header.size())), chunk_count);
  }
  Status OnChunk(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes) override {
    return v_->OnChunk(layer, chunk, bytes);
  }

 private:
  FetchVisitor* v_;
};

EntrySummary Summarize(const primecache::EntryInfo& e) {
  EntrySummary s;
  s.entry = e.id;
  s.boundary.digest = e.model;
  s.boundary.model_name = e.model_name;
  s.boundary.ns = e.ns;
  s.layer_count = e.layers;
  s.bytes = e.chunk_bytes;
  s.raw_bytes = e.raw_bytes;
  s.created_unix_ms = e.created_unix_ms;
  s.last_access = e.last_access;
  s.hits = e.hits;
  s.length = e.length;
  s.boundary.descriptor = e.model_descriptor;
  s.quarantined = e.state == EntryState::kQuarantined;
  s.reason = e.reason;
  return s;
}

class StatestoreBackend : public StoreBackend {
 public:
  explicit StatestoreBackend(std::unique_ptr<Store> store) : store_(std::move(store)) {}

  Result<std::unique_ptr<PublishSink>> BeginPublish(const BoundaryKey& b, std::uint32_t) override {
    PublishRequest req;
    req.model = b.digest;
    req.model_name = b.model_name;
    req.model_descriptor = b.descriptor;
    req.ns = b.ns;
    req.tokens = b.tokens;
    auto p = store_->BeginPublish(std::move(req));
    if (p.ok()) return std::unique_ptr<PublishSink>(new StatestoreSink(std::move(p).value()));
    if (p.status().code() != StatusCode::kAlreadyExists) return p.status();
    PC_ASSIGN_OR_RETURN(auto existing, store_->FindExact(b.digest, b.ns, b.tokens));
    if (!existing.has_value()) return p.status();  // deleted meanwhile: let the client retry
    return std::unique_ptr<PublishSink>(new StatestoreSink(*existing));
  }

  Result<std::optional<ipc::LookupHit>> Lookup(const Hash128& digest, const std::string& ns,
                                               std::span<const std::uint32_t> tokens) override {
    PC_ASSIGN_OR_RETURN(auto hit, store_->Lookup(digest, ns, tokens));
    if (!hit.has_value()) return std::optional<ipc::LookupHit>();
    ipc::LookupHit out;
    out.entry = hit->id;
    out.length = static_cast<std::uint32_t>(hit->length);
    auto info = store_->Describe(hit->id);
    if (info.ok()) {
      out.layer_count = info->layers;
      out.bytes = info->chunk_bytes;
    } else if (!info.status().IsNotFound()) {
      return info.status();
    }  // evicted between the two calls: still a hit, sizes unknown
    return std::optional<ipc::LookupHit>(out);
  }

  Result<EntrySummary> Describe(std::uint64_t entry) override {
    PC_ASSIGN_OR_RETURN(auto e, store_->Describe(entry));
    if (e.state != EntryState::kLive) return Status::NotFound("entry " + std::to_string(entry) + " is quarantined");
    return Summarize(e);
  }

  Result<EntryDetail> Inspect(std::uint64_t entry, bool layer_headers) override {
    PC_ASSIGN_OR_RETURN(auto e, store_->Describe(entry));
    EntryDetail d;
    d.summary = Summarize(e);
    if (e.state != EntryState::kLive) return d;
    PC_ASSIGN_OR_RETURN(d.summary.boundary.tokens, store_->Tokens(entry));
    if (layer_headers) {
      PC_ASSIGN_OR_RETURN(d.layer_headers, store_->LayerHeaders(entry));
    }
    return d;
  }

  Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, FetchVisitor* visitor) override {
    // Held for the fetch: the entry is neither evicted nor deleted under it.
    PC_ASSIGN_OR_RETURN(Lease lease, store_->AcquireLease(entry));
    VisitorSink sink(visitor);
    return store_->Fetch(entry, layers, sink);
  }

  Status Delete(std::uint64_t entry) override { return store_->Delete(entry); }

  Result<ipc::ListPage> List(const ListFilter& f) override {
    primecache::ListOptions o;
    o.model = f.digest;
    // The store filters by namespace only within one model; across models
    // the namespace is filtered here (a page may then come back short).
    if (f.digest.has_value()) o.ns = f.ns;
    o.page_token = f.page_token;
    o.limit = f.page_size;
    o.state = f.quarantined ? EntryState::kQuarantined : EntryState::kLive;
    PC_ASSIGN_OR_RETURN(auto page, store_->List(o));
    ipc::ListPage out;
    out.next_page_token = page.next_page_token;
    for (const auto& e : page.entries) {
      if (f.ns.has_value() && e.ns != *f.ns) continue;
      EntrySummary s = Summarize(e);
      if (f.quarantined || f.omit_tokens) {
        out.entries.push_back(std::move(s));
        continue;
      }
      auto toks = store_->Tokens(e.id);
      if (!toks.ok()) {
        if (toks.status().IsNotFound()) continue;  // evicted while listing
        return toks.status();
      }
      s.boundary.tokens = std::move(toks).value();
      out.entries.push_back(std::move(s));
    }
    return out;
  }

  Result<ipc::StoreStats> Stat() override {
    PC_ASSIGN_OR_RETURN(auto st, store_->Stat());
    ipc::StoreStats s;
    s.entries = st.entries;
    s.bytes_stored = st.stored_bytes;
    s.bytes_raw = st.raw_bytes;
    s.hits = st.hits;
    s.misses = st.misses;
    s.evictions = st.evictions;
    s.capacity_bytes = st.byte_budget;
    s.quarantined = st.quarantined;
    s.chunks = st.chunks;
    s.bytes_logical = st.logical_bytes;
    s.dedup_saved_bytes = st.dedup_saved_bytes;
    s.admission_refusals = st.admission_refusals;
    s.active_leases = st.active_leases;
    s.disk_bytes = st.disk_bytes;
    return s;
  }

  Status SetCapacity(std::uint64_t bytes) override { return store_->SetByteBudget(bytes); }

  Result<StoreReport> VerifyStore(bool read_chunks) override {
    PC_ASSIGN_OR_RETURN(auto r, store_->Verify(read_chunks));
    return StoreReport{r.entries, r.chunks, std::move(r.problems), r.problem_count};
  }

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
  o.path = config.data_dir + "/store";
  o.byte_budget = config.capacity_bytes;
  o.sync_commits = config.sync_commits;
  o.max_staged_bytes = config.max_staged_bytes;
  PC_ASSIGN_OR_RETURN(auto store, Store::Open(std::move(o)));
  return std::unique_ptr<StoreBackend>(new StatestoreBackend(std::move(store)));
}

}  // namespace primecache::ipc

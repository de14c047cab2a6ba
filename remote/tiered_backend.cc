#include "remote/tiered_backend.h"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "primecache/codec.h"
#include "remote/miss_cache.h"

namespace primecache::remote {
namespace {

// Collects a fetched entry's layers (the write-behind's read-back).
class CollectSink : public FetchSink {
 public:
  Status OnLayer(std::uint32_t layer, std::string_view header, std::uint32_t chunk_count) override {
    if (layer != layers.size()) return Status::Internal("layers out of order");
    layers.push_back({std::string(header), {}});
    layers.back().chunks.reserve(chunk_count);
    return Status::Ok();
  }
  Status OnChunk(std::uint32_t layer, std::uint32_t, std::span<const std::byte> bytes) override {
    if (layer + 1 != layers.size()) return Status::Internal("chunk of a layer not begun");
    layers.back().chunks.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return Status::Ok();
  }
  std::vector<LayerBytes> layers;
};

class Tiered;

// A local publish that, once committed, queues its entry for the cluster.
class QueueingSink : public ipc::PublishSink {
 public:
  QueueingSink(Tiered* owner, std::unique_ptr<ipc::PublishSink> inner, PublishRequest request)
      : owner_(owner), inner_(std::move(inner)), request_(std::move(request)) {}
  Status BeginLayer(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) override {
    return inner_->BeginLayer(layer, header, chunks);
  }
  Status AddChunk(std::span<const std::byte> bytes) override { return inner_->AddChunk(bytes); }
  Result<PublishResult> Commit() override;
  void Abort() override { inner_->Abort(); }

 private:
  Tiered* owner_;
  std::unique_ptr<ipc::PublishSink> inner_;
  PublishRequest request_;
};

class Tiered final : public TieredBackend {
 public:
  Tiered(std::unique_ptr<ipc::StoreBackend> local, std::shared_ptr<RemoteTier> tier, TieredOptions options)
      : local_(std::move(local)),
        tier_(std::move(tier)),
        options_(std::move(options)),
        misses_(options_.miss_ttl, options_.miss_cache_entries),
        worker_([this] { Loop(); }) {}
  ~Tiered() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  Result<std::unique_ptr<ipc::PublishSink>> BeginPublish(const PublishRequest& request,
                                                         std::uint32_t layer_count) override {
    PC_ASSIGN_OR_RETURN(auto inner, local_->BeginPublish(request, layer_count));
    if (!Uses(request.ns)) return inner;
    return std::unique_ptr<ipc::PublishSink>(new QueueingSink(this, std::move(inner), request));
  }

  // The shared length is the local store's: the cluster keeps no pass records.
  Result<std::optional<LookupHit>> Lookup(const Hash128& digest, const std::string& ns,
                                          std::span<const std::uint32_t> tokens,
                                          std::uint64_t* shared_tokens) override;

  Result<EntryDetail> Describe(std::uint64_t entry, const std::optional<std::string>& ns, bool headers) override {
    return local_->Describe(entry, ns, headers);
  }
  Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, const FetchOptions& options,
               FetchSink& sink) override {
    return local_->Fetch(entry, layers, options, sink);
  }
  Status Delete(std::uint64_t entry) override { return local_->Delete(entry); }
  Result<ListPage> List(const ipc::ListFilter& filter) override { return local_->List(filter); }
  Result<StoreStats> Stat() override { return local_->Stat(); }
  Status SetByteBudget(std::uint64_t bytes) override { return local_->SetByteBudget(bytes); }
  Result<StoreCheckReport> CheckStore(bool read_chunks) override { return local_->CheckStore(read_chunks); }
  Status Compact() override { return local_->Compact(); }

  TieredStats tiered_stats() const override;
  std::optional<RemoteStats> RemoteCounters() const override;
  void Drain() override {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [&] { return queue_.empty() && !busy_; });
  }

  // A committed local entry, for the cluster; dropped when the queue is full.
  void Enqueue(std::uint64_t id, const PublishRequest& request);

 private:
  struct Job {
    std::uint64_t id;
    PublishRequest request;
  };
  bool Uses(const std::string& ns) const { return options_.namespaces.empty() || options_.namespaces.count(ns) != 0; }
  Status Import(const Hash128& digest, const std::string& ns, std::span<const std::uint32_t> tokens,
                const RemoteHit& hit);
  void PutOne(const Job& job);
  void Loop();

  std::unique_ptr<ipc::StoreBackend> local_;
  std::shared_ptr<RemoteTier> tier_;
  const TieredOptions options_;
  MissCache misses_;
  void Count(std::uint64_t TieredStats::*field, std::uint64_t n);

  mutable std::mutex stats_mu_;
  TieredStats stats_;  // guarded by stats_mu_
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Job> queue_;  // guarded by mu_
  bool busy_ = false;      // guarded by mu_: the worker is putting a job
  bool stopping_ = false;  // guarded by mu_
  std::thread worker_;     // last: started once everything above exists
};

Result<PublishResult> QueueingSink::Commit() {
  PC_ASSIGN_OR_RETURN(PublishResult r, inner_->Commit());
  if (!r.existed) owner_->Enqueue(r.id, request_);
  return r;
}

Result<std::optional<LookupHit>> Tiered::Lookup(const Hash128& digest, const std::string& ns,
                                                std::span<const std::uint32_t> tokens,
                                                std::uint64_t* shared_tokens) {
  auto local = local_->Lookup(digest, ns, tokens, shared_tokens);
  if (!local.ok() || !Uses(ns)) return local;
  const std::uint64_t have = *local ? (*local)->length : 0;
  if (have >= tokens.size()) return local;  // the whole query is here already
  const Hash128 query = MissCache::KeyOf(digest, ns, tokens);
  const auto now = MissCache::Clock::now();
  if (misses_.Contains(query, now)) {
    Count(&TieredStats::remote_misses_cached, 1);
    return local;
  }
  auto remote = tier_->Lookup(digest, ns, tokens);
  if (!remote.ok()) {
    Count(&TieredStats::remote_errors, 1);
    spdlog::debug("remote lookup failed: {}", remote.status().ToString());
    return local;
  }
  if (!*remote || (*remote)->length <= have) {
    Count(&TieredStats::remote_misses, 1);
    misses_.Add(query, now);
    return local;
  }
  if (Status s = Import(digest, ns, tokens, **remote); !s.ok()) {
    const bool gone = s.code() == StatusCode::kNotFound;
    // The entry itself is wrong: its layers are not what a restore of this
    // model could take. Not asked for again, and removed from the cluster.
    const bool refused = s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kCorruption;
    Count(gone ? &TieredStats::remote_misses
               : refused ? &TieredStats::remote_refused
                         : &TieredStats::remote_errors,
          1);
    if (gone || refused) misses_.Add(query, now);
    if (refused) {
      spdlog::warn("refused a remote entry of {} tokens: {}", (*remote)->length, s.ToString());
      (void)tier_->Remove(digest, ns, tokens.first((*remote)->length));
    } else {
      spdlog::debug("remote entry of {} tokens not imported: {}", (*remote)->length, s.ToString());
    }
    return local;
  }
  Count(&TieredStats::remote_hits, 1);
  return local_->Lookup(digest, ns, tokens, shared_tokens);
}

Status Tiered::Import(const Hash128& digest, const std::string& ns, std::span<const std::uint32_t> tokens,
                      const RemoteHit& hit) {
  PC_ASSIGN_OR_RETURN(auto entry, tier_->Fetch(digest, ns, tokens, hit));
  if (!entry) return Status::NotFound("the remote entry is gone or failed its checks");
  // Chunks whose bytes match their addresses may still not be the layer their
  // header declares: each layer is decoded and checked as a restore would
  // see it before anything is kept.
  for (std::uint32_t l = 0; l < entry->layers.size(); ++l) {
    LayerBytes& layer = entry->layers[l];
    auto header = ParseLayerHeader(AsBytes(layer.header));
    if (!header.ok()) return header.status().WithContext("layer " + std::to_string(l));
    EncodedLayer encoded{std::move(header).value(), std::move(layer.chunks)};  // lent, not copied
    Status s = CheckDecodes(encoded).status();
    layer.chunks = std::move(encoded.chunks);
    if (!s.ok()) return s.WithContext("layer " + std::to_string(l));
  }
  // Straight into the local store (not through BeginPublish above: it came
  // from the cluster and goes back to no queue). Its commit runs the layer
  // validator over every layer, and over all of them against the model's
  // plan (the entry's descriptor).
  PC_ASSIGN_OR_RETURN(auto sink, local_->BeginPublish(entry->entry, static_cast<std::uint32_t>(entry->layers.size())));
  for (std::uint32_t l = 0; l < entry->layers.size(); ++l) {
    const LayerBytes& layer = entry->layers[l];
    PC_RETURN_IF_ERROR(sink->BeginLayer(l, AsBytes(layer.header), static_cast<std::uint32_t>(layer.chunks.size())));
    for (const std::string& c : layer.chunks) PC_RETURN_IF_ERROR(sink->AddChunk(AsBytes(c)));
  }
  PC_RETURN_IF_ERROR(sink->Commit().status());
  Count(&TieredStats::imported_bytes, entry->chunk_bytes);
  return Status::Ok();
}

void Tiered::Enqueue(std::uint64_t id, const PublishRequest& request) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (queue_.size() >= options_.queue_entries) {
      Count(&TieredStats::dropped, 1);
      return;
    }
    queue_.push_back({id, request});
  }
  Count(&TieredStats::queued, 1);
  cv_.notify_one();
}

void Tiered::PutOne(const Job& job) {
  CollectSink entry;
  FetchOptions fo;
  fo.ns = job.request.ns;
  Status s = local_->Fetch(job.id, {}, fo, entry);
  if (s.ok()) s = tier_->Put(job.request, entry.layers);
  if (!s.ok()) {
    // Evicted locally meanwhile, or the cluster failed: the entry stays local only.
    Count(&TieredStats::remote_errors, 1);
    spdlog::debug("write-behind of entry {} failed: {}", job.id, s.ToString());
    return;
  }
  std::uint64_t bytes = 0;
  for (const LayerBytes& l : entry.layers)
    for (const std::string& c : l.chunks) bytes += c.size();
  Count(&TieredStats::put, 1);
  Count(&TieredStats::put_bytes, bytes);
}

void Tiered::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    l.unlock();
    PutOne(job);
    l.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

TieredStats Tiered::tiered_stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return stats_;
}

std::optional<RemoteStats> Tiered::RemoteCounters() const {
  const TieredStats t = tiered_stats();
  const RemoteTierStats r = tier_->stats();
  const ClusterStats c = tier_->client().stats();
  RemoteStats s;
  s.hits = t.remote_hits;
  s.misses = t.remote_misses;
  s.misses_cached = t.remote_misses_cached;
  s.errors = t.remote_errors;
  s.fetched_bytes = t.imported_bytes;
  s.queued = t.queued;
  s.put = t.put;
  s.dropped = t.dropped;
  s.put_bytes = t.put_bytes;
  {
    std::lock_guard<std::mutex> l(mu_);
    s.queue_depth = queue_.size() + (busy_ ? 1 : 0);
  }
  s.evicted = r.evicted;
  s.damaged = r.damaged;
  s.refused = t.remote_refused;
  s.breaker_open = tier_->client().breaker_open();
  s.breaker_opens = c.breaker_opens;
  s.fast_failures = c.fast_failures;
  s.moved = c.moved;
  s.asked = c.asked;
  return s;
}

void Tiered::Count(std::uint64_t TieredStats::*field, std::uint64_t n) {
  std::lock_guard<std::mutex> l(stats_mu_);
  stats_.*field += n;
}

}  // namespace

std::unique_ptr<TieredBackend> NewTieredBackend(std::unique_ptr<ipc::StoreBackend> local,
                                                std::shared_ptr<RemoteTier> tier, TieredOptions options) {
  return std::make_unique<Tiered>(std::move(local), std::move(tier), std::move(options));
}

}  // namespace primecache::remote

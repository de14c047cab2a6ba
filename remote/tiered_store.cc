#include "remote/tiered_store.h"

#include <spdlog/spdlog.h>

#include "primecache/internal/codec.h"

namespace primecache::remote {
namespace {

// A local publish that, once committed, queues its entry for the cluster.
class QueueingPublisher final : public Publisher {
 public:
  QueueingPublisher(TieredStore* owner, std::unique_ptr<Publisher> inner, PublishRequest request)
      : owner_(owner), inner_(std::move(inner)), request_(std::move(request)) {}
  Status BeginLayer(std::string_view header, std::uint32_t chunk_count) override {
    return inner_->BeginLayer(header, chunk_count);
  }
  Status AddChunk(std::span<const std::byte> bytes) override { return inner_->AddChunk(bytes); }
  Status EndLayer() override { return inner_->EndLayer(); }
  Result<PublishResult> Commit() override {
    PC_ASSIGN_OR_RETURN(PublishResult r, inner_->Commit());
    // A group's entry is written by the part that completes it; the others have none yet.
    if (!r.existed && !r.group_pending) owner_->Enqueue(r.id, request_);
    return r;
  }
  void Abort() override { inner_->Abort(); }

 private:
  TieredStore* owner_;
  std::unique_ptr<Publisher> inner_;
  PublishRequest request_;
};

}  // namespace

TieredStore::TieredStore(std::unique_ptr<Store> local, std::shared_ptr<RemoteTier> tier, TieredOptions options)
    : StoreWrapper(std::move(local)),
      tier_(std::move(tier)),
      options_(std::move(options)),
      misses_(options_.miss_ttl, options_.miss_cache_entries),
      worker_([this] { Loop(); }) {}

TieredStore::~TieredStore() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

bool TieredStore::Uses(std::string_view ns) const {
  return options_.namespaces.empty() || options_.namespaces.count(std::string(ns)) != 0;
}

Result<PublishStart> TieredStore::BeginPublish(PublishRequest request) {
  if (!Uses(request.ns)) return target().BeginPublish(std::move(request));
  PC_ASSIGN_OR_RETURN(PublishStart start, target().BeginPublish(request));
  if (start.publisher == nullptr) return start;
  start.publisher = std::make_unique<QueueingPublisher>(this, std::move(start.publisher), std::move(request));
  return start;
}

Result<std::optional<LookupHit>> TieredStore::Lookup(const Hash128& digest, std::string_view ns_view,
                                                     std::span<const std::uint32_t> tokens,
                                                     const LookupOptions& options) {
  auto local = target().Lookup(digest, ns_view, tokens, options);
  if (!local.ok() || !Uses(ns_view)) return local;
  const std::uint64_t have = *local ? (*local)->length : 0;
  if (have >= tokens.size()) return local;  // the whole query is here already
  const std::string ns(ns_view);
  const Hash128 query = MissCache::KeyOf(digest, ns, tokens);
  const auto now = MissCache::Clock::now();
  if (misses_.Contains(query, now)) {
    Count(&TieredStats::remote_misses_cached, 1);
    return local;
  }
  auto remote = tier_->Lookup(digest, ns, tokens);
  if (!remote.ok()) {
    RemoteError(remote.status(), "remote lookup");
    return local;
  }
  if (!*remote || (*remote)->length <= have) {
    Count(&TieredStats::remote_misses, 1);
    misses_.Add(query, now);
    return local;
  }
  if (Status s = Import(digest, ns, tokens, **remote); !s.ok()) {
    Refused(s, digest, ns, tokens, (*remote)->length, query, now);
    return local;
  }
  Count(&TieredStats::remote_hits, 1);
  return target().Lookup(digest, ns, tokens, options);
}

void TieredStore::Refused(const Status& s, const Hash128& digest, const std::string& ns,
                          std::span<const std::uint32_t> tokens, std::uint64_t remote_length, const Hash128& query,
                          MissCache::Clock::time_point now) {
  const bool gone = s.code() == StatusCode::kNotFound;
  // The entry itself is wrong: its layers are not what a restore of this
  // model could take. Not asked for again, and removed from the cluster.
  const bool refused = s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kCorruption;
  if (!gone && !refused) {
    RemoteError(s, "remote entry of " + std::to_string(remote_length) + " tokens not imported");
    return;
  }
  Count(gone ? &TieredStats::remote_misses : &TieredStats::remote_refused, 1);
  misses_.Add(query, now);
  if (refused) {
    spdlog::warn("refused a remote entry of {} tokens: {}", remote_length, s.ToString());
    (void)tier_->Remove(digest, ns, tokens.first(remote_length));
  }
}

Status TieredStore::Import(const Hash128& digest, const std::string& ns, std::span<const std::uint32_t> tokens,
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
  PC_RETURN_IF_ERROR(target().Publish(entry->entry, entry->layers).status());
  Count(&TieredStats::imported_bytes, entry->chunk_bytes);
  return Status::Ok();
}

void TieredStore::Enqueue(EntryId id, const PublishRequest& request) {
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

void TieredStore::PutOne(const Job& job) {
  FetchOptions fo;
  fo.ns = job.request.ns;
  auto layers = target().FetchAll(job.id, fo);
  Status s = layers.status();
  if (s.ok()) s = tier_->Put(job.request, *layers);
  if (!s.ok()) {
    // Evicted locally meanwhile, or the cluster failed: the entry stays local only.
    RemoteError(s, "write-behind of entry " + std::to_string(job.id));
    return;
  }
  std::uint64_t bytes = 0;
  for (const LayerBytes& l : *layers)
    for (const std::string& c : l.chunks) bytes += c.size();
  Count(&TieredStats::put, 1);
  Count(&TieredStats::put_bytes, bytes);
}

void TieredStore::Loop() {
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

void TieredStore::Drain() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [&] { return queue_.empty() && !busy_; });
}

TieredStats TieredStore::tiered_stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return stats_;
}

RemoteStats TieredStore::remote_stats() const {
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

void TieredStore::RemoteError(const Status& s, std::string_view what) {
  bool warn = false;
  {
    std::lock_guard<std::mutex> l(stats_mu_);
    ++stats_.remote_errors;
    const auto now = std::chrono::steady_clock::now();
    if (s.code() == StatusCode::kFailedPrecondition &&
        (!last_refusal_warning_ || now - *last_refusal_warning_ >= kRefusalWarnEvery)) {
      last_refusal_warning_ = now;
      warn = true;
    }
  }
  if (warn) {
    spdlog::warn("{} failed: {} (the local store goes on serving; said again at most once a minute)", what,
                 s.ToString());
  } else {
    spdlog::debug("{} failed: {}", what, s.ToString());
  }
}

void TieredStore::Count(std::uint64_t TieredStats::*field, std::uint64_t n) {
  std::lock_guard<std::mutex> l(stats_mu_);
  stats_.*field += n;
}

}  // namespace primecache::remote

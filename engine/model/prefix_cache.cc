#include "engine/model/prefix_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

namespace primecache::model {

namespace {

using Clock = std::chrono::steady_clock;

// The most floats a restored layer of this plan can hold at `len` tokens:
// what sizes the pinned staging before any header has arrived.
std::uint64_t StagingFloats(const engine::StatePlan& plan, std::uint64_t len) {
  std::uint64_t total = 0;
  for (const auto& layer : plan.layers) {
    if (const auto* l = std::get_if<engine::LatentPlan>(&layer)) {
      total += len * l->width();
      if (l->has_indexer()) total += std::uint64_t{l->pool} * l->index_width() + len / l->pool * l->index_head_dim;
    } else if (const auto* r = std::get_if<engine::RecurrentPlan>(&layer)) {
      total += r->conv_values() + r->state_values();
    } else {
      const auto& k = std::get<engine::KvPlan>(layer);
      total += std::min<std::uint64_t>(len, k.capacity(len)) * (std::uint64_t{k.k_width} + k.v_width);
    }
  }
  return total;
}

}  // namespace

client::ModelId PrefixCache::ModelIdFor(const ModelConfig& config, const Weights& weights) {
  // The plan's intrinsic geometry: widths, pools, heads; no capacity or ring
  // size, since a snapshot restores into caches of any capacity that holds it.
  std::vector<LayerGeometry> geometry;
  for (const auto& layer : HybridModel::PlanFor(config, weights).layers) {
    if (const auto* l = std::get_if<engine::LatentPlan>(&layer)) {
      geometry.push_back(LatentGeometry{l->width(), l->index_width(), l->pool, 0, 0});
    } else if (const auto* r = std::get_if<engine::RecurrentPlan>(&layer)) {
      geometry.push_back(RecurrentGeometry{r->heads, r->head_dim, r->kernel});
    } else {
      const auto& k = std::get<engine::KvPlan>(layer);
      geometry.push_back(KvGeometry{k.k_width, k.v_width, 0, k.format});
    }
  }
  ModelFingerprint fp;
  fp.architecture = config.name;
  fp.plan_digest = GeometryDigest(geometry);
  fp.weights_digest = weights.Digest();
  fp.codec_versions = CodecRegistry::Default().Identities();
  return client::ModelId{fp.Digest(), config.name, EncodeFingerprint(fp)};
}

PrefixCache::PrefixCache(HybridModel* model, std::unique_ptr<client::Client> client, client::ModelId model_id,
                         PrefixCacheOptions options)
    : model_(model), client_(std::move(client)), model_id_(std::move(model_id)), options_(std::move(options)) {
  if (client_ != nullptr) {
    const std::size_t threads =
        options_.decode_threads != 0 ? options_.decode_threads
                                     : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);
    decode_pool_ = std::make_unique<WorkerPool>(threads);
  }
  if (client_ != nullptr && options_.publish) worker_ = std::thread([this] { PublishLoop(); });
}

PrefixCache::~PrefixCache() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::uint64_t PrefixCache::published() const {
  std::lock_guard lock(mu_);
  return published_;
}

void PrefixCache::NoteFailure(const std::string& what, const Status& why) {
  // kUnavailable is also what the daemon answers for a store that cannot
  // write; the daemon is gone only when the connection is.
  if (why.IsUnavailable() && !client_->connected()) {
    if (warned_down_.exchange(true)) return;
    spdlog::warn("prefix cache: the daemon is unavailable ({}); prefilling every prompt in full", why.ToString());
    return;
  }
  if (why.IsUnavailable()) {
    spdlog::warn("prefix cache: {} failed: the daemon is up, but answered {}", what, why.ToString());
    return;
  }
  spdlog::warn("prefix cache: {} failed: {}", what, why.ToString());
}

Status PrefixCache::ReserveStaging(std::uint64_t tokens) {
  PC_ASSIGN_OR_RETURN(auto session, model_->NewSession());
  const std::uint64_t bound = StagingFloats(session.cache->plan(), tokens) * sizeof(float);
  if (staging_.bytes() >= bound) return Status::Ok();
  staging_.Reset();
  PC_ASSIGN_OR_RETURN(staging_, model_->engine().device().AllocatePinned(bound));
  return Status::Ok();
}

Result<std::uint64_t> PrefixCache::TryRestore(ModelSession& session, std::span<const std::uint32_t> tokens,
                                              Request* figures) {
  if (client_ == nullptr || tokens.size() < options_.min_prefix) return std::uint64_t{0};
  const auto t_lookup = Clock::now();
  auto found = client_->Lookup(model_id_, tokens);
  figures->lookup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_lookup).count();
  if (!found.ok()) {
    NoteFailure("lookup", found.status());
    return std::uint64_t{0};
  }
  if (!found->has_value() || (*found)->length < options_.min_prefix) return std::uint64_t{0};
  const std::uint64_t len = (*found)->length;
  engine::SessionCache& cache = *session.cache;
  const std::vector<LayerGeometry> geometry = cache.Geometry();
  const std::size_t layers = geometry.size();

  // Pinned staging for the decoded planes, grown to this boundary's bound.
  const std::uint64_t bound = StagingFloats(cache.plan(), len) * sizeof(float);
  if (staging_.bytes() < bound) {
    staging_.Reset();
    PC_ASSIGN_OR_RETURN(staging_, model_->engine().device().AllocatePinned(bound));
  }
  float* const base = staging_.at<float>(0);
  const std::uint64_t capacity = staging_.bytes() / sizeof(float);
  std::uint64_t used = 0;
  const auto t_fetch = Clock::now();

  std::vector<std::optional<LayerDecoder>> decoders(layers);
  std::vector<std::vector<std::span<float>>> planes(layers);
  std::vector<std::vector<bool>> seen(layers);
  // Chunks decode on the pool as they arrive; each returns its loan when done.
  std::mutex decode_mu;
  std::condition_variable decode_cv;
  std::size_t decoding = 0;
  Status decode_status;
  client::FetchCallbacks cb;
  cb.on_layer = [&](std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) -> Status {
    if (layer >= layers || decoders[layer]) {
      return Status::Corruption("fetch sent layer " + std::to_string(layer) + " out of place");
    }
    PC_ASSIGN_OR_RETURN(LayerHeader h, ParseLayerHeader(header));
    // The header alone is checked against this cache before any chunk decodes.
    PC_RETURN_IF_ERROR(Validate(h, geometry[layer]).WithContext("layer " + std::to_string(layer)));
    PC_ASSIGN_OR_RETURN(LayerDecoder d, LayerDecoder::Create(std::move(h)));
    if (d.chunk_count() != chunks) return Status::Corruption("layer " + std::to_string(layer) + ": chunk count disagrees");
    for (const PlaneLayout& p : d.planes()) {
      if (p.values() > capacity - used) return Status::Corruption("fetched layers exceed the boundary's size");
      planes[layer].emplace_back(base + used, p.values());
      used += p.values();
    }
    seen[layer].assign(d.chunk_count(), false);
    decoders[layer].emplace(std::move(d));
    return Status::Ok();
  };
  cb.on_chunk_held = [&](std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                         client::ChunkRelease release) -> Status {
    if (layer >= layers || !decoders[layer] || index >= seen[layer].size() || seen[layer][index]) {
      release();
      return Status::Corruption("fetch sent chunk " + std::to_string(index) + " of layer " + std::to_string(layer) +
                                " out of place");
    }
    seen[layer][index] = true;
    {
      std::lock_guard lock(decode_mu);
      if (!decode_status.ok()) {
        release();
        return decode_status;
      }
      ++decoding;
    }
    // The decoder sits in a slot of a vector sized up front: its address holds.
    const LayerDecoder* d = &*decoders[layer];
    const std::span<float> plane = planes[layer][d->chunk(index).plane];
    decode_pool_->Post([&, d, plane, layer, index, bytes, release = std::move(release)] {
      Status s = d->DecodeChunk(index, bytes, plane);
      release();
      std::lock_guard lock(decode_mu);
      if (!s.ok() && decode_status.ok()) decode_status = s.WithContext("layer " + std::to_string(layer));
      if (--decoding == 0) decode_cv.notify_all();
    });
    return Status::Ok();
  };
  Status fetched = client_->Fetch((*found)->id, {}, cb);
  {
    // Whatever happened, no decode may outlive this frame.
    std::unique_lock lock(decode_mu);
    decode_cv.wait(lock, [&] { return decoding == 0; });
    if (fetched.ok()) fetched = decode_status;
  }
  figures->fetch_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_fetch).count();
  for (std::size_t l = 0; fetched.ok() && l < layers; ++l) {
    if (!decoders[l]) fetched = Status::Corruption("the entry has no layer " + std::to_string(l));
    for (bool s : seen[l])
      if (!s && fetched.ok()) fetched = Status::Corruption("layer " + std::to_string(l) + " is missing chunks");
  }
  if (!fetched.ok()) {
    NoteFailure("restoring entry " + std::to_string((*found)->id), fetched);
    return std::uint64_t{0};
  }

  const auto t_copy = Clock::now();
  std::vector<engine::LayerSnapshotView> views;
  for (std::size_t l = 0; l < layers; ++l) {
    const LayerShape& shape = decoders[l]->header().shape;
    const auto& p = planes[l];
    if (const auto* s = std::get_if<LatentShape>(&shape)) {
      views.push_back(engine::LatentView{*s, p[0], p.size() > 1 ? p[1] : std::span<float>(), p.size() > 2 ? p[2] : std::span<float>()});
    } else if (const auto* r = std::get_if<RecurrentShape>(&shape)) {
      views.push_back(engine::RecurrentView{*r, p[0], p[1]});
    } else {
      views.push_back(engine::KvView{std::get<KvShape>(shape), p[0], p[1]});
    }
  }
  // Every layer validated before the first byte moves; a refusal leaves the
  // session as fresh as it was.
  if (Status v = cache.ValidateRestore(views); !v.ok()) {
    spdlog::warn("prefix cache: entry {} refused: {}", (*found)->id, v.ToString());
    return std::uint64_t{0};
  }
  PC_RETURN_IF_ERROR(cache.Restore(views));
  PC_RETURN_IF_ERROR(model_->engine().device().Synchronize(engine::Lane::kCompute));
  session.position = len;
  figures->copy_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_copy).count();
  figures->restored_bytes = used * sizeof(float);
  return len;
}

Result<Request> PrefixCache::Prime(std::span<const std::uint32_t> prompt, bool all_logits) {
  if (prompt.empty()) return Status::InvalidArgument("prefix cache: empty prompt");
  const auto t0 = Clock::now();
  Request r;
  r.prompt.assign(prompt.begin(), prompt.end());
  PC_ASSIGN_OR_RETURN(r.session, model_->NewSession());
  // At least the last prompt token is primed: its logits pick the first new token.
  auto restored = TryRestore(r.session, prompt.first(prompt.size() - 1), &r);
  r.restore_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!restored.ok()) {
    // A device failure mid-restore leaves the cache unusable: start afresh.
    spdlog::warn("prefix cache: restore failed ({}); prefilling in full", restored.status().ToString());
    r.session = ModelSession{};
    PC_ASSIGN_OR_RETURN(r.session, model_->NewSession());
  }
  r.restored_tokens = restored.ok() ? *restored : 0;
  const auto rest = prompt.subspan(r.restored_tokens);
  std::vector<float> logits;
  PC_RETURN_IF_ERROR(model_->Prime(r.session, rest, all_logits ? LogitsWanted::kAll : LogitsWanted::kLast, &logits));
  const std::size_t V = model_->config().vocab;
  r.last_logits.assign(logits.end() - static_cast<std::ptrdiff_t>(V), logits.end());
  if (all_logits) r.all_logits = std::move(logits);
  r.prefilled_tokens = rest.size();
  r.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (client_ != nullptr && options_.publish) {
    auto cap = r.session.cache->CaptureEager();
    if (cap.ok()) {
      r.capture.emplace(std::move(cap).value());
    } else {
      spdlog::warn("prefix cache: no eager capture of this boundary: {}", cap.status().ToString());
    }
  }
  return r;
}

void PrefixCache::Finish(Request& r) {
  if (!r.capture) return;
  auto eager = r.capture->Collect();
  r.capture.reset();
  if (!eager.ok()) {
    spdlog::warn("prefix cache: eager capture lost: {}", eager.status().ToString());
    return;
  }
  auto layers = r.session.cache->CompleteCapture(std::move(eager).value());
  if (!layers.ok()) {
    spdlog::warn("prefix cache: boundary not published: {}", layers.status().ToString());
    return;
  }
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Job{r.prompt, std::move(layers).value()});
  }
  cv_.notify_all();
}

std::size_t PrefixCache::Drain() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  return failed_;
}

Status PrefixCache::Publish(std::span<const std::uint32_t> tokens, std::vector<LayerSnapshot> layers) {
  if (client_ == nullptr) return Status::Unavailable("prefix cache: no daemon");
  PC_ASSIGN_OR_RETURN(auto stream,
                      client_->BeginPublish(model_id_, tokens, static_cast<std::uint32_t>(layers.size())));
  for (LayerSnapshot& layer : layers) {
    PC_ASSIGN_OR_RETURN(EncodedLayer enc, EncodeLayer(layer, options_.encode));
    layer = LayerSnapshot{};  // the raw planes are no longer needed
    const std::string header = SerializeLayerHeader(enc.header);
    PC_RETURN_IF_ERROR(stream->BeginLayer(AsBytes(header), static_cast<std::uint32_t>(enc.chunks.size())));
    for (const std::string& chunk : enc.chunks) PC_RETURN_IF_ERROR(stream->AddChunk(AsBytes(chunk)));
  }
  return stream->Commit().status();
}

void PrefixCache::PublishLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Status s = Publish(job.tokens, std::move(job.layers));
    {
      std::lock_guard lock(mu_);
      busy_ = false;
      if (s.ok()) {
        ++published_;
      } else {
        ++failed_;
      }
    }
    if (!s.ok()) NoteFailure("the publish of a " + std::to_string(job.tokens.size()) + "-token boundary", s);
    cv_.notify_all();
  }
}

}  // namespace primecache::model

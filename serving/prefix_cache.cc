#include "serving/prefix_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

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
    } else if (const auto* r = std::get_if<RecurrentShape>(&layer)) {
      total += r->conv_values() + r->state_values();
    } else {
      const auto& k = std::get<engine::KvPlan>(layer);
      total += std::min<std::uint64_t>(len, k.capacity(len)) * (std::uint64_t{k.k_width} + k.v_width);
    }
  }
  return total;
}

// One fetch into staging. Layer headers are checked against the cache as
// they arrive and give each layer its block (planes back to back, in view
// order) at the same offset in host and device staging. Each chunk is handed
// to the pool: a raw one whose bytes lie in registered memory is checked and
// copied to device staging from where it lies, its loan returned by a
// releaser thread once an event recorded after the copy has passed; one the
// daemon copied into the device window is copied on from there the same way;
// any other is decoded into host staging, its loan returned, and (with device
// staging) copied up from there.
// Callbacks run on the client's reader thread; chunk work on the pool.
class StagedFetch {
 public:
  // `window`: the device window attached to the daemon (empty: none; only
  // with device staging).
  StagedFetch(engine::Device& dev, WorkerPool& pool, std::vector<LayerGeometry> geometry, float* host,
              float* device, std::uint64_t capacity, std::span<const std::byte> window)
      : dev_(dev), pool_(pool), geometry_(std::move(geometry)), host_(host), device_(device), capacity_(capacity),
        window_(device != nullptr ? window : std::span<const std::byte>{}), layers_(geometry_.size()) {
    if (device_ != nullptr) releaser_ = std::thread([this] { ReleaseLoop(); });
  }
  ~StagedFetch() { CloseLoans(); }
  StagedFetch(const StagedFetch&) = delete;
  StagedFetch& operator=(const StagedFetch&) = delete;

  client::FetchCallbacks Callbacks() {
    client::FetchCallbacks cb;
    cb.on_layer = [this](std::uint32_t l, std::span<const std::byte> h, std::uint32_t n) { return OnLayer(l, h, n); };
    cb.on_chunk_held = [this](std::uint32_t l, std::uint32_t i, std::span<const std::byte> b, client::ChunkRelease r) {
      return OnChunk(l, i, b, std::move(r));
    };
    if (!window_.empty()) {
      cb.on_device_chunk = [this](std::uint32_t l, std::uint32_t i, std::uint64_t off, std::uint64_t n,
                                  client::ChunkRelease r) { return OnDeviceChunk(l, i, off, n, std::move(r)); };
    }
    return cb;
  }

  // After Fetch returned `fetched`: waits for every chunk's work and the
  // transfer lane (whatever happened: no copy may outlive the staging), then
  // checks that every layer and chunk arrived.
  Status Finish(Status fetched) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return pending_ == 0; });
    }
    CloseLoans();  // every loan is queued by now; each is returned once its copy ran
    if (device_ != nullptr) {
      Status t = dev_.Synchronize(engine::Lane::kTransfer);
      if (fetched.ok()) fetched = t;
    }
    {
      std::lock_guard lock(mu_);
      if (fetched.ok()) fetched = status_;
    }
    for (std::size_t l = 0; fetched.ok() && l < layers_.size(); ++l) {
      if (!layers_[l].decoder) fetched = Status::Corruption("the entry has no layer " + std::to_string(l));
      for (bool s : layers_[l].seen)
        if (!s && fetched.ok()) fetched = Status::Corruption("layer " + std::to_string(l) + " is missing chunks");
    }
    return fetched;
  }

  // The staged layers as views (of device staging when there is one).
  std::vector<engine::LayerSnapshotView> Views() const {
    std::vector<engine::LayerSnapshotView> v;
    const float* base = device_ != nullptr ? device_ : host_;
    for (const Layer& l : layers_) v.push_back(engine::ViewAt(l.decoder->header().shape, base + l.offset));
    return v;
  }
  std::uint64_t floats() const { return used_; }
  std::uint64_t direct_chunks() const { return direct_.load(); }
  std::uint64_t device_chunks() const { return device_chunks_.load(); }
  std::uint64_t device_chunk_bytes() const { return device_bytes_.load(); }

 private:
  struct Layer {
    std::optional<LayerDecoder> decoder;
    std::uint64_t offset = 0;            // of its block in staging, in floats
    std::vector<std::uint64_t> planes;  // each plane's offset within the block
    std::vector<bool> seen;
  };

  Status OnLayer(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) {
    if (layer >= layers_.size() || layers_[layer].decoder) {
      return Status::Corruption("fetch sent layer " + std::to_string(layer) + " out of place");
    }
    PC_ASSIGN_OR_RETURN(LayerHeader h, ParseLayerHeader(header));
    // The header alone is checked against this cache before any chunk lands.
    PC_RETURN_IF_ERROR(Validate(h, geometry_[layer]).WithContext("layer " + std::to_string(layer)));
    PC_ASSIGN_OR_RETURN(LayerDecoder d, LayerDecoder::Create(std::move(h)));
    if (d.chunk_count() != chunks) return Status::Corruption("layer " + std::to_string(layer) + ": chunk count disagrees");
    Layer& l = layers_[layer];
    l.offset = used_;
    for (const PlaneLayout& p : d.planes()) {
      if (p.values() > capacity_ - used_) return Status::Corruption("fetched layers exceed the boundary's size");
      l.planes.push_back(used_ - l.offset);
      used_ += p.values();
    }
    l.seen.assign(d.chunk_count(), false);
    l.decoder.emplace(std::move(d));
    return Status::Ok();
  }

  // Marks chunk `index` of `layer` as arrived: refused (and released) when
  // it is not one this fetch expects, is there already, or the fetch failed.
  Status Claim(std::uint32_t layer, std::uint32_t index, const client::ChunkRelease& release) {
    if (layer >= layers_.size() || !layers_[layer].decoder || index >= layers_[layer].seen.size() ||
        layers_[layer].seen[index]) {
      release();
      return Status::Corruption("fetch sent chunk " + std::to_string(index) + " of layer " + std::to_string(layer) +
                                " out of place");
    }
    layers_[layer].seen[index] = true;
    std::lock_guard lock(mu_);
    if (!status_.ok()) release();
    return status_;
  }

  Status OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                 client::ChunkRelease release) {
    PC_RETURN_IF_ERROR(Claim(layer, index, release));
    {
      std::lock_guard lock(mu_);
      ++pending_;
    }
    // The layer sits in a vector sized up front: its address holds.
    pool_.Post([this, l = &layers_[layer], layer, index, bytes, release = std::move(release)]() mutable {
      Done(RunChunk(*l, index, bytes, std::move(release)), layer);
    });
    return Status::Ok();
  }

  Status RunChunk(const Layer& l, std::size_t index, std::span<const std::byte> bytes, client::ChunkRelease release) {
    const LayerDecoder& d = *l.decoder;
    const ChunkLocation& loc = d.chunk(index);
    const std::uint64_t at = l.offset + l.planes[loc.plane] + loc.value_offset;
    const std::size_t n = loc.value_count * sizeof(float);
    if (device_ != nullptr && d.ChunkIsRaw(index) && dev_.IsPinned(bytes.data())) {
      Status s = d.CheckEncoded(index, bytes);
      if (s.ok()) s = dev_.UploadAsync(device_ + at, bytes.data(), n, engine::Lane::kTransfer);
      PC_RETURN_IF_ERROR(Lend(s, std::move(release)));
      ++direct_;
      return Status::Ok();
    }
    const std::span<float> plane(host_ + l.offset + l.planes[loc.plane], d.planes()[loc.plane].values());
    Status s = d.DecodeChunk(index, bytes, plane);
    release();
    if (s.ok() && device_ != nullptr) s = dev_.UploadAsync(device_ + at, host_ + at, n, engine::Lane::kTransfer);
    return s;
  }

  // A raw chunk the daemon copied into the device window: checked as if the
  // daemon were hostile (a chunk this fetch expects, stored raw, exactly its
  // size, inside the window; the daemon checked its address over the bytes
  // it copied), then copied on to its place in device staging on the
  // transfer lane, here on the reader thread (an enqueue, no host work); its
  // window space is lent back once the copy has run (the releaser).
  Status OnDeviceChunk(std::uint32_t layer, std::uint32_t index, std::uint64_t offset, std::uint64_t length,
                       client::ChunkRelease release) {
    PC_RETURN_IF_ERROR(Claim(layer, index, release));
    const Layer& l = layers_[layer];
    const LayerDecoder& d = *l.decoder;
    const ChunkLocation& loc = d.chunk(index);
    const std::uint64_t n = loc.value_count * sizeof(float);
    const std::string where = "device chunk " + std::to_string(index) + " of layer " + std::to_string(layer);
    if (!d.ChunkIsRaw(index)) {
      release();
      return Status::Corruption(where + " is not stored raw");
    }
    if (length != n || length != d.header().planes[loc.plane].chunks[loc.index].encoded_bytes ||
        offset > window_.size() || length > window_.size() - offset) {
      release();
      return Status::Corruption(where + ": " + std::to_string(length) + " bytes at " + std::to_string(offset) +
                                " do not fit the chunk or the window");
    }
    const std::uint64_t at = l.offset + l.planes[loc.plane] + loc.value_offset;
    Status s = dev_.CopyOnDevice(device_ + at, window_.data() + offset, n, engine::Lane::kTransfer);
    PC_RETURN_IF_ERROR(Lend(s, std::move(release)));
    ++device_chunks_;
    device_bytes_ += n;
    return Status::Ok();
  }

  // After a copy out of lent memory was enqueued (`copied` its status):
  // queues the loan for the releaser behind an event recorded after the copy
  // (a host callback on the stream would stall the copies behind it for a
  // round trip to the host each). On failure the loan ends now.
  Status Lend(const Status& copied, client::ChunkRelease release) {
    Result<engine::Event> e = copied.ok() ? dev_.Record(engine::Lane::kTransfer) : Result<engine::Event>(copied);
    if (!e.ok()) {
      release();
      return e.status();
    }
    std::lock_guard lock(loan_mu_);
    loans_.push_back({std::move(e).value(), std::move(release)});
    loan_cv_.notify_one();
    return Status::Ok();
  }

  // The releaser: returns each direct chunk's loan once its copy has run,
  // until Finish closes the queue.
  void ReleaseLoop() {
    for (;;) {
      Loan loan;
      {
        std::unique_lock lock(loan_mu_);
        loan_cv_.wait(lock, [&] { return closing_ || !loans_.empty(); });
        if (loans_.empty()) return;
        loan = std::move(loans_.front());
        loans_.pop_front();
      }
      Status s = dev_.Synchronize(loan.copied);
      loan.release();
      if (!s.ok()) Done(s.WithContext("a copy out of the shared region or the device window"), 0, /*counted=*/false);
    }
  }

  void CloseLoans() {
    if (!releaser_.joinable()) return;
    {
      std::lock_guard lock(loan_mu_);
      closing_ = true;
    }
    loan_cv_.notify_all();
    releaser_.join();
  }

  void Done(const Status& s, std::uint32_t layer, bool counted = true) {
    std::lock_guard lock(mu_);
    if (!s.ok() && status_.ok()) status_ = counted ? s.WithContext("layer " + std::to_string(layer)) : s;
    if (counted && --pending_ == 0) cv_.notify_all();
  }

  engine::Device& dev_;
  WorkerPool& pool_;
  const std::vector<LayerGeometry> geometry_;
  float* const host_;
  float* const device_;  // null: host staging only
  const std::uint64_t capacity_;
  const std::span<const std::byte> window_;  // device; empty: no device chunks
  std::vector<Layer> layers_;
  std::uint64_t used_ = 0;
  std::atomic<std::uint64_t> direct_{0};
  std::atomic<std::uint64_t> device_chunks_{0}, device_bytes_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t pending_ = 0;
  Status status_;

  struct Loan {
    engine::Event copied;  // recorded on the transfer lane after the chunk's copy
    client::ChunkRelease release;
  };
  std::mutex loan_mu_;
  std::condition_variable loan_cv_;
  std::deque<Loan> loans_;
  bool closing_ = false;
  std::thread releaser_;  // with device staging
};

// Runs fn(0..n-1) on the pool and waits for all of them; the first error.
Status RunOnPool(WorkerPool& pool, std::size_t n, const std::function<Status(std::size_t)>& fn) {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t left = n;
  Status first;
  for (std::size_t i = 0; i < n; ++i) {
    pool.Post([&, i] {
      Status s = fn(i);
      std::lock_guard lock(mu);
      if (!s.ok() && first.ok()) first = s;
      if (--left == 0) cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  return first;
}

LayerShape ShapeOfView(const engine::LayerSnapshotView& v) {
  return std::visit([](const auto& x) -> LayerShape { return x.shape; }, v);
}

// A view's planes in the codec's stored order (the view's own order).
std::vector<std::span<const float>> PlanesOfView(const engine::LayerSnapshotView& v) {
  if (const auto* l = std::get_if<engine::LatentSnapshotView>(&v)) return {l->latent_rows, l->index_tail_rows, l->pool_keys};
  if (const auto* r = std::get_if<engine::RecurrentSnapshotView>(&v)) return {r->conv_ring, r->state};
  const auto& kv = std::get<engine::KvSnapshotView>(v);
  return {kv.k_rows, kv.v_rows};
}

}  // namespace

client::ModelId PrefixCache::ModelIdFor(const ModelConfig& config, const Weights& weights) {
  // The plan's intrinsic geometry: widths, pools, heads; no capacity or ring
  // size, since a snapshot restores into caches of any capacity that holds it.
  std::vector<LayerGeometry> geometry;
  for (const auto& layer : HybridModel::PlanFor(config, weights).layers) {
    geometry.push_back(engine::GeometryOf(layer, /*max_ctx=*/0, /*booked_ring_rows=*/0));
  }
  ModelFingerprint fp;
  fp.architecture = config.name;
  fp.plan_digest = GeometryDigest(geometry);
  fp.weights_digest = weights.Digest();
  fp.codec_versions = CodecVersionsOf(geometry);
  return client::ModelId{fp.Digest(), config.name, EncodeFingerprint(fp), PrefillCost(config)};
}

PrefixCache::PrefixCache(HybridModel* model, std::unique_ptr<client::Client> client, client::ModelId model_id,
                         PrefixCacheOptions options)
    : model_(model), client_(std::move(client)), model_id_(std::move(model_id)), options_(std::move(options)) {
  using Staging = PrefixCacheOptions::Staging;
  const bool cuda = model_->engine().device().kind() == engine::DeviceKind::kCuda;
  device_staging_ = options_.staging == Staging::kDevice || (options_.staging == Staging::kAuto && cuda);
  if (client_ != nullptr) {
    const std::size_t threads =
        options_.decode_threads != 0 ? options_.decode_threads
                                     : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);
    decode_pool_ = std::make_unique<WorkerPool>(threads);
    encode_pool_ = std::make_unique<WorkerPool>(options_.encode_threads != 0 ? options_.encode_threads
                                                                               : std::max<std::size_t>(threads / 2, 1));
    RegisterRegion();
    AttachWindow();
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
  // Before the client (destroyed after this body) unmaps the region.
  if (registered_ != nullptr) (void)model_->engine().device().UnregisterHost(registered_);
  // The daemon maps the device window while connected: the connection goes
  // first, the window (a member destroyed after this body) after it.
  client_.reset();
}

void PrefixCache::AttachWindow() {
  if (!device_staging_ || client_ == nullptr || options_.device_window_bytes == 0 || window_refused_) return;
  if (!device_window_.empty() || !client_->server_info().device_copies) return;
  engine::Device& dev = model_->engine().device();
  // Its own allocation: the IPC handle names a whole allocation, and the
  // daemon may write anywhere in what it names.
  Result<engine::Memory> window = dev.Allocate(options_.device_window_bytes);
  Result<engine::DeviceExport> exported = window.ok() ? dev.Export(*window) : window.status();
  Status s = exported.status();
  if (s.ok()) {
    s = client_->AttachDeviceWindow({exported->pci_bus_id, exported->handle, options_.device_window_bytes});
  }
  if (!s.ok()) {
    window_refused_ = true;
    spdlog::info("prefix cache: no device window ({}); raw chunks come through the shared region", s.ToString());
    return;
  }
  device_window_ = std::move(window).value();
  spdlog::info("prefix cache: a {} MiB device window is attached: the daemon copies raw chunks into it",
               options_.device_window_bytes >> 20);
}

void PrefixCache::RegisterRegion() {
  if (!device_staging_ || client_ == nullptr) return;
  const client::SharedRegion region = client_->region();
  if (region.base == registered_) return;
  // A new connection: the client attaches a window it had again itself; a
  // daemon that makes device copies only now gets one here.
  AttachWindow();
  engine::Device& dev = model_->engine().device();
  // The old region went with its connection; its registration goes too.
  if (registered_ != nullptr) (void)dev.UnregisterHost(registered_);
  registered_ = nullptr;
  if (region.base == nullptr) return;
  if (Status s = dev.RegisterHost(region.base, region.size); !s.ok()) {
    spdlog::warn("prefix cache: the shared region is not registered with the device ({}); raw chunks go through "
                 "pinned staging",
                 s.ToString());
    return;
  }
  registered_ = region.base;
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

Status PrefixCache::GrowStaging(std::uint64_t bytes) {
  engine::Device& dev = model_->engine().device();
  if (staging_.bytes() < bytes) {
    staging_.Reset();
    PC_ASSIGN_OR_RETURN(staging_, dev.AllocatePinned(bytes));
  }
  if (device_staging_ && device_staging_mem_.bytes() < bytes) {
    device_staging_mem_.Reset();
    PC_ASSIGN_OR_RETURN(device_staging_mem_, dev.Allocate(bytes));
  }
  return Status::Ok();
}

Status PrefixCache::ReserveStaging(std::uint64_t tokens) {
  PC_ASSIGN_OR_RETURN(auto session, model_->NewSession());
  const std::uint64_t bound = StagingFloats(session.cache->plan(), tokens) * sizeof(float);
  PC_RETURN_IF_ERROR(GrowStaging(bound));
  if (client_ == nullptr || !options_.publish) return Status::Ok();
  PC_ASSIGN_OR_RETURN(engine::Memory arena, TakeArena(bound));
  std::lock_guard lock(mu_);
  arenas_.push_back(std::move(arena));
  return Status::Ok();
}

Result<engine::Memory> PrefixCache::TakeArena(std::uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    for (auto it = arenas_.begin(); it != arenas_.end(); ++it) {
      if (it->bytes() < bytes) continue;
      engine::Memory m = std::move(*it);
      arenas_.erase(it);
      return m;
    }
  }
  return model_->engine().device().AllocatePinned(bytes);
}

Result<std::uint64_t> PrefixCache::TryRestore(ModelSession& session, std::span<const std::uint32_t> tokens,
                                              Request* figures) {
  if (client_ == nullptr || tokens.size() < options_.min_prefix) return std::uint64_t{0};
  const auto t_lookup = Clock::now();
  const bool want_shared = options_.publish && options_.publish_branch_points;
  auto found = client_->Lookup(model_id_, tokens, want_shared ? &figures->shared_tokens : nullptr);
  figures->lookup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_lookup).count();
  if (!found.ok()) {
    NoteFailure("lookup", found.status());
    return std::uint64_t{0};
  }
  if (!found->has_value() || (*found)->length < options_.min_prefix) return std::uint64_t{0};
  const std::uint64_t len = (*found)->length;
  engine::SessionCache& cache = *session.cache;
  engine::Device& dev = model_->engine().device();
  // Staging for the planes, grown to this boundary's bound.
  const std::uint64_t bound = StagingFloats(cache.plan(), len) * sizeof(float);
  PC_RETURN_IF_ERROR(GrowStaging(bound));
  RegisterRegion();

  const auto t_fetch = Clock::now();
  StagedFetch fetch(dev, *decode_pool_, cache.Geometry(), staging_.at<float>(0),
                    device_staging_ ? device_staging_mem_.at<float>(0) : nullptr, bound / sizeof(float),
                    std::span(device_window_.at<const std::byte>(0), device_window_.bytes()));
  Status fetched = fetch.Finish(client_->Fetch((*found)->id, {}, fetch.Callbacks()));
  figures->fetch_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_fetch).count();
  figures->direct_chunks = fetch.direct_chunks();
  figures->device_chunks = fetch.device_chunks();
  figures->device_chunk_bytes = fetch.device_chunk_bytes();
  if (!fetched.ok()) {
    NoteFailure("restoring entry " + std::to_string((*found)->id), fetched);
    return std::uint64_t{0};
  }

  const auto t_copy = Clock::now();
  const std::vector<engine::LayerSnapshotView> views = fetch.Views();
  // Restore validates every layer (the one whole-set validation) before the
  // first byte reaches the cache: a refusal leaves the session fresh. A cache
  // that is no longer fresh failed while copying.
  Status restored =
      cache.Restore(views, device_staging_ ? engine::PlaneResidence::kDevice : engine::PlaneResidence::kHost);
  if (!restored.ok() && cache.fresh()) {
    spdlog::warn("prefix cache: entry {} refused: {}", (*found)->id, restored.ToString());
    return std::uint64_t{0};
  }
  PC_RETURN_IF_ERROR(restored);
  PC_RETURN_IF_ERROR(dev.Synchronize(engine::Lane::kCompute));
  session.position = len;
  figures->copy_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_copy).count();
  figures->restored_bytes = fetch.floats() * sizeof(float);
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
  std::vector<float> logits;
  PC_RETURN_IF_ERROR(PrimeRest(r, all_logits, &logits));
  const std::size_t V = model_->config().vocab;
  r.last_logits.assign(logits.end() - static_cast<std::ptrdiff_t>(V), logits.end());
  if (all_logits) r.all_logits = std::move(logits);
  r.prefilled_tokens = prompt.size() - r.restored_tokens;
  r.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (client_ != nullptr && options_.publish && options_.publish_prompt_end) {
    auto cap = r.session.cache->CaptureEager();
    if (cap.ok()) {
      r.capture.emplace(std::move(cap).value());
    } else {
      spdlog::warn("prefix cache: no eager capture of this boundary: {}", cap.status().ToString());
    }
  }
  return r;
}

std::vector<std::uint64_t> PrefixCache::PrefillCuts(const Request& r) const {
  std::vector<std::uint64_t> cuts;
  if (client_ == nullptr || !options_.publish) return cuts;
  const std::uint64_t from = r.restored_tokens, to = r.prompt.size();
  if (options_.publish_branch_points && r.shared_tokens > from && r.shared_tokens < to) cuts.push_back(r.shared_tokens);
  if (const std::uint64_t n = options_.checkpoint_every; n > 0) {
    for (std::uint64_t at = (from / n + 1) * n; at < to; at += n) cuts.push_back(at);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

Status PrefixCache::PrimeRest(Request& r, bool all_logits, std::vector<float>* logits) {
  const std::span<const std::uint32_t> prompt(r.prompt);
  const LogitsWanted want = all_logits ? LogitsWanted::kAll : LogitsWanted::kLast;
  std::uint64_t at = r.restored_tokens;
  // The eager half taken at the previous cut: collected (its trip to host
  // memory done meanwhile, its slot freed) before the next one is taken.
  std::optional<std::pair<std::uint64_t, engine::PendingCapture>> pending;
  auto collect = [&] {
    if (!pending) return;
    auto eager = pending->second.Collect();
    if (eager.ok()) {
      r.prefill_captures.emplace_back(pending->first, std::move(eager).value());
    } else {
      spdlog::warn("prefix cache: boundary at {} tokens lost: {}", pending->first, eager.status().ToString());
    }
    pending.reset();
  };
  for (std::uint64_t cut : PrefillCuts(r)) {
    // Positions before the cut keep their logits only when all are asked for.
    std::vector<float> part;
    PC_RETURN_IF_ERROR(model_->Prime(r.session, prompt.subspan(at, cut - at),
                                     all_logits ? LogitsWanted::kAll : LogitsWanted::kNone,
                                     all_logits ? &part : nullptr));
    logits->insert(logits->end(), part.begin(), part.end());
    at = cut;
    collect();
    auto cap = r.session.cache->CaptureEager();
    if (cap.ok()) {
      pending.emplace(cut, std::move(cap).value());
    } else {
      // A boundary this request would have added; the request goes on.
      spdlog::warn("prefix cache: no capture at {} tokens: {}", cut, cap.status().ToString());
    }
  }
  std::vector<float> rest;
  PC_RETURN_IF_ERROR(model_->Prime(r.session, prompt.subspan(at), want, &rest));
  logits->insert(logits->end(), rest.begin(), rest.end());
  collect();
  return Status::Ok();
}

void PrefixCache::Finish(Request& r, std::span<const std::uint32_t> generated) {
  engine::SessionCache& cache = *r.session.cache;
  for (auto& [length, eager] : r.prefill_captures) {
    QueuePublish(cache, std::move(eager), std::vector<std::uint32_t>(r.prompt.begin(), r.prompt.begin() + length));
  }
  r.prefill_captures.clear();
  if (r.capture) {
    auto eager = r.capture->Collect();
    r.capture.reset();
    if (eager.ok()) {
      QueuePublish(cache, std::move(eager).value(), r.prompt);
    } else {
      spdlog::warn("prefix cache: eager capture lost: {}", eager.status().ToString());
    }
  }
  // The generation's end: off the decode path already, so both halves now.
  const std::uint64_t fed = r.session.position > r.prompt.size() ? r.session.position - r.prompt.size() : 0;
  if (client_ == nullptr || !options_.publish || !options_.publish_generation_end || fed == 0) return;
  if (fed > generated.size()) {
    spdlog::warn("prefix cache: {} tokens fed after the prompt, {} generated given: the generation end is not published",
                 fed, generated.size());
    return;
  }
  std::vector<std::uint32_t> tokens = r.prompt;
  tokens.insert(tokens.end(), generated.begin(), generated.begin() + static_cast<std::ptrdiff_t>(fed));
  auto cap = cache.CaptureEager();
  auto eager = cap.ok() ? cap->Collect() : Result<engine::EagerHalf>(cap.status());
  if (!eager.ok()) {
    spdlog::warn("prefix cache: no capture of the generation's end: {}", eager.status().ToString());
    return;
  }
  QueuePublish(cache, std::move(eager).value(), std::move(tokens));
}

void PrefixCache::QueuePublish(engine::SessionCache& cache, engine::EagerHalf eager, std::vector<std::uint32_t> tokens) {
  // The deferred half downloads into a pinned arena the encoder reads.
  engine::Memory arena;
  const engine::CaptureSpace space = [&](std::uint64_t floats) -> Result<std::span<float>> {
    PC_ASSIGN_OR_RETURN(arena, TakeArena(std::max<std::uint64_t>(floats, 1) * sizeof(float)));
    return std::span<float>(arena.at<float>(0), floats);
  };
  auto layers = cache.CompleteCaptureInto(std::move(eager), space);
  if (!layers.ok()) {
    spdlog::warn("prefix cache: boundary of {} tokens not published: {}", tokens.size(), layers.status().ToString());
    if (!arena.empty()) {
      std::lock_guard lock(mu_);
      arenas_.push_back(std::move(arena));
    }
    return;
  }
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Job{std::move(tokens), std::move(arena), std::move(layers).value()});
  }
  cv_.notify_all();
}

std::size_t PrefixCache::Drain() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  return failed_;
}

Status PrefixCache::Publish(std::span<const std::uint32_t> tokens, const std::vector<LayerSnapshot>& layers) {
  const std::vector<engine::LayerSnapshotView> views = engine::ViewsOf(layers);
  return Publish(tokens, views);
}

Status PrefixCache::Publish(std::span<const std::uint32_t> tokens, std::span<const engine::LayerSnapshotView> layers) {
  if (client_ == nullptr) return Status::Unavailable("prefix cache: no daemon");
  std::lock_guard publishing(publish_mu_);  // one publish at a time: the scratch is shared
  PC_ASSIGN_OR_RETURN(auto stream,
                      client_->BeginPublish(model_id_, tokens, static_cast<std::uint32_t>(layers.size())));
  for (const engine::LayerSnapshotView& view : layers) PC_RETURN_IF_ERROR(PublishLayer(*stream, view));
  return stream->Commit().status();
}

// Every chunk is written once, by the encoder (chunks in parallel on the
// encode pool), reading the planes where they lie. The header (which records
// every chunk) goes first, so a layer's chunks are all encoded before any is
// sent: into space reserved in the client's shared region when the layer
// fits in part of its publish half (nothing is copied again), else into the
// scratch, from which AddChunk copies them into the region.
Status PrefixCache::PublishLayer(client::PublishStream& stream, const engine::LayerSnapshotView& view) {
  PC_ASSIGN_OR_RETURN(LayerEncoder enc, LayerEncoder::Create(ShapeOfView(view), PlanesOfView(view), options_.encode));
  const std::size_t n = enc.chunk_count();
  // The client hands out region space in 4 KiB extents (ReservedChunk).
  constexpr std::uint64_t kExtent = 4096;
  std::uint64_t room = 0, extents = 0;
  for (std::size_t i = 0; i < n; ++i) {
    room += enc.MaxChunkBytes(i);
    extents += (enc.MaxChunkBytes(i) + kExtent - 1) / kExtent * kExtent;
  }
  const client::SharedRegion region = client_->region();
  // A layer's reservations are all held at once: three quarters of the publish
  // half at most, so one layer never waits on space only its own chunks hold.
  const bool in_place = region.base != nullptr && extents <= region.size / 2 / 4 * 3;
  std::vector<client::ReservedChunk> reserved;
  std::vector<std::span<std::byte>> space(n);
  if (!in_place && chunk_scratch_.size() < room) chunk_scratch_.resize(room);
  for (std::size_t i = 0, at = 0; i < n; at += enc.MaxChunkBytes(i), ++i) {
    if (in_place) {
      PC_ASSIGN_OR_RETURN(client::ReservedChunk rc, stream.ReserveChunk(enc.MaxChunkBytes(i)));
      space[i] = rc.bytes();
      reserved.push_back(std::move(rc));
    } else {
      space[i] = std::span(chunk_scratch_).subspan(at, enc.MaxChunkBytes(i));
    }
  }
  std::vector<std::size_t> sizes(n);
  PC_RETURN_IF_ERROR(RunOnPool(*encode_pool_, n, [&](std::size_t i) -> Status {
    PC_ASSIGN_OR_RETURN(sizes[i], enc.EncodeChunk(i, space[i]));
    return Status::Ok();
  }));
  PC_ASSIGN_OR_RETURN(LayerHeader header, enc.Finish());
  const std::string h = SerializeLayerHeader(header);
  PC_RETURN_IF_ERROR(stream.BeginLayer(AsBytes(h), static_cast<std::uint32_t>(n)));
  for (std::size_t i = 0; i < n; ++i) {
    PC_RETURN_IF_ERROR(in_place ? stream.AddReservedChunk(std::move(reserved[i]), sizes[i])
                                : stream.AddChunk(space[i].first(sizes[i])));
    published_bytes_ += sizes[i];
  }
  if (in_place) in_place_layers_ += 1;
  return Status::Ok();
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
    Status s = Publish(job.tokens, job.layers);
    {
      std::lock_guard lock(mu_);
      busy_ = false;
      arenas_.push_back(std::move(job.arena));
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

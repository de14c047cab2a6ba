// PrefixCache is split by concern: this file sets it up (the model's id, the
// pools, the shared region, the device window) and keeps its resources;
// prefix_cache_restore.cc looks a prompt up and restores it (through
// StagedFetch, staged_fetch.h); prefix_cache_publish.cc captures boundaries
// and publishes them.
#include "serving/prefix_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

namespace primecache::model {

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

}  // namespace primecache::model

#include "serving/staged_fetch.h"

#include "primecache/internal/shard.h"

#include <algorithm>
#include <string>
#include <utility>

namespace primecache::model {

StagedFetch::StagedFetch(engine::Device& dev, WorkerPool& pool, std::vector<LayerGeometry> geometry, float* host,
                         float* device, std::uint64_t capacity, std::span<const std::byte> window)
    : dev_(dev), pool_(pool), geometry_(std::move(geometry)), host_(host), device_(device), capacity_(capacity),
      window_(device != nullptr ? window : std::span<const std::byte>{}), layers_(geometry_.size()) {
  if (device_ != nullptr) releaser_ = std::thread([this] { ReleaseLoop(); });
}

client::FetchCallbacks StagedFetch::Callbacks() {
  client::FetchCallbacks cb;
  cb.on_layer = [this](std::uint32_t l, std::span<const std::byte> h, std::uint32_t n) { return OnLayer(l, h, n); };
  cb.on_chunk_held = [this](std::uint32_t l, std::uint32_t i, std::span<const std::byte> b, client::ChunkRelease r) {
    return OnChunk(l, i, b, std::move(r));
  };
  if (!window_.empty()) {
    cb.on_device_extent = [this](const client::DeviceExtent& x, client::ChunkRelease r) {
      return OnDeviceExtent(x, std::move(r));
    };
  }
  return cb;
}

Status StagedFetch::Finish(Status fetched) {
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

std::vector<engine::LayerSnapshotView> StagedFetch::Views() const {
  std::vector<engine::LayerSnapshotView> v;
  const float* base = device_ != nullptr ? device_ : host_;
  if (!gathered_.empty()) {
    for (const auto& [shape, offset] : gathered_) v.push_back(engine::ViewAt(shape, base + offset));
    return v;
  }
  for (const Layer& l : layers_) v.push_back(engine::ViewAt(l.decoder->header().shape, base + l.offset));
  return v;
}

namespace {

// A block of `rows` rows of `width` values, rows `src_pitch` and
// `dst_pitch` apart, from `src` in a part's block to `dst` in the layer's.
struct PartBlock {
  std::uint64_t src = 0, dst = 0, rows = 0, width = 0, src_pitch = 0, dst_pitch = 0;
};

// Where part j of n, of shape `part`, lies in the whole layer, both with
// their planes back to back in view order. KDA: the conv ring's q, k and v
// planes each take the part's run of channels, the state its run of heads;
// KV: each K and V row takes the part's columns.
std::vector<PartBlock> PartBlocks(const LayerShape& part, std::uint64_t n, std::uint64_t j) {
  if (const auto* r = std::get_if<RecurrentShape>(&part)) {
    const std::uint64_t conv = r->conv_values() / 3, state = r->state_values();
    return {{0, j * conv, 3, conv, conv, n * conv},
            {3 * conv, 3 * n * conv + j * state, 1, state, state, state}};
  }
  const auto& kv = std::get<KvShape>(part);
  const std::uint64_t rows = kv.held_rows(), k = kv.k_width, v = kv.v_width;
  return {{0, j * k, rows, k, k, n * k}, {rows * k, rows * n * k + j * v, rows, v, v, n * v}};
}

}  // namespace

Status StagedFetch::GatherParts(std::span<const std::vector<std::uint32_t>> parts) {
  float* base = device_ != nullptr ? device_ : host_;
  std::vector<bool> taken(layers_.size(), false);
  for (std::size_t m = 0; m < parts.size(); ++m) {
    const std::string where = "layer " + std::to_string(m);
    if (parts[m].empty()) return Status::InvalidArgument(where + ": no parts");
    for (std::uint32_t i : parts[m]) {
      if (i >= layers_.size() || taken[i] || !layers_[i].decoder)
        return Status::InvalidArgument(where + ": part " + std::to_string(i) + " out of place");
      taken[i] = true;
    }
    const LayerShape& part = layers_[parts[m][0]].decoder->header().shape;
    if (parts[m].size() == 1) {
      gathered_.emplace_back(part, layers_[parts[m][0]].offset);
      continue;
    }
    const auto n = static_cast<std::uint32_t>(parts[m].size());
    PC_ASSIGN_OR_RETURN(LayerShape whole, WholeShape(part, n));
    const std::uint64_t floats = engine::ViewFloats(whole);
    if (!IsSharded(part) || floats > capacity_ - used_)
      return Status::Corruption(where + ": its parts do not gather into the staging");
    for (std::uint32_t j = 0; j < n; ++j) {
      const Layer& l = layers_[parts[m][j]];
      if (!(l.decoder->header().shape == part))
        return Status::Corruption(where + ": its parts differ in shape");
      for (const PartBlock& b : PartBlocks(part, n, j)) {
        const float* from = base + l.offset + b.src;
        float* to = base + used_ + b.dst;
        if (device_ != nullptr) {
          PC_RETURN_IF_ERROR(dev_.CopyOnDevice2D(to, b.dst_pitch * sizeof(float), from,
                                                 b.src_pitch * sizeof(float), b.width * sizeof(float), b.rows,
                                                 engine::Lane::kTransfer));
        } else {
          for (std::uint64_t r = 0; r < b.rows; ++r)
            std::copy_n(from + r * b.src_pitch, b.width, to + r * b.dst_pitch);
        }
      }
    }
    gathered_.emplace_back(whole, used_);
    used_ += floats;
  }
  if (device_ != nullptr) PC_RETURN_IF_ERROR(dev_.Synchronize(engine::Lane::kTransfer));
  return Status::Ok();
}

Status StagedFetch::OnLayer(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) {
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

Status StagedFetch::Claim(std::uint32_t layer, std::uint32_t index, const client::ChunkRelease& release) {
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

Status StagedFetch::OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
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

Status StagedFetch::RunChunk(const Layer& l, std::size_t index, std::span<const std::byte> bytes,
                             client::ChunkRelease release) {
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

Status StagedFetch::OnDeviceExtent(const client::DeviceExtent& x, client::ChunkRelease release) {
  const std::string where = "device chunks " + std::to_string(x.index) + " + " + std::to_string(x.count) +
                            " of layer " + std::to_string(x.layer);
  if (x.offset > window_.size() || x.length > window_.size() - x.offset) {
    release();
    return Status::Corruption(where + ": " + std::to_string(x.length) + " bytes at " + std::to_string(x.offset) +
                              " do not fit the window");
  }
  // Every chunk is checked before any is copied: one this fetch expects,
  // stored raw, exactly its size; runs whose places in staging follow each
  // other go in one copy.
  struct Run {
    std::uint64_t at = 0, from = 0, bytes = 0;  // staging (floats), window offset, bytes
  };
  std::vector<Run> runs;
  std::uint64_t from = x.offset;
  for (std::uint32_t i = 0; i < x.count; ++i) {
    const std::uint32_t index = x.index + i;
    PC_RETURN_IF_ERROR(Claim(x.layer, index, release));
    const Layer& l = layers_[x.layer];
    const LayerDecoder& d = *l.decoder;
    const ChunkLocation& loc = d.chunk(index);
    const std::uint64_t n = loc.value_count * sizeof(float);
    if (!d.ChunkIsRaw(index)) {
      release();
      return Status::Corruption(where + ": chunk " + std::to_string(index) + " is not stored raw");
    }
    if (x.sizes[i] != n || n != d.header().planes[loc.plane].chunks[loc.index].encoded_bytes) {
      release();
      return Status::Corruption(where + ": chunk " + std::to_string(index) + " of " + std::to_string(x.sizes[i]) +
                                " bytes is not the stored chunk's size");
    }
    const std::uint64_t at = l.offset + l.planes[loc.plane] + loc.value_offset;
    if (!runs.empty() && runs.back().at + runs.back().bytes / sizeof(float) == at) {
      runs.back().bytes += n;
    } else {
      runs.push_back({at, from, n});
    }
    from += n;
  }
  Status s;
  for (const Run& r : runs) {
    if (s.ok()) s = dev_.CopyOnDevice(device_ + r.at, window_.data() + r.from, r.bytes, engine::Lane::kTransfer);
  }
  if (!s.ok()) (void)dev_.Synchronize(engine::Lane::kTransfer);  // the runs copied before are done with the space
  PC_RETURN_IF_ERROR(Lend(s, std::move(release)));
  device_chunks_ += x.count;
  device_bytes_ += x.length;
  ++device_extents_;
  return Status::Ok();
}

Status StagedFetch::Lend(const Status& copied, client::ChunkRelease release) {
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

void StagedFetch::ReleaseLoop() {
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

void StagedFetch::CloseLoans() {
  if (!releaser_.joinable()) return;
  {
    std::lock_guard lock(loan_mu_);
    closing_ = true;
  }
  loan_cv_.notify_all();
  releaser_.join();
}

void StagedFetch::Done(const Status& s, std::uint32_t layer, bool counted) {
  std::lock_guard lock(mu_);
  if (!s.ok() && status_.ok()) status_ = counted ? s.WithContext("layer " + std::to_string(layer)) : s;
  if (counted && --pending_ == 0) cv_.notify_all();
}

std::uint64_t StagingFloats(const engine::StatePlan& plan, std::uint64_t len, bool sharded_only) {
  std::uint64_t total = 0;
  for (const auto& layer : plan.layers) {
    if (const auto* l = std::get_if<engine::LatentPlan>(&layer)) {
      if (sharded_only) continue;
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

Result<LayerGeometry> PartGeometry(const LayerGeometry& layer, std::uint32_t parts) {
  if (parts == 0) return Status::InvalidArgument("a layer in 0 parts");
  if (const auto* r = std::get_if<RecurrentShape>(&layer); r != nullptr && r->heads % parts == 0) {
    RecurrentShape part = *r;
    part.heads /= parts;
    return LayerGeometry{part};
  }
  if (const auto* kv = std::get_if<KvGeometry>(&layer);
      kv != nullptr && kv->k_width % parts == 0 && kv->v_width % parts == 0) {
    KvGeometry part = *kv;
    part.k_width /= parts;
    part.v_width /= parts;
    return LayerGeometry{part};
  }
  return Status::InvalidArgument("a layer that does not split into " + std::to_string(parts) +
                                 " head-group parts");
}

}  // namespace primecache::model

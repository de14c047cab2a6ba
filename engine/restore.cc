// Restore: validate every layer without touching anything, then copy into a
// fresh cache.
#include <string>
#include <type_traits>
#include <utility>

#include "engine/device.h"
#include "engine/engine_core.h"
#include "engine/layer_state.h"
#include "engine/session_state.h"
#include "primecache/internal/engine.h"

namespace primecache::engine {
namespace {

std::string N(std::uint64_t v) {
  return std::to_string(v);
}

void Add(std::string* problems, const std::string& what) {
  if (!problems->empty()) *problems += "; ";
  *problems += what;
}

void PlaneSize(std::string* p, const char* plane, std::size_t have, std::uint64_t want) {
  if (have != want) Add(p, std::string(plane) + " holds " + N(have) + " floats, the shape says " + N(want));
}

// The plane sizes of a view against its shape (CheckSnapshot for views).
// Meaningful only once the shape passed CheckShape.
std::string PlaneProblems(const LayerSnapshotView& v) {
  std::string p;
  if (const auto* l = std::get_if<LatentSnapshotView>(&v)) {
    PlaneSize(&p, "latent_rows", l->latent_rows.size(), l->shape.latent_values());
    PlaneSize(&p, "index_tail_rows", l->index_tail_rows.size(), l->shape.tail_values());
    PlaneSize(&p, "pool_keys", l->pool_keys.size(), l->shape.pool_key_values());
  } else if (const auto* r = std::get_if<RecurrentSnapshotView>(&v)) {
    PlaneSize(&p, "conv_ring", r->conv_ring.size(), r->shape.conv_values());
    PlaneSize(&p, "state", r->state.size(), r->shape.state_values());
  } else {
    const auto& kv = std::get<KvSnapshotView>(v);
    PlaneSize(&p, "k_rows", kv.k_rows.size(), kv.shape.k_values());
    PlaneSize(&p, "v_rows", kv.v_rows.size(), kv.shape.v_values());
  }
  return p;
}

}  // namespace

LayerShape ShapeOfView(const LayerSnapshotView& v) {
  return std::visit([](const auto& x) -> LayerShape { return x.shape; }, v);
}

std::vector<std::span<const float>> PlanesOfView(const LayerSnapshotView& v) {
  if (const auto* l = std::get_if<LatentSnapshotView>(&v))
    return {l->latent_rows, l->index_tail_rows, l->pool_keys};
  if (const auto* r = std::get_if<RecurrentSnapshotView>(&v)) return {r->conv_ring, r->state};
  const auto& kv = std::get<KvSnapshotView>(v);
  return {kv.k_rows, kv.v_rows};
}

LayerSnapshotView ViewOf(const LayerSnapshot& layer) {
  if (const auto* l = std::get_if<LatentSnapshot>(&layer)) {
    return LatentSnapshotView{l->shape, l->latent_rows, l->index_tail_rows, l->pool_keys};
  }
  if (const auto* r = std::get_if<RecurrentSnapshot>(&layer))
    return RecurrentSnapshotView{r->shape, r->conv_ring, r->state};
  const auto& kv = std::get<KvSnapshot>(layer);
  return KvSnapshotView{kv.shape, kv.k_rows, kv.v_rows};
}

std::uint64_t ViewFloats(const LayerShape& shape) {
  if (const auto* l = std::get_if<LatentShape>(&shape))
    return l->latent_values() + l->tail_values() + l->pool_key_values();
  if (const auto* r = std::get_if<RecurrentShape>(&shape)) return r->conv_values() + r->state_values();
  const auto& kv = std::get<KvShape>(shape);
  return kv.k_values() + kv.v_values();
}

LayerSnapshotView ViewAt(const LayerShape& shape, const float* base) {
  auto take = [&base](std::uint64_t n) {
    std::span<const float> s(base, n);
    base += n;
    return s;
  };
  if (const auto* l = std::get_if<LatentShape>(&shape)) {
    auto rows = take(l->latent_values());
    auto tail = take(l->tail_values());
    return LatentSnapshotView{*l, rows, tail, take(l->pool_key_values())};
  }
  if (const auto* r = std::get_if<RecurrentShape>(&shape)) {
    auto conv = take(r->conv_values());
    return RecurrentSnapshotView{*r, conv, take(r->state_values())};
  }
  const auto& kv = std::get<KvShape>(shape);
  auto k = take(kv.k_values());
  return KvSnapshotView{kv, k, take(kv.v_values())};
}

std::vector<LayerSnapshotView> ViewsOf(std::span<const LayerSnapshot> layers) {
  std::vector<LayerSnapshotView> v;
  v.reserve(layers.size());
  for (const LayerSnapshot& l : layers) v.push_back(ViewOf(l));
  return v;
}

std::vector<LayerGeometry> RestoreGeometry(const ReserveRequest& request) {
  std::vector<LayerGeometry> g;
  g.reserve(request.plan.layers.size());
  for (const LayerPlan& lp : request.plan.layers) {
    g.push_back(GeometryOf(lp, request.max_ctx, request.index_ring_rows));
  }
  return g;
}

Status ValidateRestore(std::span<const LayerSnapshotView> layers, std::span<const LayerGeometry> targets) {
  std::string problems;
  if (layers.size() != targets.size()) {
    Add(&problems, N(layers.size()) + " layers; the cache has " + N(targets.size()));
  }
  bool have_len = false;
  std::uint64_t boundary = 0;
  std::size_t boundary_layer = 0;
  for (std::size_t i = 0; i < layers.size() && i < targets.size(); ++i) {
    const LayerShape shape = ShapeOfView(layers[i]);
    Status st = Validate(shape, targets[i]);
    if (!st.ok()) {
      Add(&problems, "layer " + N(i) + ": " + st.message());
      continue;
    }
    const std::string planes = PlaneProblems(layers[i]);
    if (!planes.empty()) Add(&problems, "layer " + N(i) + ": " + planes);
    std::uint64_t len = 0;
    if (const auto* l = std::get_if<LatentShape>(&shape)) len = l->len;
    if (const auto* kv = std::get_if<KvShape>(&shape)) len = kv->len;
    if (std::holds_alternative<RecurrentShape>(shape)) continue;
    if (have_len && len != boundary) {
      Add(&problems, "layer " + N(i) + ": len " + N(len) + " != len " + N(boundary) + " of layer " +
                         N(boundary_layer) + " (one boundary per snapshot)");
    } else if (!have_len) {
      have_len = true;
      boundary = len;
      boundary_layer = i;
    }
  }
  if (!problems.empty()) return Status::InvalidArgument("restore: " + problems);
  return Status::Ok();
}

// ---- SessionState ----------------------------------------------------------------

std::vector<LayerGeometry> SessionState::Geometry() const {
  return RestoreGeometry(core_->plan.request);
}

Status SessionState::ValidateRestore(std::span<const LayerSnapshotView> layers) const {
  if (!fresh()) {
    return Status::FailedPrecondition("restore needs a fresh session cache; session " + N(id_) +
                                      (broken_.empty() ? " already holds state" : " is broken: " + broken_));
  }
  const std::vector<LayerGeometry> g = Geometry();
  return engine::ValidateRestore(layers, g);
}

Status SessionState::ValidateRestore(std::span<const LayerSnapshot> layers) const {
  const std::vector<LayerSnapshotView> v = ViewsOf(layers);
  return ValidateRestore(v);
}

Status SessionState::ValidateRestore(const BoundarySnapshot& snapshot) const {
  std::vector<LayerShape> shapes;
  for (const LayerSnapshot& l : snapshot.layers) shapes.push_back(ShapeOf(l));
  PC_RETURN_IF_ERROR(CheckBoundary(snapshot.header, shapes).WithContext("restore: boundary"));
  return ValidateRestore(std::span<const LayerSnapshot>(snapshot.layers));
}

Status SessionState::Restore(const BoundarySnapshot& snapshot) {
  std::vector<LayerShape> shapes;
  for (const LayerSnapshot& l : snapshot.layers) shapes.push_back(ShapeOf(l));
  PC_RETURN_IF_ERROR(CheckBoundary(snapshot.header, shapes).WithContext("restore: boundary"));
  return Restore(std::span<const LayerSnapshot>(snapshot.layers));
}

Status SessionState::Restore(std::span<const LayerSnapshot> layers) {
  const std::vector<LayerSnapshotView> v = ViewsOf(layers);
  return Restore(v);
}

Status SessionState::Restore(std::span<const LayerSnapshotView> layers, PlaneResidence residence) {
  PC_RETURN_IF_ERROR(ValidateRestore(layers));
  Device& dev = *core_->device;
  // Planes staged on the device are copied there; pinned planes go up
  // asynchronously and the lane is drained once at the end; pageable ones go
  // through the device's pinned staging.
  auto upload = [&dev, residence](void* dst, std::span<const float> src) -> Status {
    if (src.empty()) return Status::Ok();
    if (residence == PlaneResidence::kDevice)
      return dev.CopyOnDevice(dst, src.data(), src.size_bytes(), Lane::kCompute);
    if (dev.IsPinned(src.data())) return dev.UploadAsync(dst, src.data(), src.size_bytes(), Lane::kCompute);
    return dev.Upload(dst, src.data(), src.size_bytes(), Lane::kCompute);
  };
  Status st;
  for (std::size_t i = 0; i < layers_.size() && st.ok(); ++i) {
    if (LatentLayerState* l = LayerAt<LatentLayerState>(layers_, i)) {
      const auto& v = std::get<LatentSnapshotView>(layers[i]);
      const LatentShape& s = v.shape;
      l->touched_ = true;
      st = upload(l->rows_, v.latent_rows);
      if (st.ok() && l->plan_.has_indexer()) {
        st = l->ResolvePool(s.pool);
        if (st.ok()) st = upload(l->keys_, v.pool_keys);
        const std::uint64_t first = s.pools_ready * s.pool, tail = s.len - first;
        if (st.ok() && tail != 0) {
          // Up into the layer's scratch in logical order, then out to the
          // physical ring (or flat) addresses.
          st = upload(l->tail_scratch_, v.index_tail_rows);
          kernels::RingRowsArgs a{
              l->index_, l->tail_scratch_, s.index_width, l->ring_ ? l->ring_rows_ : 0, first, tail};
          if (st.ok()) st = dev.ScatterRows(a, Lane::kCompute);
        }
        l->pools_ready_ = s.pools_ready;
        // Rows under the tail were never restored; their pools' keys are final.
        l->floor_ = first;
      }
      l->len_ = s.len;
      if (st.ok()) st = l->WriteLen();
    } else if (RecurrentLayerState* r = LayerAt<RecurrentLayerState>(layers_, i)) {
      const auto& v = std::get<RecurrentSnapshotView>(layers[i]);
      r->touched_ = true;
      st = upload(r->conv_, v.conv_ring);
      if (st.ok()) st = upload(r->state_[r->cur_], v.state);
    } else {
      KvLayerState* kv = LayerAt<KvLayerState>(layers_, i);
      const auto& v = std::get<KvSnapshotView>(layers[i]);
      kv->touched_ = true;
      // Held rows in logical order, to their physical rows (one run when plain).
      const std::uint64_t held = v.shape.held_rows(), first = v.shape.len - held;
      const std::uint64_t kw = v.shape.k_width, vw = v.shape.v_width;
      for (const RingRun& r : RingRuns(first, held, kv->rows_)) {
        if (st.ok()) st = upload(kv->k_ + r.physical * kw, v.k_rows.subspan(r.offset * kw, r.rows * kw));
        if (st.ok()) st = upload(kv->v_ + r.physical * vw, v.v_rows.subspan(r.offset * vw, r.rows * vw));
      }
      kv->len_ = v.shape.len;
      kv->lo_ = first;
      if (st.ok()) st = kv->WriteLen();
    }
  }
  if (st.ok()) st = dev.Synchronize(Lane::kCompute);
  if (!st.ok()) {
    broken_ = "a restore failed while copying: " + st.ToString();
    return st.WithContext("restore");
  }
  return Status::Ok();
}

}  // namespace primecache::engine

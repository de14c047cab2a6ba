// Capture: the full snapshot, the eager half through a snapshot slot, and the
// deferred half that joins it at the captured boundary.
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

// Registers a capture's watch with a layer, dropping the watches of captures
// that are gone (a session that is captured often and never rewinds would
// otherwise collect them).
void AddWatch(std::vector<std::weak_ptr<RewindWatch>>* watches, const std::shared_ptr<RewindWatch>& w) {
  std::erase_if(*watches, [](const std::weak_ptr<RewindWatch>& x) { return x.expired(); });
  watches->push_back(w);
}

Status LayerRefusal(std::size_t i, const std::string& why) {
  return Status::FailedPrecondition("layer " + N(i) + ": " + why);
}

// The eager capture of a rotating layer: its held rows of the committed
// state, copied on the device into the slot in logical order.
Status CopyRotatingToSlot(Device& dev, const KvLayerState& kv, float* k_dst, float* v_dst) {
  const std::uint64_t kw = kv.plan().k_width, vw = kv.plan().v_width;
  for (const KvCacheLayer::RowRun& r : kv.CommittedRuns()) {
    PC_RETURN_IF_ERROR(dev.CopyOnDevice(k_dst + r.offset * kw, r.k, r.rows * kw * sizeof(float), Lane::kCompute));
    PC_RETURN_IF_ERROR(dev.CopyOnDevice(v_dst + r.offset * vw, r.v, r.rows * vw * sizeof(float), Lane::kCompute));
  }
  return Status::Ok();
}

template <typename T>
std::vector<T> ToVector(const T* host, std::size_t n) {
  return std::vector<T>(host, host + n);
}

}  // namespace

// ---- preconditions ------------------------------------------------------------

Status SessionState::CheckCapturable() const {
  if (!broken_.empty()) return Status::FailedPrecondition("session cache is broken: " + broken_);
  std::uint64_t boundary = 0;
  bool have = false;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::uint64_t len = 0;
    if (const LatentLayerState* l = LayerAt<LatentLayerState>(layers_, i)) {
      if (l->plan().has_indexer() && l->pool() == 0)
        return LayerRefusal(i, "the indexer's pool is unresolved");
      PC_RETURN_IF_ERROR(l->CheckInvariants().WithContext("layer " + N(i)));
      len = l->committed_len();
    } else if (const KvLayerState* kv = LayerAt<KvLayerState>(layers_, i)) {
      PC_RETURN_IF_ERROR(kv->CheckInvariants().WithContext("layer " + N(i)));
      len = kv->committed_len();
    } else {
      continue;
    }
    if (len == 0) return LayerRefusal(i, "len 0: nothing to capture");
    if (have && len != boundary) {
      return LayerRefusal(
          i, "len " + N(len) + " != len " + N(boundary) + " of the layers before it (not a call boundary)");
    }
    boundary = len;
    have = true;
  }
  return Status::Ok();
}

// ---- where a capture's planes come from ----------------------------------------

// One copy of a capture: `values` floats from device memory (device non-null)
// or host memory (host) into plane `plane` of the layer's view, at `offset`.
struct SessionState::Sources {
  struct Run {
    std::size_t plane = 0;
    std::uint64_t offset = 0, values = 0;
    const float* device = nullptr;
    const float* host = nullptr;
  };
  std::vector<LayerShape> shapes;
  std::vector<std::vector<Run>> runs;  // per layer

  void FromDevice(std::size_t plane, std::uint64_t offset, const float* src, std::uint64_t values) {
    if (values != 0) runs.back().push_back({plane, offset, values, src, nullptr});
  }
  void FromHost(std::size_t plane, std::span<const float> src) {
    if (!src.empty()) runs.back().push_back({plane, 0, src.size(), nullptr, src.data()});
  }
  void NewLayer(LayerShape shape) {
    shapes.push_back(shape);
    runs.emplace_back();
  }
};

namespace {

// The planes of a layer of `shape` in view order, carved out of `base`.
std::vector<std::span<float>> PlanesAt(const LayerShape& shape, float* base) {
  std::vector<std::span<float>> planes;
  const LayerSnapshotView v = ViewAt(shape, base);
  std::visit(
      [&](const auto& view) {
        using V = std::decay_t<decltype(view)>;
        auto add = [&](std::span<const float> p) { planes.emplace_back(const_cast<float*>(p.data()), p.size()); };
        if constexpr (std::is_same_v<V, LatentSnapshotView>) {
          add(view.latent_rows), add(view.index_tail_rows), add(view.pool_keys);
        } else if constexpr (std::is_same_v<V, RecurrentSnapshotView>) {
          add(view.conv_ring), add(view.state);
        } else {
          add(view.k_rows), add(view.v_rows);
        }
      },
      v);
  return planes;
}

// A snapshot's planes in view order.
std::vector<std::span<float>> PlanesOf(LayerSnapshot& layer) {
  if (auto* l = std::get_if<LatentSnapshot>(&layer)) return {l->latent_rows, l->index_tail_rows, l->pool_keys};
  if (auto* r = std::get_if<RecurrentSnapshot>(&layer)) return {r->conv_ring, r->state};
  auto& kv = std::get<KvSnapshot>(layer);
  return {kv.k_rows, kv.v_rows};
}

// Every run of `src` into `dst` (per layer, its planes in view order). Runs
// into pinned memory are enqueued on the compute lane back to back and the
// lane is waited for once; pageable destinations go through the device's
// staging, one run at a time.
Status DownloadSources(Device& dev, const SessionState::Sources& src,
                       const std::vector<std::vector<std::span<float>>>& dst) {
  bool async = false;
  for (std::size_t l = 0; l < src.runs.size(); ++l) {
    for (const auto& r : src.runs[l]) {
      const std::span<float> to = dst[l][r.plane].subspan(r.offset, r.values);
      if (r.host != nullptr) {
        std::memcpy(to.data(), r.host, r.values * sizeof(float));
      } else if (dev.IsPinned(to.data())) {
        PC_RETURN_IF_ERROR(dev.DownloadAsync(to.data(), r.device, to.size_bytes(), Lane::kCompute));
        async = true;
      } else {
        PC_RETURN_IF_ERROR(dev.Download(to.data(), r.device, to.size_bytes(), Lane::kCompute));
      }
    }
  }
  return async ? dev.Synchronize(Lane::kCompute) : Status::Ok();
}

// The sources as snapshots of their own (pageable vectors).
Result<std::vector<LayerSnapshot>> ToSnapshots(Device& dev, const SessionState::Sources& src) {
  std::vector<LayerSnapshot> out;
  std::vector<std::vector<std::span<float>>> dst;
  out.reserve(src.shapes.size());
  for (const LayerShape& shape : src.shapes) {
    PC_ASSIGN_OR_RETURN(LayerSnapshot s, MakeSnapshot(shape));
    out.push_back(std::move(s));
    dst.push_back(PlanesOf(out.back()));
  }
  PC_RETURN_IF_ERROR(DownloadSources(dev, src, dst));
  return out;
}

// The sources into one block from `space`, as views of it.
Result<std::vector<LayerSnapshotView>> ToBlock(Device& dev, const SessionState::Sources& src,
                                               const CaptureSpace& space) {
  std::uint64_t floats = 0;
  for (const LayerShape& shape : src.shapes) floats += ViewFloats(shape);
  PC_ASSIGN_OR_RETURN(std::span<float> block, space(floats));
  if (block.size() < floats) {
    return Status::InvalidArgument("capture space of " + N(block.size()) + " floats; the capture takes " + N(floats));
  }
  std::vector<std::vector<std::span<float>>> dst;
  std::vector<LayerSnapshotView> views;
  float* at = block.data();
  for (const LayerShape& shape : src.shapes) {
    dst.push_back(PlanesAt(shape, at));
    views.push_back(ViewAt(shape, at));
    at += ViewFloats(shape);
  }
  PC_RETURN_IF_ERROR(DownloadSources(dev, src, dst));
  return views;
}

// A KV layer's held rows at a boundary of `len` tokens, in logical order:
// rows [0, len) of a plain layer, the committed state's held rows of a
// rotating one (len is then its committed len).
void KvSources(const KvLayerState& kv, std::uint64_t len, SessionState::Sources* src) {
  const KvPlan& p = kv.plan();
  const bool rot = p.format.rotating();
  const KvShape shape{len, p.k_width, p.v_width, p.format, rot ? len - kv.committed_first_held() : 0};
  src->NewLayer(shape);
  if (!rot) {
    src->FromDevice(0, 0, kv.k_rows(), len * p.k_width);
    src->FromDevice(1, 0, kv.v_rows(), len * p.v_width);
    return;
  }
  for (const KvCacheLayer::RowRun& r : kv.CommittedRuns()) {
    src->FromDevice(0, r.offset * p.k_width, r.k, r.rows * p.k_width);
    src->FromDevice(1, r.offset * p.v_width, r.v, r.rows * p.v_width);
  }
}

}  // namespace

// ---- full snapshot -------------------------------------------------------------

Result<SessionState::Sources> SessionState::FullSources() {
  PC_RETURN_IF_ERROR(CheckCapturable());
  Device& dev = *core_->device;
  Sources src;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (LatentLayerState* l = LayerAt<LatentLayerState>(layers_, i)) {
      const bool ring = l->ring_ && l->plan_.has_indexer();
      const LatentShape s{l->committed_len(), l->width(), l->index_width(), l->pool_, l->committed_pools_ready(),
                          ring, ring ? l->ring_rows_ : 0};
      src.NewLayer(s);
      src.FromDevice(0, 0, l->rows_, s.latent_values());
      if (l->plan_.has_indexer()) {
        const std::uint64_t first = s.pools_ready * s.pool, tail = s.len - first;
        if (tail != 0) {
          // The tail in logical order into the layer's scratch, in lane order
          // before the downloads.
          kernels::RingRowsArgs g{l->index_, l->tail_scratch_, s.index_width, s.index_ring_rows, first, tail};
          PC_RETURN_IF_ERROR(dev.GatherRows(g, Lane::kCompute));
        }
        src.FromDevice(1, 0, l->tail_scratch_, s.tail_values());
        src.FromDevice(2, 0, l->keys_, s.pool_key_values());
      }
    } else if (RecurrentLayerState* r = LayerAt<RecurrentLayerState>(layers_, i)) {
      src.NewLayer(r->plan_);
      src.FromDevice(0, 0, r->committed_conv_ring(), r->plan_.conv_values());
      src.FromDevice(1, 0, r->committed_state(), r->plan_.state_values());
    } else {
      const KvLayerState& kv = *LayerAt<KvLayerState>(layers_, i);
      KvSources(kv, kv.committed_len(), &src);
    }
  }
  return src;
}

Result<std::vector<LayerSnapshot>> SessionState::CaptureFull() {
  PC_ASSIGN_OR_RETURN(Sources src, FullSources());
  return ToSnapshots(*core_->device, src);
}

Result<std::vector<LayerSnapshotView>> SessionState::CaptureFullInto(const CaptureSpace& space) {
  PC_ASSIGN_OR_RETURN(Sources src, FullSources());
  return ToBlock(*core_->device, src, space);
}

// ---- eager half ----------------------------------------------------------------

Result<PendingCapture> SessionState::CaptureEager() {
  PC_RETURN_IF_ERROR(CheckCapturable());
  PC_ASSIGN_OR_RETURN(std::uint32_t slot, core_->AcquireSlot());
  auto pc = std::make_unique<PendingState>();
  pc->core = core_;
  pc->slot = slot;
  pc->held = true;  // from here on the slot is released by pc
  Device& dev = *core_->device;
  const Memory& dslot = core_->slots[slot];
  const std::vector<SlotArea>& areas = core_->plan.slot_areas;

  auto watch = std::make_shared<RewindWatch>();
  watch->low.assign(layers_.size(), std::numeric_limits<std::uint64_t>::max());
  EagerHalf& half = pc->half;
  half.session_id = id_;
  half.layers.reserve(layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (LatentLayerState* l = LayerAt<LatentLayerState>(layers_, i)) {
      LatentSnapshot e;  // the eager part: the shape and the tail rows
      LatentShape& s = e.shape;
      s.len = l->committed_len();
      s.pools_ready = l->committed_pools_ready();
      s.width = l->width();
      s.index_width = l->index_width();
      s.pool = l->pool_;
      s.index_is_ring = l->ring_ && l->plan_.has_indexer();
      s.index_ring_rows = s.index_is_ring ? l->ring_rows_ : 0;
      const std::uint64_t first = s.pools_ready * s.pool, tail = s.tail_rows();
      if (l->plan_.has_indexer() && tail != 0) {
        kernels::RingRowsArgs g{
            l->index_, dslot.at<float>(areas[i].tail.offset), s.index_width, s.index_ring_rows, first, tail};
        PC_RETURN_IF_ERROR(dev.GatherRows(g, Lane::kCompute));
      }
      AddWatch(&l->watches_, watch);
      half.layers.emplace_back(std::move(e));
    } else if (RecurrentLayerState* r = LayerAt<RecurrentLayerState>(layers_, i)) {
      const RecurrentShape& p = r->plan_;
      PC_RETURN_IF_ERROR(dev.CopyOnDevice(dslot.at<float>(areas[i].conv_ring.offset), r->committed_conv_ring(),
                                          p.conv_values() * sizeof(float), Lane::kCompute));
      PC_RETURN_IF_ERROR(dev.CopyOnDevice(dslot.at<float>(areas[i].state.offset), r->committed_state(),
                                          p.state_values() * sizeof(float), Lane::kCompute));
      half.layers.emplace_back(RecurrentSnapshot{p, {}, {}});
    } else {
      KvLayerState* kv = LayerAt<KvLayerState>(layers_, i);
      KvSnapshot e{{kv->committed_len(), kv->plan_.k_width, kv->plan_.v_width, kv->plan_.format, 0}};
      if (e.shape.format.rotating()) {
        e.shape.rows = e.shape.len - kv->committed_first_held();
        PC_RETURN_IF_ERROR(CopyRotatingToSlot(dev, *kv, dslot.at<float>(areas[i].k_rows.offset),
                                              dslot.at<float>(areas[i].v_rows.offset)));
      } else {
        AddWatch(&kv->watches_, watch);
      }
      half.layers.emplace_back(std::move(e));
    }
  }
  half.watch = std::move(watch);
  // The slot leaves the device on the transfer lane once the compute lane has
  // filled it; the compute lane does not wait for that.
  PC_ASSIGN_OR_RETURN(Event filled, dev.Record(Lane::kCompute));
  PC_RETURN_IF_ERROR(dev.Wait(Lane::kTransfer, filled));
  PC_RETURN_IF_ERROR(
      dev.DownloadAsync(core_->slot_staging[slot].data(), dslot.data(), dslot.bytes(), Lane::kTransfer));
  PC_ASSIGN_OR_RETURN(Event staged, dev.Record(Lane::kTransfer));
  pc->event = std::make_unique<Event>(std::move(staged));
  return PendingCapture(std::move(pc));
}

PendingCapture::PendingCapture(std::unique_ptr<PendingState> state) : state_(std::move(state)) {}
PendingCapture::PendingCapture(PendingCapture&& o) noexcept = default;
// The state given up is destroyed, its slot released, as in the destructor.
PendingCapture& PendingCapture::operator=(PendingCapture&& o) noexcept = default;
PendingCapture::~PendingCapture() = default;

void PendingState::Release() {
  if (!held) return;
  // The slot may still be on its way out: wait before handing it to another
  // capture. Without an event nothing was enqueued on the transfer lane, but
  // the compute lane may still be filling the slot.
  if (event != nullptr) {
    (void)core->device->Synchronize(*event);
  } else {
    (void)core->device->Synchronize(Lane::kCompute);
  }
  event.reset();
  core->ReleaseSlot(slot);
  held = false;
}

Result<bool> PendingCapture::Ready() const {
  if (state_ == nullptr || !state_->held || state_->event == nullptr) {
    return Status::FailedPrecondition("capture already collected");
  }
  return state_->core->device->Query(*state_->event);
}

Result<EagerHalf> PendingCapture::Collect() {
  if (state_ == nullptr || !state_->held || state_->event == nullptr) {
    return Status::FailedPrecondition("capture already collected");
  }
  PendingState& p = *state_;
  Status st = p.core->device->Synchronize(*p.event);
  if (!st.ok()) {
    p.Release();
    return st.WithContext("eager capture's trip to host memory");
  }
  const Memory& staged = p.core->slot_staging[p.slot];
  const std::vector<SlotArea>& areas = p.core->plan.slot_areas;
  EagerHalf& half = p.half;
  for (std::size_t i = 0; i < half.layers.size(); ++i) {
    if (auto* e = std::get_if<LatentSnapshot>(&half.layers[i])) {
      e->index_tail_rows = ToVector(staged.at<const float>(areas[i].tail.offset), e->shape.tail_values());
    } else if (auto* r = std::get_if<RecurrentSnapshot>(&half.layers[i])) {
      const RecurrentShape& s = r->shape;
      r->conv_ring = ToVector(staged.at<const float>(areas[i].conv_ring.offset), s.conv_values());
      r->state = ToVector(staged.at<const float>(areas[i].state.offset), s.state_values());
    } else if (auto* kv = std::get_if<KvSnapshot>(&half.layers[i]); kv != nullptr && kv->shape.format.rotating()) {
      kv->k_rows = ToVector(staged.at<const float>(areas[i].k_rows.offset), kv->shape.k_values());
      kv->v_rows = ToVector(staged.at<const float>(areas[i].v_rows.offset), kv->shape.v_values());
    }
  }
  EagerHalf out = std::move(half);
  p.Release();
  return out;
}

// ---- deferred half -------------------------------------------------------------

namespace {

// The deferred half's checks of one latent layer against its eager half.
Status CheckLatentCompletion(std::size_t i, const LayerSnapshot& el, const LatentLayerState* l, std::uint64_t low) {
  const auto* eager = std::get_if<LatentSnapshot>(&el);
  if (eager == nullptr) return LayerRefusal(i, "the eager half holds another kind of layer");
  const LatentShape* e = &eager->shape;
  if (e->width != l->width() || e->index_width != l->index_width()) {
    return LayerRefusal(i, "widths " + N(e->width) + "/" + N(e->index_width) + " != the layer's " +
                               N(l->width()) + "/" + N(l->index_width()));
  }
  if (e->len == 0) return LayerRefusal(i, "boundary len 0");
  if (l->len() < e->len) {
    return LayerRefusal(
        i, "the layer holds " + N(l->len()) + " rows, fewer than the boundary's " + N(e->len));
  }
  if (low < e->len) {
    return LayerRefusal(
        i, "rewound to " + N(low) + ", below the boundary " + N(e->len) + ", since the capture");
  }
  if (e->pool != l->pool())
    return LayerRefusal(i, "pool " + N(e->pool) + " != the layer's pool " + N(l->pool()));
  if (l->plan().has_indexer()) {
    if (e->pool == 0 || e->pools_ready != e->len / e->pool) {
      return LayerRefusal(i, "boundary pools_ready " + N(e->pools_ready) + " != len / pool");
    }
    if (l->pools_ready() < e->pools_ready) {
      return LayerRefusal(
          i, "pools_ready " + N(l->pools_ready()) + " is behind the boundary's " + N(e->pools_ready));
    }
    if (eager->index_tail_rows.size() != e->tail_values()) {
      return LayerRefusal(i, "the eager tail holds " + N(eager->index_tail_rows.size()) +
                                 " floats, not the boundary's " + N(e->tail_values()));
    }
    if (e->index_is_ring != (l->index_ring_rows() != 0) || e->index_ring_rows != l->index_ring_rows()) {
      return LayerRefusal(
          i, "index ring " + N(e->index_ring_rows) + " != the layer's " + N(l->index_ring_rows()));
    }
  } else if (e->pools_ready != 0 || !eager->index_tail_rows.empty() || e->index_is_ring ||
             e->index_ring_rows != 0) {
    return LayerRefusal(i, "pool state on a layer without an indexer");
  }
  PC_RETURN_IF_ERROR(l->CheckInvariants().WithContext("layer " + N(i)));
  return Status::Ok();
}

// The same for one KV layer (a rotating one is checked against its eager rows alone).
Status CheckKvCompletion(std::size_t i, const LayerSnapshot& el, const KvLayerState* kv, std::uint64_t low) {
  const auto* eager = std::get_if<KvSnapshot>(&el);
  if (eager == nullptr) return LayerRefusal(i, "the eager half holds another kind of layer");
  const KvShape* e = &eager->shape;
  if (e->k_width != kv->plan().k_width || e->v_width != kv->plan().v_width) {
    return LayerRefusal(i, "K/V widths differ from the layer's");
  }
  if (!(e->format == kv->plan().format)) {
    return LayerRefusal(i, "the eager half is of kind " + std::string(KvKindOf(e->format)) + ", the layer of " +
                               std::string(KvKindOf(kv->plan().format)));
  }
  if (e->len == 0) return LayerRefusal(i, "boundary len 0");
  if (e->format.rotating()) {
    // Every row was captured eagerly; the live layer is not read again.
    if (!CheckShape(*e).ok() || eager->k_rows.size() != e->k_values() || eager->v_rows.size() != e->v_values()) {
      return LayerRefusal(i, "the eager rotating rows do not have the boundary's shape");
    }
    return Status::Ok();
  }
  if (kv->len() < e->len) {
    return LayerRefusal(
        i, "the layer holds " + N(kv->len()) + " rows, fewer than the boundary's " + N(e->len));
  }
  if (low < e->len) {
    return LayerRefusal(
        i, "rewound to " + N(low) + ", below the boundary " + N(e->len) + ", since the capture");
  }
  return Status::Ok();
}

}  // namespace

Status SessionState::CheckCompletion(const EagerHalf& eager) const {
  if (!broken_.empty()) return Status::FailedPrecondition("session cache is broken: " + broken_);
  if (eager.session_id != id_) {
    return Status::FailedPrecondition("the eager half was captured from session " + N(eager.session_id) +
                                      ", not from session " + N(id_));
  }
  if (eager.layers.size() != layers_.size()) {
    return Status::FailedPrecondition("the eager half has " + N(eager.layers.size()) +
                                      " layers; the cache has " + N(layers_.size()));
  }
  if (eager.watch == nullptr || eager.watch->low.size() != layers_.size()) {
    return Status::FailedPrecondition("the eager half carries no rewind watch of this cache");
  }
  const std::vector<std::uint64_t>& low = eager.watch->low;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerSnapshot& el = eager.layers[i];
    if (const LatentLayerState* l = LayerAt<LatentLayerState>(layers_, i)) {
      PC_RETURN_IF_ERROR(CheckLatentCompletion(i, el, l, low[i]));
    } else if (const RecurrentLayerState* r = LayerAt<RecurrentLayerState>(layers_, i)) {
      const auto* e = std::get_if<RecurrentSnapshot>(&el);
      if (e == nullptr) return LayerRefusal(i, "the eager half holds another kind of layer");
      const RecurrentShape& want = r->plan();
      if (!(e->shape == want) || e->conv_ring.size() != want.conv_values() ||
          e->state.size() != want.state_values()) {
        return LayerRefusal(i, "the eager recurrent state does not have the layer's shape");
      }
    } else {
      PC_RETURN_IF_ERROR(CheckKvCompletion(i, el, LayerAt<KvLayerState>(layers_, i), low[i]));
    }
  }
  return Status::Ok();
}

// The eager half's planes stay in its vectors (host runs); the deferred ones
// are the live layers' rows at the boundary (device runs).
Result<SessionState::Sources> SessionState::CompletionSources(EagerHalf& eager) {
  PC_RETURN_IF_ERROR(CheckCompletion(eager));
  Sources src;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    LayerSnapshot& el = eager.layers[i];
    if (const LatentLayerState* l = LayerAt<LatentLayerState>(layers_, i)) {
      const auto& e = std::get<LatentSnapshot>(el);
      const LatentShape& s = e.shape;
      src.NewLayer(s);
      src.FromDevice(0, 0, l->rows_, s.latent_values());
      src.FromHost(1, e.index_tail_rows);
      src.FromDevice(2, 0, l->keys_, s.pool_key_values());
    } else if (LayerAt<RecurrentLayerState>(layers_, i) != nullptr) {
      const auto& r = std::get<RecurrentSnapshot>(el);
      src.NewLayer(r.shape);
      src.FromHost(0, r.conv_ring);
      src.FromHost(1, r.state);
    } else if (const auto& e = std::get<KvSnapshot>(el); e.shape.format.rotating()) {
      src.NewLayer(e.shape);
      src.FromHost(0, e.k_rows);
      src.FromHost(1, e.v_rows);
    } else {
      KvSources(*LayerAt<KvLayerState>(layers_, i), e.shape.len, &src);
    }
  }
  return src;
}

Result<std::vector<LayerSnapshot>> SessionState::CompleteCapture(EagerHalf eager) {
  PC_ASSIGN_OR_RETURN(Sources src, CompletionSources(eager));
  return ToSnapshots(*core_->device, src);
}

Result<std::vector<LayerSnapshotView>> SessionState::CompleteCaptureInto(EagerHalf eager,
                                                                         const CaptureSpace& space) {
  PC_ASSIGN_OR_RETURN(Sources src, CompletionSources(eager));
  return ToBlock(*core_->device, src, space);
}

}  // namespace primecache::engine

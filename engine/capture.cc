// Capture: the full snapshot, the eager half through a snapshot slot, and the
// deferred half that joins it at the captured boundary.
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/engine_core.h"
#include "primecache/engine.h"

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

// A KV layer's held rows at a boundary of `len` tokens, downloaded on the
// compute lane in logical order: rows [0, len) of a plain layer, the live
// buffer's [first_held, len) of a rotating one (len is then the layer's own).
Result<KvSnapshot> DownloadKv(Device& dev, const KvLayer& kv, std::uint64_t len) {
  const KvPlan& p = kv.plan();
  KvSnapshot s{len, p.k_width, p.v_width, {}, {}, p.format, p.format.rotating() ? kv.held_rows() : 0};
  const std::uint64_t held = s.shape().held_rows(), first = p.format.rotating() ? kv.first_held() : 0;
  s.k_rows.resize(held * s.k_width);
  s.v_rows.resize(held * s.v_width);
  for (const RingRun& r : RingRuns(first, held, kv.capacity())) {
    PC_RETURN_IF_ERROR(dev.Download(s.k_rows.data() + r.offset * s.k_width, kv.k_rows() + r.physical * s.k_width,
                                    r.rows * s.k_width * sizeof(float), Lane::kCompute));
    PC_RETURN_IF_ERROR(dev.Download(s.v_rows.data() + r.offset * s.v_width, kv.v_rows() + r.physical * s.v_width,
                                    r.rows * s.v_width * sizeof(float), Lane::kCompute));
  }
  return s;
}

// The eager capture of a rotating layer: its held rows, copied on the device
// into the slot in logical order.
Status CopyRotatingToSlot(Device& dev, const KvLayer& kv, float* k_dst, float* v_dst) {
  const std::uint64_t kw = kv.plan().k_width, vw = kv.plan().v_width;
  for (const RingRun& r : RingRuns(kv.first_held(), kv.held_rows(), kv.capacity())) {
    PC_RETURN_IF_ERROR(dev.CopyOnDevice(k_dst + r.offset * kw, kv.k_rows() + r.physical * kw,
                                        r.rows * kw * sizeof(float), Lane::kCompute));
    PC_RETURN_IF_ERROR(dev.CopyOnDevice(v_dst + r.offset * vw, kv.v_rows() + r.physical * vw,
                                        r.rows * vw * sizeof(float), Lane::kCompute));
  }
  return Status::Ok();
}

template <typename T>
std::vector<T> ToVector(const T* host, std::size_t n) {
  return std::vector<T>(host, host + n);
}

}  // namespace

// ---- preconditions ------------------------------------------------------------

Status SessionCache::CheckCapturable() const {
  if (!broken_.empty()) return Status::FailedPrecondition("session cache is broken: " + broken_);
  std::uint64_t boundary = 0;
  bool have = false;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::uint64_t len = 0;
    if (const LatentLayer* l = latent(i)) {
      if (l->plan().has_indexer() && l->pool() == 0)
        return LayerRefusal(i, "the indexer's pool is unresolved");
      PC_RETURN_IF_ERROR(l->CheckInvariants().WithContext("layer " + N(i)));
      len = l->len();
    } else if (const KvLayer* kv = this->kv(i)) {
      PC_RETURN_IF_ERROR(kv->CheckInvariants().WithContext("layer " + N(i)));
      len = kv->len();
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

// ---- full snapshot -------------------------------------------------------------

Result<std::vector<LayerSnapshot>> SessionCache::CaptureFull() {
  PC_RETURN_IF_ERROR(CheckCapturable());
  Device& dev = *core_->device;
  std::vector<LayerSnapshot> out;
  out.reserve(layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (LatentLayer* l = latent(i)) {
      LatentPlaneSnapshot s;
      s.len = l->len_;
      s.width = l->width();
      s.index_width = l->index_width();
      s.pool = l->pool_;
      s.pools_ready = l->pools_ready_;
      s.index_is_ring = l->ring_ && l->plan_.has_indexer();
      s.index_ring_rows = s.index_is_ring ? l->ring_rows_ : 0;
      s.latent_rows.resize(s.len * s.width);
      PC_RETURN_IF_ERROR(
          dev.Download(s.latent_rows.data(), l->rows_, s.latent_rows.size() * sizeof(float), Lane::kCompute));
      if (l->plan_.has_indexer()) {
        s.pool_keys.resize(s.pools_ready * l->plan_.index_head_dim);
        PC_RETURN_IF_ERROR(
            dev.Download(s.pool_keys.data(), l->keys_, s.pool_keys.size() * sizeof(float), Lane::kCompute));
        const std::uint64_t first = s.pools_ready * s.pool, tail = s.len - first;
        s.index_tail_rows.resize(tail * s.index_width);
        if (tail != 0) {
          kernels::RingRowsArgs g{
              l->index_, l->tail_scratch_, s.index_width, s.index_is_ring ? l->ring_rows_ : 0, first, tail};
          PC_RETURN_IF_ERROR(dev.GatherRows(g, Lane::kCompute));
          PC_RETURN_IF_ERROR(dev.Download(s.index_tail_rows.data(), l->tail_scratch_,
                                          s.index_tail_rows.size() * sizeof(float), Lane::kCompute));
        }
      }
      out.emplace_back(std::move(s));
    } else if (RecurrentLayer* r = recurrent(i)) {
      RecurrentSnapshot s{r->plan_.heads, r->plan_.head_dim, r->plan_.kernel, {}, {}};
      s.conv_ring.resize(r->plan_.conv_values());
      s.state.resize(r->plan_.state_values());
      PC_RETURN_IF_ERROR(
          dev.Download(s.conv_ring.data(), r->conv_, s.conv_ring.size() * sizeof(float), Lane::kCompute));
      PC_RETURN_IF_ERROR(
          dev.Download(s.state.data(), r->state(), s.state.size() * sizeof(float), Lane::kCompute));
      out.emplace_back(std::move(s));
    } else {
      const KvLayer* kv = this->kv(i);
      PC_ASSIGN_OR_RETURN(KvSnapshot s, DownloadKv(dev, *kv, kv->len_));
      out.emplace_back(std::move(s));
    }
  }
  return out;
}

// ---- eager half ----------------------------------------------------------------

Result<PendingCapture> SessionCache::CaptureEager() {
  PC_RETURN_IF_ERROR(CheckCapturable());
  PC_ASSIGN_OR_RETURN(std::uint32_t slot, core_->AcquireSlot());
  PendingCapture pc;
  pc.core_ = core_;
  pc.slot_ = slot;
  pc.held_ = true;  // from here on the slot is released by pc
  Device& dev = *core_->device;
  const Memory& dslot = core_->slots[slot];
  const std::vector<SlotArea>& areas = core_->plan.slot_areas;

  auto watch = std::make_shared<RewindWatch>();
  watch->low.assign(layers_.size(), std::numeric_limits<std::uint64_t>::max());
  EagerHalf& half = pc.half_;
  half.session_id = id_;
  half.layers.reserve(layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (LatentLayer* l = latent(i)) {
      EagerLatent e;
      e.len = l->len_;
      e.pools_ready = l->pools_ready_;
      e.width = l->width();
      e.index_width = l->index_width();
      e.pool = l->pool_;
      e.index_is_ring = l->ring_ && l->plan_.has_indexer();
      e.index_ring_rows = e.index_is_ring ? l->ring_rows_ : 0;
      const std::uint64_t first = e.pools_ready * e.pool, tail = e.len - first;
      if (l->plan_.has_indexer() && tail != 0) {
        kernels::RingRowsArgs g{
            l->index_, dslot.at<float>(areas[i].tail.offset), e.index_width, e.index_ring_rows, first, tail};
        PC_RETURN_IF_ERROR(dev.GatherRows(g, Lane::kCompute));
      }
      AddWatch(&l->watches_, watch);
      half.layers.emplace_back(std::move(e));
    } else if (RecurrentLayer* r = recurrent(i)) {
      const RecurrentPlan& p = r->plan_;
      PC_RETURN_IF_ERROR(dev.CopyOnDevice(dslot.at<float>(areas[i].conv_ring.offset), r->conv_,
                                          p.conv_values() * sizeof(float), Lane::kCompute));
      PC_RETURN_IF_ERROR(dev.CopyOnDevice(dslot.at<float>(areas[i].state.offset), r->state(),
                                          p.state_values() * sizeof(float), Lane::kCompute));
      half.layers.emplace_back(RecurrentSnapshot{p.heads, p.head_dim, p.kernel, {}, {}});
    } else {
      KvLayer* kv = this->kv(i);
      EagerKv e{kv->len_, kv->plan_.k_width, kv->plan_.v_width, kv->plan_.format, 0, {}, {}};
      if (e.format.rotating()) {
        e.rows = kv->held_rows();
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
  pc.event_ = std::make_unique<Event>(std::move(staged));
  return pc;
}

PendingCapture::PendingCapture(PendingCapture&& o) noexcept
    : core_(std::move(o.core_)),
      slot_(o.slot_),
      held_(o.held_),
      event_(std::move(o.event_)),
      half_(std::move(o.half_)) {
  o.held_ = false;
}

PendingCapture& PendingCapture::operator=(PendingCapture&& o) noexcept {
  if (this != &o) {
    Release();
    core_ = std::move(o.core_);
    slot_ = o.slot_;
    held_ = o.held_;
    event_ = std::move(o.event_);
    half_ = std::move(o.half_);
    o.held_ = false;
  }
  return *this;
}

PendingCapture::~PendingCapture() {
  Release();
}

void PendingCapture::Release() {
  if (!held_) return;
  // The slot may still be on its way out: wait before handing it to another
  // capture. Without an event nothing was enqueued on the transfer lane, but
  // the compute lane may still be filling the slot.
  if (event_ != nullptr) {
    (void)core_->device->Synchronize(*event_);
  } else {
    (void)core_->device->Synchronize(Lane::kCompute);
  }
  event_.reset();
  core_->ReleaseSlot(slot_);
  held_ = false;
}

Result<bool> PendingCapture::Ready() const {
  if (!held_ || event_ == nullptr) return Status::FailedPrecondition("capture already collected");
  return core_->device->Query(*event_);
}

Result<EagerHalf> PendingCapture::Collect() {
  if (!held_ || event_ == nullptr) return Status::FailedPrecondition("capture already collected");
  Status st = core_->device->Synchronize(*event_);
  if (!st.ok()) {
    Release();
    return st.WithContext("eager capture's trip to host memory");
  }
  const Memory& staged = core_->slot_staging[slot_];
  const std::vector<SlotArea>& areas = core_->plan.slot_areas;
  for (std::size_t i = 0; i < half_.layers.size(); ++i) {
    if (auto* e = std::get_if<EagerLatent>(&half_.layers[i])) {
      const std::uint64_t n = (e->len - e->pools_ready * e->pool) * e->index_width;
      e->tail_rows = ToVector(staged.at<const float>(areas[i].tail.offset), n);
    } else if (auto* r = std::get_if<RecurrentSnapshot>(&half_.layers[i])) {
      const RecurrentShape s = r->shape();
      r->conv_ring = ToVector(staged.at<const float>(areas[i].conv_ring.offset), s.conv_values());
      r->state = ToVector(staged.at<const float>(areas[i].state.offset), s.state_values());
    } else if (auto* kv = std::get_if<EagerKv>(&half_.layers[i]); kv != nullptr && kv->format.rotating()) {
      kv->k_rows = ToVector(staged.at<const float>(areas[i].k_rows.offset), kv->rows * kv->k_width);
      kv->v_rows = ToVector(staged.at<const float>(areas[i].v_rows.offset), kv->rows * kv->v_width);
    }
  }
  EagerHalf out = std::move(half_);
  Release();
  return out;
}

// ---- deferred half -------------------------------------------------------------

Result<std::vector<LayerSnapshot>> SessionCache::CompleteCapture(EagerHalf eager) {
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
  // First every check, then every copy.
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const EagerLayer& el = eager.layers[i];
    if (const LatentLayer* l = latent(i)) {
      const auto* e = std::get_if<EagerLatent>(&el);
      if (e == nullptr) return LayerRefusal(i, "the eager half holds another kind of layer");
      if (e->width != l->width() || e->index_width != l->index_width()) {
        return LayerRefusal(i, "widths " + N(e->width) + "/" + N(e->index_width) + " != the layer's " +
                                   N(l->width()) + "/" + N(l->index_width()));
      }
      if (e->len == 0) return LayerRefusal(i, "boundary len 0");
      if (l->len() < e->len) {
        return LayerRefusal(
            i, "the layer holds " + N(l->len()) + " rows, fewer than the boundary's " + N(e->len));
      }
      if (low[i] < e->len) {
        return LayerRefusal(
            i, "rewound to " + N(low[i]) + ", below the boundary " + N(e->len) + ", since the capture");
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
        if (e->tail_rows.size() != (e->len - e->pools_ready * e->pool) * e->index_width) {
          return LayerRefusal(i, "the eager tail holds " + N(e->tail_rows.size()) +
                                     " floats, not the boundary's " +
                                     N((e->len - e->pools_ready * e->pool) * e->index_width));
        }
        if (e->index_is_ring != (l->index_ring_rows() != 0) || e->index_ring_rows != l->index_ring_rows()) {
          return LayerRefusal(
              i, "index ring " + N(e->index_ring_rows) + " != the layer's " + N(l->index_ring_rows()));
        }
      } else if (e->pools_ready != 0 || !e->tail_rows.empty() || e->index_is_ring ||
                 e->index_ring_rows != 0) {
        return LayerRefusal(i, "pool state on a layer without an indexer");
      }
      PC_RETURN_IF_ERROR(l->CheckInvariants().WithContext("layer " + N(i)));
    } else if (const RecurrentLayer* r = recurrent(i)) {
      const auto* e = std::get_if<RecurrentSnapshot>(&el);
      if (e == nullptr) return LayerRefusal(i, "the eager half holds another kind of layer");
      const RecurrentShape want{r->plan().heads, r->plan().head_dim, r->plan().kernel};
      if (!(e->shape() == want) || e->conv_ring.size() != want.conv_values() ||
          e->state.size() != want.state_values()) {
        return LayerRefusal(i, "the eager recurrent state does not have the layer's shape");
      }
    } else {
      const KvLayer* kv = this->kv(i);
      const auto* e = std::get_if<EagerKv>(&el);
      if (e == nullptr) return LayerRefusal(i, "the eager half holds another kind of layer");
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
        const KvShape shape{e->len, e->k_width, e->v_width, e->format, e->rows};
        if (!CheckShape(shape).ok() || e->k_rows.size() != shape.k_values() || e->v_rows.size() != shape.v_values()) {
          return LayerRefusal(i, "the eager rotating rows do not have the boundary's shape");
        }
        continue;
      }
      if (kv->len() < e->len) {
        return LayerRefusal(
            i, "the layer holds " + N(kv->len()) + " rows, fewer than the boundary's " + N(e->len));
      }
      if (low[i] < e->len) {
        return LayerRefusal(
            i, "rewound to " + N(low[i]) + ", below the boundary " + N(e->len) + ", since the capture");
      }
    }
  }

  Device& dev = *core_->device;
  std::vector<LayerSnapshot> out;
  out.reserve(layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    EagerLayer& el = eager.layers[i];
    if (const LatentLayer* l = latent(i)) {
      auto& e = std::get<EagerLatent>(el);
      LatentPlaneSnapshot s;
      s.len = e.len;
      s.width = e.width;
      s.index_width = e.index_width;
      s.pool = e.pool;
      s.pools_ready = e.pools_ready;
      s.index_is_ring = e.index_is_ring;
      s.index_ring_rows = e.index_ring_rows;
      s.latent_rows.resize(s.len * s.width);
      PC_RETURN_IF_ERROR(
          dev.Download(s.latent_rows.data(), l->rows_, s.latent_rows.size() * sizeof(float), Lane::kCompute));
      s.pool_keys.resize(s.pools_ready * l->plan_.index_head_dim);
      PC_RETURN_IF_ERROR(
          dev.Download(s.pool_keys.data(), l->keys_, s.pool_keys.size() * sizeof(float), Lane::kCompute));
      s.index_tail_rows = std::move(e.tail_rows);
      out.emplace_back(std::move(s));
    } else if (recurrent(i) != nullptr) {
      out.emplace_back(std::move(std::get<RecurrentSnapshot>(el)));
    } else {
      auto& e = std::get<EagerKv>(el);
      if (e.format.rotating()) {
        out.emplace_back(KvSnapshot{e.len, e.k_width, e.v_width, std::move(e.k_rows), std::move(e.v_rows), e.format,
                                    e.rows});
        continue;
      }
      PC_ASSIGN_OR_RETURN(KvSnapshot s, DownloadKv(dev, *this->kv(i), e.len));
      out.emplace_back(std::move(s));
    }
  }
  return out;
}

}  // namespace primecache::engine

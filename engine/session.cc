// The Engine (reserve, arenas, slots) and its session caches.
#include <string>
#include <type_traits>
#include <utility>

#include "engine/device.h"
#include "engine/engine_core.h"
#include "engine/layer_state.h"
#include "engine/session_state.h"
#include "primecache/internal/engine.h"

namespace primecache::engine {

// ---- EngineCore ----------------------------------------------------------------

Result<std::uint32_t> EngineCore::AcquireSlot() {
  std::lock_guard<std::mutex> lock(mu);
  for (std::uint32_t i = 0; i < slot_in_use.size(); ++i) {
    if (!slot_in_use[i]) {
      slot_in_use[i] = true;
      return i;
    }
  }
  return Status::ResourceExhausted("no free snapshot slot (" + std::to_string(slot_in_use.size()) +
                                   " reserved)");
}

void EngineCore::ReleaseSlot(std::uint32_t slot) {
  std::lock_guard<std::mutex> lock(mu);
  if (slot < slot_in_use.size()) slot_in_use[slot] = false;
}

// ---- Engine --------------------------------------------------------------------

Engine::Engine(std::shared_ptr<EngineCore> core) : core_(std::move(core)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<Device> device,
                                               const ReserveRequest& request) {
  if (device == nullptr) return Status::InvalidArgument("engine: no device");
  PC_ASSIGN_OR_RETURN(std::uint64_t free_bytes, device->FreeBytes());
  PC_ASSIGN_OR_RETURN(ReservePlan plan, Preflight(request, free_bytes));
  auto core = std::make_shared<EngineCore>();
  core->device = std::move(device);
  core->plan = std::move(plan);
  const ReservePlan& p = core->plan;
  for (std::uint32_t s = 0; s < p.request.sessions; ++s) {
    Result<Memory> m = core->device->Allocate(p.session_bytes);
    if (!m.ok()) {
      return m.status().WithContext("allocating session arena " + std::to_string(s) + " of " +
                                    std::to_string(p.request.sessions) + " after the preflight passed");
    }
    core->arenas.push_back(std::move(m).value());
    core->arena_in_use.push_back(false);
    core->arena_zeroed.push_back(false);
  }
  for (std::uint32_t s = 0; s < p.request.snapshot_slots; ++s) {
    Result<Memory> m = core->device->Allocate(p.slot_bytes);
    if (!m.ok()) return m.status().WithContext("allocating snapshot slot " + std::to_string(s));
    Result<Memory> h = core->device->AllocatePinned(p.slot_bytes);
    if (!h.ok())
      return h.status().WithContext("allocating the pinned twin of snapshot slot " + std::to_string(s));
    core->slots.push_back(std::move(m).value());
    core->slot_staging.push_back(std::move(h).value());
    core->slot_in_use.push_back(false);
  }
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

const ReservePlan& Engine::reserve() const {
  return core_->plan;
}
Device& Engine::device() const {
  return *core_->device;
}

std::uint32_t Engine::open_sessions() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  std::uint32_t n = 0;
  for (bool b : core_->arena_in_use) n += b ? 1 : 0;
  return n;
}

std::uint32_t Engine::free_snapshot_slots() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  std::uint32_t n = 0;
  for (bool b : core_->slot_in_use) n += b ? 0 : 1;
  return n;
}

Result<std::unique_ptr<SessionCache>> Engine::NewSession() {
  std::uint32_t arena = 0;
  std::uint64_t id = 0;
  bool zeroed = false;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    while (arena < core_->arena_in_use.size() && core_->arena_in_use[arena]) ++arena;
    if (arena == core_->arena_in_use.size()) {
      return Status::ResourceExhausted("all " + std::to_string(arena) + " reserved sessions are open");
    }
    core_->arena_in_use[arena] = true;
    zeroed = core_->arena_zeroed[arena];
    core_->arena_zeroed[arena] = false;  // the session writes into it from now on
    id = core_->next_session_id++;
  }
  std::unique_ptr<SessionCache> s(new SessionState(core_, arena, id));
  // A fresh cache starts from zeros: recurrent state and conv ring are zero at
  // position 0, and every len mirror reads 0. The arena was zeroed when its
  // last session was handed back (off the next request's path: on the CPU
  // backend a memset of the whole arena, about a millisecond at 32K tokens
  // of hrm-tiny); one never used, or whose zeroing then failed, is zeroed now.
  if (!zeroed) {
    const Memory& m = core_->arenas[arena];
    PC_RETURN_IF_ERROR(core_->device->Zero(m.data(), m.bytes(), Lane::kCompute));
  }
  return s;
}

// ---- SessionState --------------------------------------------------------------

SessionState::SessionState(std::shared_ptr<EngineCore> core, std::uint32_t arena, std::uint64_t id)
    : core_(std::move(core)), arena_(arena), id_(id) {
  const ReservePlan& p = core_->plan;
  const Memory& m = core_->arenas[arena_];
  Device* dev = core_->device.get();
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const LayerPlan& lp = p.request.plan.layers[i];
    if (const auto* r = std::get_if<LatentReserve>(&p.layers[i])) {
      std::unique_ptr<LatentLayerState> l(new LatentLayerState());
      l->dev_ = dev;
      l->index_in_cache_ = i;
      l->plan_ = std::get<LatentPlan>(lp);
      l->max_ctx_ = p.request.max_ctx;
      l->rows_ = m.at<float>(r->rows.offset);
      l->len_d_ = m.at<std::int32_t>(r->len_mirror.offset);
      if (l->plan_.has_indexer()) {
        l->index_ = m.at<float>(r->index_plane.offset);
        l->index_rows_ = r->index_rows;
        l->ring_ = r->index_is_ring;
        l->keys_ = m.at<float>(r->pool_keys.offset);
        l->key_capacity_ = r->pool_key_capacity;
        l->tail_scratch_ = r->tail_scratch.bytes ? m.at<float>(r->tail_scratch.offset) : nullptr;
      }
      layers_.emplace_back(std::move(l));
    } else if (const auto* rr = std::get_if<RecurrentReserve>(&p.layers[i])) {
      std::unique_ptr<RecurrentLayerState> l(new RecurrentLayerState());
      l->dev_ = dev;
      l->plan_ = std::get<RecurrentShape>(lp);
      l->conv_ = m.at<float>(rr->conv_ring.offset);
      l->state_[0] = m.at<float>(rr->state[0].offset);
      l->state_[1] = m.at<float>(rr->state[1].offset);
      if (rr->round.state.bytes != 0) {
        const RecurrentRoundStash& st = rr->round;
        l->stash_ = {m.at<float>(st.conv_ring.offset), m.at<float>(st.state.offset),
                     m.at<float>(st.raw.offset),       m.at<float>(st.qkv.offset),
                     m.at<float>(st.g.offset),         m.at<float>(st.b.offset),
                     m.at<float>(st.out.offset),       0.0f};
      }
      layers_.emplace_back(std::move(l));
    } else {
      const auto& kr = std::get<KvReserve>(p.layers[i]);
      std::unique_ptr<KvLayerState> l(new KvLayerState());
      l->dev_ = dev;
      l->index_in_cache_ = i;
      l->plan_ = std::get<KvPlan>(lp);
      l->max_ctx_ = p.request.max_ctx;
      l->k_ = m.at<float>(kr.k_rows.offset);
      l->v_ = m.at<float>(kr.v_rows.offset);
      l->rows_ = kr.rows;
      l->len_d_ = m.at<std::int32_t>(kr.len_mirror.offset);
      if (kr.round_k.bytes != 0) {
        l->round_k_ = m.at<float>(kr.round_k.offset);
        l->round_v_ = m.at<float>(kr.round_v.offset);
      }
      layers_.emplace_back(std::move(l));
    }
  }
}

SessionState::~SessionState() {
  // Zeroed on the compute lane, after every write of this session into its
  // arena (they all run there); the next session on it starts from zeros
  // without zeroing it itself.
  const Memory& m = core_->arenas[arena_];
  const bool zeroed = core_->device->Zero(m.data(), m.bytes(), Lane::kCompute).ok();
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->arena_zeroed[arena_] = zeroed;
  core_->arena_in_use[arena_] = false;
}

const StatePlan& SessionState::plan() const {
  return core_->plan.request.plan;
}
std::uint64_t SessionState::max_ctx() const {
  return core_->plan.request.max_ctx;
}

LatentCacheLayer* SessionState::latent(std::size_t i) {
  return LayerAt<LatentLayerState>(layers_, i);
}
RecurrentCacheLayer* SessionState::recurrent(std::size_t i) {
  return LayerAt<RecurrentLayerState>(layers_, i);
}
KvCacheLayer* SessionState::kv(std::size_t i) {
  return LayerAt<KvLayerState>(layers_, i);
}
const LatentCacheLayer* SessionState::latent(std::size_t i) const {
  return LayerAt<LatentLayerState>(layers_, i);
}
const RecurrentCacheLayer* SessionState::recurrent(std::size_t i) const {
  return LayerAt<RecurrentLayerState>(layers_, i);
}
const KvCacheLayer* SessionState::kv(std::size_t i) const {
  return LayerAt<KvLayerState>(layers_, i);
}

bool SessionState::fresh() const {
  if (!broken_.empty() || round_armed_) return false;
  for (const auto& l : layers_) {
    const bool touched = std::visit([](const auto& p) { return p->touched_; }, l);
    if (touched) return false;
  }
  return true;
}

Status SessionState::CheckInvariants() const {
  if (!broken_.empty()) return Status::FailedPrecondition("session cache is broken: " + broken_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Status st = std::visit(
        [](const auto& p) -> Status {
          using T = typename std::decay_t<decltype(p)>::element_type;
          if constexpr (std::is_same_v<T, RecurrentLayerState>) {
            return Status::Ok();
          } else {
            return p->CheckInvariants();
          }
        },
        layers_[i]);
    if (!st.ok()) return st.WithContext("layer " + std::to_string(i));
  }
  return Status::Ok();
}

}  // namespace primecache::engine

// Speculative verify rounds: arming, the stash, commit and rollback of every
// layer kind (docs/engine.md, "Speculative rounds").
//
// What each kind keeps so that a rollback to `keep` positions leaves it
// bit-identical to a layer armed at the same point and given only those:
//  - latent: nothing; the reserve books the index ring big enough
//    (MinRingRows) that the round never laps a row of the tail it started
//    with, so trimming len (and pools_ready with it) is the whole rollback;
//  - plain KV: nothing; trimming len is the rollback;
//  - rotating KV: the held rows the round may overwrite, gathered as words
//    (f32 or TurboQuant, never decoded) when armed and scattered back;
//  - recurrent: the pre-round conv ring and state when armed, and per step
//    its pre-conv and scan inputs; a rollback restores both and replays the
//    kept tokens through the ring push and the very scan kernel the model
//    ran, over the very inputs it ran on.
#include <algorithm>
#include <string>
#include <type_traits>

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

constexpr std::uint64_t kF32 = sizeof(float);

RoundMark Armed(std::uint64_t base, std::uint64_t tokens) {
  RoundMark r;
  r.armed = true;
  r.base = base;
  r.limit = tokens;
  return r;
}

}  // namespace

// ---- LatentLayerState ---------------------------------------------------------------

Status LatentLayerState::Arm(std::uint64_t tokens) {
  PC_RETURN_IF_ERROR(CheckInvariants());
  if (plan_.has_indexer() && ring_) {
    const std::uint64_t ring = ring_rows_ != 0 ? ring_rows_ : EffectiveRingRows(index_rows_, plan_.pool);
    const std::uint64_t first_tail = pool_ != 0 ? len_ / pool_ * pool_ : 0;
    // The round's rows must not lap a row of the tail a rollback may return to.
    if (len_ + tokens > first_tail + ring) {
      return Status::FailedPrecondition("a round of " + N(tokens) + " tokens at len " + N(len_) +
                                        " would lap the index ring of " + N(ring) + " rows");
    }
  }
  round_ = Armed(len_, tokens);
  round_.pools_ready = pools_ready_;
  return Status::Ok();
}

Status LatentLayerState::Rollback(std::uint64_t keep) {
  const std::uint64_t target = round_.base + keep;
  round_ = {};
  return TruncateTo(target);
}

// ---- RecurrentLayerState ------------------------------------------------------------

Status RecurrentLayerState::Arm(std::uint64_t tokens) {
  if (dev_ == nullptr) return Status::FailedPrecondition("recurrent layer is not part of a cache");
  PC_RETURN_IF_ERROR(dev_->CopyOnDevice(stash_.conv, conv_, plan_.conv_values() * kF32, Lane::kCompute));
  PC_RETURN_IF_ERROR(dev_->CopyOnDevice(stash_.state, state(), plan_.state_values() * kF32, Lane::kCompute));
  round_ = Armed(0, tokens);
  return Status::Ok();
}

Status RecurrentLayerState::StashScanInputs(const ScanInputs& in, std::uint64_t count) {
  if (!round_.armed) return Status::FailedPrecondition("scan inputs stashed without an armed round");
  if (count == 0 || in.qkv == nullptr || in.g == nullptr || in.b == nullptr) {
    return Status::InvalidArgument("stash of scan inputs: no tokens or a null plane");
  }
  if (round_.stashed != round_.appended) {
    return Status::FailedPrecondition("the scan inputs of the previous stash were not stepped");
  }
  if (count > round_.limit - round_.stashed) {
    return Status::ResourceExhausted("stash of " + N(count) + " tokens passes the armed round of " +
                                     N(round_.limit) + " positions (" + N(round_.stashed) + " stashed)");
  }
  if (round_.stashed != 0 && in.gate_lower_bound != stash_.gate_lower_bound) {
    return Status::InvalidArgument("the scan's gate bound changed within a round");
  }
  const std::uint64_t c = plan_.conv_channels(), nd = std::uint64_t{plan_.heads} * plan_.head_dim,
                      at = round_.stashed;
  PC_RETURN_IF_ERROR(dev_->CopyOnDevice(stash_.qkv + at * c, in.qkv, count * c * kF32, Lane::kCompute));
  PC_RETURN_IF_ERROR(dev_->CopyOnDevice(stash_.g + at * nd, in.g, count * nd * kF32, Lane::kCompute));
  PC_RETURN_IF_ERROR(
      dev_->CopyOnDevice(stash_.b + at * plan_.heads, in.b, count * plan_.heads * kF32, Lane::kCompute));
  stash_.gate_lower_bound = in.gate_lower_bound;
  round_.stashed += count;
  return Status::Ok();
}

// Restores the pre-round ring and state, then runs the kept tokens as one
// step of `keep` tokens: their pre-conv inputs through the ring push, their
// scan inputs through the scan, from the pre-round state into next_state().
Status RecurrentLayerState::Rollback(std::uint64_t keep) {
  const std::uint64_t appended = round_.appended;
  round_ = {};
  if (keep == appended) return Status::Ok();
  const std::uint64_t c = plan_.conv_channels(), nd = std::uint64_t{plan_.heads} * plan_.head_dim;
  PC_RETURN_IF_ERROR(dev_->CopyOnDevice(conv_, stash_.conv, plan_.conv_values() * kF32, Lane::kCompute));
  if (keep == 0) {
    return dev_->CopyOnDevice(state_[cur_], stash_.state, plan_.state_values() * kF32, Lane::kCompute);
  }
  PC_RETURN_IF_ERROR(
      dev_->CopyOnDevice(next_state(), stash_.state, plan_.state_values() * kF32, Lane::kCompute));
  PC_RETURN_IF_ERROR(dev_->PushConvRing({conv_, stash_.raw, c, plan_.kernel, keep}, Lane::kCompute));
  kernels::KdaScanArgs scan;
  scan.q = stash_.qkv;
  scan.k = stash_.qkv + nd;
  scan.v = stash_.qkv + 2 * nd;
  scan.g = stash_.g;
  scan.b = stash_.b;
  scan.state = next_state();
  scan.out = stash_.out;
  scan.heads = plan_.heads;
  scan.head_dim = plan_.head_dim;
  scan.count = keep;
  scan.gate_lower_bound = stash_.gate_lower_bound;
  scan.qkv_token_stride = c;
  PC_RETURN_IF_ERROR(dev_->KdaScan(scan, Lane::kCompute));
  cur_ ^= 1;
  return Status::Ok();
}

// ---- KvLayerState -------------------------------------------------------------------

Status KvLayerState::Arm(std::uint64_t tokens) {
  PC_RETURN_IF_ERROR(CheckInvariants());
  RoundMark r = Armed(len_, tokens);
  r.first_held = lo_;
  if (plan_.format.rotating()) {
    if (tokens > rows_) {
      return Status::FailedPrecondition("a round of " + N(tokens) + " tokens passes the rotating buffer of " +
                                        N(rows_) + " rows");
    }
    // Held positions the round may overwrite: those below len + tokens - rows.
    const std::uint64_t end = std::min(len_, len_ + tokens > rows_ ? len_ + tokens - rows_ : 0);
    r.stashed = end > lo_ ? end - lo_ : 0;
    if (r.stashed != 0) {
      const std::uint64_t kw = plan_.k_width, vw = plan_.v_width;
      PC_RETURN_IF_ERROR(dev_->GatherRows({k_, round_k_, kw, rows_, lo_, r.stashed}, Lane::kCompute));
      PC_RETURN_IF_ERROR(dev_->GatherRows({v_, round_v_, vw, rows_, lo_, r.stashed}, Lane::kCompute));
    }
  }
  round_ = r;
  return Status::Ok();
}

Status KvLayerState::Rollback(std::uint64_t keep) {
  const RoundMark r = round_;
  round_ = {};
  const std::uint64_t target = r.base + keep;
  if (!plan_.format.rotating()) return TruncateTo(target);
  const std::uint64_t lo = target - r.first_held > rows_ ? target - rows_ : r.first_held;
  // Positions in [lo, base) that the round overwrote: those below len - rows.
  const std::uint64_t end = std::min(r.base, len_ > rows_ ? len_ - rows_ : 0);
  if (end > lo) {
    const std::uint64_t kw = plan_.k_width, vw = plan_.v_width, from = lo - r.first_held;
    PC_RETURN_IF_ERROR(
        dev_->ScatterRows({k_, round_k_ + from * kw, kw, rows_, lo, end - lo}, Lane::kCompute));
    PC_RETURN_IF_ERROR(
        dev_->ScatterRows({v_, round_v_ + from * vw, vw, rows_, lo, end - lo}, Lane::kCompute));
  }
  len_ = target;
  lo_ = lo;
  NoteRewind(target);
  return WriteLen();
}

std::vector<KvCacheLayer::RowRun> KvLayerState::CommittedRuns() const {
  std::vector<RowRun> runs;
  const std::uint64_t kw = plan_.k_width, vw = plan_.v_width, len = committed_len();
  if (!plan_.format.rotating()) {
    if (len != 0) runs.push_back({k_, v_, 0, len});
    return runs;
  }
  const std::uint64_t first = committed_first_held();
  std::uint64_t split = first;  // rows below it come from the stash
  if (round_.armed && len_ > rows_) split = std::clamp(len_ - rows_, first, len);
  if (split > first) runs.push_back({round_k_, round_v_, 0, split - first});
  for (const RingRun& r : RingRuns(split, len - split, rows_)) {
    runs.push_back({k_ + r.physical * kw, v_ + r.physical * vw, split - first + r.offset, r.rows});
  }
  return runs;
}

// ---- SessionState --------------------------------------------------------------

Status SessionState::CheckRoundBoundary(const char* what) const {
  if (!broken_.empty()) return Status::FailedPrecondition("session cache is broken: " + broken_);
  std::uint64_t len = 0;
  bool have = false;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::uint64_t l = 0;
    if (const LatentLayerState* lat = LayerAt<LatentLayerState>(layers_, i)) {
      l = lat->len();
    } else if (const KvLayerState* k = LayerAt<KvLayerState>(layers_, i)) {
      l = k->len();
    } else {
      continue;
    }
    if (have && l != len) {
      return Status::FailedPrecondition(std::string(what) + ": layer " + N(i) + " holds " + N(l) +
                                        " tokens, the layers before it " + N(len) + " (not a call boundary)");
    }
    len = l;
    have = true;
  }
  return Status::Ok();
}

Status SessionState::ArmRound(std::uint64_t tokens) {
  if (round_armed_) return Status::FailedPrecondition("a speculative round is already armed");
  const std::uint64_t reserved = core_->plan.request.round_tokens;
  if (tokens == 0 || tokens > reserved) {
    return Status::InvalidArgument("a round of " + N(tokens) +
                                   " positions; the reserve books rounds of 1 to " + N(reserved) +
                                   " (ReserveRequest::round_tokens)");
  }
  PC_RETURN_IF_ERROR(CheckRoundBoundary("arm round"));
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Status st = std::visit([&](auto& p) { return p->Arm(tokens); }, layers_[i]);
    if (!st.ok()) {
      for (auto& l : layers_) std::visit([](auto& p) { p->round_ = {}; }, l);
      return st.WithContext("arm round: layer " + N(i));
    }
  }
  round_armed_ = true;
  return Status::Ok();
}

Result<std::uint64_t> SessionState::RoundAppended() const {
  if (!round_armed_) return std::uint64_t{0};
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::uint64_t a = std::visit([](const auto& p) { return p->round_.appended; }, layers_[i]);
    if (i != 0 && a != n) {
      return Status::FailedPrecondition("the round's layers disagree: layer " + N(i) + " appended " + N(a) +
                                        ", the layers before it " + N(n) + " (not a call boundary)");
    }
    n = a;
  }
  return n;
}

Status SessionState::CommitRound() {
  if (!round_armed_) return Status::FailedPrecondition("commit without an armed round");
  PC_RETURN_IF_ERROR(RoundAppended().status().WithContext("commit round"));
  for (auto& l : layers_) std::visit([](auto& p) { p->round_ = {}; }, l);
  round_armed_ = false;
  return Status::Ok();
}

Status SessionState::RollbackRound(std::uint64_t keep) {
  if (!round_armed_) return Status::FailedPrecondition("rollback without an armed round");
  PC_ASSIGN_OR_RETURN(std::uint64_t appended, RoundAppended());
  if (keep > appended) {
    return Status::InvalidArgument("rollback to keep " + N(keep) + " of the " + N(appended) +
                                   " positions the round appended");
  }
  Status first;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Status st = std::visit([&](auto& p) { return p->Rollback(keep); }, layers_[i]);
    if (!st.ok() && first.ok()) first = st.WithContext("round rollback: layer " + N(i));
  }
  round_armed_ = false;
  if (!first.ok()) broken_ = first.ToString();
  return first;
}

}  // namespace primecache::engine

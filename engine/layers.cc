// The cache layers: appends, rewinds and invariants.
#include <algorithm>
#include <limits>
#include <string>
#include <tuple>

#include "engine/device.h"
#include "engine/engine_core.h"
#include "engine/layer_state.h"
#include "primecache/internal/engine.h"

namespace primecache::engine {
namespace {

std::string N(std::uint64_t v) {
  return std::to_string(v);
}

Status Broken(const std::string& what) {
  return Status::Internal("latent layer invariant broken: " + what);
}

// An append of `count` positions within the armed round, if one is armed.
Status CheckRoundRoom(const RoundMark& round, std::uint64_t count, const char* what) {
  if (!round.armed || count <= round.limit - round.appended) return Status::Ok();
  return Status::ResourceExhausted(std::string(what) + " of " + N(count) + " tokens passes the armed round of " +
                            N(round.limit) + " positions (" + N(round.appended) + " appended)");
}

Status RefuseInRound(const RoundMark& round, const char* what) {
  if (!round.armed) return Status::Ok();
  return Status::FailedPrecondition(std::string(what) + " while a speculative round is armed; commit or roll it back");
}

void LowerWatches(std::vector<std::weak_ptr<RewindWatch>>* watches, std::size_t layer,
                  std::uint64_t new_len) {
  auto it = watches->begin();
  while (it != watches->end()) {
    if (auto w = it->lock()) {
      if (layer < w->low.size()) w->low[layer] = std::min(w->low[layer], new_len);
      ++it;
    } else {
      it = watches->erase(it);
    }
  }
}

}  // namespace

// ---- LatentLayerState --------------------------------------------------------------

Status LatentLayerState::CheckInvariants() const {
  if (dev_ == nullptr) return Status::FailedPrecondition("latent layer is not part of a cache");
  if (len_ > max_ctx_) return Broken("len " + N(len_) + " > max_ctx " + N(max_ctx_));
  if (!plan_.has_indexer()) {
    if (pool_ != 0 || pools_ready_ != 0) return Broken("pool state on a layer without an indexer");
    return Status::Ok();
  }
  if (pool_ == 0) {
    if (len_ != 0 || pools_ready_ != 0) return Broken("len " + N(len_) + " with an unresolved pool");
    return Status::Ok();
  }
  if (pool_ != plan_.pool) return Broken("pool " + N(pool_) + " != plan pool " + N(plan_.pool));
  if (pools_ready_ != len_ / pool_) {
    return Broken("pools_ready " + N(pools_ready_) + " != len " + N(len_) + " / pool " + N(pool_));
  }
  if (pools_ready_ > key_capacity_)
    return Broken("pools_ready " + N(pools_ready_) + " > key capacity " + N(key_capacity_));
  const std::uint64_t tail_start = pools_ready_ * pool_;
  if (ring_) {
    if (ring_rows_ == 0 || ring_rows_ % pool_ != 0 || ring_rows_ > index_rows_) {
      return Broken("effective ring " + N(ring_rows_) + " of booked " + N(index_rows_) + " rows, pool " +
                    N(pool_));
    }
    if (len_ - tail_start > ring_rows_)
      return Broken("tail of " + N(len_ - tail_start) + " rows exceeds the ring");
  }
  if (floor_ > tail_start)
    return Broken("index floor " + N(floor_) + " above the tail start " + N(tail_start));
  return Status::Ok();
}

Status LatentLayerState::ResolvePool(std::uint32_t pool) {
  if (pool != plan_.pool) {
    return Status::InvalidArgument("indexer pool " + N(pool) + " disagrees with the plan's pool " +
                                   N(plan_.pool));
  }
  if (pool_ != 0) {
    if (pool != pool_)
      return Status::InvalidArgument("indexer pool " + N(pool) + " != resolved pool " + N(pool_));
    return Status::Ok();
  }
  std::uint64_t ring_rows = 0;
  if (ring_) {
    ring_rows = EffectiveRingRows(index_rows_, pool);
    if (ring_rows == 0) {
      return Status::FailedPrecondition("a ring of " + N(index_rows_) + " rows holds no pool of " + N(pool));
    }
  }
  pool_ = pool;
  ring_rows_ = ring_rows;
  return Status::Ok();
}

Status LatentLayerState::WriteLen() {
  return dev_->WriteI32(len_d_, static_cast<std::int32_t>(len_), Lane::kCompute);
}

void LatentLayerState::NoteRewind(std::uint64_t new_len) {
  LowerWatches(&watches_, index_in_cache_, new_len);
}

Status LatentLayerState::Append(const float* latent_rows, const float* index_rows, std::uint64_t count,
                           const IndexerInputs* indexer) {
  PC_RETURN_IF_ERROR(CheckInvariants());
  if (count == 0) return Status::Ok();
  if (latent_rows == nullptr) return Status::InvalidArgument("append: null latent rows");
  PC_RETURN_IF_ERROR(CheckRoundRoom(round_, count, "append"));
  if (count > max_ctx_ - len_) {
    return Status::ResourceExhausted("append of " + N(count) + " tokens at len " + N(len_) +
                                     " passes max_ctx " + N(max_ctx_));
  }
  const bool ix = plan_.has_indexer();
  if (ix) {
    if (indexer == nullptr || index_rows == nullptr || indexer->ape == nullptr) {
      return Status::InvalidArgument(
          "append: the layer has an indexer; index rows, pool and ape are required");
    }
    PC_RETURN_IF_ERROR(ResolvePool(indexer->pool));
  } else if (index_rows != nullptr || indexer != nullptr) {
    return Status::InvalidArgument("append: index rows given to a layer without an indexer");
  }
  touched_ = true;

  const std::uint64_t w = plan_.width(), iw = plan_.index_width(), d = plan_.index_head_dim;
  Status st;
  for (std::uint64_t done = 0; done < count;) {
    std::uint64_t chunk = count - done;
    // A ring holds the live tail plus what this chunk adds; building the keys
    // of the pools a chunk completes frees their rows for the next chunk.
    if (ix && ring_) chunk = std::min(chunk, ring_rows_ - (len_ - pools_ready_ * pool_));
    kernels::AppendRowsArgs a;
    a.latent = rows_;
    a.latent_src = latent_rows + done * w;
    a.width = w;
    if (ix) {
      a.index = index_;
      a.index_src = index_rows + done * iw;
      a.index_width = iw;
      a.ring_rows = ring_ ? ring_rows_ : 0;
    }
    a.first_row = len_;
    a.count = chunk;
    st = dev_->AppendRows(a, Lane::kCompute);
    if (!st.ok()) break;
    len_ += chunk;
    done += chunk;
    if (!ix) continue;
    if (ring_ && len_ > ring_rows_) floor_ = std::max(floor_, len_ - ring_rows_);
    const std::uint64_t ready = len_ / pool_;
    if (ready > pools_ready_) {
      kernels::PoolKeyArgs k;
      k.index_rows = index_;
      k.ring_rows = ring_ ? ring_rows_ : 0;
      k.ape = indexer->ape;
      k.keys = keys_;
      k.head_dim = d;
      k.pool = pool_;
      k.first_pool = pools_ready_;
      k.pool_count = ready - pools_ready_;
      st = dev_->BuildPoolKeys(k, Lane::kCompute);
      if (!st.ok()) {
        // The completed pools have no keys: give their rows back.
        len_ = pools_ready_ * pool_;
        break;
      }
      pools_ready_ = ready;
    }
  }
  if (round_.armed) round_.appended = len_ - round_.base;
  Status wl = WriteLen();
  return st.ok() ? wl : st;
}

Status LatentLayerState::Truncate(std::uint64_t new_len) {
  PC_RETURN_IF_ERROR(RefuseInRound(round_, "truncate"));
  return TruncateTo(new_len);
}

Status LatentLayerState::TruncateTo(std::uint64_t new_len) {
  PC_RETURN_IF_ERROR(CheckInvariants());
  if (new_len > len_) return Status::InvalidArgument("truncate to " + N(new_len) + " above len " + N(len_));
  if (new_len == len_) return Status::Ok();
  std::uint64_t ready = 0;
  if (pool_ != 0) {
    ready = std::min(pools_ready_, new_len / pool_);
    if (ready * pool_ < floor_) {
      return Status::FailedPrecondition("truncate to " + N(new_len) + ": the index rows of its tail [" +
                                        N(ready * pool_) + ", " + N(new_len) +
                                        ") are gone; the plane holds rows from " + N(floor_));
    }
  }
  // len and pools_ready move together: keys of pools at or past new_len / pool
  // are no longer final once their rows can be overwritten.
  len_ = new_len;
  pools_ready_ = ready;
  NoteRewind(new_len);
  return WriteLen();
}

// ---- RecurrentLayerState ------------------------------------------------------------

Status RecurrentLayerState::Step(const float* conv_inputs, std::uint64_t count) {
  if (dev_ == nullptr) return Status::FailedPrecondition("recurrent layer is not part of a cache");
  if (count == 0 || conv_inputs == nullptr) return Status::InvalidArgument("step: no inputs");
  if (round_.armed) {
    PC_RETURN_IF_ERROR(CheckRoundRoom(round_, count, "step"));
    if (round_.stashed != round_.appended + count) {
      return Status::FailedPrecondition("step of " + N(count) + " tokens in a round: the scan inputs of " +
                                        N(round_.stashed - round_.appended) +
                                        " tokens are stashed (StashScanInputs first)");
    }
    const std::uint64_t c = plan_.conv_channels();
    PC_RETURN_IF_ERROR(dev_->CopyOnDevice(stash_.raw + round_.appended * c, conv_inputs, count * c * sizeof(float),
                                          Lane::kCompute));
  }
  kernels::ConvRingPushArgs a;
  a.ring = conv_;
  a.inputs = conv_inputs;
  a.channels = plan_.conv_channels();
  a.kernel = plan_.kernel;
  a.count = count;
  PC_RETURN_IF_ERROR(dev_->PushConvRing(a, Lane::kCompute));
  touched_ = true;
  cur_ ^= 1;
  if (round_.armed) round_.appended += count;
  return Status::Ok();
}

// ---- KvLayerState -------------------------------------------------------------------

std::uint64_t KvLayerState::resumable_floor() const {
  if (!plan_.format.rotating() || lo_ == 0) return 0;
  return lo_ + plan_.format.window - 1;
}

Status KvLayerState::CheckInvariants() const {
  if (dev_ == nullptr) return Status::FailedPrecondition("KV layer is not part of a cache");
  auto broken = [](const std::string& what) { return Status::Internal("KV layer invariant broken: " + what); };
  if (len_ > max_ctx_) return broken("len " + N(len_) + " > max_ctx " + N(max_ctx_));
  if (!plan_.format.rotating()) {
    if (lo_ != 0) return broken("a plain layer with first held row " + N(lo_));
    return Status::Ok();
  }
  const std::uint64_t w = plan_.format.window;
  if (lo_ > len_ || len_ - lo_ > rows_ || len_ - lo_ > w) {
    return broken("holds positions [" + N(lo_) + ", " + N(len_) + ") in a buffer of " + N(rows_) + " rows");
  }
  if (lo_ != 0 && len_ - lo_ + 1 < w) {
    return broken("wrapped, yet holds " + N(len_ - lo_) + " rows of a window of " + N(w));
  }
  return Status::Ok();
}

Status KvLayerState::WriteLen() {
  return dev_->WriteI32(len_d_, static_cast<std::int32_t>(len_), Lane::kCompute);
}

void KvLayerState::NoteRewind(std::uint64_t new_len) {
  LowerWatches(&watches_, index_in_cache_, new_len);
}

Status KvLayerState::Append(const float* k_rows, const float* v_rows, std::uint64_t count) {
  PC_RETURN_IF_ERROR(CheckInvariants());
  if (count == 0) return Status::Ok();
  if (k_rows == nullptr || v_rows == nullptr) return Status::InvalidArgument("KV append: null rows");
  PC_RETURN_IF_ERROR(CheckRoundRoom(round_, count, "KV append"));
  if (count > max_ctx_ - len_) {
    return Status::ResourceExhausted("KV append of " + N(count) + " tokens at len " + N(len_) +
                                     " passes max_ctx " + N(max_ctx_));
  }
  touched_ = true;
  const std::uint64_t kw = plan_.k_width, vw = plan_.v_width;
  if (!plan_.format.rotating()) {
    PC_RETURN_IF_ERROR(dev_->CopyOnDevice(k_ + len_ * kw, k_rows, count * kw * sizeof(float), Lane::kCompute));
    PC_RETURN_IF_ERROR(dev_->CopyOnDevice(v_ + len_ * vw, v_rows, count * vw * sizeof(float), Lane::kCompute));
    len_ += count;
    if (round_.armed) round_.appended += count;
    return WriteLen();
  }
  // Only the last `rows_` rows of the call survive; earlier ones would be
  // overwritten within the call.
  const std::uint64_t keep = std::min(count, rows_), skip = count - keep;
  for (auto [plane, src, width] : {std::tuple{k_, k_rows, kw}, std::tuple{v_, v_rows, vw}}) {
    kernels::RingRowsArgs a{plane, const_cast<float*>(src + skip * width), width, rows_, len_ + skip, keep};
    PC_RETURN_IF_ERROR(dev_->ScatterRows(a, Lane::kCompute));
  }
  len_ += count;
  if (len_ - lo_ > rows_) lo_ = len_ - rows_;
  if (round_.armed) round_.appended += count;
  return WriteLen();
}

Status KvLayerState::Truncate(std::uint64_t new_len) {
  PC_RETURN_IF_ERROR(RefuseInRound(round_, "KV truncate"));
  return TruncateTo(new_len);
}

Status KvLayerState::TruncateTo(std::uint64_t new_len) {
  PC_RETURN_IF_ERROR(CheckInvariants());
  if (new_len > len_)
    return Status::InvalidArgument("KV truncate to " + N(new_len) + " above len " + N(len_));
  if (new_len == len_) return Status::Ok();
  if (new_len < resumable_floor()) {
    return Status::FailedPrecondition("KV truncate to " + N(new_len) + ": the rotating buffer of " +
                                      N(plan_.format.window) + " rows has wrapped (it holds positions from " +
                                      N(lo_) + "); its resumable floor is " + N(resumable_floor()));
  }
  len_ = new_len;
  if (lo_ > len_) lo_ = len_;  // unreachable above the floor; keeps the invariant obvious
  NoteRewind(new_len);
  return WriteLen();
}

}  // namespace primecache::engine

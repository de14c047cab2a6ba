// The cache layers' implementations: the state behind the interfaces of
// include/primecache/internal/engine.h (LatentCacheLayer, RecurrentCacheLayer,
// KvCacheLayer). Engine-internal: only engine/ (and the engine's tests,
// through EngineInternals) sees these; a SessionState (engine/session_state.h)
// owns one per layer and its own code (capture, restore, rounds) works on
// them directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "primecache/internal/engine.h"

namespace primecache::engine {

class LatentLayerState final : public LatentCacheLayer {
 public:
  const LatentPlan& plan() const override { return plan_; }
  std::uint64_t max_ctx() const override { return max_ctx_; }
  std::uint64_t len() const override { return len_; }
  std::uint32_t width() const override { return plan_.width(); }
  std::uint32_t index_width() const override { return plan_.index_width(); }
  std::uint32_t pool() const override { return pool_; }
  std::uint64_t pools_ready() const override { return pools_ready_; }
  bool index_is_ring() const override { return ring_; }
  std::uint64_t booked_ring_rows() const override { return ring_ ? index_rows_ : 0; }
  std::uint64_t index_ring_rows() const override { return ring_rows_; }
  std::uint64_t pool_key_capacity() const override { return key_capacity_; }
  std::uint64_t index_floor() const override { return floor_; }
  const float* rows() const override { return rows_; }
  const std::int32_t* len_device() const override { return len_d_; }
  const float* index_rows() const override { return index_; }
  const float* pool_keys() const override { return keys_; }
  Status Append(const float* latent_rows, const float* index_rows, std::uint64_t count,
                const IndexerInputs* indexer) override;
  Status Truncate(std::uint64_t new_len) override;
  const RoundMark& round() const override { return round_; }
  std::uint64_t committed_len() const override { return round_.armed ? round_.base : len_; }
  std::uint64_t committed_pools_ready() const override {
    return round_.armed ? round_.pools_ready : pools_ready_;
  }
  Status CheckInvariants() const override;

  Status ResolvePool(std::uint32_t pool);
  Status WriteLen();
  void NoteRewind(std::uint64_t new_len);
  Status TruncateTo(std::uint64_t new_len);
  Status Arm(std::uint64_t tokens);
  Status Rollback(std::uint64_t keep);

  Device* dev_ = nullptr;
  RoundMark round_;
  std::size_t index_in_cache_ = 0;
  LatentPlan plan_;
  std::uint64_t max_ctx_ = 0;
  float* rows_ = nullptr;
  std::int32_t* len_d_ = nullptr;
  float* index_ = nullptr;
  std::uint64_t index_rows_ = 0;  // physical rows
  bool ring_ = false;
  float* keys_ = nullptr;
  std::uint64_t key_capacity_ = 0;
  float* tail_scratch_ = nullptr;

  std::uint64_t len_ = 0;
  std::uint32_t pool_ = 0;
  std::uint64_t pools_ready_ = 0;
  std::uint64_t ring_rows_ = 0;
  std::uint64_t floor_ = 0;
  bool touched_ = false;
  std::vector<std::weak_ptr<RewindWatch>> watches_;
};

class RecurrentLayerState final : public RecurrentCacheLayer {
 public:
  const RecurrentShape& plan() const override { return plan_; }
  float* conv_ring() override { return conv_; }
  const float* conv_ring() const override { return conv_; }
  const float* state() const override { return state_[cur_]; }
  float* next_state() override { return state_[cur_ ^ 1]; }
  Status Step(const float* conv_inputs, std::uint64_t count) override;
  Status StashScanInputs(const ScanInputs& inputs, std::uint64_t count) override;
  const RoundMark& round() const override { return round_; }
  const float* committed_conv_ring() const override { return round_.armed ? stash_.conv : conv_; }
  const float* committed_state() const override { return round_.armed ? stash_.state : state(); }

  Status Arm(std::uint64_t tokens);
  Status Rollback(std::uint64_t keep);

  Device* dev_ = nullptr;
  RecurrentShape plan_;
  float* conv_ = nullptr;
  float* state_[2] = {nullptr, nullptr};
  int cur_ = 0;
  bool touched_ = false;
  struct Stash {
    float *conv = nullptr, *state = nullptr, *raw = nullptr, *qkv = nullptr, *g = nullptr, *b = nullptr,
          *out = nullptr;
    float gate_lower_bound = 0.0f;
  } stash_;
  RoundMark round_;
};

class KvLayerState final : public KvCacheLayer {
 public:
  const KvPlan& plan() const override { return plan_; }
  std::uint64_t max_ctx() const override { return max_ctx_; }
  std::uint64_t len() const override { return len_; }
  std::uint64_t capacity() const override { return rows_; }
  std::uint64_t first_held() const override { return lo_; }
  std::uint64_t held_rows() const override { return len_ - lo_; }
  std::uint64_t resumable_floor() const override;
  const float* k_rows() const override { return k_; }
  const float* v_rows() const override { return v_; }
  const std::int32_t* len_device() const override { return len_d_; }
  Status Append(const float* k_rows, const float* v_rows, std::uint64_t count) override;
  Status Truncate(std::uint64_t new_len) override;
  Status CheckInvariants() const override;
  const RoundMark& round() const override { return round_; }
  std::uint64_t committed_len() const override { return round_.armed ? round_.base : len_; }
  std::uint64_t committed_first_held() const override { return round_.armed ? round_.first_held : lo_; }
  std::vector<RowRun> CommittedRuns() const override;

  Status WriteLen();
  void NoteRewind(std::uint64_t new_len);
  Status TruncateTo(std::uint64_t new_len);
  Status Arm(std::uint64_t tokens);
  Status Rollback(std::uint64_t keep);

  RoundMark round_;
  float* round_k_ = nullptr;
  float* round_v_ = nullptr;
  Device* dev_ = nullptr;
  std::size_t index_in_cache_ = 0;
  KvPlan plan_;
  std::uint64_t max_ctx_ = 0;
  float* k_ = nullptr;
  float* v_ = nullptr;
  std::uint64_t rows_ = 0;
  std::int32_t* len_d_ = nullptr;
  std::uint64_t len_ = 0;
  std::uint64_t lo_ = 0;  // first held position (rotating)
  bool touched_ = false;
  std::vector<std::weak_ptr<RewindWatch>> watches_;
};

// Layer i of a session's layers as the implementation T, or null when it is
// of another kind (or out of range).
template <typename T, typename Layers>
T* LayerAt(Layers& layers, std::size_t i) {
  if (i >= layers.size()) return nullptr;
  auto* p = std::get_if<std::unique_ptr<T>>(&layers[i]);
  return p != nullptr ? p->get() : nullptr;
}

}  // namespace primecache::engine

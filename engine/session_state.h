// The state behind include/primecache/internal/engine.h's SessionCache and
// PendingCapture: SessionState, the session cache's implementation (its
// arena, its layers' states, whether a restore broke it, whether a round is
// armed), and PendingState, an eager capture's slot on its way to host
// memory. Engine-internal, as engine/layer_state.h is: only engine/ (and the
// engine's tests, through EngineInternals) sees these. SessionState's
// methods live by concern: session.cc (layers, freshness, invariants),
// capture.cc, restore.cc, round.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "engine/layer_state.h"
#include "primecache/internal/engine.h"

namespace primecache::engine {

class SessionState final : public SessionCache {
 public:
  SessionState(std::shared_ptr<EngineCore> core, std::uint32_t arena, std::uint64_t id);
  ~SessionState() override;  // hands its arena back to the engine

  std::uint64_t id() const override { return id_; }
  const StatePlan& plan() const override;
  std::uint64_t max_ctx() const override;
  std::size_t layer_count() const override { return layers_.size(); }
  LatentCacheLayer* latent(std::size_t i) override;
  RecurrentCacheLayer* recurrent(std::size_t i) override;
  KvCacheLayer* kv(std::size_t i) override;
  const LatentCacheLayer* latent(std::size_t i) const override;
  const RecurrentCacheLayer* recurrent(std::size_t i) const override;
  const KvCacheLayer* kv(std::size_t i) const override;
  bool fresh() const override;
  Status CheckInvariants() const override;

  Status ArmRound(std::uint64_t tokens) override;
  bool round_armed() const override { return round_armed_; }
  Result<std::uint64_t> RoundAppended() const override;
  Status CommitRound() override;
  Status RollbackRound(std::uint64_t keep) override;

  Result<std::vector<LayerSnapshot>> CaptureFull() override;
  Result<std::vector<LayerSnapshotView>> CaptureFullInto(const CaptureSpace& space) override;
  Result<PendingCapture> CaptureEager() override;
  Result<std::vector<LayerSnapshot>> CompleteCapture(EagerHalf eager) override;
  Result<std::vector<LayerSnapshotView>> CompleteCaptureInto(EagerHalf eager, const CaptureSpace& space) override;

  std::vector<LayerGeometry> Geometry() const override;
  Status ValidateRestore(std::span<const LayerSnapshotView> layers) const override;
  Status ValidateRestore(std::span<const LayerSnapshot> layers) const override;
  Status ValidateRestore(const BoundarySnapshot& snapshot) const override;
  Status Restore(std::span<const LayerSnapshotView> layers,
                 PlaneResidence residence = PlaneResidence::kHost) override;
  Status Restore(std::span<const LayerSnapshot> layers) override;
  Status Restore(const BoundarySnapshot& snapshot) override;

  struct Sources;  // capture.cc: where a capture's planes come from
  using Layer = std::variant<std::unique_ptr<LatentLayerState>, std::unique_ptr<RecurrentLayerState>,
                             std::unique_ptr<KvLayerState>>;

  Status CheckCapturable() const;
  Status CheckRoundBoundary(const char* what) const;
  Result<Sources> FullSources();
  Status CheckCompletion(const EagerHalf& eager) const;
  Result<Sources> CompletionSources(EagerHalf& eager);

  std::shared_ptr<EngineCore> core_;
  std::uint32_t arena_ = 0;
  std::uint64_t id_ = 0;
  std::vector<Layer> layers_;
  std::string broken_;  // why a failed restore left it unusable; empty when healthy
  bool round_armed_ = false;
};

// A PendingCapture's state: the slot it holds, the event its trip to host
// memory records, and the eager half's metadata. Destroying it releases the
// slot (waiting for the copy first) unless it is released already.
struct PendingState {
  PendingState() = default;
  PendingState(const PendingState&) = delete;
  PendingState& operator=(const PendingState&) = delete;
  ~PendingState() { Release(); }
  void Release();

  std::shared_ptr<EngineCore> core;
  std::uint32_t slot = 0;
  bool held = false;
  std::unique_ptr<Event> event;
  EagerHalf half;  // metadata; the planes are filled in by Collect
};

}  // namespace primecache::engine

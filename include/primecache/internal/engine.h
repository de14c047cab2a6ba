// The engine's cache state: devices, session caches and their layers.
// Internal to the build (not installed), like everything under
// include/primecache/internal/. This header is the engine's interface only:
// the layers' state is engine/layer_state.h's, behind the layer interfaces
// below, and a session's and a pending capture's engine/session_state.h's.
//
// An Engine owns one device's reserve (reserve.h): every session arena and
// every snapshot slot is allocated by Engine::Create, exactly as PlanReserve
// lays them out. A SessionCache is one session's state, one layer object per
// state-plan layer:
//
//  - LatentCacheLayer: rows [max_ctx, width] f32, one per token; len, and a device
//    mirror of len kept in lock-step (every call that moves len rewrites it,
//    in lane order); with an indexer, an index plane (flat, or a tail ring of
//    the booked rows rounded down to a multiple of the pool when the pool is
//    first seen), resident pool keys [max_ctx / pool, index_head_dim] f32 and
//    pools_ready, the count of leading pools whose keys are final. len is
//    authoritative for both planes. At every call boundary pools_ready ==
//    len / pool; every call checks it, and anything that lowers len clamps
//    pools_ready in the same place.
//  - RecurrentCacheLayer: a KDA layer's conv ring and recurrent state (a ping-pong
//    pair: a step reads state() and writes next_state()).
//  - KvCacheLayer: plain K and V rows with len and its mirror.
//
// Speculative verify rounds (SessionCache::ArmRound) put every layer in a
// round: appends stay within the armed positions, and the round ends in a
// commit (all kept) or a rollback to `keep` positions that leaves the cache
// bit-identical to one armed at the same point and given only those.
//
// Pointers the layers take and return are device pointers of the engine's
// device (host pointers on the CPU backend). The layers' work runs in order on
// the device's compute lane: inputs handed to an append or a step must stay
// valid until the lane has passed the call. A SessionCache and its layers are
// used by one thread at a time; different sessions may be used concurrently
// only on the CPU backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "primecache/internal/reserve.h"
#include "primecache/internal/snapshot.h"
#include "primecache/internal/state_plan.h"
#include "primecache/status.h"

namespace primecache::engine {

// ---- devices ----------------------------------------------------------------

// A Device is a handle here: a caller makes one (NewCpuDevice,
// NewCudaDevice) and hands it to Engine::Create, which shares it with every
// session. Its interface (memory, lanes, transfers, events, the kernels) is
// the engine's seam, engine/device.h. Like this header, it is internal to the
// build (only include/primecache/'s top-level headers are installed); it
// lives beside its library rather than under include/ because it names the
// kernels' argument types (kernels/*.h). Code of this tree that works on
// device memory itself includes it: the model (engine/model/hybrid_model.h),
// the engine's tests and the engine and model benchmarks; code that only
// runs the engine (serving, primecache-run, the Python package) does not.
// Device pointers handed to the layers come from the caller's own
// allocations on the same device (host memory on the CPU backend).
class Device;

struct CpuDeviceOptions {
  std::uint64_t memory_bytes = 8ull << 30;  // the "device memory" it hands out before refusing
};

struct CudaDeviceOptions {
  int ordinal = 0;
  std::size_t staging_chunk_bytes = 8u << 20;  // each of the two pinned staging buffers
};

std::shared_ptr<Device> NewCpuDevice(const CpuDeviceOptions& options = {});
// NotSupported when built without CUDA; Unavailable without a device.
Result<std::shared_ptr<Device>> NewCudaDevice(const CudaDeviceOptions& options = {});
// Built with CUDA and at least one device present.
bool CudaDeviceAvailable();

// ---- layers -----------------------------------------------------------------

// What the model's indexer passes with every append: the pool it runs with
// (refused unless it equals the plan's; the layer resolves its pool from the
// first append and never changes it) and the layer's constant ape, a device
// pointer to [pool, index_head_dim] f32 (weights; not part of the state).
struct IndexerInputs {
  std::uint32_t pool = 0;
  const float* ape = nullptr;
};

struct RewindWatch;  // engine-internal: low-water marks for the deferred capture

// A layer's part in the armed speculative round (engine/round.cc).
struct RoundMark {
  bool armed = false;
  std::uint64_t base = 0;      // len when armed (0 for a recurrent layer)
  std::uint64_t limit = 0;     // positions the round may append
  std::uint64_t appended = 0;  // positions appended (stepped) since arming
  std::uint64_t pools_ready = 0;  // latent: pools_ready when armed
  std::uint64_t first_held = 0;   // rotating KV: first held position when armed
  std::uint64_t stashed = 0;      // rotating KV: rows stashed; recurrent: tokens whose scan inputs are stashed
};

// The scan inputs of the tokens a recurrent layer's next Step consumes, as
// the model's scan read them (device pointers, token-major): q|k|v
// [count, 3 * heads * head_dim] (q and k l2-normalised per head), gate logits
// [count, heads * head_dim], beta logits [count, heads], and the scan's gate
// bound.
struct ScanInputs {
  const float* qkv = nullptr;
  const float* g = nullptr;
  const float* b = nullptr;
  float gate_lower_bound = 0.0f;
};
struct EngineCore;   // engine-internal shared state (arenas, slots)
struct PendingState;  // engine-internal: a pending capture's state (engine/session_state.h)

// The layers are interfaces: SessionCache owns each layer's implementation
// (engine/layer_state.h, engine-internal), and hands out these.
class LatentCacheLayer {
 public:
  LatentCacheLayer(const LatentCacheLayer&) = delete;
  LatentCacheLayer& operator=(const LatentCacheLayer&) = delete;

  virtual const LatentPlan& plan() const = 0;
  virtual std::uint64_t max_ctx() const = 0;
  virtual std::uint64_t len() const = 0;
  virtual std::uint32_t width() const = 0;
  virtual std::uint32_t index_width() const = 0;
  // 0 until the first append (or restore) resolves it.
  virtual std::uint32_t pool() const = 0;
  virtual std::uint64_t pools_ready() const = 0;
  virtual bool index_is_ring() const = 0;
  // Physical rows booked for a ring (0 when flat).
  virtual std::uint64_t booked_ring_rows() const = 0;
  // The effective ring: booked rows rounded down to a multiple of the pool,
  // once the pool is known; 0 before, and when flat.
  virtual std::uint64_t index_ring_rows() const = 0;
  virtual std::uint64_t pool_key_capacity() const = 0;
  // The lowest token whose index row the plane still holds: rows below it were
  // lapped by the ring or never restored (their pools' keys are final).
  virtual std::uint64_t index_floor() const = 0;

  virtual const float* rows() const = 0;
  virtual const std::int32_t* len_device() const = 0;
  virtual const float* index_rows() const = 0;
  virtual const float* pool_keys() const = 0;

  // Appends `count` tokens: latent rows [count, width] and, with an indexer,
  // index rows [count, index_width] (device pointers, token-major) and the
  // indexer inputs; without one, index_rows and indexer must be null. Both
  // planes are written in the same call. With a ring the call drains it: it
  // appends what fits, builds the keys of the pools that completes, and goes
  // on, so count is bounded only by max_ctx. Keys are built only for pools
  // completed by this call. Refuses (nothing written) when count would pass
  // max_ctx, the pool disagrees with the plan or the resolved pool, or the
  // layer's invariants do not hold.
  virtual Status Append(const float* latent_rows, const float* index_rows, std::uint64_t count,
                        const IndexerInputs* indexer) = 0;

  // Lowers len to new_len <= len and clamps pools_ready to new_len / pool in
  // the same place. Refuses when the rows of the new tail are no longer held
  // (new_len / pool * pool < index_floor()), and while a round is armed.
  virtual Status Truncate(std::uint64_t new_len) = 0;

  virtual const RoundMark& round() const = 0;
  // len and pools_ready of the committed state (those at arming while a
  // round is armed).
  virtual std::uint64_t committed_len() const = 0;
  virtual std::uint64_t committed_pools_ready() const = 0;

  // Host-side invariants: len <= max_ctx; without a resolved pool no pools;
  // with one, pools_ready == len / pool, the effective ring a positive multiple
  // of the pool and the live tail within it, and index_floor() at or below the
  // tail's first row. Internal error naming the first broken one.
  virtual Status CheckInvariants() const = 0;

 protected:
  LatentCacheLayer() = default;
  ~LatentCacheLayer() = default;
};

class RecurrentCacheLayer {
 public:
  RecurrentCacheLayer(const RecurrentCacheLayer&) = delete;
  RecurrentCacheLayer& operator=(const RecurrentCacheLayer&) = delete;

  virtual const RecurrentShape& plan() const = 0;
  // [3 * heads * head_dim, kernel - 1]: per channel the last kernel-1 pre-conv
  // inputs, oldest first.
  virtual float* conv_ring() = 0;
  virtual const float* conv_ring() const = 0;
  // The current state [heads, head_dim, head_dim], and where a step writes the next.
  virtual const float* state() const = 0;
  virtual float* next_state() = 0;
  // Completes a step of `count` tokens whose new state the caller wrote into
  // next_state(): pushes the step's pre-conv inputs ([count, 3*heads*head_dim],
  // device, token-major) into the conv ring and makes next_state() current.
  // While a round is armed the step must stay within it and its tokens' scan
  // inputs must have been stashed (StashScanInputs); its pre-conv inputs are
  // stashed too.
  virtual Status Step(const float* conv_inputs, std::uint64_t count) = 0;
  // While a round is armed: stashes the scan inputs of the `count` tokens the
  // next Step consumes, so that a rollback can replay the kept ones through
  // the same scan from the pre-round state. FailedPrecondition without a
  // round, ResourceExhausted past the round's positions.
  virtual Status StashScanInputs(const ScanInputs& inputs, std::uint64_t count) = 0;

  virtual const RoundMark& round() const = 0;
  // The committed conv ring and state (the pre-round copies while a round is armed).
  virtual const float* committed_conv_ring() const = 0;
  virtual const float* committed_state() const = 0;

 protected:
  RecurrentCacheLayer() = default;
  ~RecurrentCacheLayer() = default;
};

// An attention layer's K and V rows: plain (row of position p at physical
// row p, append-only, trimmable to any length) or rotating (a buffer of W
// rows, position p at physical row p % W; it holds positions [first_held,
// len)). Rows are f32 or TurboQuant words (KvFormat); the layer moves them
// as 4-byte words and never looks inside.
//
// Rotating invariants: len - first_held <= W, and first_held == 0 (never
// wrapped) or len - first_held >= W - 1. The resumable floor is the lowest
// length a trim may reach with every row the next query's window reads still
// held: 0 while nothing was overwritten, first_held + W - 1 after a wrap. A
// plain layer's floor is 0.
class KvCacheLayer {
 public:
  KvCacheLayer(const KvCacheLayer&) = delete;
  KvCacheLayer& operator=(const KvCacheLayer&) = delete;

  virtual const KvPlan& plan() const = 0;
  virtual std::uint64_t max_ctx() const = 0;
  virtual std::uint64_t len() const = 0;
  // Physical rows of each plane (W when rotating, max_ctx when plain).
  virtual std::uint64_t capacity() const = 0;
  virtual std::uint64_t first_held() const = 0;
  virtual std::uint64_t held_rows() const = 0;
  virtual std::uint64_t resumable_floor() const = 0;
  virtual const float* k_rows() const = 0;
  virtual const float* v_rows() const = 0;
  virtual const std::int32_t* len_device() const = 0;
  // Appends count rows of K [count, k_width] and V [count, v_width] (device
  // pointers, token-major). A rotating layer keeps the last W of them, written
  // by one row-scatter launch per plane.
  virtual Status Append(const float* k_rows, const float* v_rows, std::uint64_t count) = 0;
  // Lowers len to new_len; FailedPrecondition below resumable_floor() and
  // while a round is armed.
  virtual Status Truncate(std::uint64_t new_len) = 0;
  virtual Status CheckInvariants() const = 0;

  virtual const RoundMark& round() const = 0;
  virtual std::uint64_t committed_len() const = 0;
  // A rotating layer's held rows of the committed state, in logical order,
  // as runs of rows: from the round's stash where the round overwrote them,
  // else from the buffer. Plain layers: rows [0, committed_len()).
  struct RowRun {
    const float* k = nullptr;
    const float* v = nullptr;
    std::uint64_t offset = 0, rows = 0;  // logical offset from the first held row
  };
  virtual std::uint64_t committed_first_held() const = 0;
  virtual std::vector<RowRun> CommittedRuns() const = 0;

 protected:
  KvCacheLayer() = default;
  ~KvCacheLayer() = default;
};

// ---- capture and restore ----------------------------------------------------

// The eager half of a boundary capture: per layer, what generation destroys,
// copied out at the boundary, with the boundary's shape that the deferred
// half checks the live layers against. Each layer's part is a partial
// snapshot of its kind (snapshot.h), holding only the planes captured
// eagerly: a latent layer's index tail rows (index_tail_rows; its shape's
// index_ring_rows is the effective ring), a recurrent layer's whole state,
// a rotating KV layer's held rows in logical order (none for plain KV). The
// deferred half fills in the rest from the live layers.
struct EagerHalf {
  std::uint64_t session_id = 0;  // the cache it was captured from
  std::vector<LayerSnapshot> layers;  // the eagerly captured planes only (above)
  // Rewinds of the captured cache since the capture (engine-internal).
  std::shared_ptr<const RewindWatch> watch;
};

// An eager half on its way out of the device: its slot's on-device copy is
// enqueued, and the slot's content leaves for pinned host memory on the
// transfer lane. Collect waits for that and frees the slot; destroying an
// uncollected capture waits for the copy too, then frees the slot. Move-only.
class PendingCapture {
 public:
  // Made by SessionCache::CaptureEager (its state is engine-internal).
  explicit PendingCapture(std::unique_ptr<PendingState> state);
  PendingCapture(PendingCapture&& other) noexcept;
  PendingCapture& operator=(PendingCapture&& other) noexcept;
  PendingCapture(const PendingCapture&) = delete;
  PendingCapture& operator=(const PendingCapture&) = delete;
  ~PendingCapture();

  // True once the slot's content is in pinned host memory (never blocks).
  Result<bool> Ready() const;
  // Waits for the slot's trip to host memory and returns the eager half.
  // Only once: a second call is FailedPrecondition.
  Result<EagerHalf> Collect();

 private:
  std::unique_ptr<PendingState> state_;  // null once moved from
};

// Borrowed views of one layer snapshot: its shape and its planes, which may
// live anywhere in host memory (pinned memory restores at the bus rate), or in
// the engine's device memory (PlaneResidence::kDevice: a restore staged on the
// device). The planes are laid out as in the matching snapshot type of
// snapshot.h.
struct LatentSnapshotView {
  LatentShape shape;
  std::span<const float> latent_rows, index_tail_rows, pool_keys;
};
struct RecurrentSnapshotView {
  RecurrentShape shape;
  std::span<const float> conv_ring, state;
};
struct KvSnapshotView {
  KvShape shape;
  std::span<const float> k_rows, v_rows;
};
using LayerSnapshotView = std::variant<LatentSnapshotView, RecurrentSnapshotView, KvSnapshotView>;
enum class PlaneResidence : std::uint8_t { kHost, kDevice };
LayerSnapshotView ViewOf(const LayerSnapshot& layer);
LayerShape ShapeOfView(const LayerSnapshotView& view);
// A view's planes in the codec's stored order (the view's own order).
std::vector<std::span<const float>> PlanesOfView(const LayerSnapshotView& view);
// A view of `shape` whose planes lie back to back at `base` (floats, in the
// view's plane order), and how many floats they take. `shape` is of the
// reference engine's kinds: one of the engine's own, or one that passed
// Validate against an engine layer's geometry (which no linear-state or
// kv-indexed shape does).
LayerSnapshotView ViewAt(const LayerShape& shape, const float* base);
std::uint64_t ViewFloats(const LayerShape& shape);

// Gives `floats` floats of host memory for a capture to write its planes into
// (pinned memory lets the copies run back to back on the device's DMA engine).
using CaptureSpace = std::function<Result<std::span<float>>(std::uint64_t floats)>;
std::vector<LayerSnapshotView> ViewsOf(std::span<const LayerSnapshot> layers);

// The geometry a session cache of this reserve restores into, per layer
// (latent rings at their effective size).
std::vector<LayerGeometry> RestoreGeometry(const ReserveRequest& request);

// The device-independent restore validation: every layer against its target
// (kind, widths, pool, heads, kernel, len within max_ctx, tail within the
// ring, the shape's own invariants, every plane's size), the layer count, and
// one len shared by every per-token layer. InvalidArgument naming every
// failing layer; nothing is touched.
Status ValidateRestore(std::span<const LayerSnapshotView> layers, std::span<const LayerGeometry> targets);

// ---- sessions and the engine -------------------------------------------------

// One session's cache: an interface, as the layers are (its implementation,
// SessionState, is engine/session_state.h's). Engine::NewSession makes one.
class SessionCache {
 public:
  virtual ~SessionCache() = default;  // the implementation hands its arena back to the engine
  SessionCache(const SessionCache&) = delete;
  SessionCache& operator=(const SessionCache&) = delete;

  virtual std::uint64_t id() const = 0;
  virtual const StatePlan& plan() const = 0;
  virtual std::uint64_t max_ctx() const = 0;
  virtual std::size_t layer_count() const = 0;
  // Layer i as its kind, or null when layer i is of another kind (or out of range).
  virtual LatentCacheLayer* latent(std::size_t i) = 0;
  virtual RecurrentCacheLayer* recurrent(std::size_t i) = 0;
  virtual KvCacheLayer* kv(std::size_t i) = 0;
  virtual const LatentCacheLayer* latent(std::size_t i) const = 0;
  virtual const RecurrentCacheLayer* recurrent(std::size_t i) const = 0;
  virtual const KvCacheLayer* kv(std::size_t i) const = 0;

  // Nothing appended, stepped or restored since the engine handed it out.
  virtual bool fresh() const = 0;
  // Every layer's CheckInvariants, and not left broken by a failed restore.
  virtual Status CheckInvariants() const = 0;

  // ---- speculative verify rounds (docs/engine.md, "Speculative rounds")

  // Arms a round on every layer: the next calls may append up to `tokens`
  // positions (at most the reserve's round_tokens), and the round ends with
  // CommitRound (all kept) or RollbackRound(keep). Stashes what a rollback
  // needs (each recurrent layer's conv ring and state, each rotating layer's
  // rows the round may overwrite) in the arena's round stash. Refuses, with
  // nothing armed: a round already armed, tokens 0 or above the reserve, a
  // cache off a call boundary, broken or failing its invariants.
  virtual Status ArmRound(std::uint64_t tokens) = 0;
  virtual bool round_armed() const = 0;
  // Positions appended since arming (0 without a round); every layer must
  // agree (a call boundary) for a commit or a rollback.
  virtual Result<std::uint64_t> RoundAppended() const = 0;
  // Keeps everything the round appended and disarms.
  virtual Status CommitRound() = 0;
  // Keeps the first `keep` positions the round appended (0 <= keep <= the
  // appended count) and disarms: latent and plain KV layers trimmed (index
  // ring, pool keys and pools_ready with them), rotating layers trimmed with
  // the overwritten rows put back, recurrent layers restored and the kept
  // tokens replayed through the same scan. A device failure leaves the
  // cache broken.
  virtual Status RollbackRound(std::uint64_t keep) = 0;

  // ---- capture: while a round is armed, every capture takes the committed
  // state (the cache as it was when the round was armed): a boundary never
  // falls inside a round. Preconditions for all three: every per-token layer holds
  // the same len > 0, every indexer's pool is resolved, pools_ready == len /
  // pool, and the invariants hold.

  // A full snapshot, every plane copied to host memory before it returns.
  virtual Result<std::vector<LayerSnapshot>> CaptureFull() = 0;
  // The same into one block `space` gives (planes back to back, layer by
  // layer, in view order); views of it. With pinned space every plane's copy
  // is enqueued on the compute lane and the lane is waited for once.
  virtual Result<std::vector<LayerSnapshotView>> CaptureFullInto(const CaptureSpace& space) = 0;
  // The eager half: the incomplete tail-ring rows, each recurrent layer's
  // conv ring and state, and the boundary metadata, copied on the device into
  // a free snapshot slot (ResourceExhausted when none is free); the call
  // returns once the copies are enqueued.
  virtual Result<PendingCapture> CaptureEager() = 0;
  // The deferred half: slices latent rows [0, len) and final pool keys [0,
  // pools_ready * index_head_dim) (and K/V rows [0, len)) at the captured
  // boundary out of the live layers and joins them with the eager half.
  // Refuses (FailedPrecondition, nothing returned) any disagreement: another
  // session, fewer rows than the boundary, a rewind below the boundary since
  // the capture, another pool, pools_ready behind the boundary, other widths
  // or shapes, a tail that is not the boundary's.
  virtual Result<std::vector<LayerSnapshot>> CompleteCapture(EagerHalf eager) = 0;
  // The same checks, the planes written into one block `space` gives (as
  // CaptureFullInto); views of it.
  virtual Result<std::vector<LayerSnapshotView>> CompleteCaptureInto(EagerHalf eager,
                                                                     const CaptureSpace& space) = 0;

  // ---- restore

  virtual std::vector<LayerGeometry> Geometry() const = 0;
  // ValidateRestore against Geometry(), and FailedPrecondition unless the
  // cache is fresh.
  virtual Status ValidateRestore(std::span<const LayerSnapshotView> layers) const = 0;
  virtual Status ValidateRestore(std::span<const LayerSnapshot> layers) const = 0;
  // Also checks the boundary header (len == boundary_len == token count).
  virtual Status ValidateRestore(const BoundarySnapshot& snapshot) const = 0;
  // Validates every layer, then copies: latent rows [0, len), the final pool
  // keys into the plane sized to the session's capacity, the tail rows at
  // their physical ring (or flat) addresses, len, pools_ready, the pool and
  // every len mirror; conv rings and states; K/V rows. A snapshot that fails
  // validation leaves the cache exactly as it was. A device failure during
  // the copies leaves the cache broken (every later call refuses).
  virtual Status Restore(std::span<const LayerSnapshotView> layers,
                         PlaneResidence residence = PlaneResidence::kHost) = 0;
  virtual Status Restore(std::span<const LayerSnapshot> layers) = 0;
  virtual Status Restore(const BoundarySnapshot& snapshot) = 0;

 protected:
  SessionCache() = default;
};

class Engine {
 public:
  // Preflight(request, device free bytes), then allocation of every session
  // arena and snapshot slot through the same reserve plan. ResourceExhausted
  // with the preflight's reason when it does not fit.
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<Device> device,
                                                const ReserveRequest& request);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ReservePlan& reserve() const;
  // The engine's device (a handle here; see Device above).
  Device& device() const;
  // A fresh session cache (its arena zeroed); ResourceExhausted when every
  // reserved session is open.
  Result<std::unique_ptr<SessionCache>> NewSession();
  std::uint32_t open_sessions() const;
  std::uint32_t free_snapshot_slots() const;

 private:
  explicit Engine(std::shared_ptr<EngineCore> core);
  std::shared_ptr<EngineCore> core_;
};

}  // namespace primecache::engine

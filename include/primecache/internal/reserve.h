// Reserve planning: one pure function (PlanReserve) turns a state plan and a
// serving configuration into the size and place of every buffer the engine
// allocates. The preflight (Preflight, FitReserve) calls it before anything is
// allocated and refuses a configuration that will not fit, with the reason;
// Engine::Create calls the same function and allocates exactly what it says,
// so the two cannot disagree.
//
// Layout. Every session owns one device arena of session_bytes; each layer's
// buffers sit at the offsets below, each aligned to kReserveAlignment. Every
// snapshot slot is one device block of slot_bytes (per-layer areas below) plus
// a pinned host twin of the same size, through which the slot's content
// leaves the device. Both block sizes are rounded up to kAllocationGranule.
//
// All functions here are pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "primecache/internal/state_plan.h"
#include "primecache/status.h"

namespace primecache::engine {

inline constexpr std::uint64_t kReserveAlignment = 256;
// Every allocated block (a session arena, a slot) is a multiple of this, the
// CUDA allocator's large-page granule, so that device_bytes bounds what the
// allocations really take from the device.
inline constexpr std::uint64_t kAllocationGranule = 2ull << 20;

struct ReserveRequest {
  StatePlan plan;
  std::uint64_t max_ctx = 0;          // tokens per session (fits a 32-bit len mirror)
  std::uint32_t sessions = 1;         // session caches reserved up front
  std::uint32_t snapshot_slots = 0;   // device-resident eager-capture slots
  std::uint64_t index_ring_rows = 0;  // booked physical rows of each index plane; 0: flat
  // Positions one speculative verify round may append (gamma + 1); 0: no
  // rounds. Books each session's round stash (below) and bounds the rings.
  std::uint32_t round_tokens = 0;
};

// A buffer inside an arena (session) or a slot.
struct BufferSpan {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const BufferSpan&, const BufferSpan&) = default;
};

struct LatentReserve {
  BufferSpan rows;               // [max_ctx, width] f32
  BufferSpan len_mirror;         // one int32
  BufferSpan index_plane;        // [index_rows, index_width] f32; empty without an indexer
  BufferSpan pool_keys;          // [pool_key_capacity, index_head_dim] f32
  BufferSpan tail_scratch;       // [pool - 1, index_width] f32: the tail on its way in or out
  std::uint64_t index_rows = 0;  // physical rows: booked ring rows, or max_ctx when flat
  bool index_is_ring = false;
  std::uint64_t pool_key_capacity = 0;  // max_ctx / pool
};

// A recurrent layer's round stash (empty without rounds; T = round_tokens,
// C = 3 * heads * head_dim, nd = heads * head_dim): the pre-round conv ring
// and state, and per token of the round its pre-conv inputs, its scan inputs
// (q|k|v, gate logits, beta logits) and the replay's discarded readout.
struct RecurrentRoundStash {
  BufferSpan conv_ring;  // like the layer's
  BufferSpan state;      // like one of the pair
  BufferSpan raw;        // [T, C]
  BufferSpan qkv;        // [T, C]
  BufferSpan g;          // [T, nd]
  BufferSpan b;          // [T, heads]
  BufferSpan out;        // [T, nd]
  std::uint64_t bytes() const {
    return conv_ring.bytes + state.bytes + raw.bytes + qkv.bytes + g.bytes + b.bytes + out.bytes;
  }
};

struct RecurrentReserve {
  BufferSpan conv_ring;  // [3 * heads * head_dim, kernel - 1] f32
  BufferSpan state[2];   // the ping-pong pair, [heads, head_dim, head_dim] f32 each
  RecurrentRoundStash round;
};

struct KvReserve {
  BufferSpan k_rows;  // [rows, k_width] words
  BufferSpan v_rows;  // [rows, v_width] words
  BufferSpan len_mirror;
  std::uint64_t rows = 0;  // physical rows: max_ctx, or min(window, max_ctx) when rotating
  // Rotating layers with rounds: the rows a round overwrites, [round_tokens, width] words each.
  BufferSpan round_k, round_v;
};

using LayerReserve = std::variant<LatentReserve, RecurrentReserve, KvReserve>;

// One layer's area in a snapshot slot: a latent layer's tail (at most pool - 1
// index rows), a recurrent layer's conv ring and state, a rotating KV layer's
// whole buffer (every held row is overwritten by later appends); nothing for
// plain KV (append-only, sliced by the deferred half).
struct SlotArea {
  BufferSpan tail;
  BufferSpan conv_ring;
  BufferSpan state;
  BufferSpan k_rows;
  BufferSpan v_rows;
};

// Device bytes one more token costs a session's layer of this plan once it
// holds `len` tokens: a row per token for latent and plain KV layers, 0 for a
// recurrent layer, and 0 for a rotating layer past its window (its buffer
// stops growing at W rows). What the reserve books for a session is the sum
// of these up to max_ctx (plus the fixed buffers).
std::uint64_t BytesPerToken(const LayerPlan& layer, std::uint64_t len);

struct ReservePlan {
  ReserveRequest request;
  std::vector<LayerReserve> layers;  // offsets within one session arena
  std::uint64_t session_bytes = 0;
  std::vector<SlotArea> slot_areas;  // offsets within one slot
  std::uint64_t slot_bytes = 0;
  std::uint64_t device_bytes = 0;  // sessions * session_bytes + snapshot_slots * slot_bytes
  std::uint64_t pinned_bytes = 0;  // snapshot_slots * slot_bytes

  // "2 sessions x 1.2 GiB + 4 slots x 9.0 MiB = 2.4 GiB device, 36 MiB pinned".
  std::string Summary() const;
};

// The effective size of a tail ring of `booked` physical rows for a pool:
// booked rounded down to a multiple of pool (0 when pool is 0).
inline std::uint64_t EffectiveRingRows(std::uint64_t booked, std::uint32_t pool) {
  return pool == 0 ? 0 : booked / pool * pool;
}

// The fewest booked ring rows an indexer layer of `pool` needs so that a
// round of `round_tokens` positions never laps a row a rollback may need
// back: an effective ring of at least pool - 1 + round_tokens rows (just one
// pool without rounds).
std::uint64_t MinRingRows(std::uint32_t pool, std::uint32_t round_tokens);

// Every buffer's size and place. InvalidArgument for a bad plan or request
// (CheckPlan, max_ctx outside [1, 2^31 - 1], sessions 0, a ring booked below
// MinRingRows of some indexer layer, a round longer than a rotating layer's
// buffer, any size overflowing 64 bits).
Result<ReservePlan> PlanReserve(const ReserveRequest& request);

// PlanReserve, then ResourceExhausted when device_bytes exceeds free_bytes; the
// message gives the reserve, the shortfall and the largest terms.
Result<ReservePlan> Preflight(const ReserveRequest& request, std::uint64_t free_bytes);

// What a fit may shrink.
enum class FitTarget : std::uint8_t {
  kRingRows,       // the index planes: flat, then rings halving down to one pool
  kSnapshotSlots,  // the eager-capture slots: the most that fit, up to the request
};

// The depths the ring fit tries, deepest first: the requested depth (0 =
// flat), then, starting from max_ctx for a flat request, halvings that stay at
// or above MinRingRows(pool, round_tokens) of every indexer layer. Just the
// request when the plan has no indexer.
std::vector<std::uint64_t> RingFitLadder(const ReserveRequest& request);

struct FitResult {
  ReserveRequest request;  // the request with the chosen depth or slot count
  ReservePlan plan;        // PlanReserve(request)
};

// The deepest ring (kRingRows) or the most snapshot slots (kSnapshotSlots)
// whose reserve fits free_bytes. ResourceExhausted, with Preflight's reason for
// the smallest candidate, when none fits.
Result<FitResult> FitReserve(const ReserveRequest& wanted, std::uint64_t free_bytes, FitTarget target);

}  // namespace primecache::engine

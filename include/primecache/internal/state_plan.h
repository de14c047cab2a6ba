// The state plan: per model layer, the cache state the engine carries for it.
//
//  - LatentPlan: an MLA layer's latent plane, one row of width = kv_rank +
//    rope_dim f32 per token (V is the first kv_rank elements of that row), and
//    with a DSA k-pool indexer (index_head_dim > 0) an index plane of
//    index_width = 2 * index_head_dim f32 per token and resident pool keys,
//    index_head_dim f32 per pool of `pool` tokens.
//  - RecurrentShape (layer_shape.h; a layer without length is planned by its
//    shape): a KDA layer's conv ring (the last kernel-1 pre-conv inputs
//    of the fused q, k, v planes: 3 * heads * head_dim channels) and its
//    recurrent state, heads x head_dim x head_dim f32.
//  - KvPlan: an attention layer's K and V rows (plain or rotating, f32 or
//    TurboQuant).
//
// The types are plain values; CheckPlan is pure.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "primecache/internal/layer_shape.h"
#include "primecache/internal/snapshot.h"
#include "primecache/status.h"

namespace primecache::engine {

struct LatentPlan {
  std::uint32_t kv_rank = 0;
  std::uint32_t rope_dim = 0;        // 0: NoPE, the row is kv_rank wide
  std::uint32_t index_head_dim = 0;  // 0: no k-pool indexer
  std::uint32_t pool = 0;            // tokens per k-pool; 0 without an indexer

  std::uint32_t width() const { return kv_rank + rope_dim; }
  std::uint32_t index_width() const { return 2 * index_head_dim; }
  bool has_indexer() const { return index_head_dim != 0; }
  friend bool operator==(const LatentPlan&, const LatentPlan&) = default;
};

// k_width, v_width in 4-byte words per token (KvShape); format: plain or
// rotating, f32 or TurboQuant (layer_shape.h).
struct KvPlan {
  std::uint32_t k_width = 0;
  std::uint32_t v_width = 0;
  KvFormat format = {};
  // Physical rows a session holds: the window when rotating, else max_ctx.
  std::uint64_t capacity(std::uint64_t max_ctx) const {
    return format.rotating() && format.window < max_ctx ? format.window : max_ctx;
  }
  friend bool operator==(const KvPlan&, const KvPlan&) = default;
};

// A recurrent layer's plan is its shape (heads, head_dim, kernel >= 2:
// layer_shape.h): its state has no length.
using LayerPlan = std::variant<LatentPlan, RecurrentShape, KvPlan>;

struct StatePlan {
  std::vector<LayerPlan> layers;
  friend bool operator==(const StatePlan&, const StatePlan&) = default;
};

// Largest value any single dimension of a plan may take (keeps every size
// computation far from 64-bit overflow).
inline constexpr std::uint32_t kMaxPlanDim = 1u << 20;

// Checks every layer's own invariants: a latent width >= 1; an indexer with
// pool >= 1, no pool without one; a recurrent layer with heads, head_dim >= 1
// and kernel >= 2; KV widths >= 1; no dimension above kMaxPlanDim; at least
// one layer. InvalidArgument naming every bad layer otherwise.
Status CheckPlan(const StatePlan& plan);

// The geometry a cache of this layer fixes for a restore (snapshot.h): the
// plan's widths, pool and KV format, with the cache's capacity max_ctx and,
// for an indexer, the effective ring of `booked_ring_rows` (EffectiveRingRows;
// 0: a flat index plane). A model's identity uses 0 for both: a snapshot
// restores into any cache that holds it.
LayerGeometry GeometryOf(const LayerPlan& layer, std::uint64_t max_ctx, std::uint64_t booked_ring_rows);

}  // namespace primecache::engine

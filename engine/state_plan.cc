#include "primecache/internal/state_plan.h"

#include "primecache/internal/reserve.h"

#include <string>
#include <type_traits>

namespace primecache::engine {
namespace {

void Problem(std::string* out, std::size_t layer, const std::string& what) {
  if (!out->empty()) *out += "; ";
  *out += "layer " + std::to_string(layer) + ": " + what;
}

void CheckDim(std::string* out, std::size_t layer, const char* name, std::uint32_t v) {
  if (v > kMaxPlanDim)
    Problem(out, layer, std::string(name) + " " + std::to_string(v) + " > " + std::to_string(kMaxPlanDim));
}

}  // namespace

Status CheckPlan(const StatePlan& plan) {
  if (plan.layers.empty()) return Status::InvalidArgument("state plan has no layers");
  std::string problems;
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    std::visit(
        [&](const auto& l) {
          using T = std::decay_t<decltype(l)>;
          if constexpr (std::is_same_v<T, LatentPlan>) {
            CheckDim(&problems, i, "kv_rank", l.kv_rank);
            CheckDim(&problems, i, "rope_dim", l.rope_dim);
            CheckDim(&problems, i, "index_head_dim", l.index_head_dim);
            CheckDim(&problems, i, "pool", l.pool);
            if (std::uint64_t{l.kv_rank} + l.rope_dim == 0) Problem(&problems, i, "latent width 0");
            if (l.has_indexer() && l.pool == 0) Problem(&problems, i, "indexer without a pool");
            if (!l.has_indexer() && l.pool != 0)
              Problem(&problems, i, "pool " + std::to_string(l.pool) + " without an indexer");
          } else if constexpr (std::is_same_v<T, RecurrentShape>) {
            CheckDim(&problems, i, "heads", l.heads);
            CheckDim(&problems, i, "head_dim", l.head_dim);
            CheckDim(&problems, i, "kernel", l.kernel);
            if (l.heads == 0) Problem(&problems, i, "recurrent heads 0");
            if (l.head_dim == 0) Problem(&problems, i, "recurrent head_dim 0");
            if (l.kernel < 2) Problem(&problems, i, "conv kernel " + std::to_string(l.kernel) + " < 2");
          } else {
            CheckDim(&problems, i, "k_width", l.k_width);
            CheckDim(&problems, i, "v_width", l.v_width);
            if (l.k_width == 0 || l.v_width == 0) Problem(&problems, i, "KV width 0");
            // The format's own rules are the snapshot shape's (one place).
            const Status f = CheckShape(KvShape{1, l.k_width, l.v_width, l.format, l.format.rotating() ? 1u : 0u});
            if (!f.ok() && l.k_width != 0 && l.v_width != 0) Problem(&problems, i, f.message());
          }
        },
        plan.layers[i]);
  }
  if (!problems.empty()) return Status::InvalidArgument("state plan: " + problems);
  return Status::Ok();
}

LayerGeometry GeometryOf(const LayerPlan& layer, std::uint64_t max_ctx, std::uint64_t booked_ring_rows) {
  if (const auto* l = std::get_if<LatentPlan>(&layer)) {
    const std::uint64_t ring = l->has_indexer() ? EffectiveRingRows(booked_ring_rows, l->pool) : 0;
    return LatentGeometry{l->width(), l->index_width(), l->pool, ring, max_ctx};
  }
  if (const auto* r = std::get_if<RecurrentShape>(&layer)) return *r;
  const auto& kv = std::get<KvPlan>(layer);
  return KvGeometry{kv.k_width, kv.v_width, max_ctx, kv.format};
}

}  // namespace primecache::engine

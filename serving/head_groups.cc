// A TP rank's head-group parts (serving/head_groups.h).
#include "serving/head_groups.h"

#include <string>
#include <variant>

#include "primecache/internal/rank_parts.h"
#include "primecache/internal/shard.h"

namespace primecache::model {
namespace {

// The j-th of n runs of a sharded layer's heads, sliced out of its view.
Result<LayerSnapshot> SliceRun(const engine::LayerSnapshotView& view, std::uint32_t kv_heads, std::uint32_t n,
                               std::uint32_t j) {
  if (const auto* r = std::get_if<engine::RecurrentSnapshotView>(&view)) {
    PC_ASSIGN_OR_RETURN(HeadRange run, RankHeads(r->shape.heads, n, j));
    PC_ASSIGN_OR_RETURN(RecurrentSnapshot s, SliceRecurrentHeads(r->shape, r->conv_ring, r->state, run));
    return LayerSnapshot{std::move(s)};
  }
  const auto* kv = std::get_if<engine::KvSnapshotView>(&view);
  if (kv == nullptr) return Status::InvalidArgument("a replicated layer has no heads to split");
  PC_ASSIGN_OR_RETURN(HeadRange run, RankHeads(kv_heads, n, j));
  PC_ASSIGN_OR_RETURN(KvSnapshot s, SliceKvHeads(kv->shape, kv->k_rows, kv->v_rows, kv_heads, run));
  return LayerSnapshot{std::move(s)};
}

}  // namespace

std::uint32_t RankHeadGroups(std::span<const LayerShape> layers, std::uint32_t kv_heads, std::uint32_t tp) {
  std::vector<std::uint32_t> heads;
  for (const LayerShape& s : layers) {
    if (const auto* r = std::get_if<RecurrentShape>(&s)) heads.push_back(r->heads);
    if (std::holds_alternative<KvShape>(s)) heads.push_back(kv_heads);
  }
  return HeadGroups(tp, heads);
}

Result<std::vector<GroupPart>> RankGroupParts(std::span<const engine::LayerSnapshotView> layers,
                                              std::uint32_t kv_heads, std::uint32_t tp, std::uint32_t rank,
                                              std::uint64_t token) {
  if (token == 0 || tp == 0 || rank >= tp) {
    return Status::InvalidArgument("TP publish: rank " + std::to_string(rank) + " of " + std::to_string(tp) +
                                   (token == 0 ? " without a group token" : ""));
  }
  std::vector<LayerShape> shapes;
  for (const engine::LayerSnapshotView& v : layers) shapes.push_back(engine::ShapeOfView(v));
  const std::uint32_t groups = RankHeadGroups(shapes, kv_heads, tp);
  const std::uint32_t n = groups / tp;
  std::vector<GroupPart> parts;
  for (std::uint32_t j = n; j-- > 0;) {
    GroupPart part;
    part.group = PublishGroup{token, groups, rank * n + j};
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (!InRankPart(shapes[l], part.group.rank)) continue;
      if (!IsSharded(shapes[l]) || n == 1) {
        part.layers.push_back(layers[l]);
        continue;
      }
      auto run = SliceRun(layers[l], kv_heads, n, j);
      if (!run.ok()) return run.status().WithContext("TP publish: layer " + std::to_string(l));
      part.sliced.push_back(std::move(run).value());
      // The snapshot's planes stay where they are when `sliced` grows.
      part.layers.push_back(engine::ViewOf(part.sliced.back()));
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace primecache::model

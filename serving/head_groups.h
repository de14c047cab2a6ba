// The head-group parts a rank of a tensor-parallel engine publishes a
// boundary as (HeadGroups, primecache/internal/rank_parts.h): rank r of TP
// a, with n = groups / a parts of its own, publishes parts [r*n, (r+1)*n),
// part r*n + j holding the j-th run of its heads of every sharded layer and
// part 0 the replicated layers too. To the store these are the ranks of a
// group (PublishGroup): the entry is visible once every part committed.
// Private to primecache_serving.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "primecache/entry.h"
#include "primecache/internal/engine.h"
#include "primecache/internal/snapshot.h"
#include "primecache/status.h"

namespace primecache::model {

// One part, ready to publish: its group (token, part count, index) and its
// layers in layer order, as views of the rank's own (a replicated layer, or
// a sharded one when the rank has one part) or of the runs of heads sliced
// into `sliced`, which the views point into (moving the part keeps them).
struct GroupPart {
  PublishGroup group;
  std::vector<engine::LayerSnapshotView> layers;
  std::vector<LayerSnapshot> sliced;
};

// HeadGroups of a rank holding layers of these shapes (its KDA heads from
// their shapes, `kv_heads` of each KV layer).
std::uint32_t RankHeadGroups(std::span<const LayerShape> layers, std::uint32_t kv_heads, std::uint32_t tp);

// Rank `rank` of TP `tp`'s parts of a boundary held as `layers` (its every
// layer; `kv_heads` its kv heads of each KV layer), under `token`, in the
// order to publish them: descending, so that rank 0's last is part 0.
// InvalidArgument for a token of 0, a rank out of range or a layer whose
// heads do not split into its parts.
Result<std::vector<GroupPart>> RankGroupParts(std::span<const engine::LayerSnapshotView> layers,
                                              std::uint32_t kv_heads, std::uint32_t tp, std::uint32_t rank,
                                              std::uint64_t token);

}  // namespace primecache::model

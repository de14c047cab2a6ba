// What one rank of a tensor-parallel engine reads of a stored entry, and how
// it makes its own shards of what it read (docs/design-tensor-parallel.md,
// "Restore: every rank or none").
//
// An entry of `stored_ranks` parts lies in the order EntryLayerParts names:
// rank 0's every layer, then each later stored rank's shards of the sharded
// layers. A rank r of TP b holds heads [r*h/b, (r+1)*h/b) of each sharded
// layer; stored rank s of TP a holds [s*h/a, (s+1)*h/a). So rank r reads
// the replicated layers from rank 0's part and, of each sharded layer, the
// parts of the stored ranks whose heads overlap its own:
//  - a == b: its own part and nothing else;
//  - b > a: one stored part, of which it keeps a run of heads;
//  - b < a: a/b stored parts (or one more, when b does not divide a),
//    gathered, then cut to its heads.
// Which layers are sharded comes from the restoring model's own plan, so
// the plan is made before anything is fetched; the fetched layers' shapes
// are checked when they are assembled, and again by the restore.
//
// Pure functions on plain values; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "primecache/internal/snapshot.h"
#include "primecache/status.h"

namespace primecache {

// How many head-group parts a TP engine stores each boundary in (the
// entry's `ranks`): a TP-`tp` engine whose ranks each hold `rank_heads[i]`
// heads of its i-th sharded layer (KDA heads, kv heads) publishes tp * n
// parts, rank r parts [r*n, (r+1)*n), each a run of its heads, with n the
// largest divisor of every rank_heads[i] that keeps tp * n within
// kMaxHeadGroups (n = 1 at or beyond it). Any TP size that divides the
// part count then reads exactly its own heads' parts (PlanRankParts), so a
// TP-2 entry of 8 parts restores at TP 8 with one part per rank, rather
// than each rank reading a quarter more than it keeps of a TP-2 part four
// times over. Without sharded layers: tp.
inline constexpr std::uint32_t kMaxHeadGroups = 8;
std::uint32_t HeadGroups(std::uint32_t tp, std::span<const std::uint32_t> rank_heads);

// The entry layers one model layer is made of, for one rank.
struct RankLayerSource {
  std::vector<std::uint32_t> entry_layers;  // in stored rank order
  std::uint32_t first_stored_rank = 0;      // whose part entry_layers[0] is
  bool sharded = false;
};

struct RankPartsPlan {
  std::uint32_t stored_ranks = 1;
  std::uint32_t tp = 1;
  std::uint32_t rank = 0;
  std::vector<std::uint32_t> fetch;     // the entry layers to fetch: ascending, distinct
  std::vector<RankLayerSource> layers;  // per model layer
};

// The plan of rank `rank` of TP `tp` for an entry of `entry_layers` layers
// in `stored_ranks` parts, for a model whose layer m is sharded when
// sharded[m] (IsSharded of its shape). InvalidArgument unless 1 <= tp,
// stored_ranks <= 1024, rank < tp, and entry_layers is the count the
// entry's order gives this model (its layers + (stored_ranks - 1) x its
// sharded layers).
Result<RankPartsPlan> PlanRankParts(const std::vector<bool>& sharded, std::uint32_t entry_layers,
                                    std::uint32_t stored_ranks, std::uint32_t tp, std::uint32_t rank);

// This rank's snapshots, one per model layer, from the plan's fetched layers
// decoded (fetched[i] is entry layer plan.fetch[i]); `kv_heads` are the
// whole model's kv heads of each KV layer. Refuses a layer whose kind is not
// what the plan expects (a replicated layer that is a shard, or the other
// way round), shards that do not gather, and head counts that the stored
// or the restoring TP size does not divide. Moves out of `fetched`.
Result<std::vector<LayerSnapshot>> AssembleRankParts(const RankPartsPlan& plan,
                                                     std::vector<LayerSnapshot> fetched,
                                                     std::uint32_t kv_heads);

}  // namespace primecache

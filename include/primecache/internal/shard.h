// Tensor-parallel shards of the layer snapshots whose planes split by head
// (docs/design-tensor-parallel.md): which heads a rank holds, where they lie
// in the stored planes, and slicing a whole snapshot into a rank's shard or
// gathering the shards of every rank back into the whole.
//
// A rank r of TP n holds heads [r*h/n, (r+1)*h/n) of every sharded plane; n
// must divide h. Resharding from TP a to TP b is a gather at a then a slice
// at b: the whole snapshot is the universal form.
//  - RecurrentSnapshot: the state [heads, d, d] is head-major, a rank's heads
//    one range of it; the conv ring [3 planes][heads*d][kernel-1] is
//    channel-major, a rank's heads one range of each plane.
//  - KvSnapshot: rows are token-major ([rows, heads * per_head]), so a rank's
//    heads are a column slice of every row; `heads` is passed in, the shape
//    does not carry it (k_width and v_width must be multiples of it).
// Replicated planes (latent rows, index rows, pool keys) do not shard.
//
// Pure functions on plain values; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "primecache/internal/snapshot.h"
#include "primecache/status.h"

namespace primecache {

// The heads of one rank: [first, first + count).
struct HeadRange {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  friend bool operator==(const HeadRange&, const HeadRange&) = default;
};

// A run of values of a plane: [offset, offset + count), in values.
struct ValueRange {
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
  friend bool operator==(const ValueRange&, const ValueRange&) = default;
};

// InvalidArgument unless heads >= 1, tp >= 1, rank < tp and tp divides heads.
Result<HeadRange> RankHeads(std::uint32_t heads, std::uint32_t tp, std::uint32_t rank);

// The rank's part of the whole snapshot's planes, as runs of values: the
// state one run, the conv ring three (q, k, v). These are what a rank reads
// of a stored whole entry.
struct RecurrentShardRanges {
  ValueRange state;
  ValueRange conv[3];
};
Result<RecurrentShardRanges> RecurrentRanges(const RecurrentShape& whole, std::uint32_t tp,
                                             std::uint32_t rank);
// The same for any run of heads inside the layer's (a part of a part, when
// TP sizes that do not divide each other reshard).
Result<RecurrentShardRanges> RecurrentHeadRanges(const RecurrentShape& whole, HeadRange heads);

// The rank's shard of a whole snapshot (its shape has heads / tp heads).
Result<RecurrentSnapshot> SliceRecurrent(const RecurrentSnapshot& whole, std::uint32_t tp,
                                         std::uint32_t rank);
// The snapshot of the run `heads` of the snapshot's heads.
Result<RecurrentSnapshot> SliceRecurrentHeads(const RecurrentSnapshot& whole, HeadRange heads);
// The same of a layer whose planes lie elsewhere (a view of a capture): they
// must hold what `shape` says.
Result<RecurrentSnapshot> SliceRecurrentHeads(const RecurrentShape& shape, std::span<const float> conv_ring,
                                              std::span<const float> state, HeadRange heads);
// The whole snapshot from every rank's shard, in rank order; the shards
// must have one shape and match their planes.
Result<RecurrentSnapshot> GatherRecurrent(std::span<const RecurrentSnapshot> shards);

// The same for K and V rows of `heads` heads (kv heads; each head's values
// are k_width / heads and v_width / heads of a row).
Result<KvSnapshot> SliceKv(const KvSnapshot& whole, std::uint32_t heads, std::uint32_t tp,
                           std::uint32_t rank);
// The run `range` of a KV snapshot's `heads` heads.
Result<KvSnapshot> SliceKvHeads(const KvSnapshot& whole, std::uint32_t heads, HeadRange range);
Result<KvSnapshot> SliceKvHeads(const KvShape& shape, std::span<const float> k_rows,
                                std::span<const float> v_rows, std::uint32_t heads, HeadRange range);
Result<KvSnapshot> GatherKv(std::span<const KvSnapshot> shards);

// A whole boundary (every layer) from every rank's snapshots of it, rank r's
// at index r: replicated layers (latent) must be bit-identical on every rank
// (a disagreement between ranks is refused, naming the layer and the rank),
// sharded layers (recurrent, KV) are gathered. One layer list per rank, each
// of the same kinds in the same order.
Result<std::vector<LayerSnapshot>> GatherLayers(std::span<const std::vector<LayerSnapshot>> ranks);
// Rank `rank`'s snapshots of TP `tp` from the whole boundary: latent layers
// copied, recurrent layers sliced by their heads, KV layers by `kv_heads`
// (the kv heads of every KV layer).
Result<std::vector<LayerSnapshot>> SliceLayers(std::span<const LayerSnapshot> whole, std::uint32_t kv_heads,
                                               std::uint32_t tp, std::uint32_t rank);

// The whole layer's shape from the shape of one of `ranks` equal shards of
// it (heads or row widths times `ranks`; a replicated shape as it is).
Result<LayerShape> WholeShape(const LayerShape& shard, std::uint32_t ranks);

// Whether layers of this shape split among TP ranks: recurrent and KV
// layers do; latent layers are replicated.
bool IsSharded(const LayerShape& shape);
// Whether rank `rank`'s part of a TP entry holds a layer of this shape: rank
// 0's every layer, each later rank's only the sharded ones.
inline bool InRankPart(const LayerShape& shape, std::uint32_t rank) { return rank == 0 || IsSharded(shape); }
// Where a TP entry's layer comes from: the model layer it is (a part of),
// the rank that published it, and whether it is a shard (or the whole
// replicated layer, from rank 0).
struct EntryLayerPart {
  std::uint32_t model_layer = 0;
  std::uint32_t rank = 0;
  bool shard = false;
  friend bool operator==(const EntryLayerPart&, const EntryLayerPart&) = default;
};
// Every entry layer's part, from the entry's layer shapes and rank count
// (the order below); refuses a count of layers that is not that order's.
Result<std::vector<EntryLayerPart>> EntryLayerParts(std::span<const LayerShape> entry_layers, std::uint32_t ranks);
// The whole model's layer shapes from a TP entry's layers, in the entry's
// order (PublishGroup, primecache/internal/store.h): rank 0's every layer,
// then, for each later rank, its shards of the sharded layers in layer
// order. Every rank's shard of a layer has one shape; the whole has `ranks`
// times its heads (recurrent) or row widths (KV). Refuses a count of layers
// that is not that, shards that differ, and kinds TP does not split
// (linear-state, kv-indexed).
Result<std::vector<LayerShape>> GatherShapes(std::span<const LayerShape> entry_layers, std::uint32_t ranks);

// The whole boundary from a TP entry's decoded layers and their parts
// (EntryLayerParts): the replicated layers as rank 0 stored them, each
// sharded layer gathered from its shards in rank order. Moves out of
// `entry_layers`.
Result<std::vector<LayerSnapshot>> GatherEntry(std::vector<LayerSnapshot> entry_layers,
                                               std::span<const EntryLayerPart> parts);

// The universal layout of a token-major plane of `rows` rows of `width`
// values split into `heads` heads: head-major [heads, rows, width / heads],
// where a rank's heads are one run (HeadMajorRange). ToHeadMajor and
// FromHeadMajor convert exactly; both refuse a plane of another size or a
// width that `heads` does not divide.
Result<std::vector<float>> ToHeadMajor(std::span<const float> plane, std::uint64_t rows, std::uint64_t width,
                                       std::uint32_t heads);
Result<std::vector<float>> FromHeadMajor(std::span<const float> plane, std::uint64_t rows,
                                         std::uint64_t width, std::uint32_t heads);
Result<ValueRange> HeadMajorRange(std::uint64_t rows, std::uint64_t width, std::uint32_t heads,
                                  std::uint32_t tp, std::uint32_t rank);

}  // namespace primecache

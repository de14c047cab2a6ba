// Tensor-parallel shards of head-split snapshots (primecache/internal/shard.h).
#include "primecache/internal/shard.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <variant>

namespace primecache {
namespace {

// Every shard passes CheckSnapshot and has the first one's shape; `what`
// names the gather in the refusal.
template <typename Snapshot>
Status CheckShards(std::span<const Snapshot> shards, const std::string& what) {
  if (shards.empty()) return Status::InvalidArgument(what + ": no shards");
  for (const Snapshot& s : shards) {
    PC_RETURN_IF_ERROR(CheckSnapshot(s).WithContext(what));
    if (!(s.shape == shards.front().shape)) return Status::InvalidArgument(what + ": shards differ in shape");
  }
  return Status::Ok();
}

// Copies a block of `rows` rows of `width` values from rows `src_stride`
// apart to rows `dst_stride` apart: every slice, gather and change of layout
// here is such a block (a column slice of a row-major plane).
void CopyBlock(const float* src, std::uint64_t src_stride, float* dst, std::uint64_t dst_stride,
               std::uint64_t rows, std::uint64_t width) {
  for (std::uint64_t r = 0; r < rows; ++r) std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
}

// The values of one head's part of a row of `width` values split into
// `heads` heads; refuses a split that does not divide the width, or a plane
// of rows x width values that would overflow.
Result<std::uint64_t> HeadWidth(std::uint64_t rows, std::uint64_t width, std::uint32_t heads) {
  if (heads == 0 || width == 0 || width % heads != 0) {
    return Status::InvalidArgument("head-major plane: width " + std::to_string(width) +
                                   " is not split into " + std::to_string(heads) + " heads");
  }
  if (rows != 0 && width > UINT64_MAX / rows) return Status::InvalidArgument("head-major plane: too large");
  return width / heads;
}

// HeadWidth, and the plane holds rows x width values.
Result<std::uint64_t> PerHead(std::span<const float> plane, std::uint64_t rows, std::uint64_t width,
                              std::uint32_t heads) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, HeadWidth(rows, width, heads));
  if (plane.size() != rows * width) {
    return Status::InvalidArgument("head-major plane: " + std::to_string(plane.size()) + " values, not " +
                                   std::to_string(rows) + " x " + std::to_string(width));
  }
  return w;
}

}  // namespace

Result<HeadRange> RankHeads(std::uint32_t heads, std::uint32_t tp, std::uint32_t rank) {
  if (heads == 0 || tp == 0) return Status::InvalidArgument("TP shard: heads and TP size must be at least 1");
  if (rank >= tp) {
    return Status::InvalidArgument("TP shard: rank " + std::to_string(rank) + " of TP " + std::to_string(tp) +
                                   " does not exist");
  }
  if (heads % tp != 0) {
    return Status::InvalidArgument("TP shard: TP " + std::to_string(tp) + " does not divide " +
                                   std::to_string(heads) + " heads");
  }
  const std::uint32_t count = heads / tp;
  return HeadRange{rank * count, count};
}

Result<RecurrentShardRanges> RecurrentRanges(const RecurrentShape& whole, std::uint32_t tp,
                                             std::uint32_t rank) {
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{whole}));
  PC_ASSIGN_OR_RETURN(HeadRange h, RankHeads(whole.heads, tp, rank));
  return RecurrentHeadRanges(whole, h);
}

Result<RecurrentShardRanges> RecurrentHeadRanges(const RecurrentShape& whole, HeadRange h) {
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{whole}));
  if (h.count == 0 || h.first > whole.heads || h.count > whole.heads - h.first) {
    return Status::InvalidArgument("TP shard: heads [" + std::to_string(h.first) + ", +" +
                                   std::to_string(h.count) + ") of a layer of " + std::to_string(whole.heads));
  }
  const std::uint64_t d = whole.head_dim;
  const std::uint64_t taps = whole.kernel - 1;
  const std::uint64_t plane = std::uint64_t{whole.heads} * d * taps;  // one of q, k, v
  RecurrentShardRanges out;
  out.state = {h.first * d * d, h.count * d * d};
  for (std::uint64_t p = 0; p < 3; ++p) out.conv[p] = {p * plane + h.first * d * taps, h.count * d * taps};
  return out;
}

Result<RecurrentSnapshot> SliceRecurrent(const RecurrentSnapshot& whole, std::uint32_t tp,
                                         std::uint32_t rank) {
  PC_ASSIGN_OR_RETURN(HeadRange h, RankHeads(whole.shape.heads, tp, rank));
  return SliceRecurrentHeads(whole, h);
}

Result<RecurrentSnapshot> SliceRecurrentHeads(const RecurrentSnapshot& whole, HeadRange h) {
  PC_RETURN_IF_ERROR(CheckSnapshot(whole).WithContext("TP slice of a recurrent layer"));
  return SliceRecurrentHeads(whole.shape, whole.conv_ring, whole.state, h);
}

Result<RecurrentSnapshot> SliceRecurrentHeads(const RecurrentShape& shape, std::span<const float> conv_ring,
                                              std::span<const float> state, HeadRange h) {
  PC_ASSIGN_OR_RETURN(RecurrentShardRanges r, RecurrentHeadRanges(shape, h));
  if (conv_ring.size() != shape.conv_values() || state.size() != shape.state_values()) {
    return Status::InvalidArgument("TP slice of a recurrent layer: its planes do not hold its shape");
  }
  RecurrentSnapshot shard{shape, {}, {}};
  shard.shape.heads = h.count;
  const auto mine = state.subspan(r.state.offset, r.state.count);
  shard.state.assign(mine.begin(), mine.end());
  shard.conv_ring.reserve(shard.shape.conv_values());
  for (const ValueRange& c : r.conv) {
    const auto part = conv_ring.subspan(c.offset, c.count);
    shard.conv_ring.insert(shard.conv_ring.end(), part.begin(), part.end());
  }
  return shard;
}

Result<RecurrentSnapshot> GatherRecurrent(std::span<const RecurrentSnapshot> shards) {
  PC_RETURN_IF_ERROR(CheckShards(shards, "TP gather of a recurrent layer"));
  const RecurrentShape& one = shards.front().shape;
  const std::uint64_t tp = shards.size();
  if (one.heads * tp > UINT32_MAX) return Status::InvalidArgument("TP gather: too many heads");
  RecurrentSnapshot whole{one, {}, {}};
  whole.shape.heads = static_cast<std::uint32_t>(one.heads * tp);
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{whole.shape}));
  whole.state.resize(whole.shape.state_values());
  whole.conv_ring.resize(whole.shape.conv_values());
  const std::uint64_t state = one.state_values();
  const std::uint64_t part = one.conv_values() / 3;  // one of q, k, v of one shard
  for (std::uint64_t i = 0; i < tp; ++i) {
    std::copy_n(shards[i].state.data(), state, whole.state.data() + i * state);
    CopyBlock(shards[i].conv_ring.data(), part, whole.conv_ring.data() + i * part, part * tp, 3, part);
  }
  return whole;
}

Result<KvSnapshot> SliceKv(const KvSnapshot& whole, std::uint32_t heads, std::uint32_t tp,
                           std::uint32_t rank) {
  PC_ASSIGN_OR_RETURN(HeadRange h, RankHeads(heads, tp, rank));
  return SliceKvHeads(whole, heads, h);
}

Result<KvSnapshot> SliceKvHeads(const KvSnapshot& whole, std::uint32_t heads, HeadRange h) {
  PC_RETURN_IF_ERROR(CheckSnapshot(whole).WithContext("TP slice of a KV layer"));
  return SliceKvHeads(whole.shape, whole.k_rows, whole.v_rows, heads, h);
}

Result<KvSnapshot> SliceKvHeads(const KvShape& s, std::span<const float> k_rows,
                                std::span<const float> v_rows, std::uint32_t heads, HeadRange h) {
  if (heads == 0 || s.k_width % heads != 0 || s.v_width % heads != 0) {
    return Status::InvalidArgument("TP slice of a KV layer: row widths " + std::to_string(s.k_width) + "/" +
                                   std::to_string(s.v_width) + " are not split into " +
                                   std::to_string(heads) + " heads");
  }
  if (h.count == 0 || h.first > heads || h.count > heads - h.first) {
    return Status::InvalidArgument("TP slice of a KV layer: heads [" + std::to_string(h.first) + ", +" +
                                   std::to_string(h.count) + ") of " + std::to_string(heads));
  }
  if (s.format.indexed()) return Status::NotSupported("a kv-indexed layer does not split among TP ranks");
  if (k_rows.size() != s.k_values() || v_rows.size() != s.v_values()) {
    return Status::InvalidArgument("TP slice of a KV layer: its planes do not hold its shape");
  }
  const std::uint64_t k_head = s.k_width / heads;
  const std::uint64_t v_head = s.v_width / heads;
  KvSnapshot shard{s, {}, {}};
  shard.shape.k_width = static_cast<std::uint32_t>(k_head * h.count);
  shard.shape.v_width = static_cast<std::uint32_t>(v_head * h.count);
  shard.k_rows.resize(shard.shape.k_values());
  shard.v_rows.resize(shard.shape.v_values());
  CopyBlock(k_rows.data() + h.first * k_head, s.k_width, shard.k_rows.data(), shard.shape.k_width,
            s.held_rows(), shard.shape.k_width);
  CopyBlock(v_rows.data() + h.first * v_head, s.v_width, shard.v_rows.data(), shard.shape.v_width,
            s.held_rows(), shard.shape.v_width);
  return shard;
}

Result<KvSnapshot> GatherKv(std::span<const KvSnapshot> shards) {
  PC_RETURN_IF_ERROR(CheckShards(shards, "TP gather of a KV layer"));
  const KvShape& one = shards.front().shape;
  const std::uint64_t tp = shards.size();
  if (one.k_width * tp > UINT32_MAX || one.v_width * tp > UINT32_MAX) {
    return Status::InvalidArgument("TP gather of a KV layer: rows too wide");
  }
  KvSnapshot whole{one, {}, {}};
  whole.shape.k_width = static_cast<std::uint32_t>(one.k_width * tp);
  whole.shape.v_width = static_cast<std::uint32_t>(one.v_width * tp);
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{whole.shape}));
  whole.k_rows.resize(whole.shape.k_values());
  whole.v_rows.resize(whole.shape.v_values());
  for (std::uint64_t i = 0; i < tp; ++i) {
    CopyBlock(shards[i].k_rows.data(), one.k_width, whole.k_rows.data() + i * one.k_width,
              whole.shape.k_width, one.held_rows(), one.k_width);
    CopyBlock(shards[i].v_rows.data(), one.v_width, whole.v_rows.data() + i * one.v_width,
              whole.shape.v_width, one.held_rows(), one.v_width);
  }
  return whole;
}

namespace {

// Rank r's copy of a replicated layer is rank 0's, bit for bit.
Status CheckReplicated(const LatentSnapshot& mine, const LatentSnapshot& first) {
  if (mine.shape == first.shape && mine.latent_rows == first.latent_rows &&
      mine.index_tail_rows == first.index_tail_rows && mine.pool_keys == first.pool_keys) {
    return Status::Ok();
  }
  return Status::InvalidArgument("its replicated latent planes differ from rank 0's");
}

// Layer `l` of every rank, a sharded layer of kind Snapshot, gathered by `gather`.
template <typename Snapshot>
Result<LayerSnapshot> GatherKind(std::span<const std::vector<LayerSnapshot>> ranks, std::size_t l,
                                 Result<Snapshot> (*gather)(std::span<const Snapshot>)) {
  std::vector<Snapshot> shards;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto* mine = std::get_if<Snapshot>(&ranks[r][l]);
    if (mine == nullptr) {
      return Status::InvalidArgument("rank " + std::to_string(r) + ": another kind than rank 0's");
    }
    shards.push_back(*mine);
  }
  PC_ASSIGN_OR_RETURN(Snapshot whole, gather(shards));
  return LayerSnapshot{std::move(whole)};
}

// Layer `l` of every rank, gathered.
Result<LayerSnapshot> GatherLayer(std::span<const std::vector<LayerSnapshot>> ranks, std::size_t l) {
  const LayerSnapshot& first = ranks.front()[l];
  if (const auto* latent = std::get_if<LatentSnapshot>(&first)) {
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      const auto* mine = std::get_if<LatentSnapshot>(&ranks[r][l]);
      Status same = mine == nullptr ? Status::InvalidArgument("it is of another kind than rank 0's")
                                    : CheckReplicated(*mine, *latent);
      if (!same.ok()) return same.WithContext("rank " + std::to_string(r));
    }
    PC_RETURN_IF_ERROR(CheckSnapshot(*latent));
    return LayerSnapshot{*latent};
  }
  if (std::holds_alternative<RecurrentSnapshot>(first)) {
    return GatherKind<RecurrentSnapshot>(ranks, l, GatherRecurrent);
  }
  return GatherKind<KvSnapshot>(ranks, l, GatherKv);
}

}  // namespace

Result<std::vector<LayerSnapshot>> GatherLayers(std::span<const std::vector<LayerSnapshot>> ranks) {
  if (ranks.empty()) return Status::InvalidArgument("TP gather: no ranks");
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r].size() != ranks.front().size()) {
      return Status::InvalidArgument("TP gather: rank " + std::to_string(r) + " holds " +
                                     std::to_string(ranks[r].size()) + " layers, rank 0 " +
                                     std::to_string(ranks.front().size()));
    }
  }
  std::vector<LayerSnapshot> whole;
  for (std::size_t l = 0; l < ranks.front().size(); ++l) {
    auto layer = GatherLayer(ranks, l);
    if (!layer.ok()) return layer.status().WithContext("TP gather of layer " + std::to_string(l));
    whole.push_back(std::move(layer).value());
  }
  return whole;
}

Result<std::vector<LayerSnapshot>> SliceLayers(std::span<const LayerSnapshot> whole, std::uint32_t kv_heads,
                                               std::uint32_t tp, std::uint32_t rank) {
  std::vector<LayerSnapshot> mine;
  for (std::size_t l = 0; l < whole.size(); ++l) {
    Result<LayerSnapshot> part = std::visit(
        [&](const auto& layer) -> Result<LayerSnapshot> {
          using T = std::decay_t<decltype(layer)>;
          if constexpr (std::is_same_v<T, LatentSnapshot>) {
            PC_RETURN_IF_ERROR(CheckSnapshot(layer));
            return LayerSnapshot{layer};
          } else if constexpr (std::is_same_v<T, RecurrentSnapshot>) {
            PC_ASSIGN_OR_RETURN(RecurrentSnapshot shard, SliceRecurrent(layer, tp, rank));
            return LayerSnapshot{std::move(shard)};
          } else {
            PC_ASSIGN_OR_RETURN(KvSnapshot shard, SliceKv(layer, kv_heads, tp, rank));
            return LayerSnapshot{std::move(shard)};
          }
        },
        whole[l]);
    if (!part.ok()) return part.status().WithContext("TP slice of layer " + std::to_string(l));
    mine.push_back(std::move(part).value());
  }
  return mine;
}

bool IsSharded(const LayerShape& shape) {
  return std::holds_alternative<RecurrentShape>(shape) || std::holds_alternative<KvShape>(shape);
}

Result<LayerShape> WholeShape(const LayerShape& shard, std::uint32_t ranks) {
  if (const auto* r = std::get_if<RecurrentShape>(&shard)) {
    if (std::uint64_t{r->heads} * ranks > UINT32_MAX) return Status::InvalidArgument("too many heads");
    RecurrentShape whole = *r;
    whole.heads *= ranks;
    return LayerShape{whole};
  }
  const auto* kv = std::get_if<KvShape>(&shard);
  if (kv == nullptr) return LayerShape{shard};  // replicated
  if (kv->format.index_width != 0) return Status::NotSupported("a kv-indexed layer does not split among TP ranks");
  if (std::uint64_t{kv->k_width} * ranks > UINT32_MAX || std::uint64_t{kv->v_width} * ranks > UINT32_MAX) {
    return Status::InvalidArgument("rows too wide");
  }
  KvShape whole = *kv;
  whole.k_width *= ranks;
  whole.v_width *= ranks;
  return LayerShape{whole};
}

Result<std::vector<EntryLayerPart>> EntryLayerParts(std::span<const LayerShape> entry_layers, std::uint32_t ranks) {
  if (ranks == 0) return Status::InvalidArgument("TP entry: 0 ranks");
  // Rank 0 holds every model layer: with n of its L layers sharded, the
  // entry holds L + (ranks - 1) * n layers, which fixes L (the count grows
  // with L, so at most one L fits).
  std::vector<std::uint32_t> sharded;
  std::size_t model_layers = 0;
  for (std::size_t l = 0; l < entry_layers.size(); ++l) {
    if (IsSharded(entry_layers[l])) sharded.push_back(static_cast<std::uint32_t>(l));
    if (l + 1 + sharded.size() * (ranks - 1) == entry_layers.size()) {
      model_layers = l + 1;
      break;
    }
  }
  if (model_layers == 0) {
    return Status::InvalidArgument("TP entry: " + std::to_string(entry_layers.size()) +
                                   " layers are not one rank's every layer and " + std::to_string(ranks - 1) +
                                   " more ranks' sharded ones");
  }
  std::vector<EntryLayerPart> parts;
  for (std::size_t l = 0; l < model_layers; ++l) {
    parts.push_back({static_cast<std::uint32_t>(l), 0, ranks > 1 && IsSharded(entry_layers[l])});
  }
  for (std::uint32_t r = 1; r < ranks; ++r) {
    for (std::uint32_t m : sharded) parts.push_back({m, r, true});
  }
  return parts;
}

Result<std::vector<LayerShape>> GatherShapes(std::span<const LayerShape> entry_layers, std::uint32_t ranks) {
  PC_ASSIGN_OR_RETURN(const std::vector<EntryLayerPart> parts, EntryLayerParts(entry_layers, ranks));
  std::vector<LayerShape> whole;
  for (std::size_t l = 0; l < parts.size(); ++l) {
    const EntryLayerPart& p = parts[l];
    if (ranks > 1 && std::holds_alternative<LinearStateShape>(entry_layers[l])) {
      return Status::NotSupported("TP entry: layer " + std::to_string(l) +
                                  " is a linear-state layer, which TP does not split");
    }
    if (p.rank == 0) {
      auto w = WholeShape(entry_layers[l], ranks);
      if (!w.ok()) return w.status().WithContext("TP entry: layer " + std::to_string(l));
      whole.push_back(std::move(w).value());
    } else if (!(entry_layers[l] == entry_layers[p.model_layer])) {
      return Status::InvalidArgument("TP entry: rank " + std::to_string(p.rank) + "'s shard of layer " +
                                     std::to_string(p.model_layer) + " is not shaped as rank 0's");
    }
  }
  return whole;
}

Result<std::vector<LayerSnapshot>> GatherEntry(std::vector<LayerSnapshot> entry_layers,
                                               std::span<const EntryLayerPart> parts) {
  if (parts.size() != entry_layers.size()) {
    return Status::InvalidArgument("TP entry: " + std::to_string(entry_layers.size()) + " layers, " +
                                   std::to_string(parts.size()) + " parts");
  }
  std::size_t model_layers = 0;
  for (const EntryLayerPart& p : parts) model_layers = std::max<std::size_t>(model_layers, p.model_layer + 1);
  // Each model layer's parts, in rank order (the entry's order is rank order).
  std::vector<std::vector<std::size_t>> of(model_layers);
  for (std::size_t l = 0; l < parts.size(); ++l) of[parts[l].model_layer].push_back(l);
  std::vector<LayerSnapshot> whole;
  for (std::size_t m = 0; m < model_layers; ++m) {
    if (of[m].empty()) return Status::InvalidArgument("TP entry: no part of layer " + std::to_string(m));
    if (of[m].size() == 1) {
      whole.push_back(std::move(entry_layers[of[m][0]]));
      continue;
    }
    std::vector<std::vector<LayerSnapshot>> ranks(of[m].size());
    for (std::size_t r = 0; r < of[m].size(); ++r) ranks[r].push_back(std::move(entry_layers[of[m][r]]));
    auto one = GatherLayers(ranks);
    if (!one.ok()) return one.status().WithContext("layer " + std::to_string(m));
    whole.push_back(std::move((*one)[0]));
  }
  return whole;
}

Result<std::vector<float>> ToHeadMajor(std::span<const float> plane, std::uint64_t rows, std::uint64_t width,
                                       std::uint32_t heads) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, PerHead(plane, rows, width, heads));
  std::vector<float> out(plane.size());
  for (std::uint64_t h = 0; h < heads; ++h)
    CopyBlock(plane.data() + h * w, width, out.data() + h * rows * w, w, rows, w);
  return out;
}

Result<std::vector<float>> FromHeadMajor(std::span<const float> plane, std::uint64_t rows,
                                         std::uint64_t width, std::uint32_t heads) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, PerHead(plane, rows, width, heads));
  std::vector<float> out(plane.size());
  for (std::uint64_t h = 0; h < heads; ++h)
    CopyBlock(plane.data() + h * rows * w, w, out.data() + h * w, width, rows, w);
  return out;
}

Result<ValueRange> HeadMajorRange(std::uint64_t rows, std::uint64_t width, std::uint32_t heads,
                                  std::uint32_t tp, std::uint32_t rank) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, HeadWidth(rows, width, heads));
  PC_ASSIGN_OR_RETURN(HeadRange h, RankHeads(heads, tp, rank));
  const std::uint64_t per_head = rows * w;
  return ValueRange{h.first * per_head, h.count * per_head};
}

}  // namespace primecache

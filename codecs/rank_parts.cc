// One rank's parts of a tensor-parallel entry (primecache/internal/rank_parts.h).
#include "primecache/internal/rank_parts.h"

#include <numeric>
#include <string>
#include <type_traits>
#include <variant>

#include "primecache/internal/shard.h"

namespace primecache {
namespace {

constexpr std::uint32_t kMaxRanks = 1024;

// Entry layer of stored rank s's part of model layer m; `index` is m's
// place among the sharded layers.
std::uint32_t EntryLayer(std::uint32_t model_layers, std::uint32_t sharded_count, std::uint32_t m,
                         std::uint32_t index, std::uint32_t s) {
  return s == 0 ? m : model_layers + (s - 1) * sharded_count + index;
}

// The run of heads rank r of TP b keeps of the gathered parts of stored
// ranks [s0, s0 + n), each of `per_part` heads of a layer stored at TP a.
Result<HeadRange> KeptHeads(std::uint32_t per_part, std::uint32_t a, std::uint32_t b, std::uint32_t r,
                            std::uint32_t s0) {
  const std::uint64_t heads = std::uint64_t{per_part} * a;
  if (heads > UINT32_MAX) return Status::InvalidArgument("too many heads");
  PC_ASSIGN_OR_RETURN(HeadRange mine, RankHeads(static_cast<std::uint32_t>(heads), b, r));
  return HeadRange{mine.first - s0 * per_part, mine.count};
}

// Gathers one sharded layer's parts and cuts them to the rank's heads.
template <typename Snapshot>
Result<LayerSnapshot> Reshard(std::vector<Snapshot> parts, const RankPartsPlan& plan,
                              const RankLayerSource& src, std::uint32_t kv_heads) {
  const std::uint32_t a = plan.stored_ranks;
  const std::uint32_t s0 = src.first_stored_rank;
  if constexpr (std::is_same_v<Snapshot, RecurrentSnapshot>) {
    PC_ASSIGN_OR_RETURN(RecurrentSnapshot got,
                        parts.size() == 1 ? std::move(parts[0]) : GatherRecurrent(parts));
    const std::uint32_t per_part = got.shape.heads / static_cast<std::uint32_t>(src.entry_layers.size());
    PC_ASSIGN_OR_RETURN(HeadRange keep, KeptHeads(per_part, a, plan.tp, plan.rank, s0));
    if (keep.first == 0 && keep.count == got.shape.heads) return LayerSnapshot{std::move(got)};
    PC_ASSIGN_OR_RETURN(RecurrentSnapshot mine, SliceRecurrentHeads(got, keep));
    return LayerSnapshot{std::move(mine)};
  } else {
    if (kv_heads == 0 || kv_heads % a != 0) {
      return Status::InvalidArgument("TP " + std::to_string(a) + " does not divide " +
                                     std::to_string(kv_heads) + " kv heads");
    }
    PC_ASSIGN_OR_RETURN(KvSnapshot got, parts.size() == 1 ? std::move(parts[0]) : GatherKv(parts));
    const std::uint32_t per_part = kv_heads / a;
    const auto held = static_cast<std::uint32_t>(per_part * src.entry_layers.size());
    PC_ASSIGN_OR_RETURN(HeadRange keep, KeptHeads(per_part, a, plan.tp, plan.rank, s0));
    if (keep.first == 0 && keep.count == held) return LayerSnapshot{std::move(got)};
    PC_ASSIGN_OR_RETURN(KvSnapshot mine, SliceKvHeads(got, held, keep));
    return LayerSnapshot{std::move(mine)};
  }
}

// One model layer of the rank from its fetched parts.
Result<LayerSnapshot> AssembleLayer(const RankPartsPlan& plan, const RankLayerSource& src,
                                    std::vector<LayerSnapshot> parts, std::uint32_t kv_heads) {
  for (const LayerSnapshot& p : parts) {
    if (IsSharded(ShapeOf(p)) != src.sharded) {
      return Status::InvalidArgument(src.sharded
                                         ? "a shard was expected, the entry holds a replicated layer"
                                         : "a replicated layer was expected, the entry holds a shard");
    }
  }
  if (!src.sharded || (plan.stored_ranks == plan.tp && parts.size() == 1)) return std::move(parts[0]);
  return std::visit(
      [&](auto& first) -> Result<LayerSnapshot> {
        using T = std::decay_t<decltype(first)>;
        if constexpr (std::is_same_v<T, RecurrentSnapshot> || std::is_same_v<T, KvSnapshot>) {
          std::vector<T> same;
          for (LayerSnapshot& p : parts) {
            T* one = std::get_if<T>(&p);
            if (one == nullptr) return Status::InvalidArgument("the parts of a layer differ in kind");
            same.push_back(std::move(*one));
          }
          return Reshard(std::move(same), plan, src, kv_heads);
        } else {
          return Status::InvalidArgument("a layer of this kind does not split among TP ranks");
        }
      },
      parts[0]);
}

}  // namespace

std::uint32_t HeadGroups(std::uint32_t tp, std::span<const std::uint32_t> rank_heads) {
  if (tp == 0 || rank_heads.empty()) return tp;
  std::uint32_t g = 0;
  for (std::uint32_t h : rank_heads) g = std::gcd(g, h);
  std::uint32_t n = 1;
  for (std::uint32_t k = 2; k <= g && std::uint64_t{tp} * k <= kMaxHeadGroups; ++k) {
    if (g % k == 0) n = k;
  }
  return tp * n;
}

Result<RankPartsPlan> PlanRankParts(const std::vector<bool>& sharded, std::uint32_t entry_layers,
                                    std::uint32_t stored_ranks, std::uint32_t tp, std::uint32_t rank) {
  if (tp == 0 || stored_ranks == 0 || tp > kMaxRanks || stored_ranks > kMaxRanks) {
    return Status::InvalidArgument("TP parts: TP sizes must lie in [1, " + std::to_string(kMaxRanks) + "]");
  }
  if (rank >= tp) {
    return Status::InvalidArgument("TP parts: rank " + std::to_string(rank) + " of TP " + std::to_string(tp));
  }
  const auto model_layers = static_cast<std::uint32_t>(sharded.size());
  std::uint32_t sharded_count = 0;
  for (bool s : sharded) sharded_count += s ? 1 : 0;
  const std::uint64_t expected = model_layers + std::uint64_t{stored_ranks - 1} * sharded_count;
  if (model_layers == 0 || entry_layers != expected) {
    return Status::InvalidArgument("TP parts: an entry of " + std::to_string(stored_ranks) +
                                   " ranks for this " + std::to_string(model_layers) + "-layer model holds " +
                                   std::to_string(expected) + " layers, not " + std::to_string(entry_layers));
  }
  RankPartsPlan plan{stored_ranks, tp, rank, {}, {}};
  // Stored ranks s overlap rank r when s/a < (r+1)/b and r/b < (s+1)/a.
  const std::uint32_t first = rank * stored_ranks / tp;
  const std::uint32_t last = ((rank + 1) * stored_ranks + tp - 1) / tp - 1;
  std::vector<bool> wanted(entry_layers, false);
  for (std::uint32_t m = 0, index = 0; m < model_layers; ++m) {
    RankLayerSource src;
    src.sharded = sharded[m];
    if (!sharded[m]) {
      src.entry_layers.push_back(m);
    } else {
      src.first_stored_rank = first;
      for (std::uint32_t s = first; s <= last; ++s) {
        src.entry_layers.push_back(EntryLayer(model_layers, sharded_count, m, index, s));
      }
      ++index;
    }
    for (std::uint32_t e : src.entry_layers) wanted[e] = true;
    plan.layers.push_back(std::move(src));
  }
  for (std::uint32_t e = 0; e < entry_layers; ++e) {
    if (wanted[e]) plan.fetch.push_back(e);
  }
  return plan;
}

Result<std::vector<LayerSnapshot>> AssembleRankParts(const RankPartsPlan& plan,
                                                     std::vector<LayerSnapshot> fetched,
                                                     std::uint32_t kv_heads) {
  if (fetched.size() != plan.fetch.size()) {
    return Status::InvalidArgument("TP parts: " + std::to_string(fetched.size()) + " layers fetched, " +
                                   std::to_string(plan.fetch.size()) + " planned");
  }
  // Where each planned entry layer sits in `fetched`.
  std::vector<std::int64_t> at(plan.fetch.empty() ? 0 : plan.fetch.back() + 1, -1);
  for (std::size_t i = 0; i < plan.fetch.size(); ++i) at[plan.fetch[i]] = static_cast<std::int64_t>(i);
  std::vector<LayerSnapshot> mine;
  for (std::size_t m = 0; m < plan.layers.size(); ++m) {
    const RankLayerSource& src = plan.layers[m];
    std::vector<LayerSnapshot> parts;
    for (std::uint32_t e : src.entry_layers) {
      // A part read by two model layers cannot occur: each entry layer is one layer's.
      parts.push_back(std::move(fetched[static_cast<std::size_t>(at[e])]));
    }
    auto one = AssembleLayer(plan, src, std::move(parts), kv_heads);
    if (!one.ok()) return one.status().WithContext("TP parts: layer " + std::to_string(m));
    mine.push_back(std::move(one).value());
  }
  return mine;
}

}  // namespace primecache

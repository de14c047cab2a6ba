// One rank's parts of a tensor-parallel entry: for entries stored at TP a
// and ranks of TP b (a, b in 1, 2, 3, 4, 6 over 12 heads), the plan fetches
// only the parts that hold the rank's heads, and the assembled shards equal
// the rank's slice of the whole boundary, value for value; what does not
// fit is refused.
#include "primecache/internal/rank_parts.h"

#include <gtest/gtest.h>

#include <random>
#include <variant>
#include <vector>

#include "primecache/internal/shard.h"

namespace primecache {
namespace {

constexpr std::uint32_t kHeads = 12;  // recurrent heads and kv heads

std::vector<float> Random(std::uint64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Latent, recurrent, KV, latent, KV, recurrent: replicated and sharded layers interleaved.
std::vector<LayerSnapshot> Whole() {
  const LatentShape lat{.len = 5, .width = 6};
  const RecurrentShape rec{.heads = kHeads, .head_dim = 2, .kernel = 3};
  const KvShape kv{.len = 5, .k_width = kHeads * 3, .v_width = kHeads * 2};
  std::vector<LayerSnapshot> w;
  std::uint32_t seed = 1;
  auto latent = [&] { w.push_back(LatentSnapshot{lat, Random(lat.latent_values(), seed++), {}, {}}); };
  auto recurrent = [&] {
    w.push_back(
        RecurrentSnapshot{rec, Random(rec.conv_values(), seed++), Random(rec.state_values(), seed++)});
  };
  auto kvl = [&] {
    w.push_back(KvSnapshot{kv, Random(kv.k_values(), seed++), Random(kv.v_values(), seed++)});
  };
  latent();
  recurrent();
  kvl();
  latent();
  kvl();
  recurrent();
  return w;
}

std::vector<bool> ShardedOf(const std::vector<LayerSnapshot>& layers) {
  std::vector<bool> s;
  for (const LayerSnapshot& l : layers) s.push_back(IsSharded(ShapeOf(l)));
  return s;
}

// The entry TP a stores: rank 0's every layer, then each later rank's shards.
std::vector<LayerSnapshot> Entry(const std::vector<LayerSnapshot>& whole, std::uint32_t a) {
  std::vector<LayerSnapshot> entry = SliceLayers(whole, kHeads, a, 0).value();
  for (std::uint32_t s = 1; s < a; ++s) {
    std::vector<LayerSnapshot> part = SliceLayers(whole, kHeads, a, s).value();
    for (LayerSnapshot& l : part) {
      if (IsSharded(ShapeOf(l))) entry.push_back(std::move(l));
    }
  }
  return entry;
}

void ExpectSame(const LayerSnapshot& got, const LayerSnapshot& want, const std::string& where) {
  ASSERT_EQ(got.index(), want.index()) << where;
  if (const auto* g = std::get_if<LatentSnapshot>(&got)) {
    const auto& w = std::get<LatentSnapshot>(want);
    EXPECT_TRUE(g->shape == w.shape && g->latent_rows == w.latent_rows) << where;
  } else if (const auto* g = std::get_if<RecurrentSnapshot>(&got)) {
    const auto& w = std::get<RecurrentSnapshot>(want);
    EXPECT_TRUE(g->shape == w.shape && g->state == w.state && g->conv_ring == w.conv_ring) << where;
  } else {
    const auto& g2 = std::get<KvSnapshot>(got);
    const auto& w = std::get<KvSnapshot>(want);
    EXPECT_TRUE(g2.shape == w.shape && g2.k_rows == w.k_rows && g2.v_rows == w.v_rows) << where;
  }
}

std::vector<LayerSnapshot> Fetch(const std::vector<LayerSnapshot>& entry, const RankPartsPlan& plan) {
  std::vector<LayerSnapshot> out;
  for (std::uint32_t e : plan.fetch) out.push_back(entry.at(e));
  return out;
}

TEST(RankParts, EveryRankOfEveryTpSizeAssemblesItsSliceOfTheWhole) {
  const std::vector<LayerSnapshot> whole = Whole();
  const std::vector<bool> sharded = ShardedOf(whole);
  const std::uint32_t sizes[] = {1, 2, 3, 4, 6};
  for (std::uint32_t a : sizes) {
    const std::vector<LayerSnapshot> entry = Entry(whole, a);
    for (std::uint32_t b : sizes) {
      for (std::uint32_t r = 0; r < b; ++r) {
        const std::string where = "stored at TP " + std::to_string(a) + ", rank " + std::to_string(r) +
                                  " of TP " + std::to_string(b);
        const RankPartsPlan plan =
            PlanRankParts(sharded, static_cast<std::uint32_t>(entry.size()), a, b, r).value();
        // The stored parts whose heads overlap the rank's: the rank's heads
        // [r/b, (r+1)/b) of the layer against stored part s's [s/a, (s+1)/a).
        std::uint32_t overlapping = 0;
        for (std::uint32_t s = 0; s < a; ++s)
          overlapping += (s * b < (r + 1) * a && r * a < (s + 1) * b) ? 1 : 0;
        EXPECT_EQ(plan.fetch.size(), 2 + 4 * overlapping) << where;  // 2 replicated, 4 sharded layers
        const auto mine = AssembleRankParts(plan, Fetch(entry, plan), kHeads);
        ASSERT_TRUE(mine.ok()) << where << ": " << mine.status().ToString();
        const std::vector<LayerSnapshot> want = SliceLayers(whole, kHeads, b, r).value();
        ASSERT_EQ(mine->size(), want.size()) << where;
        for (std::size_t m = 0; m < want.size(); ++m)
          ExpectSame((*mine)[m], want[m], where + ", layer " + std::to_string(m));
      }
    }
  }
}

TEST(RankParts, ASameTpRankFetchesItsOwnPartAndTheReplicatedLayersOnly) {
  const std::vector<LayerSnapshot> whole = Whole();
  const std::vector<LayerSnapshot> entry = Entry(whole, 4);  // 6 + 3 * 4 = 18 layers
  const RankPartsPlan plan = PlanRankParts(ShardedOf(whole), 18, 4, 4, 2).value();
  // Rank 2's shards are the entry's second later part: 6 + 4 .. 6 + 7.
  EXPECT_EQ(plan.fetch, (std::vector<std::uint32_t>{0, 3, 10, 11, 12, 13}));
  EXPECT_EQ(PlanRankParts(ShardedOf(whole), 18, 4, 4, 0).value().fetch,
            (std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5}));
}

// The part counts TP engines store boundaries in: a GLM-5-class model (32
// KDA heads, 8 kv heads) in 8 parts at every TP size up to 8, more parts
// only as ranks; at most 8 unless the TP size is larger.
TEST(RankParts, HeadGroupsSplitEveryRanksHeadsIntoAtMostEightParts) {
  auto groups = [](std::uint32_t tp, std::vector<std::uint32_t> heads) { return HeadGroups(tp, heads); };
  for (std::uint32_t tp : {1u, 2u, 4u, 8u}) EXPECT_EQ(groups(tp, {32 / tp, 8 / tp}), 8u) << "TP " << tp;
  EXPECT_EQ(groups(16, {2, 1}), 16u);  // beyond 8: one part per rank
  EXPECT_EQ(groups(2, {3, 3}), 6u);    // 3 heads a rank: 3 parts each
  EXPECT_EQ(groups(3, {4}), 6u);       // 4 heads a rank, but 3 x 4 > 8: 2 parts each
  EXPECT_EQ(groups(2, {4, 1}), 2u);    // one kv head a rank: nothing to split
  EXPECT_EQ(groups(4, {}), 4u);        // no sharded layers
}

TEST(RankParts, RefusesWhatDoesNotFitTheEntryOrTheModel) {
  const std::vector<LayerSnapshot> whole = Whole();
  const std::vector<bool> sharded = ShardedOf(whole);
  EXPECT_EQ(PlanRankParts(sharded, 17, 4, 2, 0).status().message(),
            "TP parts: an entry of 4 ranks for this 6-layer model holds 18 layers, not 17");
  EXPECT_FALSE(PlanRankParts(sharded, 18, 4, 2, 2).ok());  // no rank 2 at TP 2
  EXPECT_FALSE(PlanRankParts(sharded, 6, 1, 0, 0).ok());
  EXPECT_FALSE(PlanRankParts(std::vector<bool>{}, 0, 1, 1, 0).ok());

  const std::vector<LayerSnapshot> entry = Entry(whole, 2);
  // A TP size that does not divide the heads: planned, refused when the heads are known.
  const RankPartsPlan five = PlanRankParts(sharded, 10, 2, 5, 1).value();
  EXPECT_FALSE(AssembleRankParts(five, Fetch(entry, five), kHeads).ok());
  // A replicated layer where a shard was planned (a layer that lies about its kind).
  const RankPartsPlan plan = PlanRankParts(sharded, 10, 2, 2, 1).value();
  std::vector<LayerSnapshot> fetched = Fetch(entry, plan);
  std::swap(fetched[0], fetched[2]);
  const auto swapped = AssembleRankParts(plan, std::move(fetched), kHeads);
  EXPECT_EQ(swapped.status().message(),
            "TP parts: layer 0: a replicated layer was expected, the entry holds a shard");
  // Fewer layers than planned.
  std::vector<LayerSnapshot> short_list = Fetch(entry, plan);
  short_list.pop_back();
  EXPECT_FALSE(AssembleRankParts(plan, std::move(short_list), kHeads).ok());
  // Parts of one layer that do not gather (shapes differ).
  const RankPartsPlan gather = PlanRankParts(sharded, 10, 2, 1, 0).value();
  std::vector<LayerSnapshot> odd = Fetch(entry, gather);
  std::get<RecurrentSnapshot>(odd.back()).state.pop_back();  // entry layer 9: rank 1's last recurrent shard
  EXPECT_FALSE(AssembleRankParts(gather, std::move(odd), kHeads).ok());
}

}  // namespace
}  // namespace primecache

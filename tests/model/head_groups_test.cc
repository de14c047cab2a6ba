// A TP rank's head-group parts (serving/head_groups.h): for every TP size
// dividing the part count, the parts every rank publishes, put in the
// entry's order, are exactly the entry a TP engine of that many ranks would
// store (part 0 every layer, each later part its shards), so that a rank of
// any TP size dividing it reads only its heads. Bad requests are refused.
#include "serving/head_groups.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <variant>

#include "primecache/internal/rank_parts.h"
#include "primecache/internal/shard.h"

namespace primecache::model {
namespace {

constexpr std::uint32_t kKdaHeads = 8, kKvHeads = 4;

std::vector<float> Random(std::uint64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Recurrent, latent, KV (rotating, 3 rows held), recurrent.
std::vector<LayerSnapshot> Whole() {
  const RecurrentShape rec{.heads = kKdaHeads, .head_dim = 2, .kernel = 3};
  const LatentShape lat{.len = 5, .width = 6};
  KvShape kv{.len = 5, .k_width = kKvHeads * 3, .v_width = kKvHeads * 2};
  kv.format.window = 3;
  kv.rows = 3;
  std::vector<LayerSnapshot> w;
  w.push_back(RecurrentSnapshot{rec, Random(rec.conv_values(), 1), Random(rec.state_values(), 2)});
  w.push_back(LatentSnapshot{lat, Random(lat.latent_values(), 3), {}, {}});
  w.push_back(KvSnapshot{kv, Random(kv.k_values(), 4), Random(kv.v_values(), 5)});
  w.push_back(RecurrentSnapshot{rec, Random(rec.conv_values(), 6), Random(rec.state_values(), 7)});
  return w;
}

bool Same(const LayerSnapshot& a, const LayerSnapshot& b) {
  if (a.index() != b.index()) return false;
  if (const auto* x = std::get_if<LatentSnapshot>(&a)) {
    const auto& y = std::get<LatentSnapshot>(b);
    return x->shape == y.shape && x->latent_rows == y.latent_rows;
  }
  if (const auto* x = std::get_if<RecurrentSnapshot>(&a)) {
    const auto& y = std::get<RecurrentSnapshot>(b);
    return x->shape == y.shape && x->state == y.state && x->conv_ring == y.conv_ring;
  }
  const auto& x = std::get<KvSnapshot>(a);
  const auto& y = std::get<KvSnapshot>(b);
  return x.shape == y.shape && x.k_rows == y.k_rows && x.v_rows == y.v_rows;
}

LayerSnapshot Copy(const engine::LayerSnapshotView& v) {
  if (const auto* r = std::get_if<engine::RecurrentSnapshotView>(&v))
    return RecurrentSnapshot{
        r->shape, {r->conv_ring.begin(), r->conv_ring.end()}, {r->state.begin(), r->state.end()}};
  if (const auto* l = std::get_if<engine::LatentSnapshotView>(&v))
    return LatentSnapshot{l->shape, {l->latent_rows.begin(), l->latent_rows.end()}, {}, {}};
  const auto& kv = std::get<engine::KvSnapshotView>(v);
  return KvSnapshot{kv.shape, {kv.k_rows.begin(), kv.k_rows.end()}, {kv.v_rows.begin(), kv.v_rows.end()}};
}

TEST(HeadGroups, EveryRanksPartsMakeTheEntryOfAsManyRanks) {
  const std::vector<LayerSnapshot> whole = Whole();
  for (std::uint32_t tp : {1u, 2u, 4u}) {
    SCOPED_TRACE("TP " + std::to_string(tp));
    // Part index -> its layers, from every rank.
    std::map<std::uint32_t, std::vector<LayerSnapshot>> parts;
    std::uint32_t groups = 0;
    for (std::uint32_t r = 0; r < tp; ++r) {
      const std::vector<LayerSnapshot> mine = SliceLayers(whole, kKvHeads, tp, r).value();
      const std::vector<engine::LayerSnapshotView> views = engine::ViewsOf(mine);
      auto got = RankGroupParts(views, kKvHeads / tp, tp, r, 77);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(got->size(), 4u / tp);  // HeadGroups: 4 parts, gcd(8, 4) / tp a rank
      EXPECT_EQ(got->back().group.rank, r * (4 / tp)) << "a rank's first part goes last";
      for (const GroupPart& p : *got) {
        EXPECT_EQ(p.group.token, 77u);
        groups = p.group.ranks;
        std::vector<LayerSnapshot>& layers = parts[p.group.rank];
        EXPECT_TRUE(layers.empty()) << "part " << p.group.rank << " twice";
        for (const auto& v : p.layers) layers.push_back(Copy(v));
      }
    }
    ASSERT_EQ(groups, 4u);
    ASSERT_EQ(parts.size(), 4u);
    // What four ranks of their own would publish.
    for (std::uint32_t p = 0; p < 4; ++p) {
      std::vector<LayerSnapshot> want, all = SliceLayers(whole, kKvHeads, 4, p).value();
      for (LayerSnapshot& l : all) {
        if (InRankPart(ShapeOf(l), p)) want.push_back(std::move(l));
      }
      ASSERT_EQ(parts[p].size(), want.size()) << "part " << p;
      for (std::size_t l = 0; l < want.size(); ++l) EXPECT_TRUE(Same(parts[p][l], want[l])) << "part " << p;
    }
  }
}

TEST(HeadGroups, RefusesAMissingTokenARankOutOfRangeAndHeadsThatDoNotSplit) {
  const std::vector<LayerSnapshot> whole = Whole();
  const std::vector<engine::LayerSnapshotView> views = engine::ViewsOf(whole);
  EXPECT_EQ(RankGroupParts(views, kKvHeads, 1, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RankGroupParts(views, kKvHeads, 2, 2, 5).status().code(), StatusCode::kInvalidArgument);
  // 8 kv heads claimed for K rows 12 values wide: 8 parts, whose rows do not split.
  EXPECT_FALSE(RankGroupParts(views, 8, 1, 0, 5).ok());
}

}  // namespace
}  // namespace primecache::model

// Tensor-parallel shards of head-split snapshots: which heads a rank holds,
// where they lie in the whole planes, and slice / gather / reshard round
// trips checked value by value against the planes' layouts.
#include "primecache/internal/shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace primecache {
namespace {

std::vector<float> Random(std::uint64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

RecurrentSnapshot Recurrent(std::uint32_t heads, std::uint32_t seed) {
  RecurrentShape shape{.heads = heads, .head_dim = 3, .kernel = 4};
  return {shape, Random(shape.conv_values(), seed), Random(shape.state_values(), seed + 1)};
}

KvSnapshot Kv(std::uint32_t heads, std::uint32_t seed) {
  KvShape shape{.len = 7, .k_width = heads * 5, .v_width = heads * 2};
  return {shape, Random(shape.k_values(), seed), Random(shape.v_values(), seed + 1)};
}

TEST(TpShard, RankHeadsSplitEvenlyAndRefuseWhatDoesNotDivide) {
  EXPECT_EQ(RankHeads(8, 4, 3).value(), (HeadRange{6, 2}));
  EXPECT_EQ(RankHeads(8, 1, 0).value(), (HeadRange{0, 8}));
  EXPECT_EQ(RankHeads(6, 4, 0).status().message(), "TP shard: TP 4 does not divide 6 heads");
  EXPECT_EQ(RankHeads(8, 4, 4).status().message(), "TP shard: rank 4 of TP 4 does not exist");
  EXPECT_FALSE(RankHeads(8, 0, 0).ok());
  EXPECT_FALSE(RankHeads(0, 1, 0).ok());
}

TEST(TpShard, RecurrentRangesPointAtTheRanksHeadsInEachPlane) {
  const RecurrentShape shape{.heads = 4, .head_dim = 3, .kernel = 4};  // plane of conv: 4*3*3 = 36
  const RecurrentShardRanges r = RecurrentRanges(shape, 2, 1).value();
  EXPECT_EQ(r.state, (ValueRange{2 * 9, 2 * 9}));
  EXPECT_EQ(r.conv[0], (ValueRange{2 * 9, 18}));
  EXPECT_EQ(r.conv[1], (ValueRange{36 + 18, 18}));
  EXPECT_EQ(r.conv[2], (ValueRange{72 + 18, 18}));
}

TEST(TpShard, ARecurrentShardHoldsExactlyItsHeadsValues) {
  const RecurrentSnapshot whole = Recurrent(4, 1);
  const std::uint64_t d = 3, taps = 3, channels = 4 * d;
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    const RecurrentSnapshot shard = SliceRecurrent(whole, 2, rank).value();
    ASSERT_EQ(shard.shape.heads, 2u);
    ASSERT_EQ(shard.state.size(), shard.shape.state_values());
    ASSERT_EQ(shard.conv_ring.size(), shard.shape.conv_values());
    const std::uint64_t first = rank * 2;
    for (std::uint64_t h = 0; h < 2; ++h) {
      for (std::uint64_t i = 0; i < d * d; ++i) {
        ASSERT_EQ(shard.state[h * d * d + i], whole.state[(first + h) * d * d + i]);
      }
    }
    for (std::uint64_t p = 0; p < 3; ++p) {
      for (std::uint64_t c = 0; c < 2 * d; ++c) {
        for (std::uint64_t t = 0; t < taps; ++t) {
          ASSERT_EQ(shard.conv_ring[(p * 2 * d + c) * taps + t],
                    whole.conv_ring[(p * channels + first * d + c) * taps + t]);
        }
      }
    }
  }
}

TEST(TpShard, RecurrentSliceGatherAndReshardAreExact) {
  const RecurrentSnapshot whole = Recurrent(8, 7);
  for (std::uint32_t tp : {1u, 2u, 4u, 8u}) {
    std::vector<RecurrentSnapshot> shards;
    for (std::uint32_t r = 0; r < tp; ++r) shards.push_back(SliceRecurrent(whole, tp, r).value());
    const RecurrentSnapshot back = GatherRecurrent(shards).value();
    EXPECT_EQ(back.shape, whole.shape) << "TP " << tp;
    EXPECT_EQ(back.state, whole.state) << "TP " << tp;
    EXPECT_EQ(back.conv_ring, whole.conv_ring) << "TP " << tp;
  }
  // TP 2 -> TP 4: gather at 2, slice at 4, equals slicing the whole at 4.
  std::vector<RecurrentSnapshot> at2 = {SliceRecurrent(whole, 2, 0).value(),
                                        SliceRecurrent(whole, 2, 1).value()};
  const RecurrentSnapshot gathered = GatherRecurrent(at2).value();
  for (std::uint32_t r = 0; r < 4; ++r) {
    const RecurrentSnapshot a = SliceRecurrent(gathered, 4, r).value();
    const RecurrentSnapshot b = SliceRecurrent(whole, 4, r).value();
    EXPECT_EQ(a.state, b.state);
    EXPECT_EQ(a.conv_ring, b.conv_ring);
  }
}

TEST(TpShard, RecurrentRefusalsNameWhatIsWrong) {
  RecurrentSnapshot whole = Recurrent(4, 3);
  EXPECT_FALSE(SliceRecurrent(whole, 3, 0).ok());
  whole.state.pop_back();
  EXPECT_EQ(SliceRecurrent(whole, 2, 0).status().message(),
            "TP slice of a recurrent layer: state holds 35 floats; heads * head_dim * head_dim = 36");
  EXPECT_FALSE(GatherRecurrent({}).ok());
  std::vector<RecurrentSnapshot> mixed = {Recurrent(2, 1), Recurrent(1, 2)};
  EXPECT_EQ(GatherRecurrent(mixed).status().message(),
            "TP gather of a recurrent layer: shards differ in shape");
}

TEST(TpShard, AKvShardIsTheColumnSliceOfItsHeadsInEveryRow) {
  const KvSnapshot whole = Kv(4, 11);
  const KvSnapshot shard = SliceKv(whole, 4, 4, 2).value();
  ASSERT_EQ(shard.shape.k_width, 5u);
  ASSERT_EQ(shard.shape.v_width, 2u);
  for (std::uint64_t r = 0; r < 7; ++r) {
    for (std::uint64_t c = 0; c < 5; ++c) ASSERT_EQ(shard.k_rows[r * 5 + c], whole.k_rows[r * 20 + 10 + c]);
    for (std::uint64_t c = 0; c < 2; ++c) ASSERT_EQ(shard.v_rows[r * 2 + c], whole.v_rows[r * 8 + 4 + c]);
  }
}

TEST(TpShard, KvSliceGatherAndReshardAreExact) {
  const KvSnapshot whole = Kv(4, 5);
  for (std::uint32_t tp : {1u, 2u, 4u}) {
    std::vector<KvSnapshot> shards;
    for (std::uint32_t r = 0; r < tp; ++r) shards.push_back(SliceKv(whole, 4, tp, r).value());
    const KvSnapshot back = GatherKv(shards).value();
    EXPECT_EQ(back.shape, whole.shape) << "TP " << tp;
    EXPECT_EQ(back.k_rows, whole.k_rows) << "TP " << tp;
    EXPECT_EQ(back.v_rows, whole.v_rows) << "TP " << tp;
  }
}

TEST(TpShard, KvRefusalsNameWhatIsWrong) {
  const KvSnapshot whole = Kv(4, 9);
  EXPECT_EQ(SliceKv(whole, 3, 1, 0).status().message(),
            "TP slice of a KV layer: row widths 20/8 are not split into 3 heads");
  EXPECT_FALSE(SliceKv(whole, 4, 3, 0).ok());
  std::vector<KvSnapshot> mixed = {Kv(2, 1), Kv(1, 2)};
  EXPECT_EQ(GatherKv(mixed).status().message(), "TP gather of a KV layer: shards differ in shape");
}

TEST(TpShard, HeadMajorPlanesRoundTripAndARanksRunIsItsShard) {
  const KvSnapshot whole = Kv(4, 21);  // 7 rows, k 4 heads x 5, v 4 heads x 2
  const std::vector<float> k = ToHeadMajor(whole.k_rows, 7, 20, 4).value();
  for (std::uint64_t h = 0; h < 4; ++h) {
    for (std::uint64_t r = 0; r < 7; ++r) {
      for (std::uint64_t c = 0; c < 5; ++c)
        ASSERT_EQ(k[(h * 7 + r) * 5 + c], whole.k_rows[r * 20 + h * 5 + c]);
    }
  }
  EXPECT_EQ(FromHeadMajor(k, 7, 20, 4).value(), whole.k_rows);
  for (std::uint32_t tp : {1u, 2u, 4u}) {
    for (std::uint32_t rank = 0; rank < tp; ++rank) {
      const ValueRange run = HeadMajorRange(7, 20, 4, tp, rank).value();
      const KvSnapshot shard = SliceKv(whole, 4, tp, rank).value();
      const std::vector<float> expect = ToHeadMajor(shard.k_rows, 7, shard.shape.k_width, 4 / tp).value();
      ASSERT_EQ(run.count, expect.size());
      EXPECT_TRUE(
          std::equal(expect.begin(), expect.end(), k.begin() + static_cast<std::ptrdiff_t>(run.offset)))
          << "rank " << rank << " of TP " << tp;
    }
  }
}

TEST(TpShard, HeadMajorRefusalsNameWhatIsWrong) {
  const std::vector<float> plane(12);
  EXPECT_EQ(ToHeadMajor(plane, 3, 4, 3).status().message(),
            "head-major plane: width 4 is not split into 3 heads");
  EXPECT_EQ(FromHeadMajor(plane, 4, 4, 2).status().message(), "head-major plane: 12 values, not 4 x 4");
  EXPECT_FALSE(HeadMajorRange(3, 4, 2, 4, 0).ok());
  EXPECT_FALSE(HeadMajorRange(1ull << 40, 1ull << 40, 2, 1, 0).ok());
}

LatentSnapshot Latent(std::uint32_t seed) {
  LatentShape shape{.len = 7, .width = 6};
  return {shape, Random(shape.latent_values(), seed), {}, {}};
}

// A boundary of three layers as TP `tp` rank `rank` holds it.
std::vector<LayerSnapshot> RankBoundary(const std::vector<LayerSnapshot>& whole, std::uint32_t tp,
                                        std::uint32_t rank) {
  return SliceLayers(whole, 4, tp, rank).value();
}

TEST(TpShard, ABoundaryReshardsBetweenAnyTwoTpSizesExactly) {
  const std::vector<LayerSnapshot> whole = {Latent(1), Recurrent(4, 2), Kv(4, 3)};
  for (std::uint32_t a : {1u, 2u, 4u}) {
    std::vector<std::vector<LayerSnapshot>> ranks;
    for (std::uint32_t r = 0; r < a; ++r) ranks.push_back(RankBoundary(whole, a, r));
    EXPECT_EQ(std::get<KvSnapshot>(ranks[0][2]).shape.k_width, 20u / a);
    EXPECT_EQ(std::get<LatentSnapshot>(ranks[a - 1][0]).latent_rows,
              std::get<LatentSnapshot>(whole[0]).latent_rows);
    const std::vector<LayerSnapshot> back = GatherLayers(ranks).value();
    ASSERT_EQ(back.size(), 3u);
    EXPECT_EQ(std::get<RecurrentSnapshot>(back[1]).state, std::get<RecurrentSnapshot>(whole[1]).state) << a;
    EXPECT_EQ(std::get<RecurrentSnapshot>(back[1]).conv_ring,
              std::get<RecurrentSnapshot>(whole[1]).conv_ring);
    EXPECT_EQ(std::get<KvSnapshot>(back[2]).k_rows, std::get<KvSnapshot>(whole[2]).k_rows) << a;
    EXPECT_EQ(std::get<KvSnapshot>(back[2]).v_rows, std::get<KvSnapshot>(whole[2]).v_rows) << a;
  }
}

TEST(TpShard, RanksThatDisagreeOnAReplicatedPlaneAreRefused) {
  const std::vector<LayerSnapshot> whole = {Latent(1), Recurrent(4, 2), Kv(4, 3)};
  std::vector<std::vector<LayerSnapshot>> ranks = {RankBoundary(whole, 2, 0), RankBoundary(whole, 2, 1)};
  std::get<LatentSnapshot>(ranks[1][0]).latent_rows[5] += 1e-6F;
  EXPECT_EQ(GatherLayers(ranks).status().message(),
            "TP gather of layer 0: rank 1: its replicated latent planes differ from rank 0's");
  ranks[1].pop_back();
  EXPECT_EQ(GatherLayers(ranks).status().message(), "TP gather: rank 1 holds 2 layers, rank 0 3");
  ranks[1] = {Kv(2, 1), Recurrent(2, 2), Kv(2, 3)};
  EXPECT_EQ(GatherLayers(ranks).status().message(),
            "TP gather of layer 0: rank 1: it is of another kind than rank 0's");
  EXPECT_FALSE(GatherLayers({}).ok());
  EXPECT_EQ(SliceLayers(whole, 3, 1, 0).status().message(),
            "TP slice of layer 2: TP slice of a KV layer: row widths 20/8 are not split into 3 heads");
}

TEST(TpShard, ATpEntrysLayersAreRankZerosEveryLayerThenEachRanksShards) {
  const LayerShape latent = LatentShape{.len = 7, .width = 6};
  const LayerShape shard = RecurrentShape{.heads = 2, .head_dim = 3, .kernel = 4};
  const LayerShape kv = KvShape{.len = 7, .k_width = 10, .v_width = 4};
  const std::vector<LayerShape> entry = {latent, shard, kv, shard, kv, shard, kv};  // 3 layers, TP 3
  const auto parts = EntryLayerParts(entry, 3).value();
  const std::vector<EntryLayerPart> want = {{0, 0, false}, {1, 0, true}, {2, 0, true}, {1, 1, true},
                                            {2, 1, true},  {1, 2, true}, {2, 2, true}};
  EXPECT_EQ(parts, want);
  const auto whole = GatherShapes(entry, 3).value();
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(std::get<RecurrentShape>(whole[1]).heads, 6u);
  EXPECT_EQ(std::get<KvShape>(whole[2]).k_width, 30u);
  EXPECT_EQ(std::get<KvShape>(whole[2]).v_width, 12u);
  EXPECT_EQ(std::get<LatentShape>(whole[0]), std::get<LatentShape>(latent));
  // One rank: every layer is its own.
  EXPECT_EQ(EntryLayerParts(std::span(entry).first(3), 1).value().size(), 3u);
  EXPECT_FALSE(EntryLayerParts(std::span(entry).first(6), 3).ok());  // a shard missing
  std::vector<LayerShape> odd = entry;
  odd[5] = RecurrentShape{.heads = 1, .head_dim = 3, .kernel = 4};
  EXPECT_EQ(GatherShapes(odd, 3).status().message(),
            "TP entry: rank 2's shard of layer 1 is not shaped as rank 0's");
}

}  // namespace
}  // namespace primecache

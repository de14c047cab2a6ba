// The CPU twin of the pool-key build against cases whose answer is known in
// closed form, and against a double-precision evaluation of the formula.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/pool_keys.h"

namespace primecache::kernels {
namespace {


TEST(PoolKeysCpuTest, EqualGatesAverageTheRows) {
  const std::size_t d = 3, pool = 4;
  std::vector<float> rows(pool * 2 * d, 0.0f), ape(pool * d, 0.0f), keys(d, -1.0f);
  for (std::size_t j = 0; j < pool; ++j)
    for (std::size_t c = 0; c < d; ++c) rows[j * 2 * d + c] = static_cast<float>(j + 10 * c);
  PoolKeyArgs a{rows.data(), 0, ape.data(), keys.data(), d, pool, 0, 1};
  ASSERT_TRUE(BuildPoolKeysCpu(a).ok());
  for (std::size_t c = 0; c < d; ++c) EXPECT_FLOAT_EQ(keys[c], 1.5f + 10.0f * static_cast<float>(c));
}

TEST(PoolKeysCpuTest, DominantGatePicksItsRowAndApeCounts) {
  const std::size_t d = 2, pool = 2;
  std::vector<float> rows = {1, 2, /*gate*/ 0, 0,  //
                             5, 7, /*gate*/ 0, 0};
  std::vector<float> ape = {0, 60, 60, 0};  // channel 0 favours j=1, channel 1 favours j=0
  std::vector<float> keys(d);
  PoolKeyArgs a{rows.data(), 0, ape.data(), keys.data(), d, pool, 0, 1};
  ASSERT_TRUE(BuildPoolKeysCpu(a).ok());
  EXPECT_NEAR(keys[0], 5.0f, 1e-6);
  EXPECT_NEAR(keys[1], 2.0f, 1e-6);
}

TEST(PoolKeysCpuTest, MatchesDoublePrecisionFormulaOnRingAndFlatPlanes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const std::size_t d = 16, pool = 4, pools = 9, tokens = pools * pool;
  std::vector<float> flat(tokens * 2 * d), ape(pool * d);
  for (auto& v : flat) v = nd(rng);
  for (auto& v : ape) v = nd(rng);
  const std::size_t ring = 8;  // two pools' worth of rows
  std::vector<float> ring_rows(ring * 2 * d);
  for (std::size_t t = tokens - ring; t < tokens; ++t)
    std::copy_n(&flat[t * 2 * d], 2 * d, &ring_rows[(t % ring) * 2 * d]);

  std::vector<float> k_flat(pools * d, NAN), k_ring(pools * d, NAN);
  ASSERT_TRUE(BuildPoolKeysCpu({flat.data(), 0, ape.data(), k_flat.data(), d, pool, 0, pools}).ok());
  ASSERT_TRUE(BuildPoolKeysCpu({ring_rows.data(), ring, ape.data(), k_ring.data(), d, pool, pools - 2, 2}).ok());
  for (std::size_t p = 0; p < pools; ++p) {
    for (std::size_t c = 0; c < d; ++c) {
      double m = -1e300, s = 0, acc = 0;
      for (std::size_t j = 0; j < pool; ++j) m = std::max(m, double(flat[(p * pool + j) * 2 * d + d + c]) + ape[j * d + c]);
      for (std::size_t j = 0; j < pool; ++j) {
        double w = std::exp(double(flat[(p * pool + j) * 2 * d + d + c]) + ape[j * d + c] - m);
        s += w;
        acc += w * flat[(p * pool + j) * 2 * d + c];
      }
      EXPECT_NEAR(k_flat[p * d + c], acc / s, 1e-5 * std::max(1.0, std::abs(acc / s)));
      if (p >= pools - 2) {
        EXPECT_EQ(k_ring[p * d + c], k_flat[p * d + c]) << "ring and flat addressing must agree exactly";
      } else {
        EXPECT_TRUE(std::isnan(k_ring[p * d + c])) << "keys outside the range stay untouched";
      }
    }
  }
}

TEST(PoolKeysCpuTest, RefusesBadGeometry) {
  float x = 0;
  EXPECT_TRUE(BuildPoolKeysCpu({&x, 6, &x, &x, 1, 4, 0, 1}).IsInvalidArgument()) << "ring not a multiple of pool";
  EXPECT_TRUE(BuildPoolKeysCpu({&x, 0, &x, &x, 1, 0, 0, 1}).IsInvalidArgument()) << "pool 0";
  EXPECT_TRUE(BuildPoolKeysCpu({nullptr, 0, &x, &x, 1, 1, 0, 1}).IsInvalidArgument()) << "null rows";
  EXPECT_TRUE(BuildPoolKeysCpu({nullptr, 0, nullptr, nullptr, 1, 1, 0, 0}).ok()) << "empty range is a no-op";
}

}  // namespace
}  // namespace primecache::kernels

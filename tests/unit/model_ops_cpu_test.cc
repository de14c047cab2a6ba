// The model-op twins: a run of tokens equals the same tokens one at a time,
// and the small ops do what their comments say.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/model_ops.h"

namespace primecache::kernels {
namespace {

TEST(ModelOpsCpuTest, ConvOverARunEqualsOneTokenAtATime) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const std::size_t C = 6, K = 4, T = 9;
  std::vector<float> in(T * C), taps(C * K), ring0(C * (K - 1));
  for (auto* v : {&in, &taps, &ring0})
    for (auto& x : *v) x = nd(rng);
  std::vector<float> run(T * C);
  ASSERT_TRUE(KdaConvCpu({in.data(), taps.data(), ring0.data(), run.data(), C, K, T}).ok());
  std::vector<float> ring = ring0, one(C);
  for (std::size_t t = 0; t < T; ++t) {
    ASSERT_TRUE(KdaConvCpu({in.data() + t * C, taps.data(), ring.data(), one.data(), C, K, 1}).ok());
    for (std::size_t c = 0; c < C; ++c) {
      EXPECT_EQ(one[c], run[t * C + c]) << "t " << t << " c " << c;
      for (std::size_t i = 0; i + 2 < K; ++i) ring[c * (K - 1) + i] = ring[c * (K - 1) + i + 1];
      ring[c * (K - 1) + K - 2] = in[t * C + c];
    }
  }
}

TEST(ModelOpsCpuTest, ArgmaxTakesTheLowestIndexOnTies) {
  std::vector<float> x = {1, 5, 5, 2, /*row 2*/ -1, -1, -1, -1};
  std::uint32_t out[2];
  ASSERT_TRUE(ArgmaxRowsCpu(x.data(), 2, 4, out).ok());
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 0u);
}

TEST(ModelOpsCpuTest, GatherRefusesOutOfVocabulary) {
  std::vector<float> table = {1, 2, 3, 4}, x(2);
  std::uint32_t ok = 1, bad = 2;
  ASSERT_TRUE(GatherRowsCpu(table.data(), 2, 2, &ok, 1, x.data()).ok());
  EXPECT_EQ(x, (std::vector<float>{3, 4}));
  EXPECT_TRUE(GatherRowsCpu(table.data(), 2, 2, &bad, 1, x.data()).IsInvalidArgument());
}

TEST(ModelOpsCpuTest, MlaRowsNormaliseThenRotate) {
  // kv_rank 2, rope 2; position 0 leaves the rope part as it is.
  std::vector<float> a = {3, 4, 0.5f, -0.5f}, w = {1, 2}, row(4);
  ASSERT_TRUE(MlaRowsCpu({a.data(), w.data(), row.data(), 1, 2, 2, 4, 0, 0.0f, 10000.0f}).ok());
  const float inv = 1.0f / std::sqrt(12.5f);
  EXPECT_FLOAT_EQ(row[0], 3 * inv);
  EXPECT_FLOAT_EQ(row[1], 2 * 4 * inv);
  EXPECT_FLOAT_EQ(row[2], 0.5f);
  EXPECT_FLOAT_EQ(row[3], -0.5f);
  // At position 1 with theta irrelevant for the first pair (angle = t).
  ASSERT_TRUE(MlaRowsCpu({a.data(), w.data(), row.data(), 1, 2, 2, 4, 1, 0.0f, 10000.0f}).ok());
  EXPECT_NEAR(row[2], 0.5f * std::cos(1.0f) + 0.5f * std::sin(1.0f), 1e-6);
  EXPECT_NEAR(row[3], 0.5f * std::sin(1.0f) - 0.5f * std::cos(1.0f), 1e-6);
}

}  // namespace
}  // namespace primecache::kernels

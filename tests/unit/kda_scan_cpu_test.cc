// The KDA scan's CPU twin against the delta rule worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/kda_scan.h"

namespace primecache::kernels {
namespace {

float Sig(float z) { return 1.0f / (1.0f + std::exp(-z)); }

TEST(KdaScanCpuTest, OneHeadTwoTokensByHand) {
  // d = 2, head 0. Token 0 writes v0 along k0 = e0; token 1 reads with q1 = e0.
  const float lb = -5.0f;
  std::vector<float> q = {1, 0, 1, 0}, k = {1, 0, 0, 1}, v = {3, 4, 5, 6}, g = {0, 0, 2, -2}, b = {0, 1};
  std::vector<float> S(4, 0.0f), out(4, NAN);
  ASSERT_TRUE(KdaScanCpu({q.data(), k.data(), v.data(), g.data(), b.data(), S.data(), out.data(), 1, 2, 2, lb}).ok());
  // Token 0: S = 0 -> S' = 0; pred = 0; S = beta0 * k0 v0^T with beta0 = 1/2.
  const float beta0 = 0.5f;
  float s00 = beta0 * 3, s01 = beta0 * 4;
  EXPECT_NEAR(out[0], s00 / std::sqrt(2.0f), 1e-6);  // o = S^T q / sqrt(d), q = e0
  EXPECT_NEAR(out[1], s01 / std::sqrt(2.0f), 1e-6);
  // Token 1: decay row 0 by alpha0, row 1 by alpha1; k1 = e1 reads row 1 (zero).
  const float a0 = std::exp(lb * Sig(2.0f)), beta1 = Sig(1.0f);
  s00 *= a0;
  s01 *= a0;
  const float s10 = beta1 * 5, s11 = beta1 * 6;  // pred = S'^T e1 = row 1 = 0
  EXPECT_NEAR(S[0], s00, 1e-6);
  EXPECT_NEAR(S[1], s01, 1e-6);
  EXPECT_NEAR(S[2], s10, 1e-6);
  EXPECT_NEAR(S[3], s11, 1e-6);
  EXPECT_NEAR(out[2], s00 / std::sqrt(2.0f), 1e-6);
  EXPECT_NEAR(out[3], s01 / std::sqrt(2.0f), 1e-6);
}

TEST(KdaScanCpuTest, DeltaRuleOverwritesAStoredValue) {
  // Writing v along k twice with beta -> 1 and alpha -> 1 converges to v.
  const std::size_t d = 4;
  std::vector<float> q(2 * d, 0), k(2 * d, 0), v = {1, 2, 3, 4, 1, 2, 3, 4}, g(2 * d, -30.0f), b = {30, 30};
  q[0] = q[d] = 1;
  k[0] = k[d] = 1;
  std::vector<float> S(d * d, 7.0f), out(2 * d);
  ASSERT_TRUE(KdaScanCpu({q.data(), k.data(), v.data(), g.data(), b.data(), S.data(), out.data(), 1, d, 2, -5.0f}).ok());
  for (std::size_t j = 0; j < d; ++j) EXPECT_NEAR(S[j], v[j], 1e-4) << "row 0 holds v after the write";
  for (std::size_t j = 0; j < d; ++j) EXPECT_NEAR(out[d + j], v[j] / 2.0f, 1e-4);
}

TEST(KdaScanCpuTest, RefusesBadArguments) {
  float x = 0;
  EXPECT_TRUE(KdaScanCpu({&x, &x, &x, &x, &x, &x, nullptr, 1, 1, 1, -5.0f}).IsInvalidArgument());
  EXPECT_TRUE(KdaScanCpu({&x, &x, &x, &x, &x, &x, &x, 0, 1, 1, -5.0f}).IsInvalidArgument());
  EXPECT_TRUE(KdaScanCpu({&x, &x, &x, &x, &x, &x, &x, 1, 1, 1, 0.5f}).IsInvalidArgument());
  EXPECT_TRUE(KdaScanCpu({nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 0, -5.0f}).ok());
}

}  // namespace
}  // namespace primecache::kernels

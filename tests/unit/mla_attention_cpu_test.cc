// The MLA attention twin on cases whose answer is known.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/mla_attention.h"

namespace primecache::kernels {
namespace {

MlaAttentionArgs Base(const std::vector<float>& qt, const std::vector<float>& rows, std::vector<float>* out) {
  MlaAttentionArgs a;
  a.qt = qt.data();
  a.rows = rows.data();
  a.out = out->data();
  a.count = 1;
  a.heads = 1;
  a.kv_rank = 2;
  a.scale = 1.0f;
  return a;
}

TEST(MlaAttentionCpuTest, FirstTokenAttendsOnlyToItself) {
  std::vector<float> qt = {5, -3}, rows = {0.25f, 0.75f}, out(2);
  ASSERT_TRUE(MlaAttentionCpu(Base(qt, rows, &out)).ok());
  EXPECT_FLOAT_EQ(out[0], 0.25f);
  EXPECT_FLOAT_EQ(out[1], 0.75f);
}

TEST(MlaAttentionCpuTest, EqualScoresAverageAndRopePartCounts) {
  // Two keys; the nope parts tie, the rope part decides.
  std::vector<float> qt = {0, 0}, qp = {1, 0}, rows = {1, 0, /*kpe*/ 0, 0, 0, 1, /*kpe*/ std::log(3.0f), 0}, out(2);
  MlaAttentionArgs a = Base(qt, rows, &out);
  a.qp = qp.data();
  a.rope_dim = 2;
  a.first_pos = 1;
  ASSERT_TRUE(MlaAttentionCpu(a).ok());
  EXPECT_NEAR(out[0], 0.25f, 1e-6);  // weights 1:3
  EXPECT_NEAR(out[1], 0.75f, 1e-6);
}

TEST(MlaAttentionCpuTest, SparseSelectionSkipsUnselectedPoolsButKeepsTheTail) {
  // pool 2, position 4: pools 0 and 1 visible, tail = {4}. Select pool 1 only.
  std::vector<float> qt = {0, 0}, out(2);
  std::vector<float> rows = {100, 100, 100, 100, 1, 1, 3, 3, 8, 8};  // r = 2, five rows
  std::vector<std::uint32_t> pools = {1};
  std::uint32_t count = 1;
  MlaAttentionArgs a = Base(qt, rows, &out);
  a.first_pos = 4;
  a.pools = pools.data();
  a.pool_count = &count;
  a.pool = 2;
  a.pool_stride = 1;
  ASSERT_TRUE(MlaAttentionCpu(a).ok());
  EXPECT_NEAR(out[0], (1 + 3 + 8) / 3.0f, 1e-5);  // rows 2, 3 and 4 with equal weight
}

TEST(MlaAttentionCpuTest, RefusesBadArguments) {
  std::vector<float> qt = {0, 0}, rows = {0, 0}, out(2);
  MlaAttentionArgs a = Base(qt, rows, &out);
  a.rope_dim = 2;  // no qp
  EXPECT_TRUE(MlaAttentionCpu(a).IsInvalidArgument());
  a = Base(qt, rows, &out);
  std::uint32_t p = 0;
  a.pools = &p;  // sparse without counts
  EXPECT_TRUE(MlaAttentionCpu(a).IsInvalidArgument());
}

}  // namespace
}  // namespace primecache::kernels

// The indexer selection twin on cases worked by hand.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/indexer_select.h"

namespace primecache::kernels {
namespace {

struct Run {
  std::vector<std::uint32_t> selected;
  std::uint32_t count = 0;
};

// One query, one head of width 1: score of pool p = wt * ReLU(q * key[p]).
Run Select(float q, float wt, const std::vector<float>& keys, std::uint64_t pos, std::size_t pool, std::size_t topk) {
  Run r;
  r.selected.assign(topk, 0xdeadu);
  IndexerSelectArgs a;
  a.qi = &q;
  a.wt = &wt;
  a.keys = keys.data();
  a.selected = r.selected.data();
  a.selected_count = &r.count;
  a.count = 1;
  a.first_pos = pos;
  a.heads = 1;
  a.head_dim = 1;
  a.pool = pool;
  a.topk = topk;
  EXPECT_TRUE(IndexerSelectCpu(a).ok());
  r.selected.resize(r.count);
  return r;
}

TEST(IndexerSelectCpuTest, KeepsTheTopKInAscendingOrder) {
  std::vector<float> keys = {1, 5, 3, 9, 2};
  auto r = Select(1, 1, keys, /*pos=*/9, /*pool=*/2, /*topk=*/3);  // all 5 pools visible
  EXPECT_EQ(r.selected, (std::vector<std::uint32_t>{1, 2, 3}));
}

TEST(IndexerSelectCpuTest, OnlyCompletedPoolsAreVisible) {
  std::vector<float> keys = {1, 5, 3, 9, 2};
  auto r = Select(1, 1, keys, /*pos=*/6, /*pool=*/2, /*topk=*/10);  // (6+1)/2 = 3 pools
  EXPECT_EQ(r.selected, (std::vector<std::uint32_t>{0, 1, 2}));
  auto none = Select(1, 1, keys, 0, 2, 4);
  EXPECT_EQ(none.count, 0u);
}

TEST(IndexerSelectCpuTest, TiesGoToTheLowerPoolAndNegativeZeroTiesPositive) {
  // q = -1: every ReLU is 0 for positive keys, so all score 0 (wt < 0 gives -0).
  std::vector<float> keys = {1, 2, 3, 4};
  auto r = Select(-1, -1, keys, 7, 2, 2);
  EXPECT_EQ(r.selected, (std::vector<std::uint32_t>{0, 1}));
  std::vector<float> mixed = {-1, 4, 4, 1};  // pools 1 and 2 tie at the top
  auto m = Select(1, 1, mixed, 7, 2, 1);
  EXPECT_EQ(m.selected, (std::vector<std::uint32_t>{1}));
}

TEST(IndexerSelectCpuTest, RefusesBadArguments) {
  IndexerSelectArgs a;
  a.count = 1;
  EXPECT_TRUE(IndexerSelectCpu(a).IsInvalidArgument());
}

}  // namespace
}  // namespace primecache::kernels

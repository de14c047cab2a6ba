// The CPU twins of the engine's row kernels and the conv-ring push, against
// plainly written references: every row of the plane is checked, written or
// untouched.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/conv_ring.h"
#include "kernels/ring_rows.h"
#include "tests/engine/engine_test_util.h"

namespace primecache::kernels {
namespace {

using engine::testing::BitEqual;
using engine::testing::RandomRows;

TEST(RingRowsCpuTest, AppendWritesLatentFlatAndIndexAtRingAddresses) {
  std::mt19937 rng(1);
  const std::size_t w = 5, iw = 4, ring = 6, first = 9, count = 6;
  std::vector<float> latent(20 * w, -1.0f), index(ring * iw, -1.0f);
  auto ls = RandomRows(rng, count * w), is = RandomRows(rng, count * iw);
  ASSERT_TRUE(
      AppendRowsCpu({latent.data(), ls.data(), w, index.data(), is.data(), iw, ring, first, count}).ok());
  for (std::size_t r = 0; r < 20; ++r) {
    for (std::size_t c = 0; c < w; ++c) {
      const float want = (r >= first && r < first + count) ? ls[(r - first) * w + c] : -1.0f;
      ASSERT_EQ(latent[r * w + c], want) << r << "," << c;
    }
  }
  for (std::size_t t = 0; t < count; ++t) {
    const std::size_t phys = (first + t) % ring;  // 9..14 -> 3,4,5,0,1,2
    for (std::size_t c = 0; c < iw; ++c) ASSERT_EQ(index[phys * iw + c], is[t * iw + c]);
  }
}

TEST(RingRowsCpuTest, AppendWithoutIndexAndFlatIndex) {
  std::vector<float> latent(8 * 2, 0.0f), index(8 * 2, 0.0f);
  std::vector<float> ls = {1, 2, 3, 4}, is = {5, 6, 7, 8};
  ASSERT_TRUE(AppendRowsCpu({latent.data(), ls.data(), 2, nullptr, nullptr, 0, 0, 3, 2}).ok());
  EXPECT_EQ(latent[6], 1.0f);
  EXPECT_EQ(latent[9], 4.0f);
  ASSERT_TRUE(AppendRowsCpu({latent.data(), ls.data(), 2, index.data(), is.data(), 2, 0, 6, 2}).ok());
  EXPECT_EQ(index[12], 5.0f);
  EXPECT_EQ(index[15], 8.0f);
}

TEST(RingRowsCpuTest, RefusesALaunchThatLapsItsRingAndNullPointers) {
  std::vector<float> latent(64), index(16), src(64);
  EXPECT_TRUE(AppendRowsCpu({latent.data(), src.data(), 1, index.data(), src.data(), 2, 8, 0, 9})
                  .IsInvalidArgument());
  EXPECT_TRUE(
      AppendRowsCpu({latent.data(), src.data(), 1, nullptr, src.data(), 2, 8, 0, 1}).IsInvalidArgument());
  EXPECT_TRUE(AppendRowsCpu({nullptr, src.data(), 1, nullptr, nullptr, 0, 0, 0, 1}).IsInvalidArgument());
  EXPECT_TRUE(AppendRowsCpu({nullptr, nullptr, 0, nullptr, nullptr, 0, 0, 0, 0}).ok());  // nothing to move
  EXPECT_TRUE(GatherRowsCpu({index.data(), src.data(), 2, 8, 0, 9}).IsInvalidArgument());
  EXPECT_TRUE(ScatterRowsCpu({index.data(), nullptr, 2, 8, 0, 1}).IsInvalidArgument());
  EXPECT_TRUE(ScatterRowsCpu({index.data(), src.data(), 0, 8, 0, 1}).IsInvalidArgument());
}

TEST(RingRowsCpuTest, GatherAndScatterAddressEveryRingSizeAndStart) {
  std::mt19937 rng(2);
  const std::size_t w = 3;
  for (std::size_t ring : {0, 1, 4, 7}) {
    const std::size_t phys = ring ? ring : 32;
    for (std::size_t first : {0, 1, 5, 13}) {
      for (std::size_t count = 0; count <= (ring ? ring : 10); ++count) {
        auto plane = RandomRows(rng, phys * w);
        const auto orig = plane;
        std::vector<float> lin(count * w);
        ASSERT_TRUE(GatherRowsCpu({plane.data(), lin.data(), w, ring, first, count}).ok());
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t p = ring ? (first + i) % ring : first + i;
          for (std::size_t c = 0; c < w; ++c) ASSERT_EQ(lin[i * w + c], plane[p * w + c]);
        }
        auto fresh = RandomRows(rng, count * w);
        ASSERT_TRUE(ScatterRowsCpu({plane.data(), fresh.data(), w, ring, first, count}).ok());
        std::vector<bool> hit(phys, false);
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t p = ring ? (first + i) % ring : first + i;
          hit[p] = true;
          for (std::size_t c = 0; c < w; ++c) ASSERT_EQ(plane[p * w + c], fresh[i * w + c]);
        }
        for (std::size_t p = 0; p < phys; ++p) {
          if (!hit[p]) {
            for (std::size_t c = 0; c < w; ++c)
              ASSERT_EQ(plane[p * w + c], orig[p * w + c]) << "untouched row " << p;
          }
        }
        std::vector<float> back(count * w);
        ASSERT_TRUE(GatherRowsCpu({plane.data(), back.data(), w, ring, first, count}).ok());
        EXPECT_TRUE(BitEqual(back, fresh));
      }
    }
  }
}

TEST(ConvRingCpuTest, PushKeepsTheLastKernelMinusOneInputsOfEveryChannel) {
  std::mt19937 rng(3);
  for (std::size_t kernel : {2, 3, 4, 6}) {
    const std::size_t C = 7, keep = kernel - 1;
    std::vector<float> ring(C * keep, 0.0f);
    std::vector<std::vector<float>> history;
    for (std::size_t count : {1, 2, 1, 5, 3, 9, 1}) {
      auto in = RandomRows(rng, count * C);
      for (std::size_t t = 0; t < count; ++t)
        history.emplace_back(in.begin() + t * C, in.begin() + (t + 1) * C);
      ASSERT_TRUE(PushConvRingCpu({ring.data(), in.data(), C, kernel, count}).ok());
      for (std::size_t c = 0; c < C; ++c) {
        for (std::size_t i = 0; i < keep; ++i) {
          const std::ptrdiff_t pos = static_cast<std::ptrdiff_t>(history.size()) -
                                     static_cast<std::ptrdiff_t>(keep) + static_cast<std::ptrdiff_t>(i);
          const float want = pos >= 0 ? history[pos][c] : 0.0f;
          ASSERT_EQ(ring[c * keep + i], want) << "kernel " << kernel << " channel " << c << " slot " << i;
        }
      }
    }
  }
  std::vector<float> r(4);
  EXPECT_TRUE(PushConvRingCpu({r.data(), r.data(), 2, 1, 1}).IsInvalidArgument());
  EXPECT_TRUE(PushConvRingCpu({nullptr, r.data(), 2, 3, 1}).IsInvalidArgument());
}

}  // namespace
}  // namespace primecache::kernels

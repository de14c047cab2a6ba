// The engine's CUDA row kernels and conv-ring push held to their CPU twins on
// fresh random data: destination buffers start as the same random poison on
// both sides, and every element is compared bit for bit (these kernels only
// move floats), so a stray or missing write shows.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/conv_ring.h"
#include "kernels/ring_rows.h"
#include "tests/engine/engine_test_util.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels {
namespace {

using engine::testing::BitEqual;
using engine::testing::RandomRows;
using primecache::testing::DeviceBuffer;

struct RowCase {
  std::size_t width, index_width, ring, first, count;
};

void PrintTo(const RowCase& g, std::ostream* os) {
  *os << "width " << g.width << ", index width " << g.index_width << ", ring " << g.ring << ", rows ["
      << g.first << ", " << g.first + g.count << ")";
}

class RowKernelsGpuTest : public ::testing::TestWithParam<RowCase> {};

TEST_P(RowKernelsGpuTest, AppendGatherScatterMatchTheCpuTwinsExactly) {
  PC_SKIP_WITHOUT_CUDA();
  const RowCase g = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::size_t latent_rows = g.first + g.count + 3;
  const std::size_t index_rows = g.ring ? g.ring : latent_rows;

  // Append.
  auto latent = RandomRows(rng, latent_rows * g.width), index = RandomRows(rng, index_rows * g.index_width);
  auto ls = RandomRows(rng, g.count * g.width), is = RandomRows(rng, g.count * g.index_width);
  DeviceBuffer<float> d_latent(latent.size()), d_index(index.size()), d_ls(ls.size()), d_is(is.size());
  PC_CUDA_OK(d_latent.Upload(latent));
  PC_CUDA_OK(d_index.Upload(index));
  PC_CUDA_OK(d_ls.Upload(ls));
  PC_CUDA_OK(d_is.Upload(is));
  ASSERT_TRUE(AppendRowsCpu({latent.data(), ls.data(), g.width, index.data(), is.data(), g.index_width,
                             g.ring, g.first, g.count})
                  .ok());
  ASSERT_TRUE(AppendRowsCuda({d_latent.get(), d_ls.get(), g.width, d_index.get(), d_is.get(), g.index_width,
                              g.ring, g.first, g.count},
                             nullptr)
                  .ok());
  PC_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> got;
  PC_CUDA_OK(d_latent.Download(&got));
  EXPECT_TRUE(BitEqual(got, latent)) << "latent plane";
  PC_CUDA_OK(d_index.Download(&got));
  EXPECT_TRUE(BitEqual(got, index)) << "index plane";

  // Gather the appended rows back out, then scatter fresh rows over them
  // (index planes only: a layer without an indexer has none).
  if (g.index_width == 0) return;
  const std::size_t n = std::min(g.count, g.ring ? g.ring : g.count);
  auto lin = RandomRows(rng, n * g.index_width);
  DeviceBuffer<float> d_lin(lin.size());
  PC_CUDA_OK(d_lin.Upload(lin));
  ASSERT_TRUE(GatherRowsCpu({index.data(), lin.data(), g.index_width, g.ring, g.first, n}).ok());
  ASSERT_TRUE(GatherRowsCuda({d_index.get(), d_lin.get(), g.index_width, g.ring, g.first, n}, nullptr).ok());
  PC_CUDA_OK(cudaDeviceSynchronize());
  PC_CUDA_OK(d_lin.Download(&got));
  EXPECT_TRUE(BitEqual(got, lin)) << "gather";

  auto fresh = RandomRows(rng, n * g.index_width);
  PC_CUDA_OK(d_lin.Upload(fresh));
  ASSERT_TRUE(ScatterRowsCpu({index.data(), fresh.data(), g.index_width, g.ring, g.first + 1, n}).ok());
  ASSERT_TRUE(
      ScatterRowsCuda({d_index.get(), d_lin.get(), g.index_width, g.ring, g.first + 1, n}, nullptr).ok());
  PC_CUDA_OK(cudaDeviceSynchronize());
  PC_CUDA_OK(d_index.Download(&got));
  EXPECT_TRUE(BitEqual(got, index)) << "scatter";
}

INSTANTIATE_TEST_SUITE_P(Shapes, RowKernelsGpuTest,
                         ::testing::Values(RowCase{576, 256, 0, 0, 1}, RowCase{576, 256, 0, 100, 4096},
                                           RowCase{576, 256, 256, 1000, 256},
                                           RowCase{576, 256, 256, 999, 100}, RowCase{7, 6, 9, 4, 9},
                                           RowCase{5, 0, 0, 3, 17}, RowCase{512, 256, 4, 3, 4}),
                         [](const auto& info) {
                           const RowCase& g = info.param;
                           return "w" + std::to_string(g.width) + "_iw" + std::to_string(g.index_width) +
                                  "_ring" + std::to_string(g.ring) + "_first" + std::to_string(g.first) +
                                  "_count" + std::to_string(g.count);
                         });

TEST(ConvRingGpuTest, PushMatchesTheCpuTwinExactly) {
  PC_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(std::random_device{}());
  for (std::size_t kernel : {2, 4, 5}) {
    const std::size_t C = 3 * 64 * 128;
    auto ring = RandomRows(rng, C * (kernel - 1));
    DeviceBuffer<float> d_ring(ring.size());
    PC_CUDA_OK(d_ring.Upload(ring));
    for (std::size_t count : {1, 2, 3, 7, 64}) {
      auto in = RandomRows(rng, count * C);
      DeviceBuffer<float> d_in(in.size());
      PC_CUDA_OK(d_in.Upload(in));
      ASSERT_TRUE(PushConvRingCpu({ring.data(), in.data(), C, kernel, count}).ok());
      ASSERT_TRUE(PushConvRingCuda({d_ring.get(), d_in.get(), C, kernel, count}, nullptr).ok());
      PC_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> got;
      PC_CUDA_OK(d_ring.Download(&got));
      ASSERT_TRUE(BitEqual(got, ring)) << "kernel " << kernel << " count " << count;
    }
  }
}

}  // namespace
}  // namespace primecache::kernels

// The CUDA indexer selection held to its CPU twin: the selections must be
// identical (the kernel computes scores exactly as the twin does).
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "kernels/indexer_select.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels {
namespace {

using primecache::testing::DeviceBuffer;

struct Geometry {
  std::size_t heads, head_dim, pool, topk, count, first_pos;
};

class IndexerSelectGpuTest : public ::testing::TestWithParam<Geometry> {};

TEST_P(IndexerSelectGpuTest, SelectsExactlyWhatTheTwinSelects) {
  PC_SKIP_WITHOUT_CUDA();
  const Geometry g = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t pools = (g.first_pos + g.count) / g.pool;
  auto fill = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  std::vector<float> qi = fill(g.count * g.heads * g.head_dim), wt = fill(g.count * g.heads),
                     keys = fill(std::max<std::size_t>(pools, 1) * g.head_dim);
  // A run of exact ties, to exercise the lower-pool rule.
  for (std::size_t p = 3; p < std::min<std::size_t>(pools, 40); ++p)
    for (std::size_t c = 0; c < g.head_dim; ++c) keys[p * g.head_dim + c] = keys[2 * g.head_dim + c];
  IndexerSelectArgs a;
  a.count = g.count;
  a.first_pos = g.first_pos;
  a.heads = g.heads;
  a.head_dim = g.head_dim;
  a.pool = g.pool;
  a.topk = g.topk;
  std::vector<std::uint32_t> cpu_sel(g.count * g.topk, 0xffffffffu), cpu_count(g.count);
  IndexerSelectArgs c = a;
  c.qi = qi.data();
  c.wt = wt.data();
  c.keys = keys.data();
  c.selected = cpu_sel.data();
  c.selected_count = cpu_count.data();
  ASSERT_TRUE(IndexerSelectCpu(c).ok());

  DeviceBuffer<float> dqi(qi.size()), dwt(wt.size()), dkeys(keys.size());
  DeviceBuffer<std::uint32_t> dsel(cpu_sel.size()), dcount(g.count);
  DeviceBuffer<std::uint8_t> scratch(std::max<std::size_t>(IndexerSelectScratchBytes(a), 1));
  PC_CUDA_OK(dqi.Upload(qi));
  PC_CUDA_OK(dwt.Upload(wt));
  PC_CUDA_OK(dkeys.Upload(keys));
  PC_CUDA_OK(cudaMemset(dsel.get(), 0xff, cpu_sel.size() * 4));
  IndexerSelectArgs d = a;
  d.qi = dqi.get();
  d.wt = dwt.get();
  d.keys = dkeys.get();
  d.selected = dsel.get();
  d.selected_count = dcount.get();
  d.scratch = scratch.get();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(IndexerSelectCuda(d, nullptr).ok());
  PC_CUDA_OK(cudaDeviceSynchronize());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::uint32_t> gpu_sel, gpu_count;
  PC_CUDA_OK(dsel.Download(&gpu_sel));
  PC_CUDA_OK(dcount.Download(&gpu_count));
  ASSERT_EQ(gpu_count, cpu_count);
  std::size_t differing = 0;
  for (std::size_t i = 0; i < g.count; ++i)
    for (std::size_t k = 0; k < cpu_count[i]; ++k) differing += gpu_sel[i * g.topk + k] != cpu_sel[i * g.topk + k];
  EXPECT_EQ(differing, 0u);
  std::printf("[ idx-select ] heads=%zu di=%zu pool=%zu topk=%zu queries=%zu at %zu (%zu pools): identical, %.2f ms\n",
              g.heads, g.head_dim, g.pool, g.topk, g.count, g.first_pos, pools, ms);
}

INSTANTIATE_TEST_SUITE_P(Geometries, IndexerSelectGpuTest,
                         ::testing::Values(Geometry{1, 1, 2, 3, 20, 0}, Geometry{2, 16, 4, 4, 64, 100},
                                           Geometry{8, 128, 4, 512, 256, 32000}, Geometry{4, 32, 1, 7, 100, 1000},
                                           Geometry{8, 128, 4, 2048, 64, 120000}),
                         [](const auto& info) {
                           const Geometry& g = info.param;
                           return "h" + std::to_string(g.heads) + "_d" + std::to_string(g.head_dim) + "_pool" +
                                  std::to_string(g.pool) + "_top" + std::to_string(g.topk) + "_at" +
                                  std::to_string(g.first_pos);
                         });

}  // namespace
}  // namespace primecache::kernels

// The CUDA MLA attention held to its CPU twin on fresh random data, dense and
// with sparse pool selections: poisoned output, every element checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "kernels/mla_attention.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels {
namespace {

using primecache::testing::Agreement;
using primecache::testing::DeviceBuffer;
using primecache::testing::ExpectCloseToCpu;

struct Geometry {
  std::size_t heads, r, dr, count, first_pos, pool, topk;  // pool 0: dense
};

class MlaAttentionGpuTest : public ::testing::TestWithParam<Geometry> {};

TEST_P(MlaAttentionGpuTest, MatchesCpuTwin) {
  PC_SKIP_WITHOUT_CUDA();
  const Geometry g = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t width = g.r + g.dr, total = g.first_pos + g.count;
  auto fill = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  std::vector<float> qt = fill(g.count * g.heads * g.r), qp = fill(g.count * g.heads * std::max<std::size_t>(g.dr, 1)),
                     rows = fill(total * width);
  std::vector<std::uint32_t> pools, counts;
  std::size_t stride = std::max<std::size_t>(g.topk, 1);
  if (g.pool) {
    for (std::size_t i = 0; i < g.count; ++i) {
      const std::size_t visible = (g.first_pos + i + 1) / g.pool;
      std::vector<std::uint32_t> all(visible);
      for (std::size_t p = 0; p < visible; ++p) all[p] = static_cast<std::uint32_t>(p);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(std::min(visible, g.topk));
      std::sort(all.begin(), all.end());
      counts.push_back(static_cast<std::uint32_t>(all.size()));
      all.resize(stride, 0);
      pools.insert(pools.end(), all.begin(), all.end());
    }
  }
  MlaAttentionArgs a;
  a.count = g.count;
  a.first_pos = g.first_pos;
  a.heads = g.heads;
  a.kv_rank = g.r;
  a.rope_dim = g.dr;
  a.pool = g.pool;
  a.pool_stride = g.pool ? stride : 0;
  a.scale = 1.0f / std::sqrt(float(g.r));
  std::vector<float> cpu(g.count * g.heads * g.r, NAN);
  MlaAttentionArgs c = a;
  c.qt = qt.data();
  c.qp = qp.data();
  c.rows = rows.data();
  c.out = cpu.data();
  if (g.pool) {
    c.pools = pools.data();
    c.pool_count = counts.data();
  }
  ASSERT_TRUE(MlaAttentionCpu(c).ok());

  DeviceBuffer<float> dqt(qt.size()), dqp(qp.size()), drows(rows.size()), dout(cpu.size());
  DeviceBuffer<std::uint32_t> dpools(std::max<std::size_t>(pools.size(), 1)), dcounts(std::max<std::size_t>(counts.size(), 1));
  PC_CUDA_OK(dqt.Upload(qt));
  PC_CUDA_OK(dqp.Upload(qp));
  PC_CUDA_OK(drows.Upload(rows));
  PC_CUDA_OK(cudaMemset(dout.get(), 0xff, cpu.size() * sizeof(float)));
  MlaAttentionArgs d = a;
  d.qt = dqt.get();
  d.qp = dqp.get();
  d.rows = drows.get();
  d.out = dout.get();
  if (g.pool) {
    PC_CUDA_OK(dpools.Upload(pools));
    PC_CUDA_OK(dcounts.Upload(counts));
    d.pools = dpools.get();
    d.pool_count = dcounts.get();
  }
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(MlaAttentionCuda(d, nullptr).ok());
  PC_CUDA_OK(cudaDeviceSynchronize());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> gpu;
  PC_CUDA_OK(dout.Download(&gpu));
  const Agreement agree = ExpectCloseToCpu(gpu, cpu);
  std::printf("[ mla-attn ] heads=%zu r=%zu dr=%zu queries=%zu from %zu pool=%zu topk=%zu: rel %.3g (max %.3g), %.2f ms\n",
              g.heads, g.r, g.dr, g.count, g.first_pos, g.pool, g.topk, agree.norm_rel, agree.worst, ms);
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, MlaAttentionGpuTest,
    ::testing::Values(Geometry{1, 8, 0, 5, 0, 0, 0}, Geometry{4, 32, 8, 40, 3, 0, 0}, Geometry{3, 33, 6, 17, 50, 4, 2},
                      Geometry{16, 512, 64, 64, 4000, 0, 0}, Geometry{16, 512, 64, 256, 8000, 4, 256},
                      Geometry{8, 64, 0, 30, 100, 1, 7}),
    [](const auto& info) {
      const Geometry& g = info.param;
      return "h" + std::to_string(g.heads) + "_r" + std::to_string(g.r) + "_dr" + std::to_string(g.dr) + "_q" +
             std::to_string(g.count) + "_at" + std::to_string(g.first_pos) +
             (g.pool ? "_pool" + std::to_string(g.pool) + "_top" + std::to_string(g.topk) : "_dense");
    });

}  // namespace
}  // namespace primecache::kernels

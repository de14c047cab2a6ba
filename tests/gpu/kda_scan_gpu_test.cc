// The CUDA KDA scan held to its CPU twin on fresh random data: poisoned
// output, every output element and every state element checked.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/kda_scan.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels {
namespace {

using primecache::testing::Agreement;
using primecache::testing::DeviceBuffer;
using primecache::testing::ExpectCloseToCpu;

struct Geometry {
  std::size_t heads, d, count;
};

void Normalize(std::vector<float>& x, std::size_t d) {
  for (std::size_t o = 0; o < x.size(); o += d) {
    float ss = 0;
    for (std::size_t i = 0; i < d; ++i) ss += x[o + i] * x[o + i];
    for (std::size_t i = 0; i < d; ++i) x[o + i] /= std::sqrt(ss + 1e-6f);
  }
}

class KdaScanGpuTest : public ::testing::TestWithParam<Geometry> {};

TEST_P(KdaScanGpuTest, MatchesCpuTwin) {
  PC_SKIP_WITHOUT_CUDA();
  const Geometry g = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t n = g.heads * g.d;
  auto fill = [&](std::size_t size) {
    std::vector<float> v(size);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  std::vector<float> q = fill(g.count * n), k = fill(g.count * n), v = fill(g.count * n), gate = fill(g.count * n),
                     b = fill(g.count * g.heads), state = fill(g.heads * g.d * g.d);
  Normalize(q, g.d);
  Normalize(k, g.d);
  std::vector<float> cpu_state = state, cpu_out(g.count * n, NAN);
  ASSERT_TRUE(KdaScanCpu({q.data(), k.data(), v.data(), gate.data(), b.data(), cpu_state.data(), cpu_out.data(),
                          g.heads, g.d, g.count, -5.0f})
                  .ok());

  DeviceBuffer<float> dq(q.size()), dk(k.size()), dv(v.size()), dg(gate.size()), db(b.size()), ds(state.size()),
      dout(cpu_out.size());
  PC_CUDA_OK(dq.Upload(q));
  PC_CUDA_OK(dk.Upload(k));
  PC_CUDA_OK(dv.Upload(v));
  PC_CUDA_OK(dg.Upload(gate));
  PC_CUDA_OK(db.Upload(b));
  PC_CUDA_OK(ds.Upload(state));
  PC_CUDA_OK(cudaMemset(dout.get(), 0xff, dout.size() * sizeof(float)));  // NaN poison
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(KdaScanCuda({dq.get(), dk.get(), dv.get(), dg.get(), db.get(), ds.get(), dout.get(), g.heads, g.d,
                           g.count, -5.0f},
                          nullptr)
                  .ok());
  PC_CUDA_OK(cudaDeviceSynchronize());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> gpu_out, gpu_state;
  PC_CUDA_OK(dout.Download(&gpu_out));
  PC_CUDA_OK(ds.Download(&gpu_state));

  const Agreement o = ExpectCloseToCpu(gpu_out, cpu_out, "output");
  const Agreement s = ExpectCloseToCpu(gpu_state, cpu_state, "state");
  std::printf("[ kda-scan ] heads=%zu d=%zu tokens=%zu: out rel %.3g (max %.3g), state rel %.3g (max %.3g), %.2f ms\n",
              g.heads, g.d, g.count, o.norm_rel, o.worst, s.norm_rel, s.worst, ms);
}

INSTANTIATE_TEST_SUITE_P(Geometries, KdaScanGpuTest,
                         ::testing::Values(Geometry{1, 16, 1}, Geometry{4, 16, 37}, Geometry{3, 40, 100},
                                           Geometry{64, 128, 1}, Geometry{64, 128, 2048}),
                         [](const auto& info) {
                           return "h" + std::to_string(info.param.heads) + "_d" + std::to_string(info.param.d) + "_t" +
                                  std::to_string(info.param.count);
                         });

}  // namespace
}  // namespace primecache::kernels

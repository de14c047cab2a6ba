// The CUDA pool-key build held to its CPU twin on fresh random data: the
// output buffer is poisoned first and every element is checked, inside the
// written range against the twin and outside it for untouched poison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/pool_keys.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels {
namespace {

using primecache::testing::DeviceBuffer;

struct Geometry {
  std::size_t d, pool, tokens, ring;  // ring 0: flat
};

class PoolKeysGpuTest : public ::testing::TestWithParam<Geometry> {};

TEST_P(PoolKeysGpuTest, MatchesCpuTwinOnEveryElement) {
  PC_SKIP_WITHOUT_CUDA();
  const Geometry g = GetParam();
  const std::size_t pools = g.tokens / g.pool;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);

  const std::size_t phys_rows = g.ring ? g.ring : g.tokens;
  std::vector<float> rows(phys_rows * 2 * g.d), ape(g.pool * g.d);
  for (auto& v : rows) v = nd(rng);
  for (auto& v : ape) v = nd(rng);
  // With a ring only the last ring/pool pools are resident.
  const std::size_t first = g.ring ? pools - g.ring / g.pool : 0;
  const std::size_t count = pools - first;

  std::vector<float> cpu(pools * g.d);
  std::uint32_t poison_bits = 0x7fc0dead;
  float poison;
  std::memcpy(&poison, &poison_bits, sizeof(poison));
  std::fill(cpu.begin(), cpu.end(), poison);
  ASSERT_TRUE(BuildPoolKeysCpu({rows.data(), g.ring, ape.data(), cpu.data(), g.d, g.pool, first, count}).ok());

  DeviceBuffer<float> d_rows(rows.size()), d_ape(ape.size()), d_keys(pools * g.d);
  ASSERT_NE(d_rows.get(), nullptr);
  ASSERT_NE(d_keys.get(), nullptr);
  PC_CUDA_OK(d_rows.Upload(rows));
  PC_CUDA_OK(d_ape.Upload(ape));
  PC_CUDA_OK(d_keys.Upload(std::vector<float>(pools * g.d, poison)));
  ASSERT_TRUE(BuildPoolKeysCuda({d_rows.get(), g.ring, d_ape.get(), d_keys.get(), g.d, g.pool, first, count}, nullptr).ok());
  PC_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> gpu;
  PC_CUDA_OK(d_keys.Download(&gpu));

  double max_rel = 0;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const std::size_t p = i / g.d;
    if (p < first) {
      std::uint32_t bits;
      std::memcpy(&bits, &gpu[i], sizeof(bits));
      if (bits != poison_bits) ++mismatches;
      continue;
    }
    ASSERT_TRUE(std::isfinite(gpu[i])) << "element " << i << " not written";
    const double rel = std::abs(double(gpu[i]) - cpu[i]) / std::max(1.0, std::abs(double(cpu[i])));
    max_rel = std::max(max_rel, rel);
    if (rel > 1e-5) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u);
  std::printf("[ pool-keys ] d=%zu pool=%zu tokens=%zu ring=%zu: %zu keys, max rel err %.3g\n", g.d, g.pool,
              g.tokens, g.ring, count * g.d, max_rel);
}

INSTANTIATE_TEST_SUITE_P(Geometries, PoolKeysGpuTest,
                         ::testing::Values(Geometry{16, 4, 64, 0}, Geometry{128, 4, 32768, 0},
                                           Geometry{128, 4, 32768, 256}, Geometry{64, 8, 4096, 64},
                                           Geometry{128, 1, 1000, 0}, Geometry{7, 3, 999, 33}),
                         [](const auto& info) {
                           const Geometry& g = info.param;
                           return "d" + std::to_string(g.d) + "_pool" + std::to_string(g.pool) + "_tokens" +
                                  std::to_string(g.tokens) + (g.ring ? "_ring" + std::to_string(g.ring) : "_flat");
                         });

}  // namespace
}  // namespace primecache::kernels

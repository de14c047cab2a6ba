// The CUDA KV kernels held to their CPU twins on fresh random data: the
// TurboQuant encoder and the rotation bit for bit (the CUDA code rounds every
// step as the CPU does), the attention over f32 and TurboQuant rows in a
// rotating or flat cache, with and without a window, within 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/kv_attention.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels {
namespace {

using primecache::testing::DeviceBuffer;
using primecache::testing::ExpectCloseToCpu;

std::vector<float> Normal(std::mt19937& rng, std::size_t n, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<float> Signs(std::mt19937& rng, std::size_t n) {
  std::vector<float> s(n);
  for (auto& x : s) x = rng() % 2 ? 1.0f : -1.0f;
  return s;
}

TEST(TurboQuantGpuTest, EncodeAndRotationAreBitIdenticalToTheCpu) {
  PC_SKIP_WITHOUT_CUDA();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (std::uint32_t bits : {2u, 4u}) {
    for (std::size_t n : {16u, 64u, 128u, 256u}) {
      const std::size_t rows = 37, heads = 3, stride = heads * n + 5;
      std::vector<float> x = Normal(rng, rows * stride, 3.0f), signs = Signs(rng, n);
      for (std::size_t h = 0; h < heads; ++h) std::fill_n(x.begin() + 4 * stride + h * n, n, 0.0f);  // a zero row
      const std::size_t words = rows * heads * KvEntryWords(n, bits);
      std::vector<std::uint32_t> want(words);
      ASSERT_TRUE(TurboQuantEncodeCpu({x.data(), want.data(), signs.data(), rows, heads, n, stride, bits}).ok());
      DeviceBuffer<float> dx(x.size()), ds(n);
      DeviceBuffer<std::uint32_t> dout(words);
      PC_CUDA_OK(dx.Upload(x));
      PC_CUDA_OK(ds.Upload(signs));
      PC_CUDA_OK(cudaMemset(dout.get(), 0xAB, words * 4));
      ASSERT_TRUE(TurboQuantEncodeCuda({dx.get(), dout.get(), ds.get(), rows, heads, n, stride, bits}, nullptr).ok());
      std::vector<std::uint32_t> got;
      PC_CUDA_OK(dout.Download(&got));
      EXPECT_EQ(got, want) << "bits " << bits << " head_dim " << n;

      for (bool inverse : {false, true}) {
        std::vector<float> cpu = x;
        ASSERT_TRUE(HadamardRowsCpu({cpu.data(), signs.data(), rows, heads, n, stride, inverse}).ok());
        ASSERT_TRUE(HadamardRowsCuda({dx.get(), ds.get(), rows, heads, n, stride, inverse}, nullptr).ok());
        std::vector<float> gpu;
        PC_CUDA_OK(dx.Download(&gpu));
        EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * 4), 0) << "head_dim " << n << " inverse " << inverse;
        PC_CUDA_OK(dx.Upload(x));
      }
    }
  }
}

struct Geometry {
  std::size_t heads, kv_heads, head_dim, count, first_pos;
  std::uint64_t window;
  std::uint32_t bits;
};

class KvAttentionGpuTest : public ::testing::TestWithParam<Geometry> {};

TEST_P(KvAttentionGpuTest, MatchesCpuTwin) {
  PC_SKIP_WITHOUT_CUDA();
  const Geometry g = GetParam();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::size_t n = g.head_dim, words = g.kv_heads * KvEntryWords(n, g.bits);
  // A rotating cache of `window` rows, or a flat one of every cached position.
  const std::uint64_t cap = g.window == 0 ? std::max<std::uint64_t>(g.first_pos, 1) : g.window;
  std::vector<float> signs = Signs(rng, n);
  auto rows = [&](std::size_t count) {
    std::vector<float> f = Normal(rng, count * g.kv_heads * n);
    if (g.bits == 0) return f;
    std::vector<float> w(count * words);
    EXPECT_TRUE(TurboQuantEncodeCpu({f.data(), reinterpret_cast<std::uint32_t*>(w.data()), signs.data(), count,
                                     g.kv_heads, n, g.kv_heads * n, g.bits})
                    .ok());
    return w;
  };
  std::vector<float> ck = rows(cap), cv = rows(cap), nk = rows(g.count), nv = rows(g.count);
  std::vector<float> q = Normal(rng, g.count * g.heads * n), out(g.count * g.heads * n);
  KvAttentionArgs a;
  a.cache_rows = cap;
  a.count = g.count;
  a.first_pos = g.first_pos;
  a.heads = g.heads;
  a.kv_heads = g.kv_heads;
  a.head_dim = n;
  a.window = g.window;
  a.bits = g.bits;
  a.scale = 1.0f / std::sqrt(float(n));
  KvAttentionArgs c = a;
  c.q = q.data();
  c.cache_k = ck.data();
  c.cache_v = cv.data();
  c.new_k = nk.data();
  c.new_v = nv.data();
  c.out = out.data();
  ASSERT_TRUE(KvAttentionCpu(c).ok());

  DeviceBuffer<float> dq(q.size()), dck(ck.size()), dcv(cv.size()), dnk(nk.size()), dnv(nv.size()), dout(out.size());
  PC_CUDA_OK(dq.Upload(q));
  PC_CUDA_OK(dck.Upload(ck));
  PC_CUDA_OK(dcv.Upload(cv));
  PC_CUDA_OK(dnk.Upload(nk));
  PC_CUDA_OK(dnv.Upload(nv));
  PC_CUDA_OK(cudaMemset(dout.get(), 0xFF, out.size() * 4));  // NaN poison
  a.q = dq.get();
  a.cache_k = dck.get();
  a.cache_v = dcv.get();
  a.new_k = dnk.get();
  a.new_v = dnv.get();
  a.out = dout.get();
  ASSERT_TRUE(KvAttentionCuda(a, nullptr).ok());
  std::vector<float> got;
  PC_CUDA_OK(dout.Download(&got));
  ExpectCloseToCpu(got, out, "KV attention");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvAttentionGpuTest,
    ::testing::Values(Geometry{4, 2, 16, 7, 0, 0, 0}, Geometry{4, 2, 16, 7, 23, 0, 0}, Geometry{8, 2, 64, 33, 100, 16, 0},
                      Geometry{8, 8, 128, 5, 300, 64, 0}, Geometry{4, 1, 128, 9, 40, 1, 0},
                      Geometry{4, 2, 16, 7, 23, 0, 2}, Geometry{8, 2, 64, 33, 100, 16, 4},
                      Geometry{32, 8, 128, 17, 2000, 0, 4}, Geometry{32, 8, 128, 17, 2000, 512, 2},
                      Geometry{8, 2, 64, 70, 10, 30, 4}),
    [](const auto& info) {
      const Geometry& g = info.param;
      return "h" + std::to_string(g.heads) + "_kv" + std::to_string(g.kv_heads) + "_d" + std::to_string(g.head_dim) +
             "_n" + std::to_string(g.count) + "_at" + std::to_string(g.first_pos) + "_w" + std::to_string(g.window) +
             "_b" + std::to_string(g.bits);
    });

}  // namespace
}  // namespace primecache::kernels

// Every small model op on CUDA held to its CPU twin on fresh random data,
// with poisoned outputs and every element checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/model_ops.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels {
namespace {

using primecache::testing::DeviceBuffer;

class ModelOpsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  std::vector<float> Random(std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng_);
    return v;
  }
  // Uploads v into a fresh device buffer.
  std::unique_ptr<DeviceBuffer<float>> Dev(const std::vector<float>& v) {
    auto b = std::make_unique<DeviceBuffer<float>>(v.size());
    EXPECT_EQ(b->Upload(v), cudaSuccess);
    return b;
  }
  std::unique_ptr<DeviceBuffer<float>> Poisoned(std::size_t n) {
    auto b = std::make_unique<DeviceBuffer<float>>(n);
    EXPECT_EQ(cudaMemset(b->get(), 0xff, n * sizeof(float)), cudaSuccess);
    return b;
  }
  void Expect(const DeviceBuffer<float>& got, const std::vector<float>& want, const char* what,
              double tol = 1e-5) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> g;
    ASSERT_EQ(got.Download(&g), cudaSuccess);
    ASSERT_EQ(g.size(), want.size());
    double worst = 0;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      double rel = std::abs(double(g[i]) - want[i]) / std::max(1.0, std::abs(double(want[i])));
      if (!(rel <= tol)) ++bad;
      if (std::isfinite(rel)) worst = std::max(worst, rel);
    }
    EXPECT_EQ(bad, 0u) << what << " (seed " << seed_ << ")";
    std::printf("[ model-ops ] %-12s %8zu values, max rel err %.3g\n", what, want.size(), worst);
  }
  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(ModelOpsGpuTest, RmsNormRows) {
  PC_SKIP_WITHOUT_CUDA();
  const std::size_t rows = 37, n = 300, stride = 310;
  auto x = Random(rows * stride, 3.0f), w = Random(n);
  std::vector<float> want(rows * n);
  ASSERT_TRUE(RmsNormRowsCpu({x.data(), want.data(), w.data(), rows, n, stride, n, 1e-6f}).ok());
  auto dx = Dev(x), dw = Dev(w);
  auto dy = Poisoned(rows * n);
  ASSERT_TRUE(RmsNormRowsCuda({dx->get(), dy->get(), dw->get(), rows, n, stride, n, 1e-6f}, nullptr).ok());
  Expect(*dy, want, "rmsnorm");
}

TEST_F(ModelOpsGpuTest, L2NormRows) {
  PC_SKIP_WITHOUT_CUDA();
  // Two of every three heads of each token, as the KDA mixer normalises q and k.
  const std::size_t T = 21, heads = 8, d = 128;
  auto x = Random(T * 3 * heads * d);
  auto dx = Dev(x);
  L2NormArgs a{x.data(), T, 2 * heads, d, 3 * heads * d};
  ASSERT_TRUE(L2NormRowsCpu(a).ok());
  a.x = dx->get();
  ASSERT_TRUE(L2NormRowsCuda(a, nullptr).ok());
  Expect(*dx, x, "l2norm");
}

TEST_F(ModelOpsGpuTest, RopeOnStridedHeadsAtLargePositions) {
  PC_SKIP_WITHOUT_CUDA();
  const std::size_t T = 19, G = 5, dn = 16, dr = 64;
  auto v = Random(T * G * (dn + dr));
  auto dv = Dev(v);
  RopeArgs a{v.data(), T, G, G * (dn + dr), dn + dr, dn, dr, 131000, 10000.0f};
  ASSERT_TRUE(RopeCpu(a).ok());
  a.v = dv->get();
  ASSERT_TRUE(RopeCuda(a, nullptr).ok());
  Expect(*dv, v, "rope");
}

TEST_F(ModelOpsGpuTest, SiluMulAddGather) {
  PC_SKIP_WITHOUT_CUDA();
  const std::size_t n = 10007;
  auto a = Random(n, 4.0f), b = Random(n);
  auto da = Dev(a), db = Dev(b);
  ASSERT_TRUE(SiluMulCpu(a.data(), b.data(), n).ok());
  ASSERT_TRUE(SiluMulCuda(da->get(), db->get(), n, nullptr).ok());
  Expect(*da, a, "silu-mul");
  ASSERT_EQ(da->Upload(a), cudaSuccess);  // the same inputs on both sides: add must be exact
  ASSERT_TRUE(AddCpu(a.data(), b.data(), n).ok());
  ASSERT_TRUE(AddCuda(da->get(), db->get(), n, nullptr).ok());
  Expect(*da, a, "add", 0.0);
  const std::size_t vocab = 300, H = 64;
  auto table = Random(vocab * H);
  std::vector<std::uint32_t> tokens = {256, 0, 299, 65, 65};
  std::vector<float> want(tokens.size() * H);
  ASSERT_TRUE(GatherRowsCpu(table.data(), vocab, H, tokens.data(), tokens.size(), want.data()).ok());
  auto dt = Dev(table);
  DeviceBuffer<std::uint32_t> dtok(tokens.size());
  ASSERT_EQ(dtok.Upload(tokens), cudaSuccess);
  auto dx = Poisoned(want.size());
  ASSERT_TRUE(GatherRowsCuda(dt->get(), vocab, H, dtok.get(), tokens.size(), dx->get(), nullptr).ok());
  Expect(*dx, want, "gather", 0.0);
}

TEST_F(ModelOpsGpuTest, KdaConvAndOutput) {
  PC_SKIP_WITHOUT_CUDA();
  const std::size_t T = 50, C = 3 * 4 * 32, K = 4, heads = 12, d = 32;
  auto in = Random(T * C), taps = Random(C * K), ring = Random(C * (K - 1));
  std::vector<float> want(T * C);
  ASSERT_TRUE(KdaConvCpu({in.data(), taps.data(), ring.data(), want.data(), C, K, T}).ok());
  auto din = Dev(in), dtaps = Dev(taps), dring = Dev(ring);
  auto dout = Poisoned(T * C);
  ASSERT_TRUE(KdaConvCuda({din->get(), dtaps->get(), dring->get(), dout->get(), C, K, T}, nullptr).ok());
  Expect(*dout, want, "kda-conv");
  auto o = Random(T * heads * d), gate = Random(T * heads * d), w = Random(d);
  auto dob = Dev(o), dg = Dev(gate), dw = Dev(w);
  ASSERT_TRUE(KdaOutputCpu(o.data(), gate.data(), w.data(), T, heads, d, 1e-6f).ok());
  ASSERT_TRUE(KdaOutputCuda(dob->get(), dg->get(), dw->get(), T, heads, d, 1e-6f, nullptr).ok());
  Expect(*dob, o, "kda-output");
}

TEST_F(ModelOpsGpuTest, MlaRowsIntoAStridedPlane) {
  PC_SKIP_WITHOUT_CUDA();
  const std::size_t T = 33, r = 512, dr = 64, width = r + dr;
  auto a = Random(T * width, 2.0f), w = Random(r);
  std::vector<float> want(T * width);
  ASSERT_TRUE(MlaRowsCpu({a.data(), w.data(), want.data(), T, r, dr, width, 32760, 1e-6f, 10000.0f}).ok());
  auto da = Dev(a), dw = Dev(w);
  auto drows = Poisoned(T * width);
  ASSERT_TRUE(
      MlaRowsCuda({da->get(), dw->get(), drows->get(), T, r, dr, width, 32760, 1e-6f, 10000.0f}, nullptr)
          .ok());
  Expect(*drows, want, "mla-rows");
}

// Both layouts of W, several operands, strided rows over more than one pass
// of the kernel, with aligned rows (vector loads), unaligned rows and a width
// that is not a multiple of four: the CUDA product agrees with its CPU twin,
// and every row is bit-identical to the same row computed by a call of that
// row alone.
TEST_F(ModelOpsGpuTest, RowsGemmMatchesTheCpuAndEachRowAlone) {
  PC_SKIP_WITHOUT_CUDA();
  struct Shape {
    std::size_t in, pad;
  };
  for (bool transposed : {false, true})
    for (Shape shape : {Shape{300, 0}, Shape{300, 5}, Shape{301, 0}}) {
      SCOPED_TRACE(std::string(transposed ? "W^T" : "W") + " in " + std::to_string(shape.in) + " pad " +
                   std::to_string(shape.pad));
      const std::size_t batch = 3, rows = 13, in = shape.in, out = 70, ldx = batch * in + shape.pad,
                        ldy = batch * out;
      auto x = Random(rows * ldx), w = Random(batch * in * out);
      RowsGemmArgs a;
      a.ldx = ldx;
      a.ldy = ldy;
      a.rows = rows;
      a.in = in;
      a.out = out;
      a.batch = batch;
      a.x_batch = in;
      a.w_batch = in * out;
      a.y_batch = out;
      a.w_transposed = transposed;
      std::vector<float> want(rows * ldy);
      a.x = x.data();
      a.w = w.data();
      a.y = want.data();
      ASSERT_TRUE(RowsGemmCpu(a).ok());
      auto dx = Dev(x), dw = Dev(w);
      auto dy = Poisoned(rows * ldy), alone = Poisoned(rows * ldy);
      a.x = dx->get();
      a.w = dw->get();
      a.y = dy->get();
      ASSERT_TRUE(RowsGemmCuda(a, nullptr).ok());
      Expect(*dy, want, transposed ? "gemm W^T" : "gemm", 1e-4);
      for (std::size_t r = 0; r < rows; ++r) {
        RowsGemmArgs one = a;
        one.rows = 1;
        one.x = dx->get() + r * ldx;
        one.y = alone->get() + r * ldy;
        ASSERT_TRUE(RowsGemmCuda(one, nullptr).ok());
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> together, single;
      ASSERT_EQ(dy->Download(&together), cudaSuccess);
      ASSERT_EQ(alone->Download(&single), cudaSuccess);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t b = 0; b < batch; ++b)
          for (std::size_t o = 0; o < out; ++o) {
            const std::size_t i = r * ldy + b * out + o;
            ASSERT_EQ(std::memcmp(&together[i], &single[i], sizeof(float)), 0)
                << "row " << r << " operand " << b << " output " << o << (transposed ? " (W^T)" : "");
          }
    }
}

TEST_F(ModelOpsGpuTest, ArgmaxWithTies) {
  PC_SKIP_WITHOUT_CUDA();
  const std::size_t rows = 9, n = 1000;
  auto x = Random(rows * n);
  x[3 * n + 10] = x[3 * n + 900] = 100.0f;  // a tie: the lower index wins
  std::vector<std::uint32_t> want(rows), got;
  ASSERT_TRUE(ArgmaxRowsCpu(x.data(), rows, n, want.data()).ok());
  EXPECT_EQ(want[3], 10u);
  auto dx = Dev(x);
  DeviceBuffer<std::uint32_t> dout(rows);
  ASSERT_TRUE(ArgmaxRowsCuda(dx->get(), rows, n, dout.get(), nullptr).ok());
  ASSERT_EQ(dout.Download(&got), cudaSuccess);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace primecache::kernels

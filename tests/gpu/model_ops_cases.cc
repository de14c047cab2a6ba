// The model's small ops: norms, RoPE on strided heads at large positions,
// the elementwise ops (add and gather bit for bit), the KDA conv and output,
// MLA rows into a strided plane, the row-invariant products (both layouts of
// W, aligned, unaligned and odd widths) and argmax with a tie. Besides the
// table, RowsGemm's every row must equal, bit for bit, a call of that row
// alone (KernelGpuTest.RowsGemmRowsAreBitIdenticalToOneRowCalls).
#include <cmath>
#include <cstring>

#include "kernels/model_ops.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

// Within 1e-5 per element: the ops that compute each element as the twin does.
const Tolerance kElementwise = Tolerance::Close(1e-5);

KernelCase Case(std::string name, std::function<std::vector<Tensor>(std::mt19937&)> build,
                std::function<Status(const Buffers&)> run) {
  KernelCase c;
  c.name = std::move(name);
  c.build = std::move(build);
  c.run = std::move(run);
  return c;
}

KernelCase RmsNormCase() {
  constexpr std::size_t rows = 37, n = 300, stride = 310;
  return Case(
      "rmsnorm_rows_strided",
      [](std::mt19937& rng) {
        return std::vector<Tensor>{Input("x", Normal(rng, rows * stride, 3.0f)), Input("w", Normal(rng, n)),
                                   Output("y", rows * n, kElementwise)};
      },
      [](const Buffers& b) {
        return OnBackend(b, RmsNormRowsCpu, RmsNormRowsCuda,
                         RmsNormArgs{b.f("x"), b.f("y"), b.f("w"), rows, n, stride, n, 1e-6f});
      });
}

// Two of every three heads of each token, as the KDA mixer normalises q and k.
KernelCase L2NormCase() {
  constexpr std::size_t T = 21, heads = 8, d = 128;
  return Case(
      "l2norm_two_of_three_heads",
      [](std::mt19937& rng) { return std::vector<Tensor>{InOut("x", Normal(rng, T * 3 * heads * d), kElementwise)}; },
      [](const Buffers& b) {
        return OnBackend(b, L2NormRowsCpu, L2NormRowsCuda, L2NormArgs{b.f("x"), T, 2 * heads, d, 3 * heads * d});
      });
}

KernelCase RopeCase() {
  constexpr std::size_t T = 19, G = 5, dn = 16, dr = 64;
  return Case(
      "rope_strided_heads_at_131000",
      [](std::mt19937& rng) { return std::vector<Tensor>{InOut("v", Normal(rng, T * G * (dn + dr)), kElementwise)}; },
      [](const Buffers& b) {
        return OnBackend(b, RopeCpu, RopeCuda, RopeArgs{b.f("v"), T, G, G * (dn + dr), dn + dr, dn, dr, 131000, 10000.0f});
      });
}

constexpr std::size_t kElementwiseN = 10007;

KernelCase SiluMulCase() {
  return Case(
      "silu_mul",
      [](std::mt19937& rng) {
        return std::vector<Tensor>{InOut("a", Normal(rng, kElementwiseN, 4.0f), kElementwise),
                                   Input("b", Normal(rng, kElementwiseN))};
      },
      [](const Buffers& b) {
        return b.cuda() ? SiluMulCuda(b.f("a"), b.f("b"), kElementwiseN, nullptr)
                        : SiluMulCpu(b.f("a"), b.f("b"), kElementwiseN);
      });
}

KernelCase AddCase() {
  return Case(
      "add",
      [](std::mt19937& rng) {
        return std::vector<Tensor>{InOut("x", Normal(rng, kElementwiseN, 4.0f), Tolerance::Bitwise()),
                                   Input("y", Normal(rng, kElementwiseN))};
      },
      [](const Buffers& b) {
        return b.cuda() ? AddCuda(b.f("x"), b.f("y"), kElementwiseN, nullptr) : AddCpu(b.f("x"), b.f("y"), kElementwiseN);
      });
}

// Rows of a table by token, a repeated token and the first and last rows included.
KernelCase GatherCase() {
  constexpr std::size_t vocab = 300, H = 64;
  static const std::vector<std::uint32_t> kTokens = {256, 0, 299, 65, 65};
  return Case(
      "gather_rows",
      [](std::mt19937& rng) {
        return std::vector<Tensor>{Input("table", Normal(rng, vocab * H)), Input("tokens", kTokens),
                                   Output("x", kTokens.size() * H, Tolerance::Bitwise())};
      },
      [](const Buffers& b) {
        return b.cuda() ? GatherRowsCuda(b.f("table"), vocab, H, b.u("tokens"), kTokens.size(), b.f("x"), nullptr)
                        : GatherRowsCpu(b.f("table"), vocab, H, b.u("tokens"), kTokens.size(), b.f("x"));
      });
}

KernelCase KdaConvCase() {
  constexpr std::size_t T = 50, C = 3 * 4 * 32, K = 4;
  return Case(
      "kda_conv",
      [](std::mt19937& rng) {
        return std::vector<Tensor>{Input("in", Normal(rng, T * C)), Input("taps", Normal(rng, C * K)),
                                   Input("ring", Normal(rng, C * (K - 1))), Output("out", T * C, kElementwise)};
      },
      [](const Buffers& b) {
        return OnBackend(b, KdaConvCpu, KdaConvCuda, KdaConvArgs{b.f("in"), b.f("taps"), b.f("ring"), b.f("out"), C, K, T});
      });
}

KernelCase KdaOutputCase() {
  constexpr std::size_t T = 50, heads = 12, d = 32;
  return Case(
      "kda_output",
      [](std::mt19937& rng) {
        return std::vector<Tensor>{InOut("o", Normal(rng, T * heads * d), kElementwise),
                                   Input("gate", Normal(rng, T * heads * d)), Input("w", Normal(rng, d))};
      },
      [](const Buffers& b) {
        return b.cuda() ? KdaOutputCuda(b.f("o"), b.f("gate"), b.f("w"), T, heads, d, 1e-6f, nullptr)
                        : KdaOutputCpu(b.f("o"), b.f("gate"), b.f("w"), T, heads, d, 1e-6f);
      });
}

KernelCase MlaRowsCase() {
  constexpr std::size_t T = 33, r = 512, dr = 64, width = r + dr;
  return Case(
      "mla_rows_into_a_strided_plane",
      [](std::mt19937& rng) {
        return std::vector<Tensor>{Input("a", Normal(rng, T * width, 2.0f)), Input("w", Normal(rng, r)),
                                   Output("rows", T * width, kElementwise)};
      },
      [](const Buffers& b) {
        return OnBackend(b, MlaRowsCpu, MlaRowsCuda,
                         MlaRowsArgs{b.f("a"), b.f("w"), b.f("rows"), T, r, dr, width, 32760, 1e-6f, 10000.0f});
      });
}

// A product of 3 operands over 13 strided rows (more than one pass of the
// kernel): `in` 300 with aligned rows (vector loads), 300 padded by 5
// (unaligned rows) or 301 (not a multiple of four).
struct GemmShape {
  std::size_t in, pad;
  bool transposed;
};

RowsGemmArgs GemmArgs(const GemmShape& s) {
  RowsGemmArgs a;
  a.batch = 3;
  a.rows = 13;
  a.in = s.in;
  a.out = 70;
  a.ldx = a.batch * a.in + s.pad;
  a.ldy = a.batch * a.out;
  a.x_batch = a.in;
  a.w_batch = a.in * a.out;
  a.y_batch = a.out;
  a.w_transposed = s.transposed;
  return a;
}

std::string GemmName(const GemmShape& s) {
  return std::string(s.transposed ? "rows_gemm_wt_in" : "rows_gemm_w_in") + std::to_string(s.in) + "_pad" +
         std::to_string(s.pad);
}

constexpr GemmShape kGemmShapes[] = {{300, 0, false}, {300, 5, false}, {301, 0, false},
                                     {300, 0, true},  {300, 5, true},  {301, 0, true}};

KernelCase RowsGemmCase(GemmShape s) {
  const RowsGemmArgs shape = GemmArgs(s);
  return Case(
      GemmName(s),
      [shape](std::mt19937& rng) {
        return std::vector<Tensor>{Input("x", Normal(rng, shape.rows * shape.ldx)),
                                   Input("w", Normal(rng, shape.batch * shape.in * shape.out)),
                                   Output("y", shape.rows * shape.ldy, Tolerance::Close(1e-4))};
      },
      [shape](const Buffers& b) {
        RowsGemmArgs a = shape;
        a.x = b.f("x");
        a.w = b.f("w");
        a.y = b.f("y");
        return OnBackend(b, RowsGemmCpu, RowsGemmCuda, a);
      });
}

// A tie in row 3 (indices 10 and 900): the lower index wins, on both sides.
KernelCase ArgmaxCase() {
  constexpr std::size_t rows = 9, n = 1000;
  KernelCase c = Case(
      "argmax_rows_with_a_tie",
      [](std::mt19937& rng) {
        std::vector<float> x = Normal(rng, rows * n);
        x[3 * n + 10] = x[3 * n + 900] = 100.0f;
        return std::vector<Tensor>{Input("x", std::move(x)), WordOutput("argmax", rows)};
      },
      [](const Buffers& b) {
        return b.cuda() ? ArgmaxRowsCuda(b.f("x"), rows, n, b.u("argmax"), nullptr)
                        : ArgmaxRowsCpu(b.f("x"), rows, n, b.u("argmax"));
      });
  c.check_twin = [](const std::vector<Tensor>& cpu) { EXPECT_EQ(Named(cpu, "argmax").u[3], 10u); };
  return c;
}

}  // namespace

std::vector<KernelCase> ModelOpsCases() {
  std::vector<KernelCase> out = {RmsNormCase(), L2NormCase(),    RopeCase(),      SiluMulCase(), AddCase(),
                                 GatherCase(),  KdaConvCase(),   KdaOutputCase(), MlaRowsCase(), ArgmaxCase()};
  for (const GemmShape& s : kGemmShapes) out.push_back(RowsGemmCase(s));
  return out;
}

// Every row of a many-row CUDA product is bit for bit the same row computed
// by a call of that row alone (what makes a verify round's rows equal
// one-token decode calls); the table holds the products to the CPU.
TEST_F(KernelGpuTest, RowsGemmRowsAreBitIdenticalToOneRowCalls) {
  using primecache::testing::DeviceBuffer;
  std::mt19937 rng(seed_);
  for (const GemmShape& s : kGemmShapes) {
    SCOPED_TRACE(GemmName(s));
    RowsGemmArgs a = GemmArgs(s);
    const std::vector<float> x = Normal(rng, a.rows * a.ldx), w = Normal(rng, a.batch * a.in * a.out);
    DeviceBuffer<float> dx(x.size()), dw(w.size()), together(a.rows * a.ldy), alone(a.rows * a.ldy);
    PC_CUDA_OK(dx.Upload(x));
    PC_CUDA_OK(dw.Upload(w));
    PC_CUDA_OK(cudaMemset(together.get(), 0xff, together.size() * sizeof(float)));
    PC_CUDA_OK(cudaMemset(alone.get(), 0xff, alone.size() * sizeof(float)));
    a.x = dx.get();
    a.w = dw.get();
    a.y = together.get();
    ASSERT_TRUE(RowsGemmCuda(a, nullptr).ok());
    for (std::size_t r = 0; r < a.rows; ++r) {
      RowsGemmArgs one = a;
      one.rows = 1;
      one.x = dx.get() + r * a.ldx;
      one.y = alone.get() + r * a.ldy;
      ASSERT_TRUE(RowsGemmCuda(one, nullptr).ok());
    }
    PC_CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> all, single;
    PC_CUDA_OK(together.Download(&all));
    PC_CUDA_OK(alone.Download(&single));
    for (std::size_t r = 0; r < a.rows; ++r)
      for (std::size_t b = 0; b < a.batch; ++b)
        for (std::size_t o = 0; o < a.out; ++o) {
          const std::size_t i = r * a.ldy + b * a.out + o;
          ASSERT_TRUE(std::isfinite(all[i])) << "row " << r << " operand " << b << " output " << o << " unwritten";
          ASSERT_EQ(std::memcmp(&all[i], &single[i], sizeof(float)), 0)
              << "row " << r << " operand " << b << " output " << o;
        }
  }
}

}  // namespace primecache::kernels::gpu_cases

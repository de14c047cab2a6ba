// The KV kernels: the TurboQuant encoder and the Hadamard rotation bit for
// bit (the CUDA code rounds every step as the CPU does; a zero row included),
// and attention over f32 or TurboQuant rows in a flat or rotating cache, with
// and without a window, within the reordered tolerance.
#include <algorithm>
#include <cmath>

#include "kernels/kv_attention.h"
#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

// 37 rows of 3 heads, 5 floats of padding after each row, row 4 all zeros.
constexpr std::size_t kRows = 37, kHeads = 3;

std::size_t RowStride(std::size_t n) { return kHeads * n + 5; }

std::vector<float> RowsWithAZeroRow(std::mt19937& rng, std::size_t n) {
  std::vector<float> x = Normal(rng, kRows * RowStride(n), 3.0f);
  std::fill_n(x.begin() + 4 * RowStride(n), kHeads * n, 0.0f);
  return x;
}

KernelCase TurboQuantEncodeCase(std::uint32_t bits, std::size_t n) {
  KernelCase c;
  c.name = "turboquant_encode_b" + std::to_string(bits) + "_d" + std::to_string(n);
  c.build = [bits, n](std::mt19937& rng) {
    return std::vector<Tensor>{Input("x", RowsWithAZeroRow(rng, n)), Input("signs", Signs(rng, n)),
                               WordOutput("codes", kRows * kHeads * KvEntryWords(n, bits))};
  };
  c.run = [bits, n](const Buffers& b) {
    const TurboQuantEncodeArgs a{b.f("x"), b.u("codes"), b.f("signs"), kRows, kHeads, n, RowStride(n), bits};
    return OnBackend(b, TurboQuantEncodeCpu, TurboQuantEncodeCuda, a);
  };
  return c;
}

KernelCase HadamardCase(std::size_t n, bool inverse) {
  KernelCase c;
  c.name = std::string(inverse ? "hadamard_inverse_d" : "hadamard_d") + std::to_string(n);
  c.build = [n](std::mt19937& rng) {
    return std::vector<Tensor>{InOut("x", RowsWithAZeroRow(rng, n), Tolerance::Bitwise()),
                               Input("signs", Signs(rng, n))};
  };
  c.run = [n, inverse](const Buffers& b) {
    const HadamardArgs a{b.f("x"), b.f("signs"), kRows, kHeads, n, RowStride(n), inverse};
    return OnBackend(b, HadamardRowsCpu, HadamardRowsCuda, a);
  };
  return c;
}

struct Geometry {
  std::size_t heads, kv_heads, head_dim, count, first_pos;
  std::uint64_t window;
  std::uint32_t bits;
};

// `count` rows of keys or values: f32, or TurboQuant words encoded by the twin.
Tensor KvRows(std::string name, const Geometry& g, std::size_t count, const std::vector<float>& signs,
              std::mt19937& rng) {
  const std::size_t n = g.head_dim;
  std::vector<float> f = Normal(rng, count * g.kv_heads * n);
  if (g.bits == 0) return Input(std::move(name), std::move(f));
  std::vector<std::uint32_t> w(count * g.kv_heads * KvEntryWords(n, g.bits));
  EXPECT_TRUE(
      TurboQuantEncodeCpu({f.data(), w.data(), signs.data(), count, g.kv_heads, n, g.kv_heads * n, g.bits}).ok());
  return Input(std::move(name), std::move(w));
}

KernelCase KvAttentionCase(Geometry g) {
  // A rotating cache of `window` rows, or a flat one of every cached position.
  const std::uint64_t cap = g.window == 0 ? std::max<std::uint64_t>(g.first_pos, 1) : g.window;
  KernelCase c;
  c.name = "kv_attention_h" + std::to_string(g.heads) + "_kv" + std::to_string(g.kv_heads) + "_d" +
           std::to_string(g.head_dim) + "_n" + std::to_string(g.count) + "_at" + std::to_string(g.first_pos) + "_w" +
           std::to_string(g.window) + "_b" + std::to_string(g.bits);
  c.build = [g, cap](std::mt19937& rng) {
    const std::vector<float> signs = Signs(rng, g.head_dim);
    std::vector<Tensor> t;
    t.push_back(KvRows("cache_k", g, cap, signs, rng));
    t.push_back(KvRows("cache_v", g, cap, signs, rng));
    t.push_back(KvRows("new_k", g, g.count, signs, rng));
    t.push_back(KvRows("new_v", g, g.count, signs, rng));
    t.push_back(Input("q", Normal(rng, g.count * g.heads * g.head_dim)));
    t.push_back(Output("out", g.count * g.heads * g.head_dim, Reordered()));
    return t;
  };
  c.run = [g, cap](const Buffers& b) {
    KvAttentionArgs a;
    a.q = b.f("q");
    a.cache_k = b.get("cache_k");
    a.cache_v = b.get("cache_v");
    a.new_k = b.get("new_k");
    a.new_v = b.get("new_v");
    a.out = b.f("out");
    a.cache_rows = cap;
    a.count = g.count;
    a.first_pos = g.first_pos;
    a.heads = g.heads;
    a.kv_heads = g.kv_heads;
    a.head_dim = g.head_dim;
    a.window = g.window;
    a.bits = g.bits;
    a.scale = 1.0f / std::sqrt(float(g.head_dim));
    return OnBackend(b, KvAttentionCpu, KvAttentionCuda, a);
  };
  return c;
}

}  // namespace

std::vector<KernelCase> KvAttentionCases() {
  std::vector<KernelCase> out;
  for (std::size_t n : {16u, 64u, 128u, 256u}) {
    for (std::uint32_t bits : {2u, 4u}) out.push_back(TurboQuantEncodeCase(bits, n));
    for (bool inverse : {false, true}) out.push_back(HadamardCase(n, inverse));
  }
  for (Geometry g : {Geometry{4, 2, 16, 7, 0, 0, 0}, Geometry{4, 2, 16, 7, 23, 0, 0}, Geometry{8, 2, 64, 33, 100, 16, 0},
                     Geometry{8, 8, 128, 5, 300, 64, 0}, Geometry{4, 1, 128, 9, 40, 1, 0},
                     Geometry{4, 2, 16, 7, 23, 0, 2}, Geometry{8, 2, 64, 33, 100, 16, 4},
                     Geometry{32, 8, 128, 17, 2000, 0, 4}, Geometry{32, 8, 128, 17, 2000, 512, 2},
                     Geometry{8, 2, 64, 70, 10, 30, 4}}) {
    out.push_back(KvAttentionCase(g));
  }
  return out;
}

}  // namespace primecache::kernels::gpu_cases

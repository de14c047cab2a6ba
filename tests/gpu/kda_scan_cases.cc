// The KDA scan: every output and every state element within the reordered
// tolerance of the twin's.
#include <cmath>

#include "kernels/kda_scan.h"
#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

struct Geometry {
  std::size_t heads, d, count;
};

// Each head's vector to unit length, as the mixer hands q and k to the scan.
std::vector<float> Normalized(std::vector<float> x, std::size_t d) {
  for (std::size_t o = 0; o < x.size(); o += d) {
    float ss = 0;
    for (std::size_t i = 0; i < d; ++i) ss += x[o + i] * x[o + i];
    for (std::size_t i = 0; i < d; ++i) x[o + i] /= std::sqrt(ss + 1e-6f);
  }
  return x;
}

KernelCase KdaScanCase(Geometry g) {
  KernelCase c;
  c.name = "kda_scan_h" + std::to_string(g.heads) + "_d" + std::to_string(g.d) + "_t" + std::to_string(g.count);
  c.build = [g](std::mt19937& rng) {
    const std::size_t n = g.count * g.heads * g.d;
    return std::vector<Tensor>{Input("q", Normalized(Normal(rng, n), g.d)),
                               Input("k", Normalized(Normal(rng, n), g.d)),
                               Input("v", Normal(rng, n)),
                               Input("gate", Normal(rng, n)),
                               Input("beta", Normal(rng, g.count * g.heads)),
                               InOut("state", Normal(rng, g.heads * g.d * g.d), Reordered()),
                               Output("out", n, Reordered())};
  };
  c.run = [g](const Buffers& b) {
    const KdaScanArgs a{b.f("q"), b.f("k"), b.f("v"), b.f("gate"), b.f("beta"), b.f("state"), b.f("out"),
                        g.heads, g.d, g.count, -5.0f};
    return OnBackend(b, KdaScanCpu, KdaScanCuda, a);
  };
  return c;
}

}  // namespace

std::vector<KernelCase> KdaScanCases() {
  std::vector<KernelCase> out;
  for (Geometry g : {Geometry{1, 16, 1}, Geometry{4, 16, 37}, Geometry{3, 40, 100}, Geometry{64, 128, 1},
                     Geometry{64, 128, 2048}}) {
    out.push_back(KdaScanCase(g));
  }
  return out;
}

}  // namespace primecache::kernels::gpu_cases

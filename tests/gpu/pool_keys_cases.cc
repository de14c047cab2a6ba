// The pool-key build: every written key within 1e-5 of the twin's, and the
// keys of the pools before a ring's first resident one left untouched.
#include "kernels/pool_keys.h"
#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

struct Geometry {
  std::size_t d, pool, tokens, ring;  // ring 0: flat
};

KernelCase PoolKeysCase(Geometry g) {
  const std::size_t pools = g.tokens / g.pool;
  // With a ring only the last ring/pool pools are resident.
  const std::size_t first = g.ring ? pools - g.ring / g.pool : 0;
  KernelCase c;
  c.name = "pool_keys_d" + std::to_string(g.d) + "_pool" + std::to_string(g.pool) + "_tokens" +
           std::to_string(g.tokens) + (g.ring ? "_ring" + std::to_string(g.ring) : "_flat");
  c.build = [g, pools, first](std::mt19937& rng) {
    const std::size_t phys_rows = g.ring ? g.ring : g.tokens;
    Tensor keys = Output("keys", pools * g.d, Tolerance::Close(1e-5));
    keys.untouched_end = first * g.d;
    return std::vector<Tensor>{Input("rows", Normal(rng, phys_rows * 2 * g.d, 3.0f)),
                               Input("ape", Normal(rng, g.pool * g.d, 3.0f)), keys};
  };
  c.run = [g, pools, first](const Buffers& b) {
    const PoolKeyArgs a{b.f("rows"), g.ring, b.f("ape"), b.f("keys"), g.d, g.pool, first, pools - first};
    return OnBackend(b, BuildPoolKeysCpu, BuildPoolKeysCuda, a);
  };
  return c;
}

}  // namespace

std::vector<KernelCase> PoolKeysCases() {
  std::vector<KernelCase> out;
  for (Geometry g : {Geometry{16, 4, 64, 0}, Geometry{128, 4, 32768, 0}, Geometry{128, 4, 32768, 256},
                     Geometry{64, 8, 4096, 64}, Geometry{128, 1, 1000, 0}, Geometry{7, 3, 999, 33}}) {
    out.push_back(PoolKeysCase(g));
  }
  return out;
}

}  // namespace primecache::kernels::gpu_cases

// The indexer's top-k selection: the kernel scores pools exactly as the twin
// does, so each query's count and selected pools are identical, a run of
// tied keys included (the lower pool wins a tie).
#include <algorithm>

#include "kernels/indexer_select.h"
#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

struct Geometry {
  std::size_t heads, head_dim, pool, topk, count, first_pos;
};

IndexerSelectArgs ArgsOf(const Geometry& g) {
  IndexerSelectArgs a;
  a.count = g.count;
  a.first_pos = g.first_pos;
  a.heads = g.heads;
  a.head_dim = g.head_dim;
  a.pool = g.pool;
  a.topk = g.topk;
  return a;
}

KernelCase IndexerSelectCase(Geometry g) {
  const std::size_t pools = (g.first_pos + g.count) / g.pool;
  KernelCase c;
  c.name = "indexer_select_h" + std::to_string(g.heads) + "_d" + std::to_string(g.head_dim) + "_pool" +
           std::to_string(g.pool) + "_top" + std::to_string(g.topk) + "_at" + std::to_string(g.first_pos);
  c.build = [g, pools](std::mt19937& rng) {
    std::vector<float> keys = Normal(rng, std::max<std::size_t>(pools, 1) * g.head_dim);
    // A run of exact ties, to exercise the lower-pool rule.
    for (std::size_t p = 3; p < std::min<std::size_t>(pools, 40); ++p)
      std::copy_n(keys.begin() + 2 * g.head_dim, g.head_dim, keys.begin() + p * g.head_dim);
    return std::vector<Tensor>{Input("qi", Normal(rng, g.count * g.heads * g.head_dim)),
                               Input("wt", Normal(rng, g.count * g.heads)), Input("keys", std::move(keys)),
                               WordOutput("selected", g.count * g.topk), WordOutput("selected_count", g.count),
                               Scratch("scratch", IndexerSelectScratchBytes(ArgsOf(g)))};
  };
  c.run = [g](const Buffers& b) {
    IndexerSelectArgs a = ArgsOf(g);
    a.qi = b.f("qi");
    a.wt = b.f("wt");
    a.keys = b.f("keys");
    a.selected = b.u("selected");
    a.selected_count = b.u("selected_count");
    a.scratch = b.get("scratch");
    return OnBackend(b, IndexerSelectCpu, IndexerSelectCuda, a);
  };
  // Past its count, a query's row of `selected` is unspecified.
  c.blank_unspecified = [g](std::vector<Tensor>& r) {
    std::vector<std::uint32_t>& sel = Named(r, "selected").u;
    const std::vector<std::uint32_t>& count = Named(r, "selected_count").u;
    for (std::size_t i = 0; i < g.count; ++i)
      for (std::size_t k = std::min<std::size_t>(count[i], g.topk); k < g.topk; ++k) sel[i * g.topk + k] = 0;
  };
  return c;
}

}  // namespace

std::vector<KernelCase> IndexerSelectCases() {
  std::vector<KernelCase> out;
  for (Geometry g : {Geometry{1, 1, 2, 3, 20, 0}, Geometry{2, 16, 4, 4, 64, 100}, Geometry{8, 128, 4, 512, 256, 32000},
                     Geometry{4, 32, 1, 7, 100, 1000}, Geometry{8, 128, 4, 2048, 64, 120000}}) {
    out.push_back(IndexerSelectCase(g));
  }
  return out;
}

}  // namespace primecache::kernels::gpu_cases

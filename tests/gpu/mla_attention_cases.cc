// MLA attention, dense and over sparse pool selections: every output element
// within the reordered tolerance of the twin's.
#include <algorithm>
#include <cmath>

#include "kernels/mla_attention.h"
#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

struct Geometry {
  std::size_t heads, r, dr, count, first_pos, pool, topk;  // pool 0: dense
};

// Per query, up to topk of the pools it sees, chosen at random and sorted,
// each row padded to `stride` entries; *counts gets each row's count.
std::vector<std::uint32_t> RandomSelections(const Geometry& g, std::size_t stride, std::mt19937& rng,
                                            std::vector<std::uint32_t>* counts) {
  std::vector<std::uint32_t> pools;
  for (std::size_t i = 0; i < g.count; ++i) {
    const std::size_t visible = (g.first_pos + i + 1) / g.pool;
    std::vector<std::uint32_t> all(visible);
    for (std::size_t p = 0; p < visible; ++p) all[p] = static_cast<std::uint32_t>(p);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min(visible, g.topk));
    std::sort(all.begin(), all.end());
    counts->push_back(static_cast<std::uint32_t>(all.size()));
    all.resize(stride, 0);
    pools.insert(pools.end(), all.begin(), all.end());
  }
  return pools;
}

KernelCase MlaAttentionCase(Geometry g) {
  const std::size_t stride = std::max<std::size_t>(g.topk, 1);
  KernelCase c;
  c.name = "mla_attention_h" + std::to_string(g.heads) + "_r" + std::to_string(g.r) + "_dr" + std::to_string(g.dr) +
           "_q" + std::to_string(g.count) + "_at" + std::to_string(g.first_pos) +
           (g.pool ? "_pool" + std::to_string(g.pool) + "_top" + std::to_string(g.topk) : "_dense");
  c.build = [g, stride](std::mt19937& rng) {
    std::vector<Tensor> t = {Input("qt", Normal(rng, g.count * g.heads * g.r)),
                             Input("qp", Normal(rng, g.count * g.heads * std::max<std::size_t>(g.dr, 1))),
                             Input("rows", Normal(rng, (g.first_pos + g.count) * (g.r + g.dr))),
                             Output("out", g.count * g.heads * g.r, Reordered())};
    if (g.pool) {
      std::vector<std::uint32_t> counts;
      t.push_back(Input("pools", RandomSelections(g, stride, rng, &counts)));
      t.push_back(Input("pool_count", std::move(counts)));
    }
    return t;
  };
  c.run = [g, stride](const Buffers& b) {
    MlaAttentionArgs a;
    a.qt = b.f("qt");
    a.qp = b.f("qp");
    a.rows = b.f("rows");
    a.out = b.f("out");
    if (g.pool) {
      a.pools = b.u("pools");
      a.pool_count = b.u("pool_count");
    }
    a.count = g.count;
    a.first_pos = g.first_pos;
    a.heads = g.heads;
    a.kv_rank = g.r;
    a.rope_dim = g.dr;
    a.pool = g.pool;
    a.pool_stride = g.pool ? stride : 0;
    a.scale = 1.0f / std::sqrt(float(g.r));
    return OnBackend(b, MlaAttentionCpu, MlaAttentionCuda, a);
  };
  return c;
}

}  // namespace

std::vector<KernelCase> MlaAttentionCases() {
  std::vector<KernelCase> out;
  for (Geometry g : {Geometry{1, 8, 0, 5, 0, 0, 0}, Geometry{4, 32, 8, 40, 3, 0, 0}, Geometry{3, 33, 6, 17, 50, 4, 2},
                     Geometry{16, 512, 64, 64, 4000, 0, 0}, Geometry{16, 512, 64, 256, 8000, 4, 256},
                     Geometry{8, 64, 0, 30, 100, 1, 7}}) {
    out.push_back(MlaAttentionCase(g));
  }
  return out;
}

}  // namespace primecache::kernels::gpu_cases

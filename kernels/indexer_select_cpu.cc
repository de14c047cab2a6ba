#include <algorithm>
#include <vector>

#include "kernels/cpu_math.h"
#include "kernels/indexer_select.h"

namespace primecache::kernels {

std::size_t IndexerSelectScratchBytes(const IndexerSelectArgs& a) {
  if (a.pool == 0) return 0;
  const std::uint64_t max_visible = (a.first_pos + a.count) / a.pool;
  return static_cast<std::size_t>(a.count * max_visible * sizeof(std::uint64_t));
}

Status ValidateIndexerSelectArgs(const IndexerSelectArgs& a) {
  if (a.count == 0) return Status::Ok();
  if (!a.qi || !a.wt || !a.selected || !a.selected_count) return Status::InvalidArgument("indexer select: null pointer");
  if (a.heads == 0 || a.head_dim == 0 || a.pool == 0 || a.topk == 0) {
    return Status::InvalidArgument("indexer select: heads, head_dim, pool and topk must be > 0");
  }
  if ((a.first_pos + a.count) / a.pool > 0 && a.keys == nullptr) {
    return Status::InvalidArgument("indexer select: visible pools without keys");
  }
  if ((a.first_pos + a.count) / a.pool > 0xffffffffull) return Status::InvalidArgument("indexer select: too many pools");
  return Status::Ok();
}

Status IndexerSelectCpu(const IndexerSelectArgs& a) {
  PC_RETURN_IF_ERROR(ValidateIndexerSelectArgs(a));
  const std::size_t di = a.head_dim;
  std::vector<std::pair<float, std::uint32_t>> scored;
  for (std::size_t i = 0; i < a.count; ++i) {
    const std::uint64_t visible = (a.first_pos + i + 1) / a.pool;
    const float* qi = a.qi + i * a.heads * di;
    const float* wt = a.wt + i * a.heads;
    scored.resize(visible);
    for (std::uint64_t p = 0; p < visible; ++p) {
      float score = 0.0f;
      for (std::size_t h = 0; h < a.heads; ++h) score += wt[h] * std::max(0.0f, cpu::Dot(qi + h * di, a.keys + p * di, di));
      scored[p] = {score + 0.0f, static_cast<std::uint32_t>(p)};
    }
    const std::size_t keep = std::min<std::size_t>(a.topk, visible);
    std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(keep), scored.end(),
                      [](const auto& x, const auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
    std::uint32_t* out = a.selected + i * a.topk;
    for (std::size_t k = 0; k < keep; ++k) out[k] = scored[k].second;
    std::sort(out, out + keep);
    a.selected_count[i] = static_cast<std::uint32_t>(keep);
  }
  return Status::Ok();
}

#ifndef PRIMECACHE_HAVE_CUDA
Status IndexerSelectCuda(const IndexerSelectArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
#endif

}  // namespace primecache::kernels

// The DSA k-pool indexer's selection for a run of queries, on the CPU (the
// reference twin) and on CUDA.
//
// Query i sits at position first_pos + i and sees pools p with
// (p+1)·pool <= pos+1. Each visible pool scores
//   I(p) = Σ_h wt[i,h] · ReLU(qi[i,h] · K_p)      (h ascending, dot in index order)
// and the query keeps the top k by score, ties to the lower pool, written to
// selected[i, 0 .. count[i]) in ascending pool order (count[i] = min(topk,
// visible)). A score of -0 counts as +0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "primecache/status.h"

namespace primecache::kernels {

struct IndexerSelectArgs {
  const float* qi = nullptr;       // [count, heads * head_dim]
  const float* wt = nullptr;       // [count, heads]
  const float* keys = nullptr;     // [pools, head_dim], final pool keys
  std::uint32_t* selected = nullptr;  // [count, topk]
  std::uint32_t* selected_count = nullptr;  // [count]
  std::size_t count = 0;
  std::uint64_t first_pos = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;
  std::size_t pool = 0;
  std::size_t topk = 0;
  // CUDA only: device scratch of count * max_visible u64 (see IndexerSelectScratchBytes).
  void* scratch = nullptr;
};

// Bytes of device scratch IndexerSelectCuda needs for these arguments.
std::size_t IndexerSelectScratchBytes(const IndexerSelectArgs& args);

Status ValidateIndexerSelectArgs(const IndexerSelectArgs& args);
Status IndexerSelectCpu(const IndexerSelectArgs& args);
Status IndexerSelectCuda(const IndexerSelectArgs& args, void* stream);

}  // namespace primecache::kernels

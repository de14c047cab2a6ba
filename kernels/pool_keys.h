// Pool-key build of the DSA k-pool indexer, on the CPU (the reference twin) and
// on CUDA.
//
// An index row is 2*head_dim floats: [kidx | gate]. Pool p covers tokens
// [p*pool, (p+1)*pool); its key, per channel c, is
//   K_p[c] = sum_j w_j[c] * kidx_{p*pool+j}[c],
//   w_.[c] = softmax over j in [0, pool) of (gate_{p*pool+j}[c] + ape[j][c]).
// Index rows may live flat (token t at row t) or in a tail ring (token t at
// row t % ring_rows, ring_rows a multiple of pool). Only keys of pools
// [first_pool, first_pool + pool_count) are written; nothing else is touched.
#pragma once

#include <cstddef>

#include "primecache/status.h"

namespace primecache::kernels {

struct PoolKeyArgs {
  const float* index_rows = nullptr;  // physical rows, 2*head_dim floats each
  std::size_t ring_rows = 0;          // 0: flat plane; else the ring's size in rows
  const float* ape = nullptr;         // [pool, head_dim]
  float* keys = nullptr;              // key p at keys + p*head_dim
  std::size_t head_dim = 0;
  std::size_t pool = 0;
  std::size_t first_pool = 0;
  std::size_t pool_count = 0;
};

// Checks the geometry: non-null pointers, pool > 0, head_dim > 0, and a ring
// whose size is a multiple of pool.
Status ValidatePoolKeyArgs(const PoolKeyArgs& args);

// The CPU twin: host pointers.
Status BuildPoolKeysCpu(const PoolKeyArgs& args);

// The CUDA kernel: device pointers, enqueued on `stream` (a cudaStream_t).
// Returns NotSupported when built without CUDA.
Status BuildPoolKeysCuda(const PoolKeyArgs& args, void* stream);

}  // namespace primecache::kernels

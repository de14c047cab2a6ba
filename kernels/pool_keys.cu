// CUDA pool-key build: one thread per (pool, channel), the CPU twin's order of
// operations (max; exp-sum and weighted sum; one division).
#include <cuda_runtime.h>

#include <string>

#include "kernels/pool_keys.h"

namespace primecache::kernels {
namespace {

__global__ void PoolKeyKernel(const float* __restrict__ rows, unsigned long long ring_rows,
                              const float* __restrict__ ape, float* __restrict__ keys,
                              unsigned long long d, unsigned long long pool,
                              unsigned long long first_pool, unsigned long long pool_count) {
  unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x;
  if (i >= pool_count * d) return;
  unsigned long long p = first_pool + i / d;
  unsigned long long c = i % d;
  float m = -INFINITY;
  for (unsigned long long j = 0; j < pool; ++j) {
    unsigned long long token = p * pool + j;
    unsigned long long row = ring_rows ? token % ring_rows : token;
    m = fmaxf(m, rows[row * 2 * d + d + c] + ape[j * d + c]);
  }
  float sum = 0.0f, acc = 0.0f;
  for (unsigned long long j = 0; j < pool; ++j) {
    unsigned long long token = p * pool + j;
    unsigned long long row = ring_rows ? token % ring_rows : token;
    const float* r = rows + row * 2 * d;
    float w = expf(r[d + c] + ape[j * d + c] - m);
    sum += w;
    acc = fmaf(w, r[c], acc);
  }
  keys[p * d + c] = acc / sum;
}

}  // namespace

Status BuildPoolKeysCuda(const PoolKeyArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidatePoolKeyArgs(a));
  if (a.pool_count == 0) return Status::Ok();
  const unsigned long long threads = a.pool_count * a.head_dim;
  constexpr unsigned kBlock = 256;
  const unsigned long long blocks = (threads + kBlock - 1) / kBlock;
  PoolKeyKernel<<<static_cast<unsigned>(blocks), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      a.index_rows, a.ring_rows, a.ape, a.keys, a.head_dim, a.pool, a.first_pool, a.pool_count);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Internal(std::string("pool-key kernel launch: ") + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace primecache::kernels

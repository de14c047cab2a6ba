// CUDA absorbed MLA attention: one block per query, every head at once, so a
// latent row is fetched once per query for all heads. Keys go in tiles of
// kTile; the softmax is the online (running max) form, and the output
// accumulators live in shared memory.
#include <cuda_runtime.h>

#include <string>

#include "kernels/mla_attention.h"

namespace primecache::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;

__device__ unsigned long long KeyAt(unsigned long long k, unsigned long long pos, const unsigned* pools,
                                    unsigned npools, unsigned long long pool) {
  if (pools == nullptr) return k;
  const unsigned long long selected = static_cast<unsigned long long>(npools) * pool;
  if (k < selected) return static_cast<unsigned long long>(pools[k / pool]) * pool + k % pool;
  return (pos + 1) / pool * pool + (k - selected);
}

__global__ void MlaAttentionKernel(MlaAttentionArgs a, unsigned long long qp_ts, unsigned long long qp_hs) {
  extern __shared__ float smem[];
  const int nh = static_cast<int>(a.heads), r = static_cast<int>(a.kv_rank), dr = static_cast<int>(a.rope_dim);
  const int width = r + dr;
  float* sqt = smem;                 // [nh * r]
  float* sqp = sqt + nh * r;         // [nh * dr]
  float* acc = sqp + nh * dr;        // [nh * r]
  float* score = acc + nh * r;       // [nh * kTile]
  float* run_max = score + nh * kTile;  // [nh]
  float* run_sum = run_max + nh;        // [nh]
  float* corr = run_sum + nh;           // [nh]
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(corr + nh + (nh & 1));  // [kTile], 8-aligned

  const unsigned long long i = blockIdx.x;
  const unsigned long long pos = a.first_pos + i;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int x = tid; x < nh * r; x += kThreads) {
    sqt[x] = a.qt[i * nh * r + x];
    acc[x] = 0.0f;
  }
  for (int x = tid; x < nh * dr; x += kThreads) sqp[x] = a.qp[i * qp_ts + (x / dr) * qp_hs + x % dr];
  for (int h = tid; h < nh; h += kThreads) {
    run_max[h] = -INFINITY;
    run_sum[h] = 0.0f;
  }
  const unsigned* pools = a.pools ? a.pools + i * a.pool_stride : nullptr;
  const unsigned npools = a.pools ? a.pool_count[i] : 0;
  unsigned long long total;
  if (a.pools == nullptr) {
    total = pos + 1;
  } else {
    total = static_cast<unsigned long long>(npools) * a.pool + (pos + 1 - (pos + 1) / a.pool * a.pool);
  }
  __syncthreads();

  for (unsigned long long base = 0; base < total; base += kTile) {
    const int n = static_cast<int>(total - base < kTile ? total - base : kTile);
    if (tid < n) keys[tid] = KeyAt(base + tid, pos, pools, npools, a.pool);
    __syncthreads();
    // Scores: warp w takes keys w, w + kWarps, ...; lanes split the dot.
    for (int k = warp; k < n; k += kWarps) {
      const float* c = a.rows + keys[k] * width;
      for (int h = 0; h < nh; ++h) {
        float part = 0.0f;
        for (int j = lane; j < r; j += 32) part += sqt[h * r + j] * c[j];
        float rope = 0.0f;
        for (int j = lane; j < dr; j += 32) rope += sqp[h * dr + j] * c[r + j];
        for (int off = 16; off > 0; off /= 2) {
          part += __shfl_xor_sync(0xffffffffu, part, off);
          rope += __shfl_xor_sync(0xffffffffu, rope, off);
        }
        if (lane == 0) score[h * kTile + k] = (part + rope) * a.scale;
      }
    }
    __syncthreads();
    // Online softmax bookkeeping, one thread per head.
    for (int h = tid; h < nh; h += kThreads) {
      float m = run_max[h];
      for (int k = 0; k < n; ++k) m = fmaxf(m, score[h * kTile + k]);
      const float c = expf(run_max[h] - m);
      float s = run_sum[h] * c;
      for (int k = 0; k < n; ++k) {
        const float p = expf(score[h * kTile + k] - m);
        score[h * kTile + k] = p;
        s += p;
      }
      run_max[h] = m;
      run_sum[h] = s;
      corr[h] = c;
    }
    __syncthreads();
    for (int x = tid; x < nh * r; x += kThreads) {
      const int h = x / r, j = x % r;
      float v = acc[x] * corr[h];
      for (int k = 0; k < n; ++k) v += score[h * kTile + k] * a.rows[keys[k] * width + j];
      acc[x] = v;
    }
    __syncthreads();
  }
  for (int x = tid; x < nh * r; x += kThreads) a.out[i * nh * r + x] = acc[x] / run_sum[x / r];
}

}  // namespace

Status MlaAttentionCuda(const MlaAttentionArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateMlaAttentionArgs(a));
  if (a.count == 0) return Status::Ok();
  const std::size_t nh = a.heads;
  const std::size_t floats = nh * a.kv_rank * 2 + nh * a.rope_dim + nh * kTile + 3 * nh + 1;
  const std::size_t smem = floats * sizeof(float) + kTile * sizeof(unsigned long long) + 8;
  if (smem > 227 * 1024) {
    return Status::InvalidArgument("MLA attention: " + std::to_string(nh) + " heads of rank " +
                                   std::to_string(a.kv_rank) + " need more shared memory than a block has");
  }
  if (smem > 48 * 1024) {
    cudaError_t err =
        cudaFuncSetAttribute(MlaAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) {
      return Status::Internal(std::string("MLA attention: shared memory: ") + cudaGetErrorString(err));
    }
  }
  MlaAttentionKernel<<<static_cast<unsigned>(a.count), kThreads, smem, static_cast<cudaStream_t>(stream)>>>(a, QpTokenStride(a), QpHeadStride(a));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Internal(std::string("MLA attention launch: ") + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace primecache::kernels

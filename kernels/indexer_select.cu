// CUDA indexer selection: one block per query. Each visible pool's score
// becomes a unique 64-bit key (order-preserving float bits, then the inverted
// pool index, so ties go to the lower pool); a byte-wise radix select finds
// the k-th largest key, and an ordered compaction writes the pools at or above
// it in ascending order. Scores are computed exactly as the CPU twin does.
#include <cuda_runtime.h>

#include <string>

#include "kernels/indexer_select.h"

namespace primecache::kernels {
namespace {

constexpr int kThreads = 256;

__device__ unsigned long long ScoreKey(float score, unsigned p) {
  unsigned u = __float_as_uint(score + 0.0f);  // -0 -> +0
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xffffffffu - p);
}

__global__ void IndexerSelectKernel(IndexerSelectArgs a, unsigned long long max_visible) {
  extern __shared__ float sq[];  // qi of this query [heads * head_dim], then wt [heads]
  __shared__ unsigned hist[256];
  __shared__ unsigned long long prefix_s;
  __shared__ unsigned remaining_s;
  __shared__ unsigned warp_count[kThreads / 32];
  const unsigned long long i = blockIdx.x;
  const unsigned long long pos = a.first_pos + i;
  const unsigned long long visible = (pos + 1) / a.pool;
  const int tid = threadIdx.x;
  const int nh = static_cast<int>(a.heads), di = static_cast<int>(a.head_dim);
  float* swt = sq + nh * di;
  for (int x = tid; x < nh * di; x += kThreads) sq[x] = a.qi[i * nh * di + x];
  for (int x = tid; x < nh; x += kThreads) swt[x] = a.wt[i * nh + x];
  __syncthreads();
  unsigned* out = a.selected + i * a.topk;
  if (visible <= a.topk) {
    for (unsigned long long p = tid; p < visible; p += kThreads) out[p] = static_cast<unsigned>(p);
    if (tid == 0) a.selected_count[i] = static_cast<unsigned>(visible);
    return;
  }
  unsigned long long* keys = static_cast<unsigned long long*>(a.scratch) + i * max_visible;
  for (unsigned long long p = tid; p < visible; p += kThreads) {
    const float* K = a.keys + p * di;
    // Separate multiply and add (no FMA contraction), in the twin's order:
    // the scores, and so the selection, match the CPU bit for bit.
    float score = 0.0f;
    for (int h = 0; h < nh; ++h) {
      float dot = 0.0f;
      for (int c = 0; c < di; ++c) dot = __fadd_rn(dot, __fmul_rn(sq[h * di + c], K[c]));
      score = __fadd_rn(score, __fmul_rn(swt[h], fmaxf(0.0f, dot)));
    }
    keys[p] = ScoreKey(score, static_cast<unsigned>(p));
  }
  if (tid == 0) {
    prefix_s = 0;
    remaining_s = static_cast<unsigned>(a.topk);
  }
  __syncthreads();
  for (int shift = 56; shift >= 0; shift -= 8) {
    hist[tid] = 0;  // kThreads == 256 bins
    __syncthreads();
    const unsigned long long hi_mask = shift == 56 ? 0ull : (~0ull << (shift + 8));
    const unsigned long long prefix = prefix_s;
    for (unsigned long long p = tid; p < visible; p += kThreads) {
      const unsigned long long k = keys[p];
      if ((k & hi_mask) == (prefix & hi_mask)) atomicAdd(&hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      unsigned cum = 0, rem = remaining_s;
      int bin = 255;
      for (; bin > 0; --bin) {
        if (cum + hist[bin] >= rem) break;
        cum += hist[bin];
      }
      remaining_s = rem - cum;
      prefix_s = prefix | (static_cast<unsigned long long>(bin) << shift);
    }
    __syncthreads();
  }
  const unsigned long long threshold = prefix_s;  // the k-th largest key itself
  unsigned written = 0;
  const int lane = tid % 32, warp = tid / 32;
  for (unsigned long long base = 0; base < visible; base += kThreads) {
    const unsigned long long p = base + tid;
    const bool keep = p < visible && keys[p] >= threshold;
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    unsigned offset = written;
    for (int w = 0; w < warp; ++w) offset += warp_count[w];
    if (keep) out[offset + __popc(ballot & ((1u << lane) - 1u))] = static_cast<unsigned>(p);
    unsigned total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_count[w];
    written += total;
    __syncthreads();
  }
  if (tid == 0) a.selected_count[i] = written;
}

}  // namespace

Status IndexerSelectCuda(const IndexerSelectArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateIndexerSelectArgs(a));
  if (a.count == 0) return Status::Ok();
  const unsigned long long max_visible = (a.first_pos + a.count) / a.pool;
  if (max_visible > a.topk && a.scratch == nullptr) {
    return Status::InvalidArgument("indexer select: CUDA needs scratch of IndexerSelectScratchBytes");
  }
  const std::size_t smem = (a.heads * a.head_dim + a.heads) * sizeof(float);
  if (smem > 200 * 1024) return Status::InvalidArgument("indexer select: query too wide for shared memory");
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(IndexerSelectKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
    if (err != cudaSuccess) return Status::Internal(std::string("indexer select: ") + cudaGetErrorString(err));
  }
  IndexerSelectKernel<<<static_cast<unsigned>(a.count), kThreads, smem, static_cast<cudaStream_t>(stream)>>>(
      a, max_visible);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Internal(std::string("indexer select launch: ") + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace primecache::kernels

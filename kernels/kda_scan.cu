// CUDA KDA scan: one warp per (head, 32 value columns). Each lane owns one
// column j of the head's state, kept in shared memory for the whole run; per
// token the warp stages q, k and alpha in shared memory, then every lane runs
// the CPU twin's two passes over its column (scale and predict; update and
// read out) in the same order.
#include <cuda_runtime.h>

#include <string>

#include "kernels/kda_scan.h"

namespace primecache::kernels {
namespace {

constexpr int kCols = 32;

__device__ float SigmoidF(float z) { return 1.0f / (1.0f + expf(-z)); }

__global__ void KdaScanKernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                              const float* __restrict__ g, const float* __restrict__ b, float* __restrict__ state,
                              float* __restrict__ out, int heads, int d, long long count, float lb, long long ts) {
  extern __shared__ float smem[];
  float* col = smem;                   // [d][kCols]: column lane at col[i*kCols + lane]
  float* sq = smem + d * kCols;        // [d]
  float* sk = sq + d;                  // [d]
  float* salpha = sk + d;              // [d]
  const int h = blockIdx.x;
  const int lane = threadIdx.x;
  const int j = blockIdx.y * kCols + lane;
  const bool active = j < d;
  const long long nd = static_cast<long long>(heads) * d;
  float* S = state + static_cast<long long>(h) * d * d;
  if (active)
    for (int i = 0; i < d; ++i) col[i * kCols + lane] = S[static_cast<long long>(i) * d + j];
  const float inv_sqrt_d = 1.0f / sqrtf(static_cast<float>(d));
  for (long long t = 0; t < count; ++t) {
    const long long base = t * nd + static_cast<long long>(h) * d;      // g and out
    const long long qkv = t * ts + static_cast<long long>(h) * d;       // q, k and v
    __syncwarp();
    for (int i = lane; i < d; i += kCols) {
      sq[i] = q[qkv + i];
      sk[i] = k[qkv + i];
      salpha[i] = expf(lb * SigmoidF(g[base + i]));
    }
    __syncwarp();
    if (!active) continue;
    const float beta = SigmoidF(b[t * heads + h]);
    float pred = 0.0f;
    for (int i = 0; i < d; ++i) {
      float s = col[i * kCols + lane] * salpha[i];
      col[i * kCols + lane] = s;
      pred += s * sk[i];
    }
    const float delta = beta * (v[qkv + j] - pred);
    float acc = 0.0f;
    for (int i = 0; i < d; ++i) {
      float s = col[i * kCols + lane] + sk[i] * delta;
      col[i * kCols + lane] = s;
      acc += s * sq[i];
    }
    out[base + j] = acc * inv_sqrt_d;
  }
  if (active)
    for (int i = 0; i < d; ++i) S[static_cast<long long>(i) * d + j] = col[i * kCols + lane];
}

}  // namespace

Status KdaScanCuda(const KdaScanArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateKdaScanArgs(a));
  if (a.count == 0) return Status::Ok();
  const int d = static_cast<int>(a.head_dim);
  const std::size_t smem = (static_cast<std::size_t>(d) * kCols + 3 * static_cast<std::size_t>(d)) * sizeof(float);
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(KdaScanKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
    if (err != cudaSuccess) return Status::Internal(std::string("KDA scan: shared memory: ") + cudaGetErrorString(err));
  }
  dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>((a.head_dim + kCols - 1) / kCols));
  KdaScanKernel<<<grid, kCols, smem, static_cast<cudaStream_t>(stream)>>>(
      a.q, a.k, a.v, a.g, a.b, a.state, a.out, static_cast<int>(a.heads), d, static_cast<long long>(a.count),
      a.gate_lower_bound, static_cast<long long>(QkvTokenStride(a)));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Internal(std::string("KDA scan launch: ") + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace primecache::kernels

// CUDA KV attention, TurboQuant encode and the Hadamard rotation.
//
// The encoder and the rotation are bit-exact twins of the CPU code: one block
// per head entry, the butterfly's stages in the same order, the norm summed
// in index order by one thread, and every product and quotient rounded
// explicitly (__fmul_rn, __fdiv_rn) so that nvcc cannot contract them into
// FMAs. The attention is one block per (query, head): keys in tiles, the
// online softmax, accumulators in shared memory (agrees with the CPU within
// rounding, not bit for bit).
#include <cuda_runtime.h>

#include <string>

#include "kernels/kv_attention.h"

namespace primecache::kernels {
namespace {

using u64 = unsigned long long;
using u32 = unsigned int;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;

__constant__ float kLevels2[4] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
__constant__ float kLevels4[16] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f, -0.3881f, -0.1284f,
                                   0.1284f,  0.3881f,  0.6568f,  0.9424f,  1.2562f,  1.6181f,  2.0690f,  2.7326f};

__device__ const float* Levels(u32 bits) { return bits == 2 ? kLevels2 : kLevels4; }

// y (shared, n values) <- butterfly(y) / sqrt(n), the CPU twin's order.
__device__ void Butterfly(float* y, int n) {
  for (int h = 1; h < n; h *= 2) {
    __syncthreads();
    for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const int j = (p / h) * 2 * h + p % h;
      const float a = y[j], b = y[j + h];
      y[j] = __fadd_rn(a, b);
      y[j + h] = __fsub_rn(a, b);
    }
  }
  __syncthreads();
  const float root = __fsqrt_rn(static_cast<float>(n));
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fdiv_rn(y[i], root);
  __syncthreads();
}

__global__ void HadamardKernel(HadamardArgs a) {
  extern __shared__ float y[];
  const int n = static_cast<int>(a.head_dim);
  const u64 r = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  float* x = a.x + r * a.stride + h * a.head_dim;
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = a.inverse ? x[i] : __fmul_rn(x[i], a.signs[i]);
  Butterfly(y, n);
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = a.inverse ? __fmul_rn(y[i], a.signs[i]) : y[i];
}

__global__ void EncodeKernel(TurboQuantEncodeArgs a) {
  extern __shared__ float y[];
  __shared__ float norm;
  __shared__ u32 codes[64];  // head_dim * bits / 32 <= 64 for head_dim <= 512
  const int n = static_cast<int>(a.head_dim), bits = static_cast<int>(a.bits);
  const u64 r = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  const float* x = a.x + r * a.src_stride + h * a.head_dim;
  u32* out = a.out + (r * a.heads + h) * (1 + a.head_dim * a.bits / 32);
  if (threadIdx.x == 0) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
    norm = __fsqrt_rn(ss);
  }
  for (int w = threadIdx.x; w < n * bits / 32; w += blockDim.x) codes[w] = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fmul_rn(x[i], a.signs[i]);
  Butterfly(y, n);  // synchronises: norm and codes are visible after it
  if (norm != 0.0f) {
    const float root = __fsqrt_rn(static_cast<float>(n));
    const float* c = Levels(a.bits);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float z = __fdiv_rn(__fmul_rn(y[i], root), norm);
      u32 best = 0;
      float best_d = fabsf(__fsub_rn(z, c[0]));
      for (u32 j = 1; j < (1u << bits); ++j) {
        const float d = fabsf(__fsub_rn(z, c[j]));
        if (d < best_d) {
          best = j;
          best_d = d;
        }
      }
      atomicOr(&codes[i * bits / 32], best << ((i * bits) % 32));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) out[0] = __float_as_uint(norm);
  for (int w = threadIdx.x; w < n * bits / 32; w += blockDim.x) out[1 + w] = codes[w];
}

// Element j of the entry of kv head g in `row` of `rows`.
__device__ float Entry(const void* rows, u64 row, u64 g, const KvAttentionArgs& a, u64 words, int j, float root) {
  const u32* base = static_cast<const u32*>(rows) + (row * a.kv_heads + g) * words;
  if (a.bits == 0) return __uint_as_float(base[j]);
  const u32 code = (base[1 + j * a.bits / 32] >> ((j * a.bits) % 32)) & ((1u << a.bits) - 1);
  return __uint_as_float(base[0]) * Levels(a.bits)[code] / root;
}

__global__ void AttentionKernel(KvAttentionArgs a) {
  extern __shared__ float smem[];
  const int n = static_cast<int>(a.head_dim);
  float* sq = smem;          // [n]
  float* acc = sq + n;       // [n]
  float* score = acc + n;    // [kTile]
  __shared__ float run_max, run_sum, corr;
  const u64 i = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  const u64 g = h * a.kv_heads / a.heads;
  const u64 pos = a.first_pos + i;
  const u64 lo = a.window == 0 || pos + 1 <= a.window ? 0 : pos + 1 - a.window;
  const u64 words = a.bits == 0 ? a.head_dim : 1 + a.head_dim * a.bits / 32;
  const float root = sqrtf(static_cast<float>(n));
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int j = tid; j < n; j += kThreads) {
    sq[j] = a.q[i * a.heads * a.head_dim + h * a.head_dim + j];
    acc[j] = 0.0f;
  }
  if (tid == 0) {
    run_max = -INFINITY;
    run_sum = 0.0f;
  }
  __syncthreads();
  for (u64 base = lo; base <= pos; base += kTile) {
    const int cnt = static_cast<int>(pos + 1 - base < kTile ? pos + 1 - base : kTile);
    for (int k = warp; k < cnt; k += kWarps) {
      const u64 s = base + k;
      const bool cached = s < a.first_pos;
      const void* rows = cached ? a.cache_k : a.new_k;
      const u64 row = cached ? s % a.cache_rows : s - a.first_pos;
      float part = 0.0f;
      for (int j = lane; j < n; j += 32) part += sq[j] * Entry(rows, row, g, a, words, j, root);
      for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
      if (lane == 0) score[k] = part * a.scale;
    }
    __syncthreads();
    if (tid == 0) {
      float m = run_max;
      for (int k = 0; k < cnt; ++k) m = fmaxf(m, score[k]);
      const float c = expf(run_max - m);
      float s = run_sum * c;
      for (int k = 0; k < cnt; ++k) {
        score[k] = expf(score[k] - m);
        s += score[k];
      }
      run_max = m;
      run_sum = s;
      corr = c;
    }
    __syncthreads();
    for (int j = tid; j < n; j += kThreads) {
      float v = acc[j] * corr;
      for (int k = 0; k < cnt; ++k) {
        const u64 s = base + k;
        const bool cached = s < a.first_pos;
        v += score[k] * Entry(cached ? a.cache_v : a.new_v, cached ? s % a.cache_rows : s - a.first_pos, g, a, words,
                              j, root);
      }
      acc[j] = v;
    }
    __syncthreads();
  }
  for (int j = tid; j < n; j += kThreads) a.out[i * a.heads * a.head_dim + h * a.head_dim + j] = acc[j] / run_sum;
}

Status Launched(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Internal(std::string(what) + " launch: " + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace

Status HadamardRowsCuda(const HadamardArgs& a, void* stream) {
  if (a.rows == 0) return Status::Ok();
  if (a.x == nullptr || a.signs == nullptr || a.head_dim == 0 || (a.head_dim & (a.head_dim - 1)) != 0 ||
      a.head_dim > 8192 || a.stride < a.heads * a.head_dim) {
    return Status::InvalidArgument("Hadamard rows: null pointer, head_dim not a power of two up to 8192, or stride");
  }
  const u64 blocks = a.rows * a.heads;
  HadamardKernel<<<static_cast<unsigned>(blocks), kThreads, a.head_dim * sizeof(float),
                   static_cast<cudaStream_t>(stream)>>>(a);
  return Launched("Hadamard rows");
}

Status TurboQuantEncodeCuda(const TurboQuantEncodeArgs& a, void* stream) {
  if (a.rows == 0) return Status::Ok();
  if (a.x == nullptr || a.out == nullptr || a.signs == nullptr || !TurboQuantGeometryOk(a.head_dim, a.bits) ||
      a.head_dim > 512 || a.src_stride < a.heads * a.head_dim) {
    return Status::InvalidArgument("TurboQuant encode: null pointer, bad geometry or stride");
  }
  const u64 blocks = a.rows * a.heads;
  EncodeKernel<<<static_cast<unsigned>(blocks), kThreads, a.head_dim * sizeof(float),
                 static_cast<cudaStream_t>(stream)>>>(a);
  return Launched("TurboQuant encode");
}

Status KvAttentionCuda(const KvAttentionArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateKvAttentionArgs(a));
  if (a.count == 0) return Status::Ok();
  if (a.head_dim > 8192) return Status::InvalidArgument("KV attention: head_dim above 8192");
  const u64 blocks = static_cast<u64>(a.count) * a.heads;
  const std::size_t smem = (2 * a.head_dim + kTile) * sizeof(float);
  AttentionKernel<<<static_cast<unsigned>(blocks), kThreads, smem, static_cast<cudaStream_t>(stream)>>>(a);
  return Launched("KV attention");
}

}  // namespace primecache::kernels

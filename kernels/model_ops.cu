// CUDA versions of the model's small per-token operations (model_ops.h).
// Row reductions use one block per row and a tree reduction; elementwise
// operations use one thread per element.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/model_ops.h"

namespace primecache::kernels {
namespace {

constexpr int kBlock = 256;

Status Launched(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Internal(std::string(what) + " launch: " + cudaGetErrorString(err));
  return Status::Ok();
}

unsigned Blocks(std::size_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

// Sum of v over the block; every thread gets the result.
__device__ float BlockSum(float v) {
  __shared__ float part[kBlock / 32];
  __shared__ float total;
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < kBlock / 32; ++w) s += part[w];
    total = s;
  }
  __syncthreads();
  float out = total;
  __syncthreads();
  return out;
}

__device__ float Sig(float z) { return 1.0f / (1.0f + expf(-z)); }

__device__ void RopeOne(float* v, long long i, long long n, unsigned long long pos, float theta) {
  const double freq = pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(n));
  const double angle = static_cast<double>(pos) * freq;
  const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
  const float v0 = v[2 * i], v1 = v[2 * i + 1];
  v[2 * i] = v0 * c - v1 * s;
  v[2 * i + 1] = v0 * s + v1 * c;
}

__global__ void RmsNormKernel(RmsNormArgs a) {
  const float* x = a.x + blockIdx.x * a.x_stride;
  float* y = a.y + blockIdx.x * a.y_stride;
  float ss = 0.0f;
  for (std::size_t i = threadIdx.x; i < a.n; i += kBlock) ss += x[i] * x[i];
  ss = BlockSum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.n) + a.eps);
  for (std::size_t i = threadIdx.x; i < a.n; i += kBlock) y[i] = a.w[i] * (x[i] * inv);
}

__global__ void L2NormKernel(L2NormArgs a) {
  const std::size_t t = blockIdx.x / a.per_token, h = blockIdx.x % a.per_token, n = a.n;
  float* row = a.x + t * a.token_stride + h * n;
  float ss = 0.0f;
  for (std::size_t i = threadIdx.x; i < n; i += kBlock) ss += row[i] * row[i];
  ss = BlockSum(ss);
  const float inv = 1.0f / sqrtf(ss + 1e-6f);
  for (std::size_t i = threadIdx.x; i < n; i += kBlock) row[i] *= inv;
}

__global__ void RopeKernel(RopeArgs a) {
  const std::size_t pairs = a.n / 2;
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(kBlock) + threadIdx.x;
  if (idx >= a.tokens * a.groups * pairs) return;
  const std::size_t p = idx % pairs, g = (idx / pairs) % a.groups, t = idx / pairs / a.groups;
  RopeOne(a.v + t * a.token_stride + g * a.group_stride + a.offset, static_cast<long long>(p),
          static_cast<long long>(a.n), a.first_pos + t, a.theta);
}

__global__ void SiluMulKernel(float* a, const float* b, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(kBlock) + threadIdx.x;
  if (i < n) {
    const float z = a[i];
    a[i] = z * Sig(z) * b[i];
  }
}

__global__ void AddKernel(float* x, const float* y, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(kBlock) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void GatherKernel(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                             std::size_t count, float* x) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(kBlock) + threadIdx.x;
  if (i >= count * n) return;
  const std::uint32_t tok = tokens[i / n];
  x[i] = tok < vocab ? table[std::size_t{tok} * n + i % n] : __int_as_float(0x7fc00000);  // NaN marks a bad id
}

__global__ void KdaConvKernel(KdaConvArgs a) {
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(kBlock) + threadIdx.x;
  if (idx >= a.count * a.channels) return;
  const std::size_t C = a.channels, K = a.kernel, t = idx / C, c = idx % C;
  const float* w = a.taps + c * K;
  float y = 0.0f;
  for (std::size_t i = 0; i + 1 < K; ++i) {
    const long long src = static_cast<long long>(t) - static_cast<long long>(K - 1) + static_cast<long long>(i);
    const float in = src >= 0 ? a.inputs[static_cast<std::size_t>(src) * C + c]
                              : a.ring[c * (K - 1) + static_cast<std::size_t>(static_cast<long long>(K - 1) + src)];
    y += w[i] * in;
  }
  y += w[K - 1] * a.inputs[t * C + c];
  a.out[idx] = y * Sig(y);
}

__global__ void KdaOutputKernel(float* o, const float* gate, const float* w, std::size_t d, float eps) {
  float* oh = o + blockIdx.x * d;
  const float* gh = gate + blockIdx.x * d;
  float ss = 0.0f;
  for (std::size_t j = threadIdx.x; j < d; j += kBlock) ss += oh[j] * oh[j];
  ss = BlockSum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (std::size_t j = threadIdx.x; j < d; j += kBlock) oh[j] = w[j] * (oh[j] * inv) * Sig(gh[j]);
}

__global__ void MlaRowsKernel(MlaRowsArgs a) {
  const std::size_t i = blockIdx.x, width = a.kv_rank + a.rope_dim;
  const float* in = a.a + i * width;
  float* row = a.rows + i * a.row_stride;
  float ss = 0.0f;
  for (std::size_t j = threadIdx.x; j < a.kv_rank; j += kBlock) ss += in[j] * in[j];
  ss = BlockSum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.kv_rank) + a.eps);
  for (std::size_t j = threadIdx.x; j < a.kv_rank; j += kBlock) row[j] = a.w[j] * (in[j] * inv);
  for (std::size_t j = threadIdx.x; j < a.rope_dim; j += kBlock) row[a.kv_rank + j] = in[a.kv_rank + j];
  __syncthreads();
  for (std::size_t p = threadIdx.x; p < a.rope_dim / 2; p += kBlock) {
    RopeOne(row + a.kv_rank, static_cast<long long>(p), static_cast<long long>(a.rope_dim), a.first_pos + i, a.theta);
  }
}

__global__ void ArgmaxKernel(const float* x, std::size_t n, std::uint32_t* out) {
  __shared__ float best_v[kBlock];
  __shared__ std::uint32_t best_i[kBlock];
  const float* row = x + blockIdx.x * n;
  float bv = -INFINITY;
  std::uint32_t bi = 0xffffffffu;
  for (std::size_t i = threadIdx.x; i < n; i += kBlock) {
    if (row[i] > bv || bi == 0xffffffffu) {
      bv = row[i];
      bi = static_cast<std::uint32_t>(i);
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const std::uint32_t oi = best_i[threadIdx.x + s];
      if (oi != 0xffffffffu &&
          (best_i[threadIdx.x] == 0xffffffffu || ov > best_v[threadIdx.x] ||
           (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0];
}

// Rows of a RowsGemm handled per pass over W: each thread keeps this many sums.
constexpr int kGemmRowsPerPass = 8;
// Threads that share one output's sum (W row-major).
constexpr int kGemmThreads = 128;

// Four consecutive values from p (as few as remain before `end`; zeros past
// it), with one 16-byte load when they are aligned.
__device__ float4 Load4(const float* __restrict__ p, std::size_t i, std::size_t end, bool aligned) {
  if (aligned) return __ldg(reinterpret_cast<const float4*>(p + i));
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (i < end) v.x = __ldg(p + i);
  if (i + 1 < end) v.y = __ldg(p + i + 1);
  if (i + 2 < end) v.z = __ldg(p + i + 2);
  if (i + 3 < end) v.w = __ldg(p + i + 3);
  return v;
}

__device__ float Fma4(float4 w, float4 x, float acc) {
  acc = fmaf(w.x, x.x, acc);
  acc = fmaf(w.y, x.y, acc);
  acc = fmaf(w.z, x.z, acc);
  return fmaf(w.w, x.w, acc);
}

// One block per output o of operand blockIdx.y (W row-major [out, in]).
// Thread t sums the groups of four values g = t, t+128, … in that order
// (fmaf, so no contraction choice is left to the compiler); each warp's lanes
// are added by a fixed xor butterfly, then the four warps in order. Nothing
// in a row's sum depends on how many rows there are (they only share the
// loads of W), nor on whether the loads were vector ones.
__global__ void RowsGemmKernel(RowsGemmArgs a) {
  __shared__ float part[kGemmThreads / 32][kGemmRowsPerPass];
  const std::size_t o = blockIdx.x;
  const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32;
  const float* __restrict__ w = a.w + blockIdx.y * a.w_batch + o * a.in;
  const float* __restrict__ x = a.x + blockIdx.y * a.x_batch;
  float* y = a.y + blockIdx.y * a.y_batch;
  const bool aligned = a.in % 4 == 0 && a.ldx % 4 == 0 &&
                       (reinterpret_cast<std::uintptr_t>(w) | reinterpret_cast<std::uintptr_t>(x)) % 16 == 0;
  const std::size_t groups = (a.in + 3) / 4;
  for (std::size_t r0 = 0; r0 < a.rows; r0 += kGemmRowsPerPass) {
    const std::size_t n = a.rows - r0 < kGemmRowsPerPass ? a.rows - r0 : kGemmRowsPerPass;
    float acc[kGemmRowsPerPass] = {};
    for (std::size_t g = t; g < groups; g += kGemmThreads) {
      const float4 wv = Load4(w, 4 * g, a.in, aligned);
#pragma unroll
      for (int r = 0; r < kGemmRowsPerPass; ++r)
        if (r < n) acc[r] = Fma4(wv, Load4(x + (r0 + r) * a.ldx, 4 * g, a.in, aligned), acc[r]);
    }
#pragma unroll
    for (int r = 0; r < kGemmRowsPerPass; ++r) {
      float v = acc[r];
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) part[warp][r] = v;
    }
    __syncthreads();
    if (t < n) {
      float v = part[0][t];
      for (int k = 1; k < kGemmThreads / 32; ++k) v += part[k][t];
      y[(r0 + t) * a.ldy + o] = v;
    }
    __syncthreads();
  }
}

// W stored [in, out] row-major: one thread per output o (neighbouring threads
// read neighbouring words of a W row), summing over i in order.
__global__ void RowsGemmTransposedKernel(RowsGemmArgs a) {
  const std::size_t o = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= a.out) return;
  const float* __restrict__ w = a.w + blockIdx.y * a.w_batch + o;
  const float* __restrict__ x = a.x + blockIdx.y * a.x_batch;
  float* y = a.y + blockIdx.y * a.y_batch;
  for (std::size_t r0 = 0; r0 < a.rows; r0 += kGemmRowsPerPass) {
    const std::size_t n = a.rows - r0 < kGemmRowsPerPass ? a.rows - r0 : kGemmRowsPerPass;
    float acc[kGemmRowsPerPass] = {};
#pragma unroll 8
    for (std::size_t i = 0; i < a.in; ++i) {
      const float wi = __ldg(w + i * a.out);
#pragma unroll
      for (int r = 0; r < kGemmRowsPerPass; ++r)
        if (r < n) acc[r] = fmaf(wi, __ldg(x + (r0 + r) * a.ldx + i), acc[r]);
    }
    for (std::size_t r = 0; r < n; ++r) y[(r0 + r) * a.ldy + o] = acc[r];
  }
}

}  // namespace

Status RmsNormRowsCuda(const RmsNormArgs& a, void* stream) {
  if (a.rows == 0) return Status::Ok();
  RmsNormKernel<<<static_cast<unsigned>(a.rows), kBlock, 0, S(stream)>>>(a);
  return Launched("RMSNorm");
}

Status L2NormRowsCuda(const L2NormArgs& a, void* stream) {
  if (a.tokens * a.per_token == 0) return Status::Ok();
  L2NormKernel<<<static_cast<unsigned>(a.tokens * a.per_token), kBlock, 0, S(stream)>>>(a);
  return Launched("L2 norm");
}

Status RopeCuda(const RopeArgs& a, void* stream) {
  if (a.n % 2 != 0) return Status::InvalidArgument("RoPE over an odd width");
  const std::size_t total = a.tokens * a.groups * (a.n / 2);
  if (total == 0) return Status::Ok();
  RopeKernel<<<Blocks(total), kBlock, 0, S(stream)>>>(a);
  return Launched("RoPE");
}

Status SiluMulCuda(float* a, const float* b, std::size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  SiluMulKernel<<<Blocks(n), kBlock, 0, S(stream)>>>(a, b, n);
  return Launched("SiLU-mul");
}

Status AddCuda(float* x, const float* y, std::size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  AddKernel<<<Blocks(n), kBlock, 0, S(stream)>>>(x, y, n);
  return Launched("add");
}

Status GatherRowsCuda(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                      std::size_t count, float* x, void* stream) {
  if (count * n == 0) return Status::Ok();
  GatherKernel<<<Blocks(count * n), kBlock, 0, S(stream)>>>(table, vocab, n, tokens, count, x);
  return Launched("gather");
}

Status KdaConvCuda(const KdaConvArgs& a, void* stream) {
  if (a.kernel < 2) return Status::InvalidArgument("KDA conv: kernel must be >= 2");
  if (a.count * a.channels == 0) return Status::Ok();
  KdaConvKernel<<<Blocks(a.count * a.channels), kBlock, 0, S(stream)>>>(a);
  return Launched("KDA conv");
}

Status KdaOutputCuda(float* o, const float* gate, const float* w, std::size_t count, std::size_t heads, std::size_t d,
                     float eps, void* stream) {
  if (count * heads == 0) return Status::Ok();
  KdaOutputKernel<<<static_cast<unsigned>(count * heads), kBlock, 0, S(stream)>>>(o, gate, w, d, eps);
  return Launched("KDA output");
}

Status MlaRowsCuda(const MlaRowsArgs& a, void* stream) {
  if (a.rope_dim % 2 != 0) return Status::InvalidArgument("MLA rows: odd rope_dim");
  if (a.count == 0) return Status::Ok();
  MlaRowsKernel<<<static_cast<unsigned>(a.count), kBlock, 0, S(stream)>>>(a);
  return Launched("MLA rows");
}

Status RowsGemmCuda(const RowsGemmArgs& a, void* stream) {
  if (a.rows * a.out * a.batch == 0) return Status::Ok();
  if (a.batch > 65535) return Status::InvalidArgument("rows GEMM: more than 65535 operands");
  if (a.w_transposed) {
    const dim3 grid(Blocks(a.out), static_cast<unsigned>(a.batch));
    RowsGemmTransposedKernel<<<grid, kBlock, 0, S(stream)>>>(a);
  } else {
    if (a.out > 0x7fffffff) return Status::InvalidArgument("rows GEMM: too many outputs");
    const dim3 grid(static_cast<unsigned>(a.out), static_cast<unsigned>(a.batch));
    RowsGemmKernel<<<grid, kGemmThreads, 0, S(stream)>>>(a);
  }
  return Launched("rows GEMM");
}

Status ArgmaxRowsCuda(const float* x, std::size_t rows, std::size_t n, std::uint32_t* out, void* stream) {
  if (rows == 0) return Status::Ok();
  ArgmaxKernel<<<static_cast<unsigned>(rows), kBlock, 0, S(stream)>>>(x, n, out);
  return Launched("argmax");
}

}  // namespace primecache::kernels

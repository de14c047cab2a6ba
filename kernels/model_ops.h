// The reference model's small per-token operations over runs of tokens, on
// the CPU (the reference twins) and on CUDA. Every array is row-major f32,
// one row per token unless said otherwise. The CPU twins run the same order
// of operations as engine/model/cpu_ops and the reference model; the CUDA
// versions take device pointers and a stream (a cudaStream_t), and return
// NotSupported without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "primecache/status.h"

namespace primecache::kernels {

// y[r] = w ⊙ x[r] / sqrt(mean(x[r]²) + eps) for `rows` rows of n values;
// row r of x starts at x + r*x_stride (y likewise). y may equal x.
struct RmsNormArgs {
  const float* x = nullptr;
  float* y = nullptr;
  const float* w = nullptr;
  std::size_t rows = 0, n = 0, x_stride = 0, y_stride = 0;
  float eps = 1e-6f;
};
Status RmsNormRowsCpu(const RmsNormArgs& a);
Status RmsNormRowsCuda(const RmsNormArgs& a, void* stream);

// z / sqrt(Σz² + 1e-6) over groups of n values, in place: `per_token` groups
// side by side (group h of token t at x + t*token_stride + h*n) for `tokens`
// tokens.
struct L2NormArgs {
  float* x = nullptr;
  std::size_t tokens = 0, per_token = 0, n = 0, token_stride = 0;
};
Status L2NormRowsCpu(const L2NormArgs& a);
Status L2NormRowsCuda(const L2NormArgs& a, void* stream);

// RoPE on one n-wide segment per (token, group): the segment of token i,
// group h starts at v + i*token_stride + h*group_stride + offset and is
// rotated for position first_pos + i.
struct RopeArgs {
  float* v = nullptr;
  std::size_t tokens = 0, groups = 0, token_stride = 0, group_stride = 0, offset = 0, n = 0;
  std::uint64_t first_pos = 0;
  float theta = 10000.0f;
};
Status RopeCpu(const RopeArgs& a);
Status RopeCuda(const RopeArgs& a, void* stream);

// a[i] = silu(a[i]) * b[i].
Status SiluMulCpu(float* a, const float* b, std::size_t n);
Status SiluMulCuda(float* a, const float* b, std::size_t n, void* stream);

// x[i] += y[i].
Status AddCpu(float* x, const float* y, std::size_t n);
Status AddCuda(float* x, const float* y, std::size_t n, void* stream);

// x[t] = table[tokens[t]] (rows of width n); tokens must be < vocab.
Status GatherRowsCpu(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                     std::size_t count, float* x);
Status GatherRowsCuda(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                      std::size_t count, float* x, void* stream);

// The KDA short conv over a run: for channel c and token t,
//   y = Σ_{i<K-1} taps[c,i]·in[t-(K-1)+i, c] + taps[c,K-1]·in[t, c],
// where inputs before the run come from ring [channels, K-1] (oldest first),
// then out[t, c] = silu(y). The ring is read, not updated.
struct KdaConvArgs {
  const float* inputs = nullptr;  // [count, channels]
  const float* taps = nullptr;    // [channels, kernel]
  const float* ring = nullptr;    // [channels, kernel-1]
  float* out = nullptr;           // [count, channels]
  std::size_t channels = 0, kernel = 0, count = 0;
};
Status KdaConvCpu(const KdaConvArgs& a);
Status KdaConvCuda(const KdaConvArgs& a, void* stream);

// KDA output: per token and head, o_h = RMSNorm(o_h; w) ⊙ sigmoid(gate_h),
// in place over o [count, heads*d]; gate [count, heads*d].
Status KdaOutputCpu(float* o, const float* gate, const float* w, std::size_t count, std::size_t heads,
                    std::size_t d, float eps);
Status KdaOutputCuda(float* o, const float* gate, const float* w, std::size_t count, std::size_t heads,
                     std::size_t d, float eps, void* stream);

// MLA latent rows from a = wdkv·u [count, kv_rank + rope_dim]: row =
// [RMSNorm(a[:kv_rank]; w) | RoPE(a[kv_rank:], pos)], written to
// rows + i*row_stride for token i at position first_pos + i.
struct MlaRowsArgs {
  const float* a = nullptr;
  const float* w = nullptr;
  float* rows = nullptr;
  std::size_t count = 0, kv_rank = 0, rope_dim = 0, row_stride = 0;
  std::uint64_t first_pos = 0;
  float eps = 1e-6f, theta = 10000.0f;
};
Status MlaRowsCpu(const MlaRowsArgs& a);
Status MlaRowsCuda(const MlaRowsArgs& a, void* stream);

// Products for calls of few rows: y[b][r, o] = Σ_i W_b[o, i] · x[b][r, i] for
// `batch` independent operands (operand b at w + b*w_batch, x + b*x_batch,
// y + b*y_batch; row r of x at +r*ldx, of y at +r*ldy). W_b is [out, in]
// row-major, or [in, out] row-major when w_transposed. The sum for one (r, o)
// runs in one fixed order that does not depend on `rows`: a row's result is
// bit-identical whether it is computed alone or with others, which is what
// makes a verify call's rows equal one-token decode calls on CUDA (cuBLAS
// picks its algorithm, and so its rounding, by shape).
struct RowsGemmArgs {
  const float* x = nullptr;
  const float* w = nullptr;
  float* y = nullptr;
  std::size_t ldx = 0, ldy = 0, rows = 0, in = 0, out = 0;
  std::size_t batch = 1, x_batch = 0, w_batch = 0, y_batch = 0;
  bool w_transposed = false;
};
Status RowsGemmCpu(const RowsGemmArgs& a);
Status RowsGemmCuda(const RowsGemmArgs& a, void* stream);

// Greedy choice per row: the index of the largest value, the lowest index on ties.
Status ArgmaxRowsCpu(const float* x, std::size_t rows, std::size_t n, std::uint32_t* out);
Status ArgmaxRowsCuda(const float* x, std::size_t rows, std::size_t n, std::uint32_t* out, void* stream);

}  // namespace primecache::kernels

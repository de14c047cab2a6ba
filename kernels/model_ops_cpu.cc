#include <cmath>
#include <string>

#include "kernels/cpu_math.h"
#include "kernels/model_ops.h"

namespace primecache::kernels {

Status RmsNormRowsCpu(const RmsNormArgs& a) {
  for (std::size_t r = 0; r < a.rows; ++r) cpu::RmsNorm(a.x + r * a.x_stride, a.w, a.n, a.eps, a.y + r * a.y_stride);
  return Status::Ok();
}

Status L2NormRowsCpu(const L2NormArgs& a) {
  for (std::size_t t = 0; t < a.tokens; ++t)
    for (std::size_t h = 0; h < a.per_token; ++h) cpu::L2Normalize(a.x + t * a.token_stride + h * a.n, a.n);
  return Status::Ok();
}

Status RopeCpu(const RopeArgs& a) {
  if (a.n % 2 != 0) return Status::InvalidArgument("RoPE over an odd width");
  for (std::size_t i = 0; i < a.tokens; ++i)
    for (std::size_t h = 0; h < a.groups; ++h)
      cpu::Rope(a.v + i * a.token_stride + h * a.group_stride + a.offset, a.n, a.first_pos + i, a.theta);
  return Status::Ok();
}

Status SiluMulCpu(float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] = cpu::Silu(a[i]) * b[i];
  return Status::Ok();
}

Status AddCpu(float* x, const float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] += y[i];
  return Status::Ok();
}

Status GatherRowsCpu(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                     std::size_t count, float* x) {
  for (std::size_t t = 0; t < count; ++t) {
    if (tokens[t] >= vocab) {
      return Status::InvalidArgument("token " + std::to_string(tokens[t]) + " outside a vocabulary of " +
                                     std::to_string(vocab));
    }
  }
  for (std::size_t t = 0; t < count; ++t)
    for (std::size_t i = 0; i < n; ++i) x[t * n + i] = table[std::size_t{tokens[t]} * n + i];
  return Status::Ok();
}

Status KdaConvCpu(const KdaConvArgs& a) {
  if (a.kernel < 2) return Status::InvalidArgument("KDA conv: kernel must be >= 2");
  const std::size_t C = a.channels, K = a.kernel;
  for (std::size_t t = 0; t < a.count; ++t) {
    for (std::size_t c = 0; c < C; ++c) {
      const float* w = a.taps + c * K;
      float y = 0.0f;
      for (std::size_t i = 0; i + 1 < K; ++i) {
        // Input t-(K-1)+i: from the run when non-negative, else from the ring.
        const long src = static_cast<long>(t) - static_cast<long>(K - 1) + static_cast<long>(i);
        const float in = src >= 0 ? a.inputs[static_cast<std::size_t>(src) * C + c]
                                  : a.ring[c * (K - 1) + static_cast<std::size_t>(static_cast<long>(K - 1) + src)];
        y += w[i] * in;
      }
      y += w[K - 1] * a.inputs[t * C + c];
      a.out[t * C + c] = cpu::Silu(y);
    }
  }
  return Status::Ok();
}

Status KdaOutputCpu(float* o, const float* gate, const float* w, std::size_t count, std::size_t heads, std::size_t d,
                    float eps) {
  for (std::size_t r = 0; r < count * heads; ++r) {
    float* oh = o + r * d;
    cpu::RmsNorm(oh, w, d, eps, oh);
    for (std::size_t j = 0; j < d; ++j) oh[j] *= cpu::Sigmoid(gate[r * d + j]);
  }
  return Status::Ok();
}

Status MlaRowsCpu(const MlaRowsArgs& a) {
  const std::size_t width = a.kv_rank + a.rope_dim;
  for (std::size_t i = 0; i < a.count; ++i) {
    const float* in = a.a + i * width;
    float* row = a.rows + i * a.row_stride;
    cpu::RmsNorm(in, a.w, a.kv_rank, a.eps, row);
    for (std::size_t j = 0; j < a.rope_dim; ++j) row[a.kv_rank + j] = in[a.kv_rank + j];
    cpu::Rope(row + a.kv_rank, a.rope_dim, a.first_pos + i, a.theta);
  }
  return Status::Ok();
}

Status RowsGemmCpu(const RowsGemmArgs& a) {
  for (std::size_t b = 0; b < a.batch; ++b) {
    const float* w = a.w + b * a.w_batch;
    for (std::size_t r = 0; r < a.rows; ++r) {
      const float* x = a.x + b * a.x_batch + r * a.ldx;
      float* y = a.y + b * a.y_batch + r * a.ldy;
      if (!a.w_transposed) {
        cpu::MatVec(w, a.out, a.in, x, y);
        continue;
      }
      for (std::size_t o = 0; o < a.out; ++o) {
        float s = 0.0f;
        for (std::size_t i = 0; i < a.in; ++i) s += w[i * a.out + o] * x[i];
        y[o] = s;
      }
    }
  }
  return Status::Ok();
}

Status ArgmaxRowsCpu(const float* x, std::size_t rows, std::size_t n, std::uint32_t* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < n; ++i)
      if (x[r * n + i] > x[r * n + best]) best = i;
    out[r] = static_cast<std::uint32_t>(best);
  }
  return Status::Ok();
}

}  // namespace primecache::kernels

#ifndef PRIMECACHE_HAVE_CUDA
namespace primecache::kernels {
namespace {
Status NoCuda() { return Status::NotSupported("primecache was built without CUDA"); }
}  // namespace
Status RmsNormRowsCuda(const RmsNormArgs&, void*) { return NoCuda(); }
Status L2NormRowsCuda(const L2NormArgs&, void*) { return NoCuda(); }
Status RopeCuda(const RopeArgs&, void*) { return NoCuda(); }
Status SiluMulCuda(float*, const float*, std::size_t, void*) { return NoCuda(); }
Status AddCuda(float*, const float*, std::size_t, void*) { return NoCuda(); }
Status GatherRowsCuda(const float*, std::size_t, std::size_t, const std::uint32_t*, std::size_t, float*, void*) {
  return NoCuda();
}
Status KdaConvCuda(const KdaConvArgs&, void*) { return NoCuda(); }
Status RowsGemmCuda(const RowsGemmArgs&, void*) { return NoCuda(); }
Status KdaOutputCuda(float*, const float*, const float*, std::size_t, std::size_t, std::size_t, float, void*) {
  return NoCuda();
}
Status MlaRowsCuda(const MlaRowsArgs&, void*) { return NoCuda(); }
Status ArgmaxRowsCuda(const float*, std::size_t, std::size_t, std::uint32_t*, void*) { return NoCuda(); }
}  // namespace primecache::kernels
#endif

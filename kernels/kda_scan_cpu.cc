#include <cmath>
#include <vector>

#include "kernels/kda_scan.h"

namespace primecache::kernels {
namespace {
float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
}  // namespace

Status ValidateKdaScanArgs(const KdaScanArgs& a) {
  if (a.count == 0) return Status::Ok();
  if (!a.q || !a.k || !a.v || !a.g || !a.b || !a.state || !a.out) {
    return Status::InvalidArgument("KDA scan: null pointer");
  }
  if (a.heads == 0 || a.head_dim == 0) return Status::InvalidArgument("KDA scan: heads and head_dim must be > 0");
  if (!(a.gate_lower_bound < 0.0f)) return Status::InvalidArgument("KDA scan: gate_lower_bound must be negative");
  return Status::Ok();
}

Status KdaScanCpu(const KdaScanArgs& a) {
  PC_RETURN_IF_ERROR(ValidateKdaScanArgs(a));
  const std::size_t n = a.heads, d = a.head_dim, nd = n * d, ts = QkvTokenStride(a);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> alpha(d);
  for (std::size_t t = 0; t < a.count; ++t) {
    for (std::size_t h = 0; h < n; ++h) {
      const float* q = a.q + t * ts + h * d;
      const float* k = a.k + t * ts + h * d;
      const float* v = a.v + t * ts + h * d;
      const float* g = a.g + t * nd + h * d;
      const float beta = Sigmoid(a.b[t * n + h]);
      float* S = a.state + h * d * d;
      float* o = a.out + t * nd + h * d;
      for (std::size_t i = 0; i < d; ++i) alpha[i] = std::exp(a.gate_lower_bound * Sigmoid(g[i]));
      // Column by column, in the order the CUDA kernel uses per thread.
      for (std::size_t j = 0; j < d; ++j) {
        float pred = 0.0f;
        for (std::size_t i = 0; i < d; ++i) {
          float s = S[i * d + j] * alpha[i];
          S[i * d + j] = s;
          pred += s * k[i];
        }
        const float delta = beta * (v[j] - pred);
        float acc = 0.0f;
        for (std::size_t i = 0; i < d; ++i) {
          float s = S[i * d + j] + k[i] * delta;
          S[i * d + j] = s;
          acc += s * q[i];
        }
        o[j] = acc * inv_sqrt_d;
      }
    }
  }
  return Status::Ok();
}

#ifndef PRIMECACHE_HAVE_CUDA
Status KdaScanCuda(const KdaScanArgs&, void*) { return Status::NotSupported("primecache was built without CUDA"); }
#endif

}  // namespace primecache::kernels

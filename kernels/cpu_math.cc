#include "kernels/cpu_math.h"

#include <cmath>

namespace primecache::kernels::cpu {

float Dot(const float* a, const float* b, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void MatVec(const float* w, std::size_t out, std::size_t in, const float* x, float* y) {
  for (std::size_t o = 0; o < out; ++o) y[o] = Dot(w + o * in, x, in);
}

void RmsNorm(const float* x, const float* w, std::size_t n, float eps, float* y) {
  float ss = 0.0f;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::size_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * inv);
}

void Rope(float* v, std::size_t n, std::uint64_t t, float theta) {
  for (std::size_t i = 0; i < n / 2; ++i) {
    // The angle in double, then rounded once: positions reach 10^5 and more.
    const double freq = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(n));
    const double angle = static_cast<double>(t) * freq;
    const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
    const float v0 = v[2 * i], v1 = v[2 * i + 1];
    v[2 * i] = v0 * c - v1 * s;
    v[2 * i + 1] = v0 * s + v1 * c;
  }
}

float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
float Silu(float z) { return z * Sigmoid(z); }

void L2Normalize(float* z, std::size_t n) {
  float ss = 0.0f;
  for (std::size_t i = 0; i < n; ++i) ss += z[i] * z[i];
  const float inv = 1.0f / std::sqrt(ss + 1e-6f);
  for (std::size_t i = 0; i < n; ++i) z[i] *= inv;
}

}  // namespace primecache::kernels::cpu

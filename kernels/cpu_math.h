// Scalar f32 math shared by the CPU twins and the CPU reference model: one
// fixed reduction order (index order, left to right, one accumulator), no
// threads. Obviously right first. All functions are pure over their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace primecache::kernels::cpu {

// y[o] = sum_i W[o, i] x[i]; W is [out, in] row-major.
void MatVec(const float* w, std::size_t out, std::size_t in, const float* x, float* y);

// y = w ⊙ x / sqrt(mean(x²) + eps), n values.
void RmsNorm(const float* x, const float* w, std::size_t n, float eps, float* y);

// Rotates the pairs (v[2i], v[2i+1]) by t·theta^(-2i/n), in place; n even.
void Rope(float* v, std::size_t n, std::uint64_t t, float theta);

float Sigmoid(float z);
float Silu(float z);

// z / sqrt(sum z² + 1e-6), in place.
void L2Normalize(float* z, std::size_t n);

float Dot(const float* a, const float* b, std::size_t n);

}  // namespace primecache::kernels::cpu

// The KDA (Kimi Delta Attention) recurrence over a run of tokens, on the CPU
// (the reference twin) and on CUDA.
//
// Per head h and token t, with q_t, k_t already l2-normalised, v_t raw:
//   alpha_t[i] = exp(gate_lower_bound * sigmoid(g_t[h*d + i]))
//   beta_t     = sigmoid(b_t[h])
//   S'         = Diag(alpha_t) S                      (row i: key dim)
//   S          = S' + beta_t k_t (v_t - S'^T k_t)^T
//   o_t        = S^T q_t / sqrt(d)
// The state is [heads, d, d] (S[i*d + j], row i key dim, column j value dim)
// and is updated in place. A column j of S evolves independently of the
// others, which is what the CUDA kernel parallelises over.
#pragma once

#include <cstddef>

#include "primecache/status.h"

namespace primecache::kernels {

struct KdaScanArgs {
  const float* q = nullptr;     // [count, heads*d], l2-normalised per head
  const float* k = nullptr;     // [count, heads*d], l2-normalised per head
  const float* v = nullptr;     // [count, heads*d]
  const float* g = nullptr;     // [count, heads*d], gate logits
  const float* b = nullptr;     // [count, heads], beta logits
  float* state = nullptr;       // [heads, d, d], in place
  float* out = nullptr;         // [count, heads*d]
  std::size_t heads = 0;
  std::size_t head_dim = 0;
  std::size_t count = 0;
  float gate_lower_bound = -5.0f;
  std::size_t qkv_token_stride = 0;  // floats between tokens of q, k and v; 0: heads*d
};

// The q/k/v token stride with its default filled in.
inline std::size_t QkvTokenStride(const KdaScanArgs& a) {
  return a.qkv_token_stride ? a.qkv_token_stride : a.heads * a.head_dim;
}

Status ValidateKdaScanArgs(const KdaScanArgs& args);
Status KdaScanCpu(const KdaScanArgs& args);
// Device pointers, enqueued on `stream`; NotSupported without CUDA.
Status KdaScanCuda(const KdaScanArgs& args, void* stream);

}  // namespace primecache::kernels

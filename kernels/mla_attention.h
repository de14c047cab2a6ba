// Absorbed MLA attention over the latent plane, for a run of queries, on the
// CPU (the reference twin) and on CUDA.
//
// Query i sits at position first_pos + i. Per head h it carries the absorbed
// query qt[i, h] (kv_rank wide: wuk[h]^T · q_nope) and the roped qp[i, h]
// (rope_dim wide). Its attended set S is, in this order:
//  - dense (pools == nullptr): every position 0 .. pos;
//  - sparse: the tokens of the selected pools pools[i, 0 .. pool_count[i]),
//    in the order given (the caller sorts them ascending), each pool p
//    covering [p·pool, (p+1)·pool), then the incomplete tail
//    [⌊(pos+1)/pool⌋·pool, pos].
// For each s in S: score = (qt·c_s + qp·kpe_s) · scale, where row s of the
// latent plane is [c_s (kv_rank) | kpe_s (rope_dim)]; the output is
// out[i, h] = Σ softmax(score)_s · c_s (kv_rank wide).
#pragma once

#include <cstddef>
#include <cstdint>

#include "primecache/status.h"

namespace primecache::kernels {

struct MlaAttentionArgs {
  const float* qt = nullptr;          // [count, heads, kv_rank]
  const float* qp = nullptr;          // query i, head h at qp + i*qp_token_stride + h*qp_head_stride; unused when rope_dim == 0
  std::size_t qp_token_stride = 0;    // 0: heads * rope_dim (contiguous)
  std::size_t qp_head_stride = 0;     // 0: rope_dim
  const float* rows = nullptr;        // latent plane, row s at rows + s * (kv_rank + rope_dim)
  const std::uint32_t* pools = nullptr;       // [count, pool_stride] or null (dense)
  const std::uint32_t* pool_count = nullptr;  // [count] (sparse only)
  float* out = nullptr;               // [count, heads, kv_rank]
  std::size_t count = 0;
  std::uint64_t first_pos = 0;
  std::size_t heads = 0;
  std::size_t kv_rank = 0;
  std::size_t rope_dim = 0;
  std::size_t pool = 0;          // sparse only
  std::size_t pool_stride = 0;   // sparse only: entries per query in `pools`
  float scale = 1.0f;
};

Status ValidateMlaAttentionArgs(const MlaAttentionArgs& args);
// The qp strides with the contiguous defaults filled in.
std::size_t QpTokenStride(const MlaAttentionArgs& args);
std::size_t QpHeadStride(const MlaAttentionArgs& args);
Status MlaAttentionCpu(const MlaAttentionArgs& args);
// Device pointers, enqueued on `stream`; NotSupported without CUDA.
Status MlaAttentionCuda(const MlaAttentionArgs& args, void* stream);

}  // namespace primecache::kernels

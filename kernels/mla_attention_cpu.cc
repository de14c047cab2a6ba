#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/mla_attention.h"

namespace primecache::kernels {

std::size_t QpTokenStride(const MlaAttentionArgs& a) {
  return a.qp_token_stride ? a.qp_token_stride : a.heads * a.rope_dim;
}
std::size_t QpHeadStride(const MlaAttentionArgs& a) { return a.qp_head_stride ? a.qp_head_stride : a.rope_dim; }

Status ValidateMlaAttentionArgs(const MlaAttentionArgs& a) {
  if (a.count == 0) return Status::Ok();
  if (!a.qt || !a.rows || !a.out || (a.rope_dim > 0 && !a.qp)) {
    return Status::InvalidArgument("MLA attention: null pointer");
  }
  if (a.heads == 0 || a.kv_rank == 0) return Status::InvalidArgument("MLA attention: heads and kv_rank must be > 0");
  if (a.pools != nullptr) {
    if (a.pool_count == nullptr || a.pool == 0 || a.pool_stride == 0) {
      return Status::InvalidArgument("MLA attention: sparse selection needs pool_count, pool and pool_stride");
    }
  }
  return Status::Ok();
}

Status MlaAttentionCpu(const MlaAttentionArgs& a) {
  PC_RETURN_IF_ERROR(ValidateMlaAttentionArgs(a));
  const std::size_t r = a.kv_rank, dr = a.rope_dim, width = r + dr;
  std::vector<std::uint64_t> S;
  std::vector<float> score;
  for (std::size_t i = 0; i < a.count; ++i) {
    const std::uint64_t pos = a.first_pos + i;
    S.clear();
    if (a.pools == nullptr) {
      for (std::uint64_t s = 0; s <= pos; ++s) S.push_back(s);
    } else {
      for (std::uint32_t k = 0; k < a.pool_count[i]; ++k) {
        const std::uint64_t p = a.pools[i * a.pool_stride + k];
        for (std::size_t j = 0; j < a.pool; ++j) S.push_back(p * a.pool + j);
      }
      for (std::uint64_t s = (pos + 1) / a.pool * a.pool; s <= pos; ++s) S.push_back(s);
    }
    score.resize(S.size());
    for (std::size_t h = 0; h < a.heads; ++h) {
      const float* qt = a.qt + (i * a.heads + h) * r;
      const float* qp = dr ? a.qp + i * QpTokenStride(a) + h * QpHeadStride(a) : nullptr;
      float mx = -INFINITY;
      for (std::size_t k = 0; k < S.size(); ++k) {
        const float* c = a.rows + S[k] * width;
        float dot = 0.0f;
        for (std::size_t j = 0; j < r; ++j) dot += qt[j] * c[j];
        float rope = 0.0f;
        for (std::size_t j = 0; j < dr; ++j) rope += qp[j] * c[r + j];
        score[k] = (dot + rope) * a.scale;
        mx = std::max(mx, score[k]);
      }
      float sum = 0.0f;
      for (float& s : score) {
        s = std::exp(s - mx);
        sum += s;
      }
      float* o = a.out + (i * a.heads + h) * r;
      std::fill(o, o + r, 0.0f);
      for (std::size_t k = 0; k < S.size(); ++k) {
        const float p = score[k] / sum;
        const float* c = a.rows + S[k] * width;
        for (std::size_t j = 0; j < r; ++j) o[j] += p * c[j];
      }
    }
  }
  return Status::Ok();
}

#ifndef PRIMECACHE_HAVE_CUDA
Status MlaAttentionCuda(const MlaAttentionArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
#endif

}  // namespace primecache::kernels

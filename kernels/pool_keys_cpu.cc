#include <cmath>
#include <string>

#include "kernels/pool_keys.h"

namespace primecache::kernels {

Status ValidatePoolKeyArgs(const PoolKeyArgs& a) {
  if (a.pool_count == 0) return Status::Ok();
  if (a.index_rows == nullptr || a.ape == nullptr || a.keys == nullptr) {
    return Status::InvalidArgument("pool-key build: null pointer");
  }
  if (a.pool == 0 || a.head_dim == 0) return Status::InvalidArgument("pool-key build: pool and head_dim must be > 0");
  if (a.ring_rows != 0) {
    if (a.ring_rows % a.pool != 0) {
      return Status::InvalidArgument("pool-key build: ring of " + std::to_string(a.ring_rows) +
                                     " rows is not a multiple of pool " + std::to_string(a.pool));
    }
  }
  return Status::Ok();
}

Status BuildPoolKeysCpu(const PoolKeyArgs& a) {
  PC_RETURN_IF_ERROR(ValidatePoolKeyArgs(a));
  const std::size_t d = a.head_dim;
  for (std::size_t p = a.first_pool; p < a.first_pool + a.pool_count; ++p) {
    for (std::size_t c = 0; c < d; ++c) {
      // Same order of operations as the CUDA kernel: max, then exp-sum and
      // weighted sum in one pass over j, then one division.
      float m = -INFINITY;
      for (std::size_t j = 0; j < a.pool; ++j) {
        std::size_t token = p * a.pool + j;
        std::size_t row = a.ring_rows ? token % a.ring_rows : token;
        float z = a.index_rows[row * 2 * d + d + c] + a.ape[j * d + c];
        m = std::fmax(m, z);
      }
      float sum = 0.0f, acc = 0.0f;
      for (std::size_t j = 0; j < a.pool; ++j) {
        std::size_t token = p * a.pool + j;
        std::size_t row = a.ring_rows ? token % a.ring_rows : token;
        const float* r = a.index_rows + row * 2 * d;
        float w = std::exp(r[d + c] + a.ape[j * d + c] - m);
        sum += w;
        acc += w * r[c];
      }
      a.keys[p * d + c] = acc / sum;
    }
  }
  return Status::Ok();
}

#ifndef PRIMECACHE_HAVE_CUDA
Status BuildPoolKeysCuda(const PoolKeyArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
#endif

}  // namespace primecache::kernels

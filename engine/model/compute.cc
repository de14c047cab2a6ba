// The three matrix-product shapes of the forward pass, each written as the one
// product (kernels::RowsGemmArgs) that every backend implements.
#include "engine/model/compute.h"

namespace primecache::model {

Status Compute::Gemm(const float* x, std::size_t ldx, const float* w, float* y, std::size_t ldy, std::size_t rows,
                     std::size_t in, std::size_t out) {
  return Product({.x = x, .w = w, .y = y, .ldx = ldx, .ldy = ldy, .rows = rows, .in = in, .out = out});
}

Status Compute::AbsorbQuery(const float* q, const float* wuk, float* qt, std::size_t tokens, std::size_t heads,
                            std::size_t dn, std::size_t dr, std::size_t r) {
  // Head h: W = wuk[h] stored [dn, r] (the transpose of the [r, dn] product),
  // its queries every heads*(dn+dr) words from h*(dn+dr).
  return Product({.x = q, .w = wuk, .y = qt,
                  .ldx = heads * (dn + dr), .ldy = heads * r, .rows = tokens, .in = dn, .out = r,
                  .batch = heads, .x_batch = dn + dr, .w_batch = dn * r, .y_batch = r,
                  .w_transposed = true});
}

Status Compute::HeadsOut(const float* o, const float* wuv, float* out, std::size_t tokens, std::size_t heads,
                         std::size_t r, std::size_t dv) {
  // Head h: W = wuv[h] stored [dv, r]; its rows of o every heads*r words from h*r.
  return Product({.x = o, .w = wuv, .y = out,
                  .ldx = heads * r, .ldy = heads * dv, .rows = tokens, .in = r, .out = dv,
                  .batch = heads, .x_batch = r, .w_batch = dv * r, .y_batch = dv});
}

}  // namespace primecache::model

// The three matrix-product shapes of the forward pass, each written as the one
// product (kernels::RowsGemmArgs) that every backend implements.
#include "engine/model/compute.h"

namespace primecache::model {

Status Compute::Gemm(const float* x, std::size_t ldx, const float* w, float* y, std::size_t ldy, std::size_t rows,
                     std::size_t in, std::size_t out) {
  kernels::RowsGemmArgs a;
  a.x = x;
  a.w = w;
  a.y = y;
  a.ldx = ldx;
  a.ldy = ldy;
  a.rows = rows;
  a.in = in;
  a.out = out;
  return Product(a);
}

Status Compute::AbsorbQuery(const float* q, const float* wuk, float* qt, std::size_t tokens, std::size_t heads,
                            std::size_t dn, std::size_t dr, std::size_t r) {
  // Head h: W = wuk[h] stored [dn, r] (the transpose of the [r, dn] product),
  // its queries every heads*(dn+dr) words from h*(dn+dr).
  kernels::RowsGemmArgs a;
  a.x = q;
  a.w = wuk;
  a.y = qt;
  a.ldx = heads * (dn + dr);
  a.ldy = heads * r;
  a.rows = tokens;
  a.in = dn;
  a.out = r;
  a.batch = heads;
  a.x_batch = dn + dr;
  a.w_batch = dn * r;
  a.y_batch = r;
  a.w_transposed = true;
  return Product(a);
}

Status Compute::HeadsOut(const float* o, const float* wuv, float* out, std::size_t tokens, std::size_t heads,
                         std::size_t r, std::size_t dv) {
  kernels::RowsGemmArgs a;
  a.x = o;
  a.w = wuv;
  a.y = out;
  a.ldx = heads * r;
  a.ldy = heads * dv;
  a.rows = tokens;
  a.in = r;
  a.out = dv;
  a.batch = heads;
  a.x_batch = r;
  a.w_batch = dv * r;
  a.y_batch = dv;
  return Product(a);
}

}  // namespace primecache::model

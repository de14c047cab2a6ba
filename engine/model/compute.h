// Compute: the model's arithmetic on one backend. The CPU backend runs the
// CPU twins (kernels/*_cpu.cc), matrix products included, in the reference
// order; the CUDA backend runs the CUDA kernels (and cuBLAS SGEMM, f32, TF32
// off, for products of many rows) on one stream. Pointers are host pointers
// on the CPU backend and device pointers on CUDA. The forward pass (HybridModel) is
// written once against this interface.
//
// Thread-safety: one thread at a time per Compute.
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/indexer_select.h"
#include "kernels/kda_scan.h"
#include "kernels/kv_attention.h"
#include "kernels/mla_attention.h"
#include "kernels/model_ops.h"
#include "kernels/pool_keys.h"
#include "primecache/status.h"

namespace primecache::model {

class Compute {
 public:
  virtual ~Compute() = default;
  static std::unique_ptr<Compute> NewCpu();
  // A cuBLAS handle on `stream` (a cudaStream_t; null for the default stream).
  // NotSupported when built without CUDA.
  static Result<std::unique_ptr<Compute>> NewCuda(void* stream);

  virtual bool on_device() const = 0;

  // Calls of at most this many rows compute every row independently of the
  // others, bit for bit, on every backend: a verify round's rows (γ + 1 ≤ 65
  // in the tools) equal one-token decode calls. Longer calls (prefill chunks)
  // may use a faster product whose rounding depends on the shape.
  static constexpr std::size_t kRowInvariantRows = 128;

  // y[r, :out] = W · x[r, :in] for `rows` rows; W is [out, in] row-major; row r
  // of x starts at x + r*ldx, of y at y + r*ldy.
  Status Gemm(const float* x, std::size_t ldx, const float* w, float* y, std::size_t ldy, std::size_t rows,
              std::size_t in, std::size_t out);
  // Absorbed queries: for token t and head h, qt[t, h, :r] = wuk[h]^T · q[t, h*(dn+dr) : +dn]
  // with wuk [heads, dn, r] row-major.
  Status AbsorbQuery(const float* q, const float* wuk, float* qt, std::size_t tokens, std::size_t heads,
                     std::size_t dn, std::size_t dr, std::size_t r);
  // Per-head value projection: out[t, h*dv : +dv] = wuv[h] · o[t, h, :r] with wuv [heads, dv, r].
  Status HeadsOut(const float* o, const float* wuv, float* out, std::size_t tokens, std::size_t heads,
                  std::size_t r, std::size_t dv);
  // The one matrix product behind the three above (kernels/model_ops.h).
  virtual Status Product(const kernels::RowsGemmArgs& a) = 0;

  virtual Status RmsNormRows(const kernels::RmsNormArgs& a) = 0;
  virtual Status L2NormRows(const kernels::L2NormArgs& a) = 0;
  virtual Status Rope(const kernels::RopeArgs& a) = 0;
  virtual Status SiluMul(float* a, const float* b, std::size_t n) = 0;
  virtual Status Add(float* x, const float* y, std::size_t n) = 0;
  virtual Status GatherRows(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                            std::size_t count, float* x) = 0;
  virtual Status KdaConv(const kernels::KdaConvArgs& a) = 0;
  virtual Status KdaScan(const kernels::KdaScanArgs& a) = 0;
  virtual Status KdaOutput(float* o, const float* gate, const float* w, std::size_t count, std::size_t heads,
                           std::size_t d, float eps) = 0;
  virtual Status MlaRows(const kernels::MlaRowsArgs& a) = 0;
  virtual Status MlaAttention(const kernels::MlaAttentionArgs& a) = 0;
  virtual Status IndexerSelect(const kernels::IndexerSelectArgs& a) = 0;
  virtual Status HadamardRows(const kernels::HadamardArgs& a) = 0;
  virtual Status TurboQuantEncode(const kernels::TurboQuantEncodeArgs& a) = 0;
  virtual Status KvAttention(const kernels::KvAttentionArgs& a) = 0;
  virtual Status ArgmaxRows(const float* x, std::size_t rows, std::size_t n, std::uint32_t* out) = 0;
};

}  // namespace primecache::model

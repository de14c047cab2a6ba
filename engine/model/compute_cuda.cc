// The CUDA Compute: the CUDA kernels and cuBLAS SGEMM on one stream. The
// handle's math mode is CUBLAS_DEFAULT_MATH, which keeps f32 products in f32
// (no TF32): the model must agree with the CPU reference within 1e-4.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "engine/model/compute.h"

namespace primecache::model {
namespace {

namespace k = kernels;

Status Cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

int I(std::size_t v) { return static_cast<int>(v); }

class CudaCompute final : public Compute {
 public:
  CudaCompute(cublasHandle_t h, void* stream) : handle_(h), stream_(stream) {}
  ~CudaCompute() override { cublasDestroy(handle_); }
  bool on_device() const override { return true; }

  Status Gemm(const float* x, std::size_t ldx, const float* w, float* y, std::size_t ldy, std::size_t rows,
              std::size_t in, std::size_t out) override {
    if (rows == 0) return Status::Ok();
    const float one = 1.0f, zero = 0.0f;
    // Column-major: Y^T [out, rows] = W^T^T · X^T, W row-major [out, in] is col-major [in, out].
    return Cublas(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, I(out), I(rows), I(in), &one, w, I(in), x, I(ldx),
                              &zero, y, I(ldy)),
                  "gemm");
  }

  Status AbsorbQuery(const float* q, const float* wuk, float* qt, std::size_t tokens, std::size_t heads,
                     std::size_t dn, std::size_t dr, std::size_t r) override {
    if (tokens == 0) return Status::Ok();
    const float one = 1.0f, zero = 0.0f;
    // Per head: QT_h^T [r, T] = wuk_h (col-major [r, dn]) · Qn_h^T [dn, T].
    return Cublas(cublasSgemmStridedBatched(handle_, CUBLAS_OP_N, CUBLAS_OP_N, I(r), I(tokens), I(dn), &one, wuk, I(r),
                                            static_cast<long long>(dn * r), q, I(heads * (dn + dr)),
                                            static_cast<long long>(dn + dr), &zero, qt, I(heads * r),
                                            static_cast<long long>(r), I(heads)),
                  "absorbed query");
  }

  Status HeadsOut(const float* o, const float* wuv, float* out, std::size_t tokens, std::size_t heads, std::size_t r,
                  std::size_t dv) override {
    if (tokens == 0) return Status::Ok();
    const float one = 1.0f, zero = 0.0f;
    // Per head: OUT_h^T [dv, T] = wuv_h [dv, r] (col-major [r, dv], transposed) · O_h^T [r, T].
    return Cublas(cublasSgemmStridedBatched(handle_, CUBLAS_OP_T, CUBLAS_OP_N, I(dv), I(tokens), I(r), &one, wuv, I(r),
                                            static_cast<long long>(dv * r), o, I(heads * r),
                                            static_cast<long long>(r), &zero, out, I(heads * dv),
                                            static_cast<long long>(dv), I(heads)),
                  "heads out");
  }

  Status RmsNormRows(const k::RmsNormArgs& a) override { return k::RmsNormRowsCuda(a, stream_); }
  Status L2NormRows(const k::L2NormArgs& a) override { return k::L2NormRowsCuda(a, stream_); }
  Status Rope(const k::RopeArgs& a) override { return k::RopeCuda(a, stream_); }
  Status SiluMul(float* a, const float* b, std::size_t n) override { return k::SiluMulCuda(a, b, n, stream_); }
  Status Add(float* x, const float* y, std::size_t n) override { return k::AddCuda(x, y, n, stream_); }
  Status GatherRows(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                    std::size_t count, float* x) override {
    return k::GatherRowsCuda(table, vocab, n, tokens, count, x, stream_);
  }
  Status KdaConv(const k::KdaConvArgs& a) override { return k::KdaConvCuda(a, stream_); }
  Status KdaScan(const k::KdaScanArgs& a) override { return k::KdaScanCuda(a, stream_); }
  Status KdaOutput(float* o, const float* gate, const float* w, std::size_t count, std::size_t heads, std::size_t d,
                   float eps) override {
    return k::KdaOutputCuda(o, gate, w, count, heads, d, eps, stream_);
  }
  Status MlaRows(const k::MlaRowsArgs& a) override { return k::MlaRowsCuda(a, stream_); }
  Status MlaAttention(const k::MlaAttentionArgs& a) override { return k::MlaAttentionCuda(a, stream_); }
  Status IndexerSelect(const k::IndexerSelectArgs& a) override { return k::IndexerSelectCuda(a, stream_); }
  Status HadamardRows(const k::HadamardArgs& a) override { return k::HadamardRowsCuda(a, stream_); }
  Status TurboQuantEncode(const k::TurboQuantEncodeArgs& a) override { return k::TurboQuantEncodeCuda(a, stream_); }
  Status KvAttention(const k::KvAttentionArgs& a) override { return k::KvAttentionCuda(a, stream_); }
  Status ArgmaxRows(const float* x, std::size_t rows, std::size_t n, std::uint32_t* out) override {
    return k::ArgmaxRowsCuda(x, rows, n, out, stream_);
  }

 private:
  cublasHandle_t handle_;
  void* stream_;
};

}  // namespace

Result<std::unique_ptr<Compute>> Compute::NewCuda(void* stream) {
  cublasHandle_t h = nullptr;
  PC_RETURN_IF_ERROR(Cublas(cublasCreate(&h), "cublasCreate"));
  Status s = Cublas(cublasSetStream(h, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  if (s.ok()) s = Cublas(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  if (!s.ok()) {
    cublasDestroy(h);
    return s;
  }
  return std::unique_ptr<Compute>(new CudaCompute(h, stream));
}

}  // namespace primecache::model

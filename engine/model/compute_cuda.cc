// The CUDA Compute: the CUDA kernels, and cuBLAS SGEMM for long products, on
// one stream. The handle's math mode is CUBLAS_DEFAULT_MATH, which keeps f32 products in f32
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

  // Few rows: the row-invariant kernel (see kRowInvariantRows). More: cuBLAS,
  // whose tiles are faster for prefill chunks but round by shape.
  Status Product(const k::RowsGemmArgs& a) override {
    if (a.rows * a.out * a.batch == 0) return Status::Ok();
    if (a.rows <= kRowInvariantRows) return k::RowsGemmCuda(a, stream_);
    const float one = 1.0f, zero = 0.0f;
    // Column-major view: Y_b^T [out, rows] = op(W_b) · X_b^T [in, rows]. W_b
    // row-major [out, in] is col-major [in, out] (transposed by the op);
    // stored [in, out] row-major it is col-major [out, in] as it stands.
    const cublasOperation_t op = a.w_transposed ? CUBLAS_OP_N : CUBLAS_OP_T;
    const int lda = I(a.w_transposed ? a.out : a.in);
    if (a.batch == 1) {
      return Cublas(cublasSgemm(handle_, op, CUBLAS_OP_N, I(a.out), I(a.rows), I(a.in), &one, a.w, lda, a.x, I(a.ldx),
                                &zero, a.y, I(a.ldy)),
                    "gemm");
    }
    return Cublas(cublasSgemmStridedBatched(handle_, op, CUBLAS_OP_N, I(a.out), I(a.rows), I(a.in), &one, a.w, lda,
                                            static_cast<long long>(a.w_batch), a.x, I(a.ldx),
                                            static_cast<long long>(a.x_batch), &zero, a.y, I(a.ldy),
                                            static_cast<long long>(a.y_batch), I(a.batch)),
                  "batched gemm");
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

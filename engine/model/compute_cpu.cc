// The CPU Compute: the CPU twins, and matrix products as one MatVec per row.
#include "engine/model/compute.h"
#include "kernels/cpu_math.h"

namespace primecache::model {
namespace {

namespace k = kernels;

class CpuCompute final : public Compute {
 public:
  bool on_device() const override { return false; }

  Status Product(const k::RowsGemmArgs& a) override { return k::RowsGemmCpu(a); }

  Status RmsNormRows(const k::RmsNormArgs& a) override { return k::RmsNormRowsCpu(a); }
  Status L2NormRows(const k::L2NormArgs& a) override { return k::L2NormRowsCpu(a); }
  Status Rope(const k::RopeArgs& a) override { return k::RopeCpu(a); }
  Status SiluMul(float* a, const float* b, std::size_t n) override { return k::SiluMulCpu(a, b, n); }
  Status Add(float* x, const float* y, std::size_t n) override { return k::AddCpu(x, y, n); }
  Status GatherRows(const float* table, std::size_t vocab, std::size_t n, const std::uint32_t* tokens,
                    std::size_t count, float* x) override {
    return k::GatherRowsCpu(table, vocab, n, tokens, count, x);
  }
  Status KdaConv(const k::KdaConvArgs& a) override { return k::KdaConvCpu(a); }
  Status KdaScan(const k::KdaScanArgs& a) override { return k::KdaScanCpu(a); }
  Status KdaOutput(float* o, const float* gate, const float* w, std::size_t count, std::size_t heads, std::size_t d,
                   float eps) override {
    return k::KdaOutputCpu(o, gate, w, count, heads, d, eps);
  }
  Status MlaRows(const k::MlaRowsArgs& a) override { return k::MlaRowsCpu(a); }
  Status MlaAttention(const k::MlaAttentionArgs& a) override { return k::MlaAttentionCpu(a); }
  Status IndexerSelect(const k::IndexerSelectArgs& a) override { return k::IndexerSelectCpu(a); }
  Status HadamardRows(const k::HadamardArgs& a) override { return k::HadamardRowsCpu(a); }
  Status TurboQuantEncode(const k::TurboQuantEncodeArgs& a) override { return k::TurboQuantEncodeCpu(a); }
  Status KvAttention(const k::KvAttentionArgs& a) override { return k::KvAttentionCpu(a); }
  Status ArgmaxRows(const float* x, std::size_t rows, std::size_t n, std::uint32_t* out) override {
    return k::ArgmaxRowsCpu(x, rows, n, out);
  }
};

}  // namespace

std::unique_ptr<Compute> Compute::NewCpu() { return std::make_unique<CpuCompute>(); }

#ifndef PRIMECACHE_HAVE_CUDA
Result<std::unique_ptr<Compute>> Compute::NewCuda(void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
#endif

}  // namespace primecache::model

// Small helpers for GPU tests: device presence, checked CUDA calls, and a
// device buffer that frees itself.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace primecache::testing {

inline bool CudaDevicePresent() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Skips the test without a CUDA device, unless PRIMECACHE_REQUIRE_GPU is set
// (as tools/gpu-check's runner sets it), where a missing device fails.
#define PC_SKIP_WITHOUT_CUDA()                                                       \
  do {                                                                               \
    if (!::primecache::testing::CudaDevicePresent()) {                               \
      if (std::getenv("PRIMECACHE_REQUIRE_GPU") != nullptr) FAIL() << "no CUDA device"; \
      GTEST_SKIP() << "no CUDA device";                                              \
    }                                                                                \
  } while (0)

#define PC_CUDA_OK(expr)                                                    \
  do {                                                                      \
    cudaError_t pc_err_ = (expr);                                           \
    ASSERT_EQ(pc_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(pc_err_); \
  } while (0)

// How a GPU result agrees with its CPU twin.
struct Agreement {
  double norm_rel = 0;  // ||got - want|| / ||want||
  double worst = 0;     // the largest |got - want| / max(1, |want|)
};

// Holds a GPU result to its CPU twin: every element finite and within 1e-4
// of it (relative, or absolute below 1), and the whole within 1e-5 in norm.
inline Agreement ExpectCloseToCpu(const std::vector<float>& got, const std::vector<float>& want,
                                  const std::string& what = "") {
  double num = 0, den = 0, worst = 0;
  std::size_t bad = 0;
  EXPECT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++bad;
      continue;
    }
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
    const double rel = std::abs(d) / std::max(1.0, std::abs(double(want[i])));
    worst = std::max(worst, rel);
    if (rel > 1e-4) ++bad;
  }
  EXPECT_EQ(bad, 0u) << what;
  const double norm_rel = std::sqrt(num / std::max(den, 1e-30));
  EXPECT_LE(norm_rel, 1e-5) << what;
  return {norm_rel, worst};
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  cudaError_t Upload(const std::vector<T>& v) { return cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  cudaError_t Download(std::vector<T>* v) const {
    v->resize(n_);
    return cudaMemcpy(v->data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

}  // namespace primecache::testing

// Small helpers for GPU tests: device presence, checked CUDA calls, and a
// device buffer that frees itself. (The kernels' comparison to their CPU
// twins lives in kernel_cases.h.)
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
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

// Every CUDA kernel held to its CPU twin: the table of cases (kernel_cases.h,
// one *_cases.cc per kernel family) run by one parameterized test, on fresh
// random data each run (the seed is printed; PRIMECACHE_GPU_TEST_SEED
// replays it). Checks that are not a comparison of one run on each backend
// sit beside the table as TEST_F(KernelGpuTest, ...) in their family's file.
// Without a GPU the CUDA tests skip and the table runs CPU against CPU.
#include <gtest/gtest.h>

#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

std::vector<KernelCase> Table() {
  std::vector<KernelCase> all;
  for (auto family : {PoolKeysCases, KdaScanCases, MlaAttentionCases, IndexerSelectCases, KvAttentionCases,
                      ModelOpsCases}) {
    for (KernelCase& c : family()) all.push_back(std::move(c));
  }
  return all;
}

class KernelCaseTest : public KernelGpuTest, public ::testing::WithParamInterface<KernelCase> {};

TEST_P(KernelCaseTest, CudaMatchesTheCpuTwin) { RunKernelCase(GetParam(), seed_, Backend::kCuda); }

// Where there is no GPU (CI, development machines), the same table with the
// CPU twin in CUDA's place: every case builds, its arguments are valid, its
// buffer names resolve, and the harness passes the twin against itself. On
// a GPU machine CudaMatchesTheCpuTwin does all this and more, so it skips.
class KernelCaseOnCpuTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(KernelCaseOnCpuTest, TwinMatchesItself) {
  if (primecache::testing::CudaDevicePresent()) GTEST_SKIP() << "CudaMatchesTheCpuTwin covers the case";
  RunKernelCase(GetParam(), TestSeed(), Backend::kCpu);
}

INSTANTIATE_TEST_SUITE_P(Table, KernelCaseTest, ::testing::ValuesIn(Table()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Table, KernelCaseOnCpuTest, ::testing::ValuesIn(Table()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace primecache::kernels::gpu_cases

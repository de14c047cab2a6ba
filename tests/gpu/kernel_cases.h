// The kernels' GPU checks as one table of cases, in the manner of llama.cpp's
// test-backend-ops: a case builds its inputs once, runs the same op on the
// CPU twin and on CUDA over its own copies of them, and the harness compares
// every result buffer by one rule.
//
// What the harness does for every case (kernel_harness.cc):
//   - random inputs from a seed it prints (PRIMECACHE_GPU_TEST_SEED replays one);
//   - every output buffer poisoned on both sides, with a different NaN on
//     each, so an element either side fails to write shows;
//   - the CPU twin on host buffers, the CUDA op on device buffers;
//   - every output and in-place buffer compared to the CPU's (Tolerance),
//     elements an op must leave alone checked to still hold the poison;
//   - one line per case with each buffer's worst error and the CUDA op's time.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/status.h"
#include "tests/gpu/cuda_test_util.h"

namespace primecache::kernels::gpu_cases {

enum class Backend { kCpu, kCuda };

enum class Role {
  kInput,    // read by the op; the same contents on both sides
  kOutput,   // written by the op; poisoned on both sides first, compared after
  kInOut,    // read and written in place; the same contents on both sides, compared after
  kScratch,  // workspace (the CUDA op's); poisoned, never compared
};

// How a result must agree with the CPU twin's. The one rule: an element
// agrees when its bits equal the twin's, or, unless `bitwise`, when both are
// finite and |got - want| / max(1, |want|) <= element; a buffer agrees when
// every element does and ||got - want|| / ||want|| <= norm. f32 results must
// be finite (a NaN is an unwritten, poisoned element); word buffers are
// always compared bit for bit.
struct Tolerance {
  double element = 0;
  double norm = std::numeric_limits<double>::infinity();
  bool bitwise = false;

  static Tolerance Bitwise() { return {0, std::numeric_limits<double>::infinity(), true}; }
  // Every element within `element`; the whole, when given, within `norm`.
  static Tolerance Close(double element, double norm = std::numeric_limits<double>::infinity()) {
    return {element, norm, false};
  }
};

// Within 1e-4 per element and 1e-5 in norm: the kernels that reduce in
// another order than their twin (attention, scans).
inline Tolerance Reordered() { return Tolerance::Close(1e-4, 1e-5); }

// One buffer of a case: f32 values or 32-bit words.
struct Tensor {
  std::string name;
  Role role = Role::kInput;
  std::vector<float> f;           // f32 contents (empty for words)
  std::vector<std::uint32_t> u;   // word contents (empty for f32)
  bool words = false;
  Tolerance tol = Tolerance::Bitwise();  // outputs and in-place buffers
  // Outputs: elements [untouched_begin, untouched_end) the op must not write.
  std::size_t untouched_begin = 0, untouched_end = 0;

  std::size_t elements() const { return words ? u.size() : f.size(); }
  void* data() { return words ? static_cast<void*>(u.data()) : static_cast<void*>(f.data()); }
  const void* data() const { return words ? static_cast<const void*>(u.data()) : static_cast<const void*>(f.data()); }
};

// The tensor of that name in a case's buffers (a failure when there is none).
Tensor& Named(std::vector<Tensor>& ts, std::string_view name);
const Tensor& Named(const std::vector<Tensor>& ts, std::string_view name);

Tensor Input(std::string name, std::vector<float> v);
Tensor Input(std::string name, std::vector<std::uint32_t> v);
Tensor InOut(std::string name, std::vector<float> v, Tolerance tol);
Tensor Output(std::string name, std::size_t n, Tolerance tol);
Tensor WordOutput(std::string name, std::size_t n);
Tensor Scratch(std::string name, std::size_t bytes);

// Normally distributed values (mean 0, standard deviation sd).
std::vector<float> Normal(std::mt19937& rng, std::size_t n, float sd = 1.0f);
// Each +1 or -1 (TurboQuant's sign vectors).
std::vector<float> Signs(std::mt19937& rng, std::size_t n);

// The addresses of one run's buffers: host vectors for the CPU twin, device
// memory for CUDA. Looked up by the tensor's name.
class Buffers {
 public:
  Buffers(Backend backend, std::vector<std::string> names, std::vector<void*> ptrs)
      : backend_(backend), names_(std::move(names)), ptrs_(std::move(ptrs)) {}
  Backend backend() const { return backend_; }
  bool cuda() const { return backend_ == Backend::kCuda; }
  float* f(std::string_view name) const { return static_cast<float*>(get(name)); }
  std::uint32_t* u(std::string_view name) const { return static_cast<std::uint32_t*>(get(name)); }
  void* get(std::string_view name) const;

 private:
  Backend backend_;
  std::vector<std::string> names_;
  std::vector<void*> ptrs_;
};

// The twin or the CUDA op of an op that takes one argument struct.
template <typename Args>
Status OnBackend(const Buffers& b, Status (*cpu)(const Args&), Status (*cuda)(const Args&, void*), const Args& a) {
  return b.cuda() ? cuda(a, nullptr) : cpu(a);
}

// One check of the table.
struct KernelCase {
  std::string name;  // letters, digits and '_' (a gtest parameter name)
  // The inputs, and the outputs as Output(...) placeholders.
  std::function<std::vector<Tensor>(std::mt19937& rng)> build;
  // Runs the op on b's backend over b's buffers: the same arguments either way.
  std::function<Status(const Buffers& b)> run;
  // Optional: blanks, in either side's results, the elements the op leaves
  // unspecified (after a selection's count, say), so that they compare equal.
  std::function<void(std::vector<Tensor>& results)> blank_unspecified;
  // Optional: what the CPU twin's own results must show (a tie's winner, say).
  std::function<void(const std::vector<Tensor>& cpu)> check_twin;
};

inline void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }

// The table, by kernel family (one *_cases.cc each).
std::vector<KernelCase> PoolKeysCases();
std::vector<KernelCase> KdaScanCases();
std::vector<KernelCase> MlaAttentionCases();
std::vector<KernelCase> IndexerSelectCases();
std::vector<KernelCase> KvAttentionCases();
std::vector<KernelCase> ModelOpsCases();

// The seed of a run: PRIMECACHE_GPU_TEST_SEED when set, else a fresh one.
unsigned TestSeed();

// Runs one case's CPU twin and its op on `tested` (CUDA; the CPU, to check
// the case itself where there is no GPU) from the same inputs, and holds the
// tested results to the twin's (gtest expectations).
void RunKernelCase(const KernelCase& c, unsigned seed, Backend tested);

// The fixture of every kernel check, in the table or beside it: skips
// without a CUDA device (fails instead under PRIMECACHE_REQUIRE_GPU) and
// draws the seed of the check's random data.
class KernelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PC_SKIP_WITHOUT_CUDA();
    seed_ = TestSeed();
    std::printf("[ kernels ] seed %u (PRIMECACHE_GPU_TEST_SEED=%u replays it)\n", seed_, seed_);
  }
  unsigned seed_ = 0;
};

}  // namespace primecache::kernels::gpu_cases

// The harness of the kernel case table (kernel_cases.h): builds a case's
// buffers, runs the CPU twin and the CUDA op, and compares the results.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <type_traits>

#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/kernel_cases.h"

namespace primecache::kernels::gpu_cases {
namespace {

using primecache::testing::DeviceBuffer;

// Each side's poison: two NaNs of different bits, so that an element neither
// side writes still differs (and, being a NaN, fails as f32).
constexpr std::uint32_t kTwinPoison = 0xffffffffu;
constexpr std::uint32_t kTestedPoison = 0x7fc0deadu;

bool Compared(const Tensor& t) { return t.role == Role::kOutput || t.role == Role::kInOut; }

bool Poisoned(const Tensor& t) { return t.role == Role::kOutput || t.role == Role::kScratch; }

std::uint32_t BitsAt(const Tensor& t, std::size_t i) {
  return t.words ? t.u[i] : std::bit_cast<std::uint32_t>(t.f[i]);
}

void Poison(Tensor& t, std::uint32_t bits) {
  if (t.words) {
    std::fill(t.u.begin(), t.u.end(), bits);
  } else {
    std::fill(t.f.begin(), t.f.end(), std::bit_cast<float>(bits));
  }
}

Buffers HostBuffers(std::vector<Tensor>& ts) {
  std::vector<std::string> names;
  std::vector<void*> ptrs;
  for (Tensor& t : ts) {
    names.push_back(t.name);
    ptrs.push_back(t.data());
  }
  return Buffers(Backend::kCpu, std::move(names), std::move(ptrs));
}

// How one result buffer agrees with the twin's.
struct Agreement {
  std::size_t bad = 0, first_bad = 0;
  double worst = 0;     // the largest |got - want| / max(1, |want|)
  double norm_rel = 0;  // ||got - want|| / ||want||
};

Agreement Compare(const Tensor& got, const Tensor& want) {
  Agreement a;
  double num = 0, den = 0;
  auto fail = [&a](std::size_t i) {
    if (a.bad++ == 0) a.first_bad = i;
  };
  for (std::size_t i = 0; i < want.elements(); ++i) {
    if (i >= want.untouched_begin && i < want.untouched_end) {
      if (BitsAt(got, i) != kTestedPoison || BitsAt(want, i) != kTwinPoison) fail(i);
      continue;
    }
    if (want.words || want.tol.bitwise) {
      const bool finite = want.words || std::isfinite(want.f[i]);
      if (!finite || BitsAt(got, i) != BitsAt(want, i)) fail(i);
      continue;
    }
    const double g = got.f[i], w = want.f[i];
    if (!std::isfinite(g) || !std::isfinite(w)) {
      fail(i);
      continue;
    }
    num += (g - w) * (g - w);
    den += w * w;
    const double rel = std::abs(g - w) / std::max(1.0, std::abs(w));
    a.worst = std::max(a.worst, rel);
    if (rel > want.tol.element) fail(i);
  }
  a.norm_rel = std::sqrt(num / std::max(den, 1e-30));
  return a;
}

// The CUDA side's copies of a case's buffers.
struct DeviceSide {
  std::vector<std::unique_ptr<DeviceBuffer<std::byte>>> memory;
  std::vector<std::string> names;
  std::vector<void*> ptrs;
};

// Uploads every buffer of `ts` (as they are: the caller poisoned them).
void Upload(const std::vector<Tensor>& ts, DeviceSide* d) {
  for (const Tensor& t : ts) {
    const std::size_t bytes = t.elements() * 4;
    auto& m = d->memory.emplace_back(std::make_unique<DeviceBuffer<std::byte>>(std::max<std::size_t>(bytes, 4)));
    ASSERT_NE(m->get(), nullptr) << t.name << ": no device memory";
    PC_CUDA_OK(cudaMemcpy(m->get(), t.data(), bytes, cudaMemcpyHostToDevice));
    d->names.push_back(t.name);
    d->ptrs.push_back(m->get());
  }
}

// Downloads the compared buffers into *got (shaped as the case's).
void Download(const DeviceSide& d, std::vector<Tensor>* got) {
  for (std::size_t i = 0; i < got->size(); ++i) {
    Tensor& t = (*got)[i];
    if (!Compared(t)) continue;
    PC_CUDA_OK(cudaMemcpy(t.data(), d.ptrs[i], t.elements() * 4, cudaMemcpyDeviceToHost));
  }
}

// Runs the case's op on `backend` over a copy of `built` whose outputs and
// scratch hold `poison`; *results: the buffers after it, *ms: the op's time.
void RunSide(const KernelCase& c, Backend backend, std::uint32_t poison, const std::vector<Tensor>& built,
             std::vector<Tensor>* results, double* ms) {
  *results = built;
  for (Tensor& t : *results) {
    if (Poisoned(t)) Poison(t, poison);
  }
  DeviceSide dev;
  if (backend == Backend::kCuda) {
    ASSERT_NO_FATAL_FAILURE(Upload(*results, &dev));
    PC_CUDA_OK(cudaDeviceSynchronize());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = backend == Backend::kCuda ? c.run(Buffers(backend, dev.names, dev.ptrs))
                                             : c.run(HostBuffers(*results));
  ASSERT_TRUE(s.ok()) << (backend == Backend::kCuda ? "CUDA op: " : "CPU twin: ") << s.ToString();
  if (backend == Backend::kCpu) {
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  PC_CUDA_OK(cudaDeviceSynchronize());
  *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_NO_FATAL_FAILURE(Download(dev, results));
}

// Holds every compared buffer to the twin's; returns the case's report line.
std::string CompareAll(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& name) {
  std::string line;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Tensor& w = want[i];
    if (!Compared(w)) continue;
    const Agreement a = Compare(got[i], w);
    EXPECT_EQ(a.bad, 0u) << name << " " << w.name << ": " << a.bad << " of " << w.elements()
                         << " elements disagree, the first at " << a.first_bad << " (got bits " << std::hex
                         << BitsAt(got[i], a.first_bad) << ", want " << BitsAt(w, a.first_bad) << std::dec << ")";
    if (!w.words && !w.tol.bitwise && std::isfinite(w.tol.norm)) {
      EXPECT_LE(a.norm_rel, w.tol.norm) << name << " " << w.name << ": norm-wise relative error";
    }
    char buf[160];
    if (w.words || w.tol.bitwise) {
      std::snprintf(buf, sizeof buf, " %s %s;", w.name.c_str(), a.bad == 0 ? "identical" : "DIFFERS");
    } else {
      std::snprintf(buf, sizeof buf, " %s max rel err %.3g (norm %.3g);", w.name.c_str(), a.worst, a.norm_rel);
    }
    line += buf;
  }
  return line;
}

template <typename Vector>
auto FindNamed(Vector& ts, std::string_view name)
    -> std::conditional_t<std::is_const_v<Vector>, const Tensor&, Tensor&> {
  for (auto& t : ts) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no buffer named " << name;
  static Tensor none;
  none = Tensor{};
  return none;
}

}  // namespace

const Tensor& Named(const std::vector<Tensor>& ts, std::string_view name) {
  return FindNamed(ts, name);
}

Tensor& Named(std::vector<Tensor>& ts, std::string_view name) { return FindNamed(ts, name); }

Tensor Input(std::string name, std::vector<float> v) {
  Tensor t;
  t.name = std::move(name);
  t.f = std::move(v);
  return t;
}

Tensor Input(std::string name, std::vector<std::uint32_t> v) {
  Tensor t;
  t.name = std::move(name);
  t.u = std::move(v);
  t.words = true;
  return t;
}

Tensor InOut(std::string name, std::vector<float> v, Tolerance tol) {
  Tensor t = Input(std::move(name), std::move(v));
  t.role = Role::kInOut;
  t.tol = tol;
  return t;
}

Tensor Output(std::string name, std::size_t n, Tolerance tol) {
  Tensor t = Input(std::move(name), std::vector<float>(n));
  t.role = Role::kOutput;
  t.tol = tol;
  return t;
}

Tensor WordOutput(std::string name, std::size_t n) {
  Tensor t = Input(std::move(name), std::vector<std::uint32_t>(n));
  t.role = Role::kOutput;
  return t;
}

Tensor Scratch(std::string name, std::size_t bytes) {
  Tensor t = Input(std::move(name), std::vector<std::uint32_t>((bytes + 3) / 4));
  t.role = Role::kScratch;
  return t;
}

std::vector<float> Normal(std::mt19937& rng, std::size_t n, float sd) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<float> Signs(std::mt19937& rng, std::size_t n) {
  std::vector<float> s(n);
  for (auto& x : s) x = rng() % 2 ? 1.0f : -1.0f;
  return s;
}

void* Buffers::get(std::string_view name) const {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return ptrs_[i];
  }
  ADD_FAILURE() << "no buffer named " << name;
  return nullptr;
}

unsigned TestSeed() {
  if (const char* s = std::getenv("PRIMECACHE_GPU_TEST_SEED")) return static_cast<unsigned>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

void RunKernelCase(const KernelCase& c, unsigned seed, Backend tested) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<Tensor> built = c.build(rng);
  std::vector<Tensor> twin, got;
  double twin_ms = 0, ms = 0;
  ASSERT_NO_FATAL_FAILURE(RunSide(c, Backend::kCpu, kTwinPoison, built, &twin, &twin_ms));
  if (c.check_twin) c.check_twin(twin);
  ASSERT_NO_FATAL_FAILURE(RunSide(c, tested, kTestedPoison, built, &got, &ms));
  if (c.blank_unspecified) {
    c.blank_unspecified(twin);
    c.blank_unspecified(got);
  }
  const std::string line = CompareAll(got, twin, c.name);
  std::printf("[ kernels ] %s (seed %u):%s %s %.2f ms\n", c.name.c_str(), seed, line.c_str(),
              tested == Backend::kCuda ? "cuda" : "cpu", ms);
}

}  // namespace primecache::kernels::gpu_cases

// Helpers for the engine tests, shared by the CPU suite and its CUDA twin:
// devices by kind, device buffers filled from host vectors, reads of device
// planes back into host vectors, random rows, and a host reference of what a
// latent layer must hold.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/device.h"
#include "kernels/pool_keys.h"
#include "primecache/engine.h"

namespace primecache::engine::testing {

inline std::shared_ptr<Device> MakeDevice(DeviceKind kind) {
  if (kind == DeviceKind::kCpu) return NewCpuDevice({.memory_bytes = 1ull << 30});
  auto d = NewCudaDevice({});
  return d.ok() ? d.value() : nullptr;
}

// Skips (or, with PRIMECACHE_REQUIRE_GPU, fails) when a CUDA test has no device.
#define PC_ENGINE_REQUIRE_DEVICE(kind)                                                  \
  do {                                                                                  \
    if ((kind) == ::primecache::engine::DeviceKind::kCuda &&                            \
        !::primecache::engine::CudaDeviceAvailable()) {                                 \
      if (std::getenv("PRIMECACHE_REQUIRE_GPU") != nullptr) FAIL() << "no CUDA device"; \
      GTEST_SKIP() << "no CUDA device";                                                 \
    }                                                                                   \
  } while (0)

// Device memory holding a copy of a host vector.
class DeviceVec {
 public:
  DeviceVec(Device* dev, const std::vector<float>& host) : dev_(dev), n_(host.size()) {
    auto m = dev->Allocate(host.size() * sizeof(float));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return;
    mem_ = std::move(m).value();
    EXPECT_TRUE(dev->Upload(mem_.data(), host.data(), host.size() * sizeof(float), Lane::kCompute).ok());
  }
  float* get() const { return static_cast<float*>(mem_.data()); }
  std::size_t size() const { return n_; }

 private:
  Device* dev_;
  std::size_t n_;
  Memory mem_;
};

inline std::vector<float> Read(Device* dev, const float* p, std::size_t n) {
  std::vector<float> v(n);
  Status st = dev->Download(v.data(), p, n * sizeof(float), Lane::kCompute);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return v;
}

inline void Write(Device* dev, float* p, const std::vector<float>& v) {
  Status st = dev->Upload(p, v.data(), v.size() * sizeof(float), Lane::kCompute);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

inline std::vector<float> RandomRows(std::mt19937& rng, std::size_t n, float sd = 2.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Largest |a-b| / max(1, |b|) over two vectors of equal size; inf when sizes differ.
inline double MaxRelErr(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i])) / std::max(1.0, std::abs(double(b[i])));
    if (!(d <= m)) m = d;  // NaN counts as worst
  }
  return m;
}

inline constexpr double kKeyTolerance = 1e-5;

// What one latent layer must hold: every token's latent and index row in
// logical order, and the keys of every completed pool computed by the CPU
// twin on a flat copy of the index rows.
struct LatentReference {
  LatentPlan plan;
  std::vector<float> ape;
  std::vector<float> latent;  // [len, width]
  std::vector<float> index;   // [len, index_width]

  std::uint64_t len() const { return latent.size() / plan.width(); }
  void Append(const std::vector<float>& l, const std::vector<float>& ix) {
    latent.insert(latent.end(), l.begin(), l.end());
    index.insert(index.end(), ix.begin(), ix.end());
  }
  void Truncate(std::uint64_t n) {
    latent.resize(n * plan.width());
    index.resize(n * plan.index_width());
  }
  std::vector<float> Keys(std::uint64_t pools) const {
    const std::size_t d = plan.index_head_dim;
    std::vector<float> k(pools * d);
    if (pools == 0) return k;
    kernels::PoolKeyArgs a{index.data(), 0, ape.data(), k.data(), d, plan.pool, 0, pools};
    EXPECT_TRUE(kernels::BuildPoolKeysCpu(a).ok());
    return k;
  }
  std::vector<float> IndexRows(std::uint64_t first, std::uint64_t last) const {
    const std::size_t iw = plan.index_width();
    return {index.begin() + static_cast<std::ptrdiff_t>(first * iw),
            index.begin() + static_cast<std::ptrdiff_t>(last * iw)};
  }
};

// The index rows [first, last) as the device plane holds them, read at their
// physical (ring or flat) addresses.
inline std::vector<float> ReadIndexRows(Device* dev, const LatentLayer& l, std::uint64_t first, std::uint64_t last) {
  const std::size_t iw = l.index_width();
  const std::uint64_t physical = l.index_is_ring() ? l.booked_ring_rows() : l.max_ctx();
  const std::vector<float> plane = Read(dev, l.index_rows(), physical * iw);
  std::vector<float> out;
  for (std::uint64_t r = first; r < last; ++r) {
    const std::uint64_t phys = l.index_ring_rows() ? r % l.index_ring_rows() : r;
    out.insert(out.end(), plane.begin() + static_cast<std::ptrdiff_t>(phys * iw),
               plane.begin() + static_cast<std::ptrdiff_t>((phys + 1) * iw));
  }
  return out;
}

// Checks everything a latent layer must hold against the reference.
inline void ExpectLatentMatches(Device* dev, const LatentLayer& l, const LatentReference& ref) {
  ASSERT_TRUE(l.CheckInvariants().ok()) << l.CheckInvariants().ToString();
  const std::uint64_t len = ref.len();
  ASSERT_EQ(l.len(), len);
  auto mirror = dev->ReadI32(l.len_device(), Lane::kCompute);
  ASSERT_TRUE(mirror.ok());
  EXPECT_EQ(static_cast<std::uint64_t>(mirror.value()), len) << "len mirror out of step";
  EXPECT_TRUE(BitEqual(Read(dev, l.rows(), len * l.width()), ref.latent)) << "latent rows differ";
  if (!l.plan().has_indexer()) return;
  ASSERT_NE(l.pool(), 0u);
  EXPECT_EQ(l.pools_ready(), len / l.pool());
  const std::uint64_t ready = l.pools_ready();
  const double err = MaxRelErr(Read(dev, l.pool_keys(), ready * l.plan().index_head_dim), ref.Keys(ready));
  EXPECT_LE(err, kKeyTolerance) << "pool keys differ from the flat reference";
  // Every row the plane still holds (from its floor) sits at its physical address.
  const std::uint64_t first = l.index_floor();
  EXPECT_TRUE(BitEqual(ReadIndexRows(dev, l, first, len), ref.IndexRows(first, len))) << "index rows differ";
}

}  // namespace primecache::engine::testing

// The backend a suite source is instantiated for: the CPU reference, or CUDA
// when the file is compiled into a gpu binary with PC_ENGINE_SUITE_CUDA.
#ifdef PC_ENGINE_SUITE_CUDA
#define PC_ENGINE_SUITE_BACKEND ::primecache::engine::DeviceKind::kCuda
#define PC_ENGINE_SUITE_NAME Cuda
#else
#define PC_ENGINE_SUITE_BACKEND ::primecache::engine::DeviceKind::kCpu
#define PC_ENGINE_SUITE_NAME Cpu
#endif

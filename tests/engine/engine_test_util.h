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
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "engine/device.h"
#include "kernels/pool_keys.h"
#include "primecache/internal/engine.h"

namespace primecache::engine {
// Test names read "cpu" / "cuda" rather than raw bytes.
inline void PrintTo(DeviceKind kind, std::ostream* os) {
  *os << DeviceKindName(kind);
}
}  // namespace primecache::engine

namespace primecache::engine::testing {

inline std::shared_ptr<Device> MakeDevice(DeviceKind kind) {
  if (kind == DeviceKind::kCpu) return NewCpuDevice({.memory_bytes = 1ull << 30});
  auto d = NewCudaDevice({});
  return d.ok() ? d.value() : nullptr;
}

// Skips (or, with PRIMECACHE_REQUIRE_GPU, fails) when a CUDA test has no device.
#define PC_ENGINE_REQUIRE_DEVICE(kind)                                                                       \
  do {                                                                                                       \
    if ((kind) == ::primecache::engine::DeviceKind::kCuda && !::primecache::engine::CudaDeviceAvailable()) { \
      if (std::getenv("PRIMECACHE_REQUIRE_GPU") != nullptr) FAIL() << "no CUDA device";                      \
      GTEST_SKIP() << "no CUDA device";                                                                      \
    }                                                                                                        \
  } while (0)

// Device memory holding a copy of a host vector.
class DeviceVec {
 public:
  DeviceVec(Device* dev, const std::vector<float>& host) : n_(host.size()) {
    auto m = dev->Allocate(host.size() * sizeof(float));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return;
    mem_ = std::move(m).value();
    EXPECT_TRUE(dev->Upload(mem_.data(), host.data(), host.size() * sizeof(float), Lane::kCompute).ok());
  }
  float* get() const { return static_cast<float*>(mem_.data()); }
  std::size_t size() const { return n_; }

 private:
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
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
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
inline std::vector<float> ReadIndexRows(Device* dev, const LatentCacheLayer& l, std::uint64_t first,
                                        std::uint64_t last) {
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
inline void ExpectLatentMatches(Device* dev, const LatentCacheLayer& l, const LatentReference& ref) {
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

// Rows that depend only on (seed, layer, position, salt): two sessions fed at
// the same positions get the same inputs, whatever happened before.
inline std::vector<float> DetRows(std::uint64_t seed, std::uint64_t layer, std::uint64_t pos,
                                  std::uint32_t salt, std::size_t n) {
  std::seed_seq seq{static_cast<std::uint32_t>(seed),      static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(layer),     static_cast<std::uint32_t>(pos),
                    static_cast<std::uint32_t>(pos >> 32), salt};
  std::mt19937 rng(seq);
  return RandomRows(rng, n);
}

// Appends deterministic tokens to one latent layer and to its reference.
struct LatentDriver {
  LatentDriver(Device* d, LatentCacheLayer* l, std::uint64_t seed_, std::size_t layer_index = 0)
      : dev(d), layer(l), seed(seed_), li(layer_index) {
    ref.plan = l->plan();
    if (ref.plan.has_indexer()) {
      ref.ape = DetRows(seed, li, 0, 1, std::size_t{ref.plan.pool} * ref.plan.index_head_dim);
      ape = std::make_unique<DeviceVec>(dev, ref.ape);
    }
  }
  Status Append(std::uint64_t count) {
    const std::uint64_t pos = layer->len();
    auto lat = DetRows(seed, li, pos, 2, count * ref.plan.width());
    auto idx = DetRows(seed, li, pos, 3, count * ref.plan.index_width());
    DeviceVec dl(dev, lat), di(dev, idx);
    IndexerInputs ix{ref.plan.pool, ape ? ape->get() : nullptr};
    Status st = layer->Append(dl.get(), ref.plan.has_indexer() ? di.get() : nullptr, count,
                              ref.plan.has_indexer() ? &ix : nullptr);
    if (st.ok()) ref.Append(lat, idx);
    return st;
  }
  Device* dev;
  LatentCacheLayer* layer;
  std::uint64_t seed;
  std::size_t li;
  LatentReference ref;
  std::unique_ptr<DeviceVec> ape;
};

// Feeds every layer of a session the same token count per call: latent
// appends, recurrent steps (a deterministic "new state" written into
// next_state, the step's pre-conv inputs pushed into the ring), K/V appends.
struct SessionDriver {
  SessionDriver(Device* d, SessionCache* s, std::uint64_t seed_, std::uint64_t start_pos = 0)
      : dev(d), session(s), seed(seed_), pos(start_pos) {
    for (std::size_t i = 0; i < s->layer_count(); ++i) {
      latent.push_back(s->latent(i) ? std::make_unique<LatentDriver>(d, s->latent(i), seed, i) : nullptr);
    }
  }
  Status Append(std::uint64_t count) {
    for (std::size_t i = 0; i < session->layer_count(); ++i) {
      if (latent[i]) {
        PC_RETURN_IF_ERROR(latent[i]->Append(count));
      } else if (RecurrentCacheLayer* r = session->recurrent(i)) {
        const RecurrentShape& p = r->plan();
        Write(dev, r->next_state(), DetRows(seed, i, pos, 4, p.state_values()));
        DeviceVec in(dev, DetRows(seed, i, pos, 5, count * p.conv_channels()));
        PC_RETURN_IF_ERROR(r->Step(in.get(), count));
      } else if (KvCacheLayer* kv = session->kv(i)) {
        DeviceVec k(dev, DetRows(seed, i, pos, 6, count * kv->plan().k_width));
        DeviceVec v(dev, DetRows(seed, i, pos, 7, count * kv->plan().v_width));
        PC_RETURN_IF_ERROR(kv->Append(k.get(), v.get(), count));
      }
    }
    pos += count;
    return Status::Ok();
  }
  Device* dev;
  SessionCache* session;
  std::uint64_t seed;
  std::uint64_t pos;
  std::vector<std::unique_ptr<LatentDriver>> latent;
};

// Two layer snapshots equal field by field and bit by bit on every plane.
// With `ignore_ring`, the latent planes' ring fields (which describe the
// source's index plane, not the state) are not compared.
inline void ExpectLayerEqual(const LayerSnapshot& a, const LayerSnapshot& b, bool ignore_ring = false) {
  ASSERT_EQ(a.index(), b.index());
  if (const auto* x = std::get_if<LatentSnapshot>(&a)) {
    const auto& y = std::get<LatentSnapshot>(b);
    EXPECT_EQ(x->shape.len, y.shape.len);
    EXPECT_EQ(x->shape.width, y.shape.width);
    EXPECT_EQ(x->shape.index_width, y.shape.index_width);
    EXPECT_EQ(x->shape.pool, y.shape.pool);
    EXPECT_EQ(x->shape.pools_ready, y.shape.pools_ready);
    if (!ignore_ring) {
      EXPECT_EQ(x->shape.index_is_ring, y.shape.index_is_ring);
      EXPECT_EQ(x->shape.index_ring_rows, y.shape.index_ring_rows);
    }
    EXPECT_TRUE(BitEqual(x->latent_rows, y.latent_rows)) << "latent rows";
    EXPECT_TRUE(BitEqual(x->index_tail_rows, y.index_tail_rows)) << "index tail rows";
    EXPECT_TRUE(BitEqual(x->pool_keys, y.pool_keys)) << "pool keys";
  } else if (const auto* r = std::get_if<RecurrentSnapshot>(&a)) {
    const auto& q = std::get<RecurrentSnapshot>(b);
    EXPECT_TRUE(r->shape == q.shape);
    EXPECT_TRUE(BitEqual(r->conv_ring, q.conv_ring)) << "conv ring";
    EXPECT_TRUE(BitEqual(r->state, q.state)) << "recurrent state";
  } else {
    const auto& k = std::get<KvSnapshot>(a);
    const auto& l = std::get<KvSnapshot>(b);
    EXPECT_TRUE(k.shape == l.shape);
    EXPECT_TRUE(BitEqual(k.k_rows, l.k_rows)) << "K rows";
    EXPECT_TRUE(BitEqual(k.v_rows, l.v_rows)) << "V rows";
  }
}

inline void ExpectSnapshotsEqual(const std::vector<LayerSnapshot>& a, const std::vector<LayerSnapshot>& b,
                                 bool ignore_ring = false) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    ExpectLayerEqual(a[i], b[i], ignore_ring);
  }
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

// The KV storage kinds at a long boundary (primecache-engine-bench
// --kv-kinds): per kind, what a session books and what a snapshot holds per
// token, the full capture, and the restore from pinned host memory in GB/s;
// TurboQuant's sizes against f32. One GLM-5-class attention layer: 8 KV heads
// of 128, a window of 4096 where rotating; TurboQuant rows encoded from the
// same Gaussian rows the f32 kinds store.
#include "tools/bench/kv_kinds_bench.h"
#include "tools/common/csv.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/device.h"
#include "kernels/kv_attention.h"
#include "primecache/internal/codec.h"

namespace primecache::engine {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr std::uint32_t kKvHeads = 8, kHeadDim = 128, kWindow = 4096;

struct Rows {
  std::vector<float> k, v;  // f32 rows, or TurboQuant words, [tokens, width]
};

// Gaussian K and V rows for `tokens` positions, as f32 or encoded.
Rows MakeRows(std::uint64_t tokens, std::uint32_t bits, const std::vector<float>& signs) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::size_t f32_width = std::size_t{kKvHeads} * kHeadDim;
  const std::size_t width = kKvHeads * kernels::KvEntryWords(kHeadDim, bits);
  Rows r;
  for (std::vector<float>* plane : {&r.k, &r.v}) {
    std::vector<float> f(tokens * f32_width);
    for (auto& x : f) x = nd(rng);
    if (bits == 0) {
      *plane = std::move(f);
      continue;
    }
    plane->resize(tokens * width);
    kernels::TurboQuantEncodeArgs a{f.data(), reinterpret_cast<std::uint32_t*>(plane->data()), signs.data(),
                                    tokens, kKvHeads, kHeadDim, f32_width, bits};
    if (!kernels::TurboQuantEncodeCpu(a).ok()) std::exit(1);
  }
  return r;
}

struct Measured {
  double booked_per_token = 0, snapshot_per_token = 0, stored_per_token = 0, capture_s = 0, restore_gbs = 0;
  bool exact = false;
};

template <typename T>
T Must(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "kv-kinds bench: %s: %s\n", what, r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}
void Must(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "kv-kinds bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

Measured MeasureKind(const std::shared_ptr<Device>& device, const KvPlan& plan, const Rows& rows,
                     std::uint64_t tokens, std::uint32_t reps) {
  Device& dev = *device;
  auto engine = Must(Engine::Create(device, ReserveRequest{StatePlan{{plan}}, tokens + 1, 2, 1, 0}), "engine");
  Measured m;
  const auto& kr = std::get<KvReserve>(engine->reserve().layers[0]);
  m.booked_per_token = double(kr.k_rows.bytes + kr.v_rows.bytes) / double(tokens);
  {
    auto s = Must(engine->NewSession(), "session");
    constexpr std::uint64_t kChunk = 8192;
    Memory dk = Must(dev.Allocate(kChunk * plan.k_width * 4), "rows"), dv = Must(dev.Allocate(kChunk * plan.v_width * 4), "rows");
    for (std::uint64_t at = 0; at < tokens; at += kChunk) {
      const std::uint64_t n = std::min(kChunk, tokens - at);
      Must(dev.Upload(dk.data(), rows.k.data() + at * plan.k_width, n * plan.k_width * 4, Lane::kCompute), "upload");
      Must(dev.Upload(dv.data(), rows.v.data() + at * plan.v_width, n * plan.v_width * 4, Lane::kCompute), "upload");
      Must(s->kv(0)->Append(dk.at<float>(0), dv.at<float>(0), n), "append");
    }
    Must(dev.Synchronize(Lane::kCompute), "sync");
    auto t0 = Clock::now();
    std::vector<LayerSnapshot> snap = Must(s->CaptureFull(), "capture");
    m.capture_s = Since(t0);
    const auto& kv = std::get<KvSnapshot>(snap[0]);
    const std::uint64_t bytes = (kv.k_rows.size() + kv.v_rows.size()) * 4;
    m.snapshot_per_token = double(bytes) / double(tokens);
    m.stored_per_token = double([&] {
      std::uint64_t b = 0;
      for (const auto& c : Must(EncodeLayer(snap[0]), "encode").chunks) b += c.size();
      return b;
    }()) / double(tokens);

    // The snapshot in one pinned block, restored into fresh sessions.
    Memory pinned = Must(dev.AllocatePinned(bytes), "pinned");
    const std::size_t k_bytes = kv.k_rows.size() * sizeof(float);  // Memory::at takes byte offsets
    std::memcpy(pinned.data(), kv.k_rows.data(), k_bytes);
    std::memcpy(pinned.at<float>(k_bytes), kv.v_rows.data(), kv.v_rows.size() * sizeof(float));
    const KvSnapshotView view{kv.shape, {pinned.at<const float>(0), kv.k_rows.size()},
                      {pinned.at<const float>(k_bytes), kv.v_rows.size()}};
    std::vector<double> times;
    for (std::uint32_t r = 0; r < reps; ++r) {
      auto fresh = Must(engine->NewSession(), "fresh session");
      const std::vector<LayerSnapshotView> views{view};
      t0 = Clock::now();
      Must(fresh->Restore(views), "restore");
      times.push_back(Since(t0));
      if (r + 1 == reps) {
        auto back = Must(fresh->CaptureFull(), "capture after restore");
        const auto& b = std::get<KvSnapshot>(back[0]);
        m.exact = b.shape == kv.shape && std::memcmp(b.k_rows.data(), kv.k_rows.data(), kv.k_rows.size() * 4) == 0 &&
                  std::memcmp(b.v_rows.data(), kv.v_rows.data(), kv.v_rows.size() * 4) == 0;
      }
    }
    std::sort(times.begin(), times.end());
    m.restore_gbs = double(bytes) / 1e9 / times[times.size() / 2];
  }
  return m;
}

}  // namespace

int KvKindsBench(const std::shared_ptr<Device>& device, std::uint64_t tokens, std::uint32_t reps,
                 const std::string& csv_dir, const std::string& csv_name) {
  bench::CsvTable csv({"device", "tokens", "kind", "booked_bytes_per_token", "snapshot_bytes_per_token",
                       "stored_bytes_per_token", "capture_ms", "restore_gbps"});
  std::vector<float> signs(kHeadDim);
  std::mt19937 rng(5);
  for (auto& s : signs) s = rng() % 2 ? 1.0f : -1.0f;
  const std::uint64_t signs_digest = Checksum64(std::as_bytes(std::span(signs)));
  std::printf("kv-kinds: %s; one attn layer, %u KV heads x %u, %llu tokens, window %u where rotating\n",
              device->name().c_str(), kKvHeads, kHeadDim, static_cast<unsigned long long>(tokens), kWindow);
  std::printf("kv-kinds: %-32s %12s %12s %12s %9s %10s %9s  %s\n", "kind", "booked B/tok", "snap B/tok",
              "stored B/tok", "vs f32", "capture", "restore", "restored == captured");
  double f32_snapshot = 0;
  bool pass = true;
  for (std::uint32_t bits : {0u, 4u, 2u}) {
    const Rows rows = MakeRows(tokens, bits, signs);
    for (std::uint32_t window : {0u, kWindow}) {
      KvPlan plan;
      plan.format = KvFormat{window, bits, bits ? kHeadDim : 0, bits ? signs_digest : 0};
      plan.k_width = plan.v_width = kKvHeads * static_cast<std::uint32_t>(kernels::KvEntryWords(kHeadDim, bits));
      const Measured m = MeasureKind(device, plan, rows, tokens, reps);
      if (bits == 0 && window == 0) f32_snapshot = m.snapshot_per_token;
      // The f32 plain kind's bytes per token over this kind's, per stored row.
      const double row_ratio = double(2 * kKvHeads * kHeadDim * 4) / double(plan.k_width * 4 + plan.v_width * 4);
      std::printf("kv-kinds: %-32s %12.0f %12.1f %12.1f %8.2fx %8.1fms %6.2fGB/s  %s\n",
                  std::string(KvKindOf(plan.format)).c_str(), m.booked_per_token, m.snapshot_per_token,
                  m.stored_per_token, window == 0 ? f32_snapshot / m.snapshot_per_token : row_ratio, m.capture_s * 1e3,
                  m.restore_gbs, m.exact ? "bit-identical" : "DIFFERENT");
      pass = pass && m.exact;
      Must(csv.Add({device->name(), tokens, std::string(KvKindOf(plan.format)), m.booked_per_token,
                    m.snapshot_per_token, m.stored_per_token, m.capture_s * 1e3, m.restore_gbs}),
           "csv");
    }
  }
  Must(csv.WriteToDir(csv_dir, csv_name), "csv");
  return pass ? 0 : 1;
}

}  // namespace primecache::engine

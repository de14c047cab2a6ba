// primecache-engine-bench: the engine's capture and restore costs on a
// GLM-5-class hybrid (by default 12 MLA layers: latent row 512 + 64, DSA
// indexer head_dim 128, pool 4, index tail ring; 36 KDA layers: 64 heads x
// 128, conv kernel 4), on one CUDA device.
//
// For each boundary length it primes a session to that length and measures:
//  - the full snapshot (CaptureFull: every plane to host memory, pageable
//    vectors allocated by the call), and the same into one pinned block
//    (CaptureFullInto) against a pinned device-to-host copy of as many bytes;
//  - the eager half on the decode path: CaptureEager plus the compute lane
//    draining its on-device copies into the snapshot slot (median), and,
//    apart, the slot's asynchronous trip to pinned host memory (Collect);
//  - the restore of the full snapshot from pinned host memory into a fresh
//    session cache, against a pinned cudaMemcpy of the same bytes measured in
//    the same run.
// Exit status 1 when a copy is not exact (a restored cache that does not
// equal its source, an eager + deferred snapshot that differs) or a CSV could
// not be written; 3 when every copy was exact but a target was missed (as a
// brief --cpu run may). Targets: eager half <= 5 % of the full snapshot at the first
// length; restore >= 0.8 x the pinned copy rate at every length; the full
// snapshot into pinned memory >= 0.5 x the pinned device-to-host rate.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/device.h"
#include "primecache/internal/engine.h"
#include "tools/bench/kv_kinds_bench.h"
#include "tools/common/csv.h"

using namespace primecache;
using namespace primecache::engine;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double GiB(double bytes) {
  return bytes / double(1ull << 30);
}

#define BENCH_OK(expr)                                                               \
  do {                                                                               \
    ::primecache::Status st_ = (expr);                                               \
    if (!st_.ok()) {                                                                 \
      std::fprintf(stderr, "engine-bench: %s: %s\n", #expr, st_.ToString().c_str()); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

template <typename T>
T Must(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "engine-bench: %s: %s\n", what, r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

Memory RandomDevice(Device& dev, std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> h(n);
  for (auto& x : h) x = nd(rng);
  Memory m = Must(dev.Allocate(n * sizeof(float)), "allocate inputs");
  BENCH_OK(dev.Upload(m.data(), h.data(), n * sizeof(float), Lane::kCompute));
  return m;
}

// Feeds the model's per-call state to every layer: latent and index rows of
// `count` tokens to each MLA layer (the ring drains inside the call); to each
// KDA layer a new state and the last kernel-1 pre-conv inputs of the call
// (the only ones its conv ring keeps).
struct Primer {
  Device& dev;
  const StatePlan& plan;
  std::uint64_t chunk;
  Memory latent, index, ape, state, conv;
  Primer(Device& d, const StatePlan& p, std::uint64_t chunk_tokens, std::mt19937& rng)
      : dev(d), plan(p), chunk(chunk_tokens) {
    const auto& mla = std::get<LatentPlan>(plan.layers.back());
    RecurrentShape kda{};
    for (const auto& l : plan.layers) {
      if (const auto* r = std::get_if<RecurrentShape>(&l)) kda = *r;
    }
    latent = RandomDevice(dev, chunk * mla.width(), rng);
    index = RandomDevice(dev, chunk * mla.index_width(), rng);
    ape = RandomDevice(dev, std::size_t{mla.pool} * mla.index_head_dim, rng);
    state = RandomDevice(dev, kda.state_values(), rng);
    conv = RandomDevice(dev, (kda.kernel - 1) * kda.conv_channels(), rng);
  }
  void Prime(SessionCache& s, std::uint64_t to) {
    for (std::uint64_t len = s.latent(plan.layers.size() - 1)->len(); len < to;) {
      const std::uint64_t t = std::min(chunk, to - len);
      for (std::size_t i = 0; i < s.layer_count(); ++i) {
        if (LatentCacheLayer* l = s.latent(i)) {
          IndexerInputs ix{l->plan().pool, static_cast<const float*>(ape.data())};
          BENCH_OK(l->Append(static_cast<const float*>(latent.data()),
                             static_cast<const float*>(index.data()), t, &ix));
        } else if (RecurrentCacheLayer* r = s.recurrent(i)) {
          BENCH_OK(dev.CopyOnDevice(r->next_state(), state.data(), state.bytes(), Lane::kCompute));
          BENCH_OK(r->Step(static_cast<const float*>(conv.data()), r->plan().kernel - 1));
        }
      }
      len += t;
    }
    BENCH_OK(dev.Synchronize(Lane::kCompute));
  }
};

std::uint64_t SnapshotBytes(const std::vector<LayerSnapshot>& snap) {
  std::uint64_t b = 0;
  for (const auto& l : snap) {
    if (const auto* x = std::get_if<LatentSnapshot>(&l)) {
      b += (x->latent_rows.size() + x->index_tail_rows.size() + x->pool_keys.size()) * 4;
    } else if (const auto* r = std::get_if<RecurrentSnapshot>(&l)) {
      b += (r->conv_ring.size() + r->state.size()) * 4;
    } else {
      const auto& kv = std::get<KvSnapshot>(l);
      b += (kv.k_rows.size() + kv.v_rows.size()) * 4;
    }
  }
  return b;
}

bool Same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

bool SameSnapshot(const std::vector<LayerSnapshot>& a, const std::vector<LayerSnapshot>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].index() != b[i].index()) return false;
    if (const auto* x = std::get_if<LatentSnapshot>(&a[i])) {
      const auto& y = std::get<LatentSnapshot>(b[i]);
      if (!(x->shape == y.shape) || !Same(x->latent_rows, y.latent_rows) ||
          !Same(x->index_tail_rows, y.index_tail_rows) || !Same(x->pool_keys, y.pool_keys)) {
        return false;
      }
    } else if (const auto* r = std::get_if<RecurrentSnapshot>(&a[i])) {
      const auto& q = std::get<RecurrentSnapshot>(b[i]);
      if (!(r->shape == q.shape) || !Same(r->conv_ring, q.conv_ring) || !Same(r->state, q.state))
        return false;
    }
  }
  return true;
}

// The snapshot copied into one pinned block, and views of it.
struct PinnedSnapshot {
  Memory block;
  std::vector<LayerSnapshotView> views;
  PinnedSnapshot(Device& dev, const std::vector<LayerSnapshot>& snap) {
    block = Must(dev.AllocatePinned(SnapshotBytes(snap)), "pinned snapshot");
    float* at = static_cast<float*>(block.data());
    auto place = [&](std::span<const float> s) {
      if (!s.empty()) std::memcpy(at, s.data(), s.size_bytes());
      std::span<const float> out(at, s.size());
      at += s.size();
      return out;
    };
    for (const auto& l : snap) {
      LayerSnapshotView v = ViewOf(l);
      if (auto* x = std::get_if<LatentSnapshotView>(&v)) {
        x->latent_rows = place(x->latent_rows);
        x->index_tail_rows = place(x->index_tail_rows);
        x->pool_keys = place(x->pool_keys);
      } else if (auto* r = std::get_if<RecurrentSnapshotView>(&v)) {
        r->conv_ring = place(r->conv_ring);
        r->state = place(r->state);
      } else {
        auto& kv = std::get<KvSnapshotView>(v);
        kv.k_rows = place(kv.k_rows);
        kv.v_rows = place(kv.v_rows);
      }
      views.push_back(v);
    }
  }
};

// The command line.
struct Options {
  std::vector<std::uint64_t> tokens{32767, 131071};
  std::uint32_t mla_layers = 12, kda_layers = 36, eager_reps = 20, full_reps = 3, restore_reps = 5;
  std::uint64_t ring = 4096, chunk = 8192;
  bool cpu = false, kv_kinds = false;
  std::string csv_dir;
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--tokens", o.tokens, "boundary lengths, ascending")->delimiter(',');
  app.add_option("--mla-layers", o.mla_layers)->check(CLI::Range(1, 200));
  app.add_option("--kda-layers", o.kda_layers)->check(CLI::Range(0, 400));
  app.add_option("--ring", o.ring, "booked index ring rows (0: flat)");
  app.add_option("--chunk", o.chunk, "tokens per priming call")->check(CLI::Range(1, 1 << 20));
  app.add_option("--eager-reps", o.eager_reps)->check(CLI::Range(1, 1000));
  app.add_option("--full-reps", o.full_reps)->check(CLI::Range(1, 100));
  app.add_option("--restore-reps", o.restore_reps)->check(CLI::Range(1, 100));
  app.add_flag("--cpu", o.cpu, "run on the CPU reference backend (a smoke test of the benchmark itself)");
  app.add_flag(
      "--kv-kinds", o.kv_kinds,
      "measure the KV storage kinds (plain, rotating, TurboQuant) at the first --tokens length instead");
  app.add_option("--csv-dir", o.csv_dir,
                 "also write the restore rates as DIR/engine-restore-BACKEND.csv, or with --kv-kinds "
                 "DIR/kv-kinds-BACKEND.csv (BACKEND cpu or cuda; tools/bench/plot.py)");
}

// The restore rates in model_bench's restore table's columns, so that one
// chart draws both.
bench::CsvTable RestoreTable() {
  return bench::CsvTable({"config", "device", "prefix_tokens", "path", "restored_bytes", "restore_ms",
                          "restore_gbps", "pinned_h2d_gbps"});
}

const LatentPlan kMla{512, 64, 128, 4};
const RecurrentShape kKda{64, 128, 4};

// kda, kda, kda, mla, ... with the MLA layers spread evenly, an MLA layer last.
StatePlan HybridPlan(const Options& o) {
  StatePlan plan;
  for (std::uint32_t m = 0; m < o.mla_layers; ++m) {
    const std::uint32_t k_here = (o.kda_layers * (m + 1)) / o.mla_layers - (o.kda_layers * m) / o.mla_layers;
    for (std::uint32_t k = 0; k < k_here; ++k) plan.layers.push_back(kKda);
    plan.layers.push_back(kMla);
  }
  return plan;
}

// What one boundary length's measurements share.
struct Run {
  Run(const Options& opts, Device& d, Engine& e, SessionCache& s, std::uint64_t length)
      : o(opts), dev(d), engine(e), source(s), len(length) {}
  const Options& o;
  Device& dev;
  Engine& engine;
  SessionCache& source;
  std::uint64_t len;
  std::vector<LayerSnapshot> full;  // the source's full snapshot at len
  double full_bytes = 0, full_med = 0;
  bench::CsvTable* csv = nullptr;  // the restore rows, when asked for
  bool exact = true;               // false once a copy differed (a failure, whatever the targets)
};

// CaptureFull, timed: the median of full_reps into run.full_med.
void MeasureFull(Run& run) {
  std::vector<double> full_s;
  for (std::uint32_t r = 0; r < run.o.full_reps; ++r) {
    BENCH_OK(run.dev.Synchronize(Lane::kCompute));
    const auto t0 = Clock::now();
    run.full = Must(run.source.CaptureFull(), "full snapshot");
    full_s.push_back(Seconds(t0, Clock::now()));
  }
  run.full_bytes = static_cast<double>(SnapshotBytes(run.full));
  run.full_med = Median(full_s);
}

// The same snapshot into one pinned block (allocated once, outside the
// timing): every copy enqueued back to back, the lane waited for once;
// against a pinned device-to-host copy of as many bytes into that block.
// Whether the target is met (and the views cover every layer).
bool MeasurePinnedCapture(Run& run) {
  Device& dev = run.dev;
  const auto bytes = static_cast<std::size_t>(run.full_bytes);
  Memory pinned_block;
  const CaptureSpace space = [&](std::uint64_t floats) -> Result<std::span<float>> {
    if (pinned_block.bytes() < floats * sizeof(float)) {
      PC_ASSIGN_OR_RETURN(pinned_block, dev.AllocatePinned(floats * sizeof(float)));
    }
    return std::span<float>(pinned_block.at<float>(0), floats);
  };
  bool pass = true;
  std::vector<double> pinned_s, d2h_s;
  Memory d2h_src = Must(dev.Allocate(bytes), "d2h source");
  for (std::uint32_t r = 0; r < run.o.full_reps + 1; ++r) {
    BENCH_OK(dev.Synchronize(Lane::kCompute));
    auto t0 = Clock::now();
    auto views = Must(run.source.CaptureFullInto(space), "full snapshot into pinned memory");
    if (r > 0) pinned_s.push_back(Seconds(t0, Clock::now()));  // the first allocates the block
    if (r == 0 && views.size() != run.full.size()) pass = run.exact = false;
    t0 = Clock::now();
    BENCH_OK(dev.DownloadAsync(pinned_block.data(), d2h_src.data(), bytes, Lane::kCompute));
    BENCH_OK(dev.Synchronize(Lane::kCompute));
    if (r > 0) d2h_s.push_back(Seconds(t0, Clock::now()));
  }
  d2h_src.Reset();
  const double pinned_gbs = run.full_bytes / Median(pinned_s) / 1e9,
               d2h_gbs = run.full_bytes / Median(d2h_s) / 1e9;
  const bool snapshot_target = pinned_gbs >= 0.5 * d2h_gbs;
  std::printf(
      "engine-bench: [%llu tokens] full snapshot into pinned memory %.1f ms = %.1f GB/s (median of %u); "
      "pinned "
      "device-to-host copy %.1f GB/s; ratio %.2f (target >= 0.5: %s)\n",
      static_cast<unsigned long long>(run.len), Median(pinned_s) * 1e3, pinned_gbs, run.o.full_reps, d2h_gbs,
      pinned_gbs / d2h_gbs, snapshot_target ? "PASS" : "FAIL");
  return pass && snapshot_target;
}

// The eager half's two legs, medians in seconds.
struct EagerTimes {
  double decode_path = 0, leg = 0;
  bool same = true;  // eager + deferred == the full snapshot
};

// Eager half: the decode path's share, then the asynchronous leg.
EagerTimes MeasureEager(Run& run) {
  Device& dev = run.dev;
  EagerTimes out;
  std::vector<double> eager_s, leg_s;
  for (std::uint32_t r = 0; r < run.o.eager_reps; ++r) {
    BENCH_OK(dev.Synchronize(Lane::kCompute));
    BENCH_OK(dev.Synchronize(Lane::kTransfer));
    const auto t0 = Clock::now();
    PendingCapture pending = Must(run.source.CaptureEager(), "eager capture");
    BENCH_OK(dev.Synchronize(Lane::kCompute));
    const auto t1 = Clock::now();
    EagerHalf half = Must(pending.Collect(), "collect");
    const auto t2 = Clock::now();
    eager_s.push_back(Seconds(t0, t1));
    leg_s.push_back(Seconds(t1, t2));
    if (r + 1 == run.o.eager_reps) {
      // The deferred half joins it into the same snapshot as the full one.
      auto joined = Must(run.source.CompleteCapture(std::move(half)), "deferred half");
      out.same = SameSnapshot(joined, run.full);
    }
  }
  out.decode_path = Median(eager_s);
  out.leg = Median(leg_s);
  return out;
}

// The bus rate for `bytes` from the pinned block: a pinned cudaMemcpy H2D
// (memcpy on the CPU backend); seconds of each of `reps`, after a warm-up.
std::vector<double> CopyRate(Device& dev, const Memory& pinned, std::size_t bytes, std::uint32_t reps,
                             bool cpu) {
  Memory scratch = Must(dev.Allocate(bytes), "copy-rate scratch");
  std::vector<double> copy_s;
  for (std::uint32_t r = 0; r < reps + 1; ++r) {
    auto t0 = Clock::now();
    if (cpu) {
      std::memcpy(scratch.data(), pinned.data(), bytes);
    } else {
      cudaDeviceSynchronize();
      t0 = Clock::now();
      if (cudaMemcpy(scratch.data(), pinned.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        std::fprintf(stderr, "engine-bench: pinned cudaMemcpy failed\n");
        std::exit(1);
      }
    }
    if (r > 0) copy_s.push_back(Seconds(t0, Clock::now()));  // the first warms up
  }
  return copy_s;
}

// Restore from pinned host memory into fresh session caches, against the
// bus rate for the same bytes, same pinned block, same run. Whether the
// target is met and the restored cache equals the source.
bool MeasureRestore(Run& run) {
  PinnedSnapshot pinned(run.dev, run.full);
  bool pass = true;
  std::vector<double> restore_s;
  for (std::uint32_t r = 0; r < run.o.restore_reps; ++r) {
    auto target = Must(run.engine.NewSession(), "target session");
    BENCH_OK(run.dev.Synchronize(Lane::kCompute));  // its arena's zeroing is not the restore's
    const auto t0 = Clock::now();
    BENCH_OK(target->Restore(pinned.views));
    restore_s.push_back(Seconds(t0, Clock::now()));
    if (r == 0) {
      auto back = Must(target->CaptureFull(), "capture of the restored cache");
      if (!SameSnapshot(back, run.full)) {
        std::printf("engine-bench: [%llu tokens] restored cache != source\n",
                    static_cast<unsigned long long>(run.len));
        pass = run.exact = false;
      }
    }
  }
  const std::vector<double> copy_s = CopyRate(run.dev, pinned.block, static_cast<std::size_t>(run.full_bytes),
                                              run.o.restore_reps, run.o.cpu);
  const double restore_gbs = run.full_bytes / Median(restore_s) / 1e9;
  const double copy_gbs = run.full_bytes / Median(copy_s) / 1e9;
  const bool restore_target = restore_gbs >= 0.8 * copy_gbs;
  if (run.csv != nullptr) {
    (void)run.csv->Add({"engine-bench hybrid", run.dev.name(), run.len, "engine restore, pinned",
                        static_cast<std::uint64_t>(run.full_bytes), Median(restore_s) * 1e3, restore_gbs, copy_gbs});
  }
  std::printf(
      "engine-bench: [%llu tokens] restore from pinned host %.3f GiB in %.1f ms = %.1f GB/s (median of "
      "%u); "
      "%s %.1f GB/s; ratio %.2f (target >= 0.8: %s)\n",
      static_cast<unsigned long long>(run.len), GiB(run.full_bytes), Median(restore_s) * 1e3, restore_gbs,
      run.o.restore_reps, run.o.cpu ? "pinned memcpy" : "pinned cudaMemcpy H2D", copy_gbs,
      restore_gbs / copy_gbs, restore_target ? "PASS" : "FAIL");
  return pass && restore_target;
}

// One boundary length (the `ti`-th): prime the source to it, then every
// measurement. Whether every target was met and every copy was exact.
bool MeasureLength(Run& run, Primer& primer, std::size_t ti) {
  const auto t0 = Clock::now();
  primer.Prime(run.source, run.len);
  const double prime_s = Seconds(t0, Clock::now());
  MeasureFull(run);
  bool pass = MeasurePinnedCapture(run);
  const EagerTimes eager = MeasureEager(run);
  if (!eager.same) {
    std::printf("engine-bench: [%llu tokens] eager + deferred != full snapshot\n",
                static_cast<unsigned long long>(run.len));
    pass = run.exact = false;
  }
  const double ratio = eager.decode_path / run.full_med;
  std::printf(
      "engine-bench: [%llu tokens] primed in %.2f s; full snapshot %.3f GiB in %.1f ms (median of %u, "
      "%.1f GB/s)\n",
      static_cast<unsigned long long>(run.len), prime_s, GiB(run.full_bytes), run.full_med * 1e3,
      run.o.full_reps, run.full_bytes / run.full_med / 1e9);
  const bool eager_target = ti != 0 || ratio <= 0.05;
  std::printf(
      "engine-bench: [%llu tokens] eager half on the decode path %.1f us (median of %u), slot to pinned "
      "host %.1f us more; eager / full = %.3f %%%s\n",
      static_cast<unsigned long long>(run.len), eager.decode_path * 1e6, run.o.eager_reps, eager.leg * 1e6,
      ratio * 100, ti == 0 ? (eager_target ? " (target <= 5 %: PASS)" : " (target <= 5 %: FAIL)") : "");
  pass = pass && eager_target;
  return MeasureRestore(run) && pass;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Capture and restore costs of the engine on a GLM-5-class hybrid"};
  Options o;
  AddOptions(app, o);
  CLI11_PARSE(app, argc, argv);
  std::sort(o.tokens.begin(), o.tokens.end());

  if (!o.cpu && !CudaDeviceAvailable()) {
    std::printf("engine-bench: no CUDA device; nothing measured\n");
    return 0;
  }
  auto device =
      o.cpu ? NewCpuDevice({.memory_bytes = 64ull << 30}) : Must(NewCudaDevice({}), "open CUDA device");
  Device& dev = *device;
  // The backend in the file names: a CPU run's CSV never replaces a GPU one's.
  const std::string backend = o.cpu ? "-cpu" : "-cuda";
  if (o.kv_kinds) return KvKindsBench(device, o.tokens.front(), o.restore_reps, o.csv_dir, "kv-kinds" + backend);

  const StatePlan plan = HybridPlan(o);
  const std::uint64_t max_ctx = o.tokens.back() + 1;
  const ReserveRequest req{plan, max_ctx, 2, 2, o.ring};
  auto engine = Must(Engine::Create(device, req), "engine");
  std::printf(
      "engine-bench: %s; %u MLA layers (row %u f32, indexer %u, pool %u, ring %llu booked) + %u KDA layers "
      "(%ux%u, kernel %u); reserve %s\n",
      dev.name().c_str(), o.mla_layers, kMla.width(), kMla.index_head_dim, kMla.pool,
      static_cast<unsigned long long>(o.ring), o.kda_layers, kKda.heads, kKda.head_dim, kKda.kernel,
      engine->reserve().Summary().c_str());

  std::mt19937 rng(1234);
  Primer primer(dev, plan, o.chunk, rng);
  auto source = Must(engine->NewSession(), "source session");
  bool pass = true, exact = true;
  const auto bench_start = Clock::now();
  bench::CsvTable csv = RestoreTable();
  for (std::size_t ti = 0; ti < o.tokens.size(); ++ti) {
    Run run{o, dev, *engine, *source, o.tokens[ti]};
    run.csv = &csv;
    pass = MeasureLength(run, primer, ti) && pass;
    exact = exact && run.exact;
  }
  if (Status st = csv.WriteToDir(o.csv_dir, "engine-restore" + backend); !st.ok()) {
    std::fprintf(stderr, "engine-bench: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("engine-bench: %s in %.1f s\n",
              !exact ? "MISMATCH" : pass ? "all targets met" : "every copy exact, TARGET MISSED",
              Seconds(bench_start, Clock::now()));
  return !exact ? 1 : pass ? 0 : 3;
}

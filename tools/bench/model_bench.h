// primecache-model-bench's pieces (model_bench.cc: the arguments and the
// run): the cases it measures (model_bench_cases.cc: the bus and disk
// baselines, the in-process reference, the path through the daemon, the
// TurboQuant error) and how it reports them (model_bench_report.cc: lines,
// ratios against their targets, the CSV tables).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/model/hybrid_model.h"
#include "serving/prefix_cache.h"
#include "tools/common/csv.h"
#include "tools/common/daemon_process.h"

namespace primecache::model_bench {

using Clock = std::chrono::steady_clock;
inline double Ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

inline int Fail(const Status& s, const char* what) {
  std::fprintf(stderr, "model-bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

// ---- the cases (model_bench_cases.cc) ----------------------------------------

// A model on its engine: the config's, with weights generated from `seed`,
// on the CPU reference or CUDA, for contexts up to `max_ctx` and `sessions`
// sessions at once. With tp > 1 the engine's model is rank `rank`'s share
// of it (RankConfig, RankWeights; no collective: the benches only restore
// into it); config and weights stay the whole model's, its ModelIdFor.
struct BenchSetup {
  model::ModelConfig config;
  model::Weights weights;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<model::HybridModel> model;
};
Result<BenchSetup> Setup(const std::string& config_path, std::uint64_t seed, std::size_t max_ctx, std::size_t chunk,
                         bool cpu, std::size_t sessions = 3, std::uint32_t tp = 1, std::uint32_t rank = 0);

// `n` tokens from `rng`, the first the model's BOS.
std::vector<std::uint32_t> RandomTokens(std::size_t n, std::mt19937& rng);

// The bytes of the largest of `views`' layers.
std::uint64_t LargestLayerBytes(std::span<const engine::LayerSnapshotView> views);

// A way through the daemon: the default settings (no transform named: what a
// user who changes nothing gets), or one transform for every plane.
struct DaemonPath {
  std::string name;                        // its label and namespace
  std::optional<TransformSpec> transform;  // nullopt: the codecs' default
};

// A prefix cache on a new connection to the daemon at `socket` under the
// namespace of `path`, encoding along it, its shared region sized for layers of up to
// `largest_layer_bytes` and its staging for a `P`-token boundary reserved
// (as an engine does at start-up: pinning the staging is not a request's
// cost).
Result<std::unique_ptr<model::PrefixCache>> OpenCache(const std::string& socket, model::HybridModel& m,
                                                      const model::ModelConfig& config,
                                                      const model::Weights& weights,
                                                      std::uint64_t largest_layer_bytes, std::size_t P,
                                                      const DaemonPath& path, const model::PrefixCacheOptions& base);

struct BusRates {
  double h2d_gbs = 0, d2h_gbs = 0;
};

// Pinned host <-> device copies of `bytes`, best of three each way.
Result<BusRates> MeasureBus(engine::Device& dev, std::uint64_t bytes);

// Drops every file under `dir` from the page cache (written back first, so
// the pages are clean and really go).
void DropPageCache(const std::string& dir);

struct DiskRates {
  double write_ms = 0, read_ms = 0;  // fsync'd sequential write; O_DIRECT sequential read
};

// `bytes` written sequentially to a file in `dir` (4 MiB writes, then
// fsync), dropped from the page cache, read back with O_DIRECT.
Result<DiskRates> MeasureDisk(const std::string& dir, std::uint64_t bytes);

// One prefix length: the full prefill, the captured session (pinned full
// snapshot) and its continuation, and the restore from pinned memory.
struct InProcess {
  double full_ms = 0, snapshot_ms = 0, restore_ms = 0, ttft_ms = 0;
  std::uint64_t bytes = 0;
  engine::Memory block;  // the pinned snapshot
  std::vector<engine::LayerSnapshotView> views;
  std::vector<float> full_logits, continued;
  bool exact = false;
};

Result<InProcess> MeasureInProcess(model::HybridModel& m, engine::Device& dev,
                                   std::span<const std::uint32_t> tokens, std::size_t P);

struct DaemonRun {
  double publish_ms = 0;
  std::uint64_t publish_bytes = 0, in_place_layers = 0, layers = 0;
  bool device_window = false;  // attached to the daemon (device copies)
  model::Request hot, cold;
  bool exact = false;
};

// The paths measured, the default first: it is what the targets hold.
std::vector<DaemonPath> DaemonPaths();

// The capture published along `path` (its own namespace), then restored
// hot (the second of two requests) and cold: a new daemon on the same store
// (the old one's registered mappings held the segments' pages), the store's
// files dropped from the page cache, a new connection warmed by a short
// request that misses.
Result<DaemonRun> MeasureDaemon(launcher::DaemonProcess& daemon, model::HybridModel& m,
                                const model::ModelConfig& config, const model::Weights& weights,
                                const InProcess& ref, std::span<const std::uint32_t> tokens, std::size_t P,
                                const DaemonPath& path, const model::PrefixCacheOptions& base);

// TurboQuant against f32 on the same weights: the config as given (its
// attn layers quantized) and its twin with kv_quant null, both priming the
// same `tokens` random tokens in one session; the relative error of every
// position's logits, and the KV bytes per token of each.
int QuantError(const model::ModelConfig& config, const model::Weights& weights, std::size_t tokens,
               std::size_t chunk, const std::shared_ptr<engine::Device>& device);

// ---- reporting (model_bench_report.cc) -----------------------------------------

// Encodes every layer of a real snapshot with each transform and reports,
// per plane, the compression ratio and the encode and decode rates (one
// thread): the measurement the codecs' default choice rests on.
void ReportRatios(const std::vector<LayerSnapshot>& layers);

// GB/s of `bytes` in `ms`.
double Gbs(std::uint64_t bytes, double ms);

void ReportInProcess(std::size_t P, std::size_t suffix, const InProcess& r, const BusRates& bus);
void ReportDaemon(const DaemonPath& path, const DaemonRun& d, const InProcess& ref, const BusRates& bus,
                  const DiskRates& disk);

// The figures as CSV tables: TTFT per path and prefix, and every restore's
// rate beside the pinned host-to-device copy of the same run.
struct Figures {
  std::string config, device;
  bench::CsvTable ttft{{"config", "device", "prefix_tokens", "suffix_tokens", "path", "ttft_ms"}};
  bench::CsvTable restore{{"config", "device", "prefix_tokens", "path", "restored_bytes", "restore_ms",
                           "restore_gbps", "pinned_h2d_gbps"}};
};

void RecordInProcess(Figures& f, std::size_t P, std::size_t suffix, const InProcess& r, const BusRates& bus);
void RecordDaemon(Figures& f, std::size_t P, std::size_t suffix, const DaemonPath& path, const DaemonRun& d,
                  const BusRates& bus);

}  // namespace primecache::model_bench

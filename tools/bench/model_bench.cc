// primecache-model-bench: time to first token with and without a restored
// prefix, in process and through the daemon, on CUDA (or the CPU reference
// with --cpu).
//
// For each prefix length P (random tokens, then a suffix of S tokens):
//   full      one session primes P + S tokens; time to the last token's logits;
//   snapshot  a second session primes P and is captured in full into pinned
//             host memory (the engine's full snapshot, timed);
//   restore   a fresh session restores that snapshot from pinned memory and
//             primes the S-token suffix; time from the restore's start;
//   copy      as many bytes copied host-to-device and device-to-host between
//             pinned and device memory in the same run: the bus rates the
//             restore and the snapshot are held to.
// With --daemon, the same capture is published through a primecached child
// (raw and shuffle-zstd) and restored through PrefixCache with the store in
// the page cache (hot) and with its files dropped from it (cold), beside an
// fsync'd sequential write and an O_DIRECT sequential read of as many bytes on
// the daemon's file system; one line per ratio with its target.
// --ttft-table prints the TTFT rows of docs/BENCHMARKS.md instead.
// --csv-dir DIR also writes the figures as DIR/model-ttft-CONFIG.csv and
// DIR/model-restore-CONFIG.csv (tools/bench/plot.py draws them).
// Every restored continuation must be bit-identical to the captured session's.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "engine/device.h"
#include "engine/model/hybrid_model.h"
#include "primecache/internal/codec.h"
#include "serving/prefix_cache.h"
#include "tools/common/csv.h"
#include "tools/common/daemon_process.h"

using namespace primecache;

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int Fail(const Status& s, const char* what) {
  std::fprintf(stderr, "model-bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

// Encodes every layer of a real snapshot with each transform and reports,
// per plane, the compression ratio and the encode and decode rates (one
// thread): the measurement the codecs' default choice rests on.
void ReportRatios(const std::vector<LayerSnapshot>& layers) {
  struct Choice {
    const char* name;
    TransformSpec spec;
  };
  const Choice choices[] = {{"raw", {"raw/v1", 0}},
                            {"shuffle-zstd-1", {"shuffle-zstd/v1", 1}},
                            {"shuffle-zstd-3", {"shuffle-zstd/v1", 3}},
                            {"bf16 (latent only)", {"bf16/v1", 0}},
                            {"q8_0 (latent only)", {"q8_0/v1", 0}}};
  for (const Choice& c : choices) {
    EncodeOptions opt;
    const bool lossy = c.spec.id == "bf16/v1" || c.spec.id == "q8_0/v1";
    if (lossy) {
      opt.plane_transforms.push_back({PlaneId::kLatentRows, c.spec});
    } else {
      opt.all_planes = c.spec;
    }
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> per_plane;  // raw, encoded
    double enc_s = 0, dec_s = 0;
    std::uint64_t raw_total = 0;
    for (const LayerSnapshot& layer : layers) {
      auto t0 = Clock::now();
      auto enc = EncodeLayer(layer, opt);
      enc_s += Ms(t0) / 1e3;
      if (!enc.ok()) {
        std::printf("model-bench: ratios: %s: %s\n", c.name, enc.status().ToString().c_str());
        return;
      }
      for (const PlaneRecord& p : enc->header.planes) {
        auto& acc = per_plane[std::string(PlaneName(p.id)) + (lossy && p.id != PlaneId::kLatentRows ? " (default)" : "")];
        for (const ChunkRecord& ch : p.chunks) {
          acc.first += ch.raw_bytes;
          acc.second += ch.encoded_bytes;
          raw_total += ch.raw_bytes;
        }
      }
      // Decode into planes allocated and touched beforehand, as a restore
      // decodes into its staging: the rate is the codec's, not the allocator's.
      auto dst = MakeSnapshot(ShapeOf(layer));
      auto codec = CodecRegistry::Default().KindFor(ShapeOf(layer));
      if (!dst.ok() || !codec.ok()) return;
      const std::vector<std::span<float>> spans = (*codec)->MutablePlaneData(*dst);
      t0 = Clock::now();
      Status dec = DecodeLayerInto(*enc, spans);
      dec_s += Ms(t0) / 1e3;
      if (!dec.ok()) {
        std::printf("model-bench: ratios: %s decode: %s\n", c.name, dec.ToString().c_str());
        return;
      }
    }
    std::string planes;
    for (const auto& [name, v] : per_plane) {
      if (v.first == 0) continue;  // an empty plane (the index tail at a pool multiple)
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.3f", name.c_str(), double(v.first) / double(std::max<std::uint64_t>(v.second, 1)));
      planes += buf;
    }
    std::printf("model-bench: ratios %-19s encode %5.2f GB/s decode %5.2f GB/s |%s\n", c.name,
                double(raw_total) / 1e9 / enc_s, double(raw_total) / 1e9 / dec_s, planes.c_str());
  }
}

// ---- baselines: the bus and the file system ---------------------------------

struct BusRates {
  double h2d_gbs = 0, d2h_gbs = 0;
};

// Pinned host <-> device copies of `bytes`, best of three each way.
Result<BusRates> MeasureBus(engine::Device& dev, std::uint64_t bytes) {
  PC_ASSIGN_OR_RETURN(engine::Memory host, dev.AllocatePinned(bytes));
  PC_ASSIGN_OR_RETURN(engine::Memory device, dev.Allocate(bytes));
  double up = 1e30, down = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    PC_RETURN_IF_ERROR(dev.UploadAsync(device.data(), host.data(), bytes, engine::Lane::kCompute));
    PC_RETURN_IF_ERROR(dev.Synchronize(engine::Lane::kCompute));
    up = std::min(up, Ms(t0));
    t0 = Clock::now();
    PC_RETURN_IF_ERROR(dev.DownloadAsync(host.data(), device.data(), bytes, engine::Lane::kCompute));
    PC_RETURN_IF_ERROR(dev.Synchronize(engine::Lane::kCompute));
    down = std::min(down, Ms(t0));
  }
  return BusRates{double(bytes) / 1e6 / up, double(bytes) / 1e6 / down};
}

// Drops every file under `dir` from the page cache (written back first, so
// the pages are clean and really go).
void DropPageCache(const std::string& dir) {
  std::error_code ec;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!f.is_regular_file(ec)) continue;
    const int fd = open(f.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    (void)fdatasync(fd);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

struct DiskRates {
  double write_ms = 0, read_ms = 0;  // fsync'd sequential write; O_DIRECT sequential read
};

// `bytes` written sequentially to a file in `dir` (4 MiB writes, then
// fsync), dropped from the page cache, read back with O_DIRECT.
Result<DiskRates> MeasureDisk(const std::string& dir, std::uint64_t bytes) {
  constexpr std::size_t kBlock = 4u << 20;
  const std::string path = dir + "/disk-baseline";
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, kBlock) != 0) return Status::ResourceExhausted("aligned buffer");
  std::unique_ptr<void, decltype(&std::free)> hold(buf, &std::free);
  std::memset(buf, 0x5a, kBlock);
  const std::uint64_t total = (bytes + kBlock - 1) / kBlock * kBlock;
  DiskRates r;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return Status::IOError("open " + path);
  auto t0 = Clock::now();
  bool ok = true;
  for (std::uint64_t off = 0; off < total && ok; off += kBlock) ok = write(fd, buf, kBlock) == ssize_t(kBlock);
  ok = ok && fsync(fd) == 0;
  r.write_ms = Ms(t0);
  close(fd);
  if (!ok) return Status::IOError("write " + path);
  DropPageCache(dir);
  fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return Status::IOError("open O_DIRECT " + path);
  t0 = Clock::now();
  for (std::uint64_t off = 0; off < total && ok; off += kBlock) ok = read(fd, buf, kBlock) == ssize_t(kBlock);
  r.read_ms = Ms(t0);
  close(fd);
  std::filesystem::remove(path);
  if (!ok) return Status::IOError("O_DIRECT read " + path);
  return r;
}

// ---- the in-process reference ----------------------------------------------

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

// The prefix's full snapshot into one pinned block: sized by a first capture,
// timed on a second into the same block.
Status SnapshotPinned(engine::Device& dev, model::ModelSession& src, InProcess* r) {
  const engine::CaptureSpace space = [&](std::uint64_t floats) -> Result<std::span<float>> {
    if (r->block.bytes() < floats * sizeof(float)) {
      r->block.Reset();
      PC_ASSIGN_OR_RETURN(r->block, dev.AllocatePinned(floats * sizeof(float)));
    }
    r->bytes = floats * sizeof(float);
    return std::span<float>(r->block.at<float>(0), floats);
  };
  PC_RETURN_IF_ERROR(src.cache->CaptureFullInto(space).status());
  const auto t0 = Clock::now();
  PC_ASSIGN_OR_RETURN(r->views, src.cache->CaptureFullInto(space));
  r->snapshot_ms = Ms(t0);
  return Status::Ok();
}

Result<InProcess> MeasureInProcess(model::HybridModel& m, engine::Device& dev, std::span<const std::uint32_t> tokens,
                                   std::size_t P) {
  InProcess r;
  const auto prefix = tokens.first(P), rest = tokens.subspan(P);
  {
    PC_ASSIGN_OR_RETURN(auto s, m.NewSession());
    const auto t0 = Clock::now();
    PC_RETURN_IF_ERROR(m.Prime(s, tokens, model::LogitsWanted::kLast, &r.full_logits));
    r.full_ms = Ms(t0);
  }
  PC_ASSIGN_OR_RETURN(auto src, m.NewSession());
  PC_RETURN_IF_ERROR(m.Prime(src, prefix, model::LogitsWanted::kNone, nullptr));
  PC_RETURN_IF_ERROR(SnapshotPinned(dev, src, &r));
  PC_RETURN_IF_ERROR(m.Prime(src, rest, model::LogitsWanted::kLast, &r.continued));
  src.cache.reset();

  PC_ASSIGN_OR_RETURN(auto dst, m.NewSession());
  std::vector<float> logits;
  const auto t0 = Clock::now();
  PC_RETURN_IF_ERROR(dst.cache->Restore(r.views));
  PC_RETURN_IF_ERROR(dev.Synchronize(engine::Lane::kCompute));
  r.restore_ms = Ms(t0);
  dst.position = P;
  PC_RETURN_IF_ERROR(m.Prime(dst, rest, model::LogitsWanted::kLast, &logits));
  r.ttft_ms = Ms(t0);
  r.exact = logits.size() == r.continued.size() &&
            std::memcmp(logits.data(), r.continued.data(), logits.size() * sizeof(float)) == 0;
  return r;
}

// ---- through the daemon -------------------------------------------------------

struct DaemonRun {
  double publish_ms = 0;
  std::uint64_t publish_bytes = 0, in_place_layers = 0, layers = 0;
  bool device_window = false;  // attached to the daemon (device copies)
  model::Request hot, cold;
  bool exact = false;
};

// One request through the cache; exact when its logits are the continued ones.
Result<model::Request> Through(model::PrefixCache& cache, std::span<const std::uint32_t> tokens,
                               const InProcess& ref, std::size_t P, bool* exact) {
  PC_ASSIGN_OR_RETURN(model::Request r, cache.Prime(tokens));
  *exact = *exact && r.restored_tokens == P && r.last_logits.size() == ref.continued.size() &&
           std::memcmp(r.last_logits.data(), ref.continued.data(), ref.continued.size() * sizeof(float)) == 0;
  return r;
}

// A prefix cache on a new connection to `daemon` under namespace
// `transform`, its staging for a `P`-token boundary reserved (as an engine
// does at start-up: pinning the staging is not a request's cost).
Result<std::unique_ptr<model::PrefixCache>> OpenCache(launcher::DaemonProcess& daemon, model::HybridModel& m,
                                                      const model::ModelConfig& config,
                                                      const model::Weights& weights, const InProcess& ref,
                                                      std::size_t P, const char* transform,
                                                      const model::PrefixCacheOptions& base) {
  client::ClientOptions o;
  o.endpoint = daemon.socket();
  o.ns = transform;
  o.shared_memory = true;
  // Room for the largest layer's chunks in the publish half (so each is
  // encoded in place) and a fetch window as large: at least 256 MiB.
  std::uint64_t largest = 0;
  for (const auto& v : ref.views) {
    largest = std::max(largest, engine::ViewFloats(std::visit([](const auto& x) -> LayerShape { return x.shape; }, v)) *
                                    sizeof(float));
  }
  o.shared_memory_bytes = std::clamp<std::uint64_t>(4 * largest + (64u << 20), 256u << 20, 4ull << 30);
  o.timeout = std::chrono::milliseconds(300000);
  PC_ASSIGN_OR_RETURN(auto cl, client::Client::Connect(o));
  model::PrefixCacheOptions opt = base;  // its staging and chunking
  opt.encode.all_planes = TransformSpec{transform, transform == std::string("raw/v1") ? 0 : 1};
  opt.publish = false;
  auto cache =
      std::make_unique<model::PrefixCache>(&m, std::move(cl), model::PrefixCache::ModelIdFor(config, weights), opt);
  PC_RETURN_IF_ERROR(cache->ReserveStaging(P));
  return cache;
}

// The capture published under `transform` (its own namespace), then restored
// hot (the second of two requests) and cold: a new daemon on the same store
// (the old one's registered mappings held the segments' pages), the store's
// files dropped from the page cache, a new connection warmed by a short
// request that misses.
Result<DaemonRun> MeasureDaemon(launcher::DaemonProcess& daemon, model::HybridModel& m,
                                const model::ModelConfig& config, const model::Weights& weights,
                                const InProcess& ref, std::span<const std::uint32_t> tokens, std::size_t P,
                                const char* transform, const model::PrefixCacheOptions& base) {
  PC_ASSIGN_OR_RETURN(auto cache, OpenCache(daemon, m, config, weights, ref, P, transform, base));
  DaemonRun d;
  auto t0 = Clock::now();
  PC_RETURN_IF_ERROR(cache->Publish(tokens.first(P), ref.views));
  d.publish_ms = Ms(t0);
  d.publish_bytes = cache->published_bytes();
  d.in_place_layers = cache->in_place_layers();
  d.layers = ref.views.size();
  d.device_window = cache->device_window();
  d.exact = true;
  // A first request warms what a long-running engine has warm (the region's
  // pages, the connection, the staging's first touch); the second is timed.
  for (int rep = 0; rep < 2; ++rep) {
    PC_ASSIGN_OR_RETURN(d.hot, Through(*cache, tokens, ref, P, &d.exact));
    d.hot.session = model::ModelSession{};
  }
  cache.reset();
  PC_RETURN_IF_ERROR(daemon.Restart());
  DropPageCache(daemon.data_dir());
  PC_ASSIGN_OR_RETURN(cache, OpenCache(daemon, m, config, weights, ref, P, transform, base));
  const std::vector<std::uint32_t> miss = {model::kBosToken, 1, 2, 3, 4, 5, 6, 7};
  PC_RETURN_IF_ERROR(cache->Prime(miss).status());
  PC_ASSIGN_OR_RETURN(d.cold, Through(*cache, tokens, ref, P, &d.exact));
  d.cold.session = model::ModelSession{};
  return d;
}

// ---- reporting ----------------------------------------------------------------

double Gbs(std::uint64_t bytes, double ms) { return double(bytes) / 1e6 / ms; }

void Ratio(const char* what, double ratio, const char* cmp, double target) {
  const bool met = cmp[0] == '>' ? ratio >= target : ratio <= target;
  std::printf("model-bench: ratio %-52s %6.2fx (target %s %.1fx: %s)\n", what, ratio, cmp, target,
              met ? "met" : "MISSED");
}

void ReportDaemon(const char* transform, const DaemonRun& d, const InProcess& ref, const BusRates& bus,
                  const DiskRates& disk) {
  const std::uint64_t b = d.hot.restored_bytes;
  std::printf(
      "model-bench: daemon %-15s publish %.1f ms (%.3f GB encoded, %.2f GB/s; %llu of %llu layers encoded in place) | "
      "hot: restore %.1f ms = %.2f GB/s "
      "(lookup %.1f, fetch %.1f, validate+copy %.1f ms; %llu raw chunks straight from the region, "
      "%llu = %.3f GB as device chunks%s), ttft %.1f ms | "
      "cold: restore %.1f ms = %.2f GB/s, ttft %.1f ms | restored == continued: %s\n",
      transform, d.publish_ms, d.publish_bytes / 1e9, Gbs(d.publish_bytes, d.publish_ms),
      static_cast<unsigned long long>(d.in_place_layers), static_cast<unsigned long long>(d.layers), d.hot.restore_ms,
      Gbs(b, d.hot.restore_ms), d.hot.lookup_ms, d.hot.fetch_ms, d.hot.copy_ms,
      static_cast<unsigned long long>(d.hot.direct_chunks), static_cast<unsigned long long>(d.hot.device_chunks),
      d.hot.device_chunk_bytes / 1e9, d.device_window ? "" : ", no device window", d.hot.ttft_ms, d.cold.restore_ms,
      Gbs(b, d.cold.restore_ms), d.cold.ttft_ms, d.exact ? "bit-identical" : "DIFFERENT");
  if (std::string(transform) != "raw/v1") return;  // the ratios hold the raw path to the machine
  const double disk_read = Gbs(b, disk.read_ms), disk_write = Gbs(d.publish_bytes, disk.write_ms);
  Ratio("restore from the daemon, hot / pinned H2D", Gbs(b, d.hot.restore_ms) / bus.h2d_gbs, ">=", 0.8);
  Ratio("TTFT through the daemon / TTFT from pinned in process", d.hot.ttft_ms / ref.ttft_ms, "<=", 1.2);
  Ratio("restore from the daemon, cold / O_DIRECT read", Gbs(b, d.cold.restore_ms) / disk_read, ">=", 0.8);
  Ratio("publish / fsync'd sequential write", Gbs(d.publish_bytes, d.publish_ms) / disk_write, ">=", 0.8);
  (void)ref;
}

// TurboQuant against f32 on the same weights: the config as given (its
// attn layers quantized) and its twin with kv_quant null, both priming the
// same `tokens` random tokens in one session; the relative error of every
// position's logits, and the KV bytes per token of each.
int QuantError(const model::ModelConfig& config, const model::Weights& weights, std::size_t tokens,
               std::size_t chunk, const std::shared_ptr<engine::Device>& device) {
  if (!config.HasLayer(model::LayerType::kAttn) || config.attn.kv_quant_bits == 0) {
    std::fprintf(stderr, "model-bench: --quant-error needs a config with quantized attn layers\n");
    return 1;
  }
  model::ModelConfig f32 = config;
  f32.attn.kv_quant_bits = 0;
  std::map<std::string, model::Tensor> kept;
  for (const auto& [name, t] : weights.tensors())
    if (!name.ends_with("tq_signs")) kept.emplace(name, t);
  const model::Weights f32_weights(std::move(kept));
  std::mt19937 rng(3);
  std::vector<std::uint32_t> prompt(tokens);
  prompt[0] = model::kBosToken;
  for (std::size_t i = 1; i < tokens; ++i) prompt[i] = rng() % 256;
  std::vector<float> logits[2];
  std::uint64_t kv_bytes[2] = {0, 0};
  for (int q = 0; q < 2; ++q) {
    const model::ModelConfig& c = q ? config : f32;
    const model::Weights& w = q ? weights : f32_weights;
    engine::ReserveRequest req;
    req.plan = model::HybridModel::PlanFor(c, w);
    req.max_ctx = tokens;
    req.sessions = 1;
    req.snapshot_slots = 0;
    auto eng = engine::Engine::Create(device, req);
    if (!eng.ok()) return Fail(eng.status(), "engine");
    auto m = model::HybridModel::Create(c, w, eng->get(), {chunk});
    if (!m.ok()) return Fail(m.status(), "model");
    auto s = (*m)->NewSession();
    if (!s.ok()) return Fail(s.status(), "session");
    if (Status st = (*m)->Prime(*s, prompt, model::LogitsWanted::kAll, &logits[q]); !st.ok()) return Fail(st, "prime");
    for (const auto& l : req.plan.layers)
      if (const auto* kv = std::get_if<engine::KvPlan>(&l)) kv_bytes[q] += (kv->k_width + kv->v_width) * 4ull;
  }
  double num = 0, den = 0, worst = 0;
  const std::size_t V = config.vocab;
  for (std::size_t t = 0; t < tokens; ++t) {
    double n = 0, d = 0;
    for (std::size_t v = 0; v < V; ++v) {
      const double e = double(logits[1][t * V + v]) - logits[0][t * V + v];
      n += e * e;
      d += double(logits[0][t * V + v]) * logits[0][t * V + v];
    }
    num += n;
    den += d;
    worst = std::max(worst, std::sqrt(n / d));
  }
  std::printf("model-bench: %s, %zu tokens on %s: TurboQuant-%u KV %llu B/token vs f32 %llu B/token (%.2fx smaller); "
              "logits rel err vs f32 %.3g overall, %.3g at the worst position\n",
              config.name.c_str(), tokens, device->name().c_str(), config.attn.kv_quant_bits,
              static_cast<unsigned long long>(kv_bytes[1]), static_cast<unsigned long long>(kv_bytes[0]),
              double(kv_bytes[0]) / double(kv_bytes[1]), std::sqrt(num / den), worst);
  return 0;
}

struct BenchSetup {
  model::ModelConfig config;
  model::Weights weights;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<model::HybridModel> model;
};

Result<BenchSetup> Setup(const std::string& config_path, std::uint64_t seed, std::size_t max_ctx, std::size_t chunk,
                         bool cpu) {
  PC_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(Env::Default(), config_path));
  auto t0 = Clock::now();
  BenchSetup b{config, model::Weights::Generate(config, seed), nullptr, nullptr};
  std::printf("model-bench: %s, %zu layers, weights generated in %.0f ms\n", config.name.c_str(), config.layers.size(),
              Ms(t0));
  std::shared_ptr<engine::Device> device;
  if (cpu) {
    device = engine::NewCpuDevice({.memory_bytes = 64ull << 30});
  } else {
    PC_ASSIGN_OR_RETURN(device, engine::NewCudaDevice());
  }
  engine::ReserveRequest req;
  req.plan = model::HybridModel::PlanFor(b.config, b.weights);
  req.max_ctx = max_ctx;
  req.sessions = 3;
  req.snapshot_slots = 1;
  PC_ASSIGN_OR_RETURN(b.engine, engine::Engine::Create(device, req));
  t0 = Clock::now();
  PC_ASSIGN_OR_RETURN(b.model, model::HybridModel::Create(b.config, b.weights, b.engine.get(), {chunk}));
  std::printf("model-bench: weights on %s in %.0f ms; chunks of %zu tokens\n", device->name().c_str(), Ms(t0), chunk);
  return b;
}

std::vector<std::uint32_t> RandomTokens(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint32_t> tokens(n);
  tokens[0] = model::kBosToken;
  for (std::size_t i = 1; i < n; ++i) tokens[i] = rng() % 256;
  return tokens;
}

void ReportInProcess(std::size_t P, std::size_t suffix, const InProcess& r, const BusRates& bus) {
  std::printf(
      "model-bench: prefix %6zu + %zu: ttft full %9.1f ms | restore from pinned %7.1f ms (%.3f GB at %.1f GB/s) + "
      "suffix = ttft %7.1f ms | speedup %.1fx | full snapshot %.1f ms = %.2f GB/s | pinned H2D %.1f GB/s, D2H %.1f "
      "GB/s | restored == continued: %s\n",
      P, suffix, r.full_ms, r.restore_ms, r.bytes / 1e9, Gbs(r.bytes, r.restore_ms), r.ttft_ms, r.full_ms / r.ttft_ms,
      r.snapshot_ms, Gbs(r.bytes, r.snapshot_ms), bus.h2d_gbs, bus.d2h_gbs, r.exact ? "bit-identical" : "DIFFERENT");
  Ratio("restore in process / pinned H2D", Gbs(r.bytes, r.restore_ms) / bus.h2d_gbs, ">=", 0.8);
  Ratio("full snapshot / pinned D2H", Gbs(r.bytes, r.snapshot_ms) / bus.d2h_gbs, ">=", 0.5);
}

// The figures as CSV tables: TTFT per path and prefix, and every restore's
// rate beside the pinned host-to-device copy of the same run.
struct Figures {
  std::string config, device;
  bench::CsvTable ttft{{"config", "device", "prefix_tokens", "suffix_tokens", "path", "ttft_ms"}};
  bench::CsvTable restore{{"config", "device", "prefix_tokens", "path", "restored_bytes", "restore_ms",
                           "restore_gbps", "pinned_h2d_gbps"}};
};

void RecordInProcess(Figures& f, std::size_t P, std::size_t suffix, const InProcess& r, const BusRates& bus) {
  (void)f.ttft.Add({f.config, f.device, P, suffix, "full prefill", r.full_ms});
  (void)f.ttft.Add({f.config, f.device, P, suffix, "restore in process", r.ttft_ms});
  (void)f.restore.Add(
      {f.config, f.device, P, "in process, pinned", r.bytes, r.restore_ms, Gbs(r.bytes, r.restore_ms), bus.h2d_gbs});
}

void RecordDaemon(Figures& f, std::size_t P, std::size_t suffix, const std::string& transform, const DaemonRun& d,
                  const BusRates& bus) {
  const std::uint64_t b = d.hot.restored_bytes;
  for (const auto& [temp, req] : {std::pair<const char*, const model::Request*>{"hot", &d.hot}, {"cold", &d.cold}}) {
    const std::string path = "daemon " + transform + ", " + temp;
    (void)f.ttft.Add({f.config, f.device, P, suffix, path, req->ttft_ms});
    (void)f.restore.Add({f.config, f.device, P, path, b, req->restore_ms, Gbs(b, req->restore_ms), bus.h2d_gbs});
  }
}

struct Args {
  std::string config_path = "configs/hrm-glm5-class.json";
  std::vector<std::size_t> prefixes = {4096, 32768};
  std::size_t suffix = 16, chunk = 2048, quant_error = 0;
  std::uint64_t seed = 1;
  std::string daemon_bin, csv_dir;
  std::vector<std::string> daemon_args;
  bool cpu = false, ttft_table = false, ratios = false;
  model::PrefixCacheOptions::Staging staging = model::PrefixCacheOptions::Staging::kAuto;
  std::uint64_t max_chunk_rows = kDefaultMaxChunkRows;
};

// One prefix length: the in-process figures and, with a daemon, both
// transforms through it; the TTFT table's row when asked for.
int RunPrefix(const Args& a, BenchSetup& b, std::size_t P, std::mt19937& rng, Figures& fig) {
  engine::Device& dev = b.engine->device();
  const std::vector<std::uint32_t> tokens = RandomTokens(P + a.suffix, rng);
  auto r = MeasureInProcess(*b.model, dev, tokens, P);
  if (!r.ok()) return Fail(r.status(), "in-process restore");
  auto bus = MeasureBus(dev, r->bytes);
  if (!bus.ok()) return Fail(bus.status(), "pinned copies");
  if (!a.ttft_table) ReportInProcess(P, a.suffix, *r, *bus);
  if (!r->exact) return 1;
  RecordInProcess(fig, P, a.suffix, *r, *bus);
  if (a.ratios && P == *std::max_element(a.prefixes.begin(), a.prefixes.end())) {
    auto snap = b.model->NewSession();
    if (snap.ok() && b.model->Prime(*snap, std::span(tokens).first(P), model::LogitsWanted::kNone, nullptr).ok()) {
      auto layers = snap->cache->CaptureFull();
      if (layers.ok()) ReportRatios(*layers);
    }
  }
  if (a.daemon_bin.empty()) return 0;
  launcher::DaemonProcess daemon(a.daemon_bin, a.daemon_args);
  if (Status s = daemon.Start(); !s.ok()) return Fail(s, "daemon");
  auto disk = MeasureDisk(daemon.dir(), r->bytes);
  if (!disk.ok()) return Fail(disk.status(), "disk baseline");
  if (!a.ttft_table) {
    std::printf("model-bench: disk under %s: fsync'd sequential write %.2f GB/s, O_DIRECT sequential read %.2f GB/s\n",
                daemon.dir().c_str(), Gbs(r->bytes, disk->write_ms), Gbs(r->bytes, disk->read_ms));
  }
  for (const char* transform : {"raw/v1", "shuffle-zstd/v1"}) {
    model::PrefixCacheOptions base;
    base.staging = a.staging;
    base.encode.max_chunk_rows = a.max_chunk_rows;
    auto d = MeasureDaemon(daemon, *b.model, b.config, b.weights, *r, tokens, P, transform, base);
    if (!d.ok()) return Fail(d.status(), transform);
    if (!d->exact) {
      std::printf("model-bench: %s: a restore through the daemon was not bit-identical\n", transform);
      return 1;
    }
    RecordDaemon(fig, P, a.suffix, transform, *d, *bus);
    if (a.ttft_table && std::string(transform) == "raw/v1") {
      std::printf("| %zu | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n", P, r->full_ms, r->ttft_ms, d->hot.ttft_ms,
                  d->cold.ttft_ms);
    } else if (!a.ttft_table) {
      ReportDaemon(transform, *d, *r, *bus, *disk);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time to first token with and without a restored prefix, in process and through the daemon"};
  Args a;
  app.add_option("--config", a.config_path, "model config (JSON)");
  app.add_option("--prefix", a.prefixes, "prefix lengths in tokens")->expected(1, 16);
  app.add_option("--suffix", a.suffix, "suffix tokens primed after the prefix")->check(CLI::Range(1, 4096));
  app.add_option("--chunk", a.chunk, "tokens per forward call")->check(CLI::Range(1, 65536));
  app.add_option("--seed", a.seed, "weights seed");
  app.add_option("--daemon", a.daemon_bin, "primecached binary: also measure the path through the daemon");
  app.add_option("--daemon-arg", a.daemon_args,
                 "an argument for the daemon (repeat; e.g. --daemon-arg=--read-threads --daemon-arg=8)")
      ->allow_extra_args(false);
  app.add_option("--quant-error", a.quant_error,
                 "instead: prime this many tokens through the config (quantized attn) and its f32 twin on the same "
                 "weights, and compare their logits")
      ->check(CLI::Range(2, 1 << 20));
  app.add_flag("--cpu", a.cpu, "run on the CPU reference instead of CUDA");
  app.add_flag("--ttft-table", a.ttft_table,
               "print the TTFT table rows (full prefill, restore in process, through the daemon hot and cold) for "
               "each --prefix (default 4096, 32768, 131072)");
  app.add_option("--csv-dir", a.csv_dir, "also write the figures as CSV files here (tools/bench/plot.py)");
  app.add_flag("--ratios", a.ratios, "also encode the longest prefix's capture with every transform");
  const std::map<std::string, model::PrefixCacheOptions::Staging> stagings = {
      {"auto", model::PrefixCacheOptions::Staging::kAuto},
      {"device", model::PrefixCacheOptions::Staging::kDevice},
      {"host", model::PrefixCacheOptions::Staging::kHost}};
  app.add_option("--max-chunk-rows", a.max_chunk_rows, "the most rows a published chunk of an append-only plane holds")
      ->check(CLI::Range(std::uint64_t{1}, primecache::CodecLimits{}.max_tokens));  // the encoder's bound
  app.add_option("--staging", a.staging, "where a restore through the daemon stages (auto: device on CUDA)")
      ->transform(CLI::CheckedTransformer(stagings, CLI::ignore_case));
  CLI11_PARSE(app, argc, argv);
  if (a.ttft_table && app.count("--prefix") == 0) a.prefixes = {4096, 32768, 131072};

  if (a.quant_error != 0) {
    auto config = model::LoadModelConfig(Env::Default(), a.config_path);
    if (!config.ok()) return Fail(config.status(), "config");
    std::shared_ptr<engine::Device> dev;
    if (a.cpu) {
      dev = engine::NewCpuDevice({.memory_bytes = 64ull << 30});
    } else {
      auto d = engine::NewCudaDevice();
      if (!d.ok()) return Fail(d.status(), "device");
      dev = *d;
    }
    return QuantError(*config, model::Weights::Generate(*config, a.seed), a.quant_error, a.chunk, dev);
  }
  if (!a.cpu && !engine::CudaDeviceAvailable()) {
    std::printf("model-bench: no CUDA device; nothing measured (--cpu runs on the CPU reference)\n");
    return 0;
  }
  const std::size_t longest = *std::max_element(a.prefixes.begin(), a.prefixes.end());
  auto b = Setup(a.config_path, a.seed, longest + a.suffix, a.chunk, a.cpu);
  if (!b.ok()) return Fail(b.status(), "setup");
  if (a.ttft_table) {
    std::printf("| prefix | full prefill | restore in process | through the daemon, hot | through the daemon, cold |\n");
    std::printf("| --- | --- | --- | --- | --- |\n");
  }
  std::mt19937 rng(7);
  Figures fig;
  fig.config = b->config.name;
  fig.device = b->engine->device().name();
  for (std::size_t P : a.prefixes) {
    if (const int rc = RunPrefix(a, *b, P, rng, fig); rc != 0) return rc;
  }
  for (const auto& [table, name] : {std::pair{&fig.ttft, "model-ttft-"}, {&fig.restore, "model-restore-"}}) {
    if (Status s = table->WriteToDir(a.csv_dir, name + fig.config); !s.ok()) return Fail(s, "csv");
  }
  return 0;
}

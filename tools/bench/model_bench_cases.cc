// primecache-model-bench's cases (model_bench.h): the bus and the file
// system, the in-process reference, the path through the daemon, and
// TurboQuant's error against f32.
#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "tools/bench/model_bench.h"

#include "engine/model/tensor_parallel.h"

namespace primecache::model_bench {

Result<BenchSetup> Setup(const std::string& config_path, std::uint64_t seed, std::size_t max_ctx, std::size_t chunk,
                         bool cpu, std::size_t sessions, std::uint32_t tp, std::uint32_t rank) {
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
  model::ModelConfig mine = b.config;
  model::Weights mine_weights;
  if (tp > 1) {
    PC_ASSIGN_OR_RETURN(mine, model::RankConfig(b.config, tp));
    PC_ASSIGN_OR_RETURN(mine_weights, model::RankWeights(b.config, b.weights, tp, rank));
  }
  const model::Weights& w = tp > 1 ? mine_weights : b.weights;
  engine::ReserveRequest req;
  req.plan = model::HybridModel::PlanFor(mine, w);
  req.max_ctx = max_ctx;
  req.sessions = sessions;
  req.snapshot_slots = 1;
  PC_ASSIGN_OR_RETURN(b.engine, engine::Engine::Create(device, req));
  t0 = Clock::now();
  PC_ASSIGN_OR_RETURN(b.model, model::HybridModel::Create(mine, w, b.engine.get(), {chunk}));
  std::printf("model-bench: weights on %s in %.0f ms; chunks of %zu tokens\n", device->name().c_str(), Ms(t0), chunk);
  return b;
}

std::vector<std::uint32_t> RandomTokens(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint32_t> tokens(n);
  tokens[0] = model::kBosToken;
  for (std::size_t i = 1; i < n; ++i) tokens[i] = rng() % 256;
  return tokens;
}

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
  for (std::uint64_t off = 0; off < total && ok; off += kBlock)
    ok = write(fd, buf, kBlock) == ssize_t(kBlock);
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

namespace {

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

}  // namespace

Result<InProcess> MeasureInProcess(model::HybridModel& m, engine::Device& dev,
                                   std::span<const std::uint32_t> tokens, std::size_t P) {
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

namespace {

// One request through the cache; exact when its logits are the continued ones.
Result<model::Request> Through(model::PrefixCache& cache, std::span<const std::uint32_t> tokens,
                               const InProcess& ref, std::size_t P, bool* exact) {
  PC_ASSIGN_OR_RETURN(model::Request r, cache.Prime(tokens));
  *exact = *exact && r.restored_tokens == P && r.last_logits.size() == ref.continued.size() &&
           std::memcmp(r.last_logits.data(), ref.continued.data(), ref.continued.size() * sizeof(float)) == 0;
  return r;
}

}  // namespace

std::uint64_t LargestLayerBytes(std::span<const engine::LayerSnapshotView> views) {
  std::uint64_t largest = 0;
  for (const auto& v : views) {
    largest = std::max(largest, engine::ViewFloats(std::visit([](const auto& x) -> LayerShape { return x.shape; }, v)) *
                                    sizeof(float));
  }
  return largest;
}

Result<std::unique_ptr<model::PrefixCache>> OpenCache(const std::string& socket, model::HybridModel& m,
                                                      const model::ModelConfig& config,
                                                      const model::Weights& weights, std::uint64_t largest,
                                                      std::size_t P, const DaemonPath& path,
                                                      const model::PrefixCacheOptions& base) {
  client::ClientOptions o;
  o.endpoint = socket;
  o.ns = path.name;
  o.shared_memory = true;
  // Room for the largest layer's chunks in the publish half (so each is
  // encoded in place) and a fetch window as large: at least 256 MiB.
  o.shared_memory_bytes = std::clamp<std::uint64_t>(4 * largest + (64u << 20), 256u << 20, 4ull << 30);
  o.timeout = std::chrono::milliseconds(300000);
  if (base.tp.size > 1) o.tp_rank = base.tp.rank;  // the daemon counts its bytes by rank
  PC_ASSIGN_OR_RETURN(auto cl, client::Client::Connect(o));
  model::PrefixCacheOptions opt = base;  // its staging and chunking
  opt.encode.all_planes = path.transform;
  opt.publish = false;
  auto cache = std::make_unique<model::PrefixCache>(&m, std::move(cl),
                                                    model::PrefixCache::ModelIdFor(config, weights), opt);
  PC_RETURN_IF_ERROR(cache->ReserveStaging(P));
  return cache;
}

std::vector<DaemonPath> DaemonPaths() {
  return {{"default", std::nullopt},
          {std::string(kShuffleZstdTransform), TransformSpec{std::string(kShuffleZstdTransform), 1}}};
}

Result<DaemonRun> MeasureDaemon(launcher::DaemonProcess& daemon, model::HybridModel& m,
                                const model::ModelConfig& config, const model::Weights& weights,
                                const InProcess& ref, std::span<const std::uint32_t> tokens, std::size_t P,
                                const DaemonPath& path, const model::PrefixCacheOptions& base) {
  PC_ASSIGN_OR_RETURN(auto cache, OpenCache(daemon.socket(), m, config, weights, LargestLayerBytes(ref.views), P, path, base));
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
  PC_ASSIGN_OR_RETURN(cache, OpenCache(daemon.socket(), m, config, weights, LargestLayerBytes(ref.views), P, path, base));
  const std::vector<std::uint32_t> miss = {model::kBosToken, 1, 2, 3, 4, 5, 6, 7};
  PC_RETURN_IF_ERROR(cache->Prime(miss).status());
  PC_ASSIGN_OR_RETURN(d.cold, Through(*cache, tokens, ref, P, &d.exact));
  d.cold.session = model::ModelSession{};
  return d;
}

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
    if (Status st = (*m)->Prime(*s, prompt, model::LogitsWanted::kAll, &logits[q]); !st.ok())
      return Fail(st, "prime");
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
  std::printf(
      "model-bench: %s, %zu tokens on %s: TurboQuant-%u KV %llu B/token vs f32 %llu B/token (%.2fx smaller); "
      "logits rel err vs f32 %.3g overall, %.3g at the worst position\n",
      config.name.c_str(), tokens, device->name().c_str(), config.attn.kv_quant_bits,
      static_cast<unsigned long long>(kv_bytes[1]), static_cast<unsigned long long>(kv_bytes[0]),
      double(kv_bytes[0]) / double(kv_bytes[1]), std::sqrt(num / den), worst);
  return 0;
}

}  // namespace primecache::model_bench

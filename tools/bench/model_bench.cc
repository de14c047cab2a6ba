// primecache-model-bench: time to first token on the GPU with and without a
// restored prefix, for the realistic-geometry model.
//
// For each prefix length P (random tokens, then a suffix of S tokens):
//   full     one session primes P + S tokens; time to the last token's logits;
//   restore  a second session primes P, is captured in full into pinned host
//            memory; a fresh session restores that snapshot and primes the
//            S-token suffix; time from the restore's start to the logits;
//   copy     the same bytes copied host-to-device from pinned memory, in the
//            same run, as the bus rate the restore is held to.
// It also checks restore exactness: the captured session, continued with the
// same suffix, must give bit-identical logits to the restored one.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "engine/device.h"
#include "primecache/codec.h"
#include "engine/model/hybrid_model.h"
#include "engine/model/prefix_cache.h"

using namespace primecache;

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int Fail(const Status& s, const char* what) {
  std::fprintf(stderr, "model-bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

// A snapshot's planes copied into one pinned block, with views onto them.
struct PinnedSnapshot {
  engine::Memory block;
  std::vector<engine::LayerSnapshotView> views;
  std::uint64_t bytes = 0;
};

Result<PinnedSnapshot> Pin(engine::Device& dev, const std::vector<LayerSnapshot>& layers) {
  PinnedSnapshot p;
  for (const auto& v : engine::ViewsOf(layers)) {
    std::visit([&](const auto& view) {
      if constexpr (std::is_same_v<std::decay_t<decltype(view)>, engine::LatentView>) {
        p.bytes += (view.latent_rows.size() + view.index_tail_rows.size() + view.pool_keys.size()) * 4;
      } else if constexpr (std::is_same_v<std::decay_t<decltype(view)>, engine::RecurrentView>) {
        p.bytes += (view.conv_ring.size() + view.state.size()) * 4;
      } else {
        p.bytes += (view.k_rows.size() + view.v_rows.size()) * 4;
      }
    }, v);
  }
  PC_ASSIGN_OR_RETURN(p.block, dev.AllocatePinned(p.bytes));
  float* at = p.block.at<float>(0);
  auto place = [&](std::span<const float> src) {
    std::memcpy(at, src.data(), src.size_bytes());
    std::span<const float> out(at, src.size());
    at += src.size();
    return out;
  };
  for (const auto& v : engine::ViewsOf(layers)) {
    if (auto* l = std::get_if<engine::LatentView>(&v)) {
      p.views.push_back(engine::LatentView{l->shape, place(l->latent_rows), place(l->index_tail_rows), place(l->pool_keys)});
    } else if (auto* r = std::get_if<engine::RecurrentView>(&v)) {
      p.views.push_back(engine::RecurrentView{r->shape, place(r->conv_ring), place(r->state)});
    } else {
      const auto& k = std::get<engine::KvView>(v);
      p.views.push_back(engine::KvView{k.shape, place(k.k_rows), place(k.v_rows)});
    }
  }
  return p;
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

// A primecached child on a temporary data dir, for the daemon restore path.
class DaemonProcess {
 public:
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  Status Start(const std::string& binary) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pcbench-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return Status::IOError("mkdtemp");
    dir_ = tmpl;
    int p[2];
    if (pipe(p) != 0) return Status::IOError("pipe");
    std::vector<std::string> args = {binary, "--data-dir", dir_ + "/data", "--socket", socket(), "--no-admin-socket",
                                     "--ready-fd", std::to_string(p[1]), "--log-level", "warn"};
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(p[1]);
    pollfd pf{p[0], POLLIN, 0};
    char buf[8] = {};
    const bool ok = poll(&pf, 1, 30000) == 1 && read(p[0], buf, sizeof buf) > 0;
    close(p[0]);
    return ok ? Status::Ok() : Status::Unavailable("primecached did not become ready");
  }
  std::string socket() const { return dir_ + "/d.sock"; }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

// The restore path from the daemon: the capture published under each
// transform, then a fresh request through PrefixCache (lookup, fetch over
// shared memory, decode into pinned staging, validate, restore, suffix).
int DaemonPath(const std::string& daemon_bin, model::HybridModel& m, const model::ModelConfig& config,
               const model::Weights& weights, const std::vector<LayerSnapshot>& snap,
               std::span<const std::uint32_t> prefix, std::span<const std::uint32_t> tokens,
               const std::vector<float>& continued, double pinned_gbs) {
  DaemonProcess daemon;
  if (Status s = daemon.Start(daemon_bin); !s.ok()) return Fail(s, "daemon");
  for (const char* transform : {"raw/v1", "shuffle-zstd/v1"}) {
    client::ClientOptions o;
    o.endpoint = daemon.socket();
    o.ns = transform;
    o.shared_memory = true;
    o.shared_memory_bytes = 256u << 20;
    o.timeout = std::chrono::milliseconds(120000);
    auto cl = client::Client::Connect(o);
    if (!cl.ok()) return Fail(cl.status(), "client");
    model::PrefixCacheOptions opt;
    opt.encode.all_planes = TransformSpec{transform, transform == std::string("raw/v1") ? 0 : 1};
    opt.publish = false;
    model::PrefixCache cache(&m, std::move(cl).value(), model::PrefixCache::ModelIdFor(config, weights), opt);
    // As an engine does at start-up: pinning the staging is not a request's cost.
    if (Status s = cache.ReserveStaging(prefix.size()); !s.ok()) return Fail(s, "reserve staging");
    auto t0 = Clock::now();
    if (Status s = cache.Publish(prefix, snap); !s.ok()) return Fail(s, "publish");
    const double publish_ms = Ms(t0);
    auto r = cache.Prime(tokens);
    if (!r.ok()) return Fail(r.status(), "request through the daemon");
    const bool exact = r->last_logits.size() == continued.size() &&
                       std::memcmp(r->last_logits.data(), continued.data(), continued.size() * 4) == 0;
    const double gb = double(r->restored_bytes) / 1e9;
    std::printf(
        "model-bench: daemon path, %-15s publish %.0f ms | restored %llu tokens, %.3f GB in %.1f ms = %.2f GB/s "
        "(%.2f x the pinned copy rate; lookup %.1f ms, fetch+decode %.1f ms = %.2f GB/s, validate+copy %.1f ms) "
        "| ttft %.1f ms | restored == continued: %s\n",
        transform, publish_ms, static_cast<unsigned long long>(r->restored_tokens), gb, r->restore_ms,
        gb / (r->restore_ms / 1e3), gb / (r->restore_ms / 1e3) / pinned_gbs, r->lookup_ms, r->fetch_ms,
        gb / (r->fetch_ms / 1e3), r->copy_ms, r->ttft_ms, exact ? "bit-identical" : "DIFFERENT");
    if (!exact || r->restored_tokens != prefix.size()) return 1;
  }
  return 0;
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time to first token with and without a restored prefix (CUDA)"};
  std::string config_path = "configs/hrm-glm5-class.json";
  std::vector<std::size_t> prefixes = {4096, 32768};
  std::size_t suffix = 16, chunk = 2048;
  std::uint64_t seed = 1;
  app.add_option("--config", config_path, "model config (JSON)");
  app.add_option("--prefix", prefixes, "prefix lengths in tokens")->expected(1, 16);
  app.add_option("--suffix", suffix, "suffix tokens primed after the prefix")->check(CLI::Range(1, 4096));
  app.add_option("--chunk", chunk, "tokens per forward call")->check(CLI::Range(1, 65536));
  app.add_option("--seed", seed, "weights seed");
  std::string daemon_bin;
  app.add_option("--daemon", daemon_bin, "primecached binary: also measure the restore path through the daemon");
  std::size_t quant_error = 0;
  bool cpu = false;
  app.add_option("--quant-error", quant_error,
                 "instead: prime this many tokens through the config (quantized attn) and its f32 twin on the same "
                 "weights, and compare their logits")
      ->check(CLI::Range(2, 1 << 20));
  app.add_flag("--cpu", cpu, "with --quant-error: run on the CPU reference");
  CLI11_PARSE(app, argc, argv);

  if (quant_error != 0) {
    auto config = model::LoadModelConfig(Env::Default(), config_path);
    if (!config.ok()) return Fail(config.status(), "config");
    std::shared_ptr<engine::Device> dev;
    if (cpu) {
      dev = engine::NewCpuDevice({.memory_bytes = 64ull << 30});
    } else {
      auto d = engine::NewCudaDevice();
      if (!d.ok()) return Fail(d.status(), "device");
      dev = *d;
    }
    return QuantError(*config, model::Weights::Generate(*config, seed), quant_error, chunk, dev);
  }
  if (!engine::CudaDeviceAvailable()) {
    std::printf("model-bench: no CUDA device; nothing measured\n");
    return 0;
  }
  auto config = model::LoadModelConfig(Env::Default(), config_path);
  if (!config.ok()) return Fail(config.status(), "config");
  auto t0 = Clock::now();
  model::Weights weights = model::Weights::Generate(*config, seed);
  std::printf("model-bench: %s, %zu layers, weights generated in %.0f ms\n", config->name.c_str(),
              config->layers.size(), Ms(t0));
  std::size_t longest = 0;
  for (std::size_t p : prefixes) longest = std::max(longest, p);

  auto device = engine::NewCudaDevice();
  if (!device.ok()) return Fail(device.status(), "device");
  engine::ReserveRequest req;
  req.plan = model::HybridModel::PlanFor(*config, weights);
  req.max_ctx = longest + suffix;
  req.sessions = 3;
  req.snapshot_slots = 1;
  auto eng = engine::Engine::Create(*device, req);
  if (!eng.ok()) return Fail(eng.status(), "engine");
  t0 = Clock::now();
  auto m = model::HybridModel::Create(*config, weights, eng->get(), {chunk});
  if (!m.ok()) return Fail(m.status(), "model");
  std::printf("model-bench: weights on the device in %.0f ms; chunks of %zu tokens\n", Ms(t0), chunk);
  engine::Device& dev = (*eng)->device();

  std::mt19937 rng(7);
  for (std::size_t P : prefixes) {
    std::vector<std::uint32_t> tokens(P + suffix);
    tokens[0] = model::kBosToken;
    for (std::size_t i = 1; i < tokens.size(); ++i) tokens[i] = rng() % 256;
    std::span<const std::uint32_t> prefix(tokens.data(), P), rest(tokens.data() + P, suffix);

    // Without a restore: the whole prompt.
    std::vector<float> full_logits;
    double full_ms;
    {
      auto s = (*m)->NewSession();
      if (!s.ok()) return Fail(s.status(), "session");
      t0 = Clock::now();
      Status st = (*m)->Prime(*s, tokens, model::LogitsWanted::kLast, &full_logits);
      full_ms = Ms(t0);
      if (!st.ok()) return Fail(st, "full prefill");
    }
    // The captured session, continued with the suffix: the exactness reference.
    auto src = (*m)->NewSession();
    if (!src.ok()) return Fail(src.status(), "session");
    if (Status st = (*m)->Prime(*src, prefix, model::LogitsWanted::kNone, nullptr); !st.ok()) return Fail(st, "prefix");
    t0 = Clock::now();
    auto snap = src->cache->CaptureFull();
    const double capture_ms = Ms(t0);
    if (!snap.ok()) return Fail(snap.status(), "capture");
    auto pinned = Pin(dev, *snap);
    if (!pinned.ok()) return Fail(pinned.status(), "pinning the snapshot");
    std::vector<float> cont_logits;
    if (Status st = (*m)->Prime(*src, rest, model::LogitsWanted::kLast, &cont_logits); !st.ok()) return Fail(st, "suffix");
    src->cache.reset();

    // The bus rate for the same bytes, pinned host to device.
    auto scratch = dev.Allocate(pinned->bytes);
    if (!scratch.ok()) return Fail(scratch.status(), "scratch");
    double copy_ms = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      t0 = Clock::now();
      Status st = dev.UploadAsync(scratch->data(), pinned->block.data(), pinned->bytes, engine::Lane::kCompute);
      if (st.ok()) st = dev.Synchronize(engine::Lane::kCompute);
      if (!st.ok()) return Fail(st, "pinned copy");
      copy_ms = std::min(copy_ms, Ms(t0));
    }
    scratch->Reset();

    // With a restore: restore the prefix, then the suffix.
    auto dst = (*m)->NewSession();
    if (!dst.ok()) return Fail(dst.status(), "session");
    std::vector<float> restored_logits;
    t0 = Clock::now();
    Status st = dst->cache->Restore(pinned->views);
    if (st.ok()) st = dev.Synchronize(engine::Lane::kCompute);
    const double restore_ms = Ms(t0);
    if (!st.ok()) return Fail(st, "restore");
    dst->position = P;
    st = (*m)->Prime(*dst, rest, model::LogitsWanted::kLast, &restored_logits);
    const double ttft_restore_ms = Ms(t0);
    if (!st.ok()) return Fail(st, "suffix after restore");
    const bool exact = restored_logits.size() == cont_logits.size() &&
                       std::memcmp(restored_logits.data(), cont_logits.data(), cont_logits.size() * 4) == 0;
    double num = 0, den = 0;
    for (std::size_t i = 0; i < full_logits.size(); ++i) {
      const double d = double(restored_logits[i]) - full_logits[i];
      num += d * d;
      den += double(full_logits[i]) * full_logits[i];
    }
    const double gb = static_cast<double>(pinned->bytes) / 1e9;
    std::printf(
        "model-bench: prefix %6zu + %zu: ttft full %9.1f ms | restore %7.1f ms (%.3f GB at %.1f GB/s; pinned copy %.1f GB/s, "
        "ratio %.2f) + suffix = ttft %7.1f ms | speedup %.1fx | capture %.0f ms | restored == continued: %s | "
        "vs one-call prefill rel %.2g\n",
        P, suffix, full_ms, restore_ms, gb, gb / (restore_ms / 1e3), gb / (copy_ms / 1e3), copy_ms / restore_ms,
        ttft_restore_ms, full_ms / ttft_restore_ms, capture_ms, exact ? "bit-identical" : "DIFFERENT",
        std::sqrt(num / den));
    if (!exact) return 1;
    if (P == longest) {
      ReportRatios(*snap);
      if (!daemon_bin.empty()) {
        const int rc = DaemonPath(daemon_bin, **m, *config, weights, *snap, prefix, tokens, cont_logits,
                                  gb / (copy_ms / 1e3));
        if (rc != 0) return rc;
      }
    }
  }
  return 0;
}

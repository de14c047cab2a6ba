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
//
// The cases and the reporting: model_bench.h.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include "primecache/internal/codec.h"
#include "tools/bench/model_bench.h"

using namespace primecache;
using namespace primecache::model_bench;

namespace {

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
    if (snap.ok() &&
        b.model->Prime(*snap, std::span(tokens).first(P), model::LogitsWanted::kNone, nullptr).ok()) {
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
    std::printf(
        "model-bench: disk under %s: fsync'd sequential write %.2f GB/s, O_DIRECT sequential read %.2f "
        "GB/s\n",
        daemon.dir().c_str(), Gbs(r->bytes, disk->write_ms), Gbs(r->bytes, disk->read_ms));
  }
  for (const DaemonPath& path : DaemonPaths()) {
    model::PrefixCacheOptions base;
    base.staging = a.staging;
    base.encode.max_chunk_rows = a.max_chunk_rows;
    auto d = MeasureDaemon(daemon, *b.model, b.config, b.weights, *r, tokens, P, path, base);
    if (!d.ok()) return Fail(d.status(), path.name.c_str());
    if (!d->exact) {
      std::printf("model-bench: %s: a restore through the daemon was not bit-identical\n", path.name.c_str());
      return 1;
    }
    RecordDaemon(fig, P, a.suffix, path, *d, *bus);
    if (a.ttft_table && !path.transform) {
      std::printf("| %zu | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n", P, r->full_ms, r->ttft_ms,
                  d->hot.ttft_ms, d->cold.ttft_ms);
    } else if (!a.ttft_table) {
      ReportDaemon(path, *d, *r, *bus, *disk);
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
  app.add_option(
         "--quant-error", a.quant_error,
         "instead: prime this many tokens through the config (quantized attn) and its f32 twin on the same "
         "weights, and compare their logits")
      ->check(CLI::Range(2, 1 << 20));
  app.add_flag("--cpu", a.cpu, "run on the CPU reference instead of CUDA");
  app.add_flag(
      "--ttft-table", a.ttft_table,
      "print the TTFT table rows (full prefill, restore in process, through the daemon hot and cold) for "
      "each --prefix (default 4096, 32768, 131072)");
  app.add_option("--csv-dir", a.csv_dir, "also write the figures as CSV files here (tools/bench/plot.py)");
  app.add_flag("--ratios", a.ratios, "also encode the longest prefix's capture with every transform");
  const std::map<std::string, model::PrefixCacheOptions::Staging> stagings = {
      {"auto", model::PrefixCacheOptions::Staging::kAuto},
      {"device", model::PrefixCacheOptions::Staging::kDevice},
      {"host", model::PrefixCacheOptions::Staging::kHost}};
  app.add_option("--max-chunk-rows", a.max_chunk_rows,
                 "the most rows a published chunk of an append-only plane holds")
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
    std::printf(
        "| prefix | full prefill | restore in process | through the daemon, hot | through the daemon, cold "
        "|\n");
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

// primecache-fanin-bench: many engines restoring at once through one daemon.
//
// Publishes K different boundaries of --prefix tokens (each a real capture of
// the model: a session primed and captured in full, published raw through
// PrefixCache), then, for each N of --engines, starts N engine processes
// (this program again, each with its own model, client connection, shared
// region and, on CUDA, its own device window and staging) that restore
// different entries at the same moment: each warms its connection and
// staging with one restore of its entry (the store's pages are in the page
// cache: hot), waits at a barrier (a pipe the parent closes), and restores
// it again, timed. Per N: the aggregate rate (every engine's restored bytes
// over the span from the first start to the last restore's end) beside the
// pinned host-to-device copy of the same run (on the CPU backend: memcpy
// between its host and "device" memory), and each engine's restore time
// against its fair share (the engines' restore times in all, split among
// them by their bytes: what each would take if all restored at one rate).
// Targets: aggregate >= 0.8x the copy rate, every engine within 1.5x of
// its fair share.
//
// --tp: the ranks of a tensor-parallel engine instead (docs/BENCHMARKS.md,
// "Tensor-parallel ranks restoring at once"). Each N of --engines is a TP
// size: one boundary is captured by the whole model, resharded and
// published as a TP-N entry (one part per rank, a group; TP 1: a plain
// entry), and N rank processes (rank r's share of the model, RankConfig and
// RankWeights, on one device) restore their own parts of it at once, each
// through its PrefixCache as a rank (PrefixCacheOptions::tp): the
// replicated layers and its own shards, fetched straight into its staging.
// Without a collective between the processes each rank looks up by itself.
//
// --csv-dir DIR also writes the rounds as DIR/fanin-CONFIG-BACKEND.csv (with
// --tp, fanin-tp-CONFIG-BACKEND.csv), one row per N, rewritten after each
// round (tools/bench/plot.py draws it: docs/BENCHMARKS.md, "Charts").
//
// The model and its restore path are primecache-model-bench's
// (model_bench.h: Setup, OpenCache, MeasureBus).
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "primecache/internal/shard.h"
#include "serving/tp_prefix_cache.h"
#include "tools/bench/model_bench.h"
#include "tools/common/csv.h"

using namespace primecache;
using namespace primecache::model_bench;

namespace {

struct Args {
  std::string config_path = "configs/hrm-glm5-class.json";
  std::size_t prefix = 32768, chunk = 2048;
  std::uint64_t seed = 1;
  std::vector<std::size_t> engines = {1, 2, 4, 8};
  std::string daemon_bin, csv_dir;
  std::vector<std::string> daemon_args;
  bool cpu = false;
  bool tp = false;  // the rounds are TP sizes: rank processes of one TP entry
  // An engine process (internal): its index (with --tp: its rank, of
  // tp_size), the daemon's socket, the barrier's descriptor.
  int child = -1;
  std::uint32_t tp_size = 1;
  std::string socket;
  int go_fd = -1;
};

// Where a round's entries live: each TP size's entry its own namespace.
std::string Namespace(const Args& a, std::uint32_t tp) { return a.tp ? "tp" + std::to_string(tp) : "default"; }

// The tokens of entry `k`: the prefix and one token more.
std::vector<std::uint32_t> EntryTokens(const Args& a, std::size_t k) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000 + k));
  return RandomTokens(a.prefix + 1, rng);
}

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

Result<std::unique_ptr<model::PrefixCache>> Cache(const Args& a, BenchSetup& b, std::uint64_t largest) {
  model::PrefixCacheOptions base;
  if (a.tp) base.tp = {a.tp_size, static_cast<std::uint32_t>(a.child), 0};  // restores only: no group token
  return OpenCache(a.socket, *b.model, b.config, b.weights, largest, a.prefix,
                   DaemonPath{Namespace(a, a.tp_size), std::nullopt}, base);
}

// An engine process: "ready" once warm, then the timed restore after the
// barrier: "result START_NS RESTORE_MS BYTES DEVICE_CHUNKS LOOKUP_MS FETCH_MS
// COPY_MS" (the restore's parts: PrefixCache's Request figures).
int RunChild(const Args& a, std::uint64_t largest) {
  const auto rank = static_cast<std::uint32_t>(a.child);
  auto b = Setup(a.config_path, a.seed, a.prefix + 1, a.chunk, a.cpu, 2, a.tp ? a.tp_size : 1, a.tp ? rank : 0);
  if (!b.ok()) return Fail(b.status(), "engine setup");
  auto cache = Cache(a, *b, largest);
  if (!cache.ok()) return Fail(cache.status(), "engine cache");
  const auto tokens = EntryTokens(a, a.tp ? 0 : static_cast<std::size_t>(a.child));
  auto warm = (*cache)->Prime(tokens);
  if (!warm.ok()) return Fail(warm.status(), "warm-up restore");
  if (warm->restored_tokens != a.prefix) {
    std::fprintf(stderr, "fanin-bench: engine %d restored %llu tokens, not %zu\n", a.child,
                 static_cast<unsigned long long>(warm->restored_tokens), a.prefix);
    return 1;
  }
  warm->session = model::ModelSession{};
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (read(a.go_fd, &c, 1) > 0) {
  }
  const std::int64_t start = NowNs();
  auto r = (*cache)->Prime(tokens);
  if (!r.ok()) return Fail(r.status(), "restore");
  if (r->restored_tokens != a.prefix) return Fail(Status::Internal("restored less than its entry"), "restore");
  std::printf("result %lld %.6f %llu %llu %.6f %.6f %.6f\n", static_cast<long long>(start), r->restore_ms,
              static_cast<unsigned long long>(r->restored_bytes), static_cast<unsigned long long>(r->device_chunks),
              r->lookup_ms, r->fetch_ms, r->copy_ms);
  std::fflush(stdout);
  return 0;
}

// The figure: one row per round of N engines.
bench::CsvTable FaninTable() {
  return bench::CsvTable({"config", "device", "prefix_tokens", "engines", "restored_bytes", "span_ms",
                          "aggregate_gbps", "copy_gbps", "vs_copy", "restore_ms_min", "restore_ms_max",
                          "max_fair_share", "device_chunks"});
}

// What a round measured, for its table line and CSV row.
struct Round {
  std::size_t engines = 0;
  std::uint64_t total = 0, device_chunks = 0;
  double span_ms = 0, aggregate_gbps = 0, min_ms = 0, max_ms = 0, worst_share = 0;
  std::string times;  // each engine's restore, ms
  std::string parts;  // each engine's start (after the first) and restore's parts, ms
};

// The run's side-by-side copy rate, and what its rows are named by.
struct Baseline {
  double copy_gbps = 0;
  std::string config, device;
};

struct Engine {
  pid_t pid = -1;
  FILE* out = nullptr;
  std::int64_t start = 0;
  double restore_ms = 0;
  double lookup_ms = 0, fetch_ms = 0, copy_ms = 0;  // the restore's parts (the rest: a new session)
  std::uint64_t bytes = 0, device_chunks = 0;
};

// Starts engine `k` (this program with --engine-child): its stdout piped back.
Result<Engine> Spawn(const Args& a, std::size_t k, std::uint64_t largest, int go_read) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Status::IOError("pipe");
  std::vector<std::string> args = {"/proc/self/exe", "--engine-child", std::to_string(k), "--socket", a.socket,
                                   "--go-fd", std::to_string(go_read), "--config", a.config_path, "--prefix",
                                   std::to_string(a.prefix), "--chunk", std::to_string(a.chunk), "--seed",
                                   std::to_string(a.seed), "--largest-layer", std::to_string(largest)};
  if (a.cpu) args.emplace_back("--cpu");
  if (a.tp) {
    args.emplace_back("--tp");
    args.emplace_back("--tp-size");
    args.emplace_back(std::to_string(a.tp_size));
  }
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return Status::IOError("fork");
  if (pid == 0) {
    // Only the barrier's read end and stdout pass to the engine.
    if (dup2(out[1], 1) < 0 || fcntl(go_read, F_SETFD, 0) != 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  Engine e;
  e.pid = pid;
  e.out = fdopen(out[0], "r");
  return e;
}

// The engine's next line that begins with `tag` (its setup prints others).
bool NextLine(FILE* f, const std::string& tag, char* line, int size) {
  while (std::fgets(line, size, f) != nullptr) {
    if (std::string(line).starts_with(tag)) return true;
  }
  return false;
}

// N engines restoring at once: each one's figures, or false when one failed.
bool RunEngines(const Args& a, std::size_t n, std::uint64_t largest, std::vector<Engine>* out) {
  int go[2];
  if (pipe2(go, O_CLOEXEC) != 0) return false;
  std::vector<Engine> engines;
  bool ok = true;
  for (std::size_t k = 0; k < n && ok; ++k) {
    auto e = Spawn(a, k, largest, go[0]);
    ok = e.ok();
    if (ok) engines.push_back(*e);
  }
  char line[512];
  for (auto& e : engines) ok = ok && NextLine(e.out, "ready", line, sizeof line);
  close(go[1]);  // the barrier: every engine starts now
  close(go[0]);
  for (auto& e : engines) {
    long long start = 0;
    unsigned long long bytes = 0, dev = 0;
    ok = ok && NextLine(e.out, "result", line, sizeof line) &&
         std::sscanf(line, "result %lld %lf %llu %llu %lf %lf %lf", &start, &e.restore_ms, &bytes, &dev, &e.lookup_ms,
                     &e.fetch_ms, &e.copy_ms) == 7;
    e.start = start;
    e.bytes = bytes;
    e.device_chunks = dev;
  }
  for (auto& e : engines) {
    int st = 0;
    waitpid(e.pid, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    std::fclose(e.out);
  }
  if (!ok) {
    std::fprintf(stderr, "fanin-bench: an engine of %zu failed\n", n);
    return false;
  }
  *out = std::move(engines);
  return true;
}

// A round's figures from its engines' (at least one).
Round Summarize(const std::vector<Engine>& engines) {
  Round r;
  r.engines = engines.size();
  std::int64_t first = engines[0].start, last = 0;
  r.min_ms = engines[0].restore_ms;
  for (const auto& e : engines) {
    first = std::min(first, e.start);
    last = std::max(last, e.start + static_cast<std::int64_t>(e.restore_ms * 1e6));
    r.total += e.bytes;
    r.device_chunks += e.device_chunks;
    r.min_ms = std::min(r.min_ms, e.restore_ms);
    r.max_ms = std::max(r.max_ms, e.restore_ms);
  }
  r.span_ms = double(last - first) / 1e6;
  r.aggregate_gbps = Gbs(r.total, r.span_ms);
  // Fair shares: every engine restoring at the same rate, the engines'
  // time in all split among them by their bytes.
  double sum_ms = 0;
  for (const auto& e : engines) sum_ms += e.restore_ms;
  for (const auto& e : engines) {
    const double fair_ms = sum_ms * double(e.bytes) / double(r.total);
    r.worst_share = std::max(r.worst_share, e.restore_ms / fair_ms);
    char t[32];
    std::snprintf(t, sizeof t, "%s%.1f", r.times.empty() ? "" : " ", e.restore_ms);
    r.times += t;
    char p[160];
    std::snprintf(p, sizeof p, "%s+%.1f: %.1f lookup, %.1f fetch, %.1f copy, %.1f else", r.parts.empty() ? "" : "; ",
                  double(e.start - first) / 1e6, e.lookup_ms, e.fetch_ms, e.copy_ms,
                  e.restore_ms - e.lookup_ms - e.fetch_ms - e.copy_ms);
    r.parts += p;
  }
  return r;
}

// The round of N engines: its table line, and its row of `table`.
// Its engines' restores in parts are added to `parts` (printed after the table).
bool RunRound(Args a, std::size_t n, std::uint64_t largest, const Baseline& base, bench::CsvTable* table,
              std::vector<std::string>* parts) {
  a.tp_size = a.tp ? static_cast<std::uint32_t>(n) : 1;
  std::vector<Engine> engines;
  if (!RunEngines(a, n, largest, &engines)) return false;
  const Round r = Summarize(engines);
  const double vs_copy = r.aggregate_gbps / base.copy_gbps;
  std::printf("| %zu | %.3f GB | %.1f ms | %.2f GB/s | %.2fx | %s ms | %.2fx | %llu |\n", n, double(r.total) / 1e9,
              r.span_ms, r.aggregate_gbps, vs_copy, r.times.c_str(), r.worst_share,
              static_cast<unsigned long long>(r.device_chunks));
  std::fflush(stdout);
  parts->push_back(std::to_string(n) + (a.tp ? " ranks" : " engines") +
                   " (each started at +ms: its restore's parts, ms): " + r.parts);
  const Status s = table->Add({base.config, base.device, a.prefix, n, r.total, r.span_ms, r.aggregate_gbps,
                               base.copy_gbps, vs_copy, r.min_ms, r.max_ms, r.worst_share, r.device_chunks});
  if (!s.ok()) Fail(s, "csv row");
  return s.ok();
}

// Publishes the K entries through a cache of the parent's model; their
// largest layer's bytes and one entry's restored bytes.
Result<std::pair<std::uint64_t, std::uint64_t>> PublishEntries(const Args& a, BenchSetup& b, std::size_t k) {
  std::uint64_t largest = 0, bytes = 0;
  std::unique_ptr<model::PrefixCache> cache;
  for (std::size_t i = 0; i < k; ++i) {
    const auto tokens = EntryTokens(a, i);
    PC_ASSIGN_OR_RETURN(auto session, b.model->NewSession());
    PC_RETURN_IF_ERROR(b.model->Prime(session, std::span(tokens).first(a.prefix), model::LogitsWanted::kNone, nullptr));
    PC_ASSIGN_OR_RETURN(std::vector<LayerSnapshot> layers, session.cache->CaptureFull());
    if (!cache) {
      for (const auto& l : layers) largest = std::max(largest, engine::ViewFloats(ShapeOf(l)) * sizeof(float));
      PC_ASSIGN_OR_RETURN(cache, Cache(a, b, largest));
    }
    bytes = 0;
    for (const auto& l : layers) bytes += engine::ViewFloats(ShapeOf(l)) * sizeof(float);
    PC_RETURN_IF_ERROR(cache->Publish(std::span(tokens).first(a.prefix), layers));
  }
  return std::pair{largest, bytes};
}

// With --tp: one boundary captured by the whole model, published for each TP
// size N of --engines as a TP-N entry under its own namespace (PublishRanks:
// rank 0's part every layer, each later rank's its shards). Its largest
// layer's bytes and the whole boundary's.
Result<std::pair<std::uint64_t, std::uint64_t>> PublishTpEntries(const Args& a, BenchSetup& b) {
  const auto tokens = EntryTokens(a, 0);
  PC_ASSIGN_OR_RETURN(auto session, b.model->NewSession());
  PC_RETURN_IF_ERROR(b.model->Prime(session, std::span(tokens).first(a.prefix), model::LogitsWanted::kNone, nullptr));
  PC_ASSIGN_OR_RETURN(std::vector<LayerSnapshot> whole, session.cache->CaptureFull());
  std::uint64_t largest = 0, bytes = 0;
  for (const auto& l : whole) {
    largest = std::max(largest, engine::ViewFloats(ShapeOf(l)) * sizeof(float));
    bytes += engine::ViewFloats(ShapeOf(l)) * sizeof(float);
  }
  const client::ModelId id = model::PrefixCache::ModelIdFor(b.config, b.weights);
  for (std::size_t n : a.engines) {
    const auto tp = static_cast<std::uint32_t>(n);
    client::ClientOptions o;
    o.endpoint = a.socket;
    o.ns = Namespace(a, tp);
    o.shared_memory = true;
    o.timeout = std::chrono::milliseconds(300000);
    PC_ASSIGN_OR_RETURN(auto c, client::Client::Connect(o));
    std::vector<std::vector<LayerSnapshot>> ranks;
    for (std::uint32_t r = 0; r < tp; ++r) {
      PC_ASSIGN_OR_RETURN(auto mine, SliceLayers(whole, b.config.attn.kv_heads, tp, r));
      ranks.push_back(std::move(mine));
    }
    PC_ASSIGN_OR_RETURN(PublishResult p, model::PublishRanks(*c, id, std::span(tokens).first(a.prefix),
                                                             std::move(ranks), b.config.attn.kv_heads,
                                                             /*token=*/tp, EncodeOptions{}));
    if (p.group_pending) return Status::Internal("TP " + std::to_string(tp) + " entry left pending");
  }
  return std::pair{largest, bytes};
}

int RunParent(Args& a) {
  if (!a.cpu && !engine::CudaDeviceAvailable()) {
    std::printf("fanin-bench: no CUDA device; nothing measured (--cpu runs on the CPU reference)\n");
    return 0;
  }
  if (a.daemon_bin.empty()) return Fail(Status::InvalidArgument("--daemon is required"), "arguments");
  const std::size_t k = *std::max_element(a.engines.begin(), a.engines.end());
  launcher::DaemonProcess daemon(a.daemon_bin, a.daemon_args);
  if (Status s = daemon.Start(); !s.ok()) return Fail(s, "daemon");
  a.socket = daemon.socket();
  std::uint64_t largest = 0, entry_bytes = 0;
  Baseline base;
  {
    auto b = Setup(a.config_path, a.seed, a.prefix + 1, a.chunk, a.cpu, 2);
    if (!b.ok()) return Fail(b.status(), "setup");
    auto published = a.tp ? PublishTpEntries(a, *b) : PublishEntries(a, *b, k);
    if (!published.ok()) return Fail(published.status(), "publish");
    std::tie(largest, entry_bytes) = *published;
    auto bus = MeasureBus(b->engine->device(), entry_bytes);
    if (!bus.ok()) return Fail(bus.status(), "pinned copies");
    base.copy_gbps = bus->h2d_gbs;
    base.device = b->engine->device().name();
    base.config = b->config.name;
  }
  if (a.tp) {
    std::printf("fanin-bench: %s on %s, TP entries of one %zu-token boundary (%.3f GB whole; each rank restores the "
                "replicated layers and its shards); pinned host-to-device copy %.2f GB/s\n",
                a.config_path.c_str(), base.device.c_str(), a.prefix, double(entry_bytes) / 1e9, base.copy_gbps);
  } else {
    std::printf("fanin-bench: %s on %s, %zu entries of %zu tokens (%.3f GB restored each); pinned host-to-device "
                "copy %.2f GB/s\n",
                a.config_path.c_str(), base.device.c_str(), k, a.prefix, double(entry_bytes) / 1e9, base.copy_gbps);
  }
  std::printf("| %s | restored | span | aggregate | vs copy | each %s restore | max/fair share | "
              "device chunks |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
              a.tp ? "TP ranks" : "engines", a.tp ? "rank's" : "engine's");
  // Written again after every round: a run cut short keeps the rounds it finished.
  bench::CsvTable table = FaninTable();
  const std::string name = std::string(a.tp ? "fanin-tp-" : "fanin-") + base.config + (a.cpu ? "-cpu" : "-cuda");
  std::vector<std::string> parts;
  for (std::size_t n : a.engines) {
    if (!RunRound(a, n, largest, base, &table, &parts)) return 1;
    if (Status s = table.WriteToDir(a.csv_dir, name); !s.ok()) return Fail(s, "csv");
  }
  for (const std::string& p : parts) std::printf("fanin-bench: %s\n", p.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Many engine processes restoring different entries at once through one daemon"};
  Args a;
  std::uint64_t largest = 0;
  app.add_option("--config", a.config_path, "model config (JSON)");
  app.add_option("--prefix", a.prefix, "tokens of each entry")->check(CLI::Range(16, 1 << 20));
  app.add_option("--engines", a.engines, "engine processes restoring at once, one round each")
      ->expected(1, 16)
      ->check(CLI::Range(1, 64));
  app.add_option("--chunk", a.chunk, "tokens per forward call")->check(CLI::Range(1, 65536));
  app.add_option("--seed", a.seed, "weights seed");
  app.add_option("--daemon", a.daemon_bin, "primecached binary");
  app.add_option("--daemon-arg", a.daemon_args, "an argument for the daemon (repeat)")->allow_extra_args(false);
  app.add_flag("--cpu", a.cpu, "run on the CPU reference instead of CUDA");
  app.add_flag("--tp", a.tp, "each --engines value is a TP size: its rank processes restore their parts of one entry");
  app.add_option("--csv-dir", a.csv_dir, "also write the rounds as a CSV file here (tools/bench/plot.py)");
  auto* child = app.add_option("--engine-child", a.child)->group("");
  app.add_option("--socket", a.socket)->group("");
  app.add_option("--go-fd", a.go_fd)->group("");
  app.add_option("--largest-layer", largest)->group("");
  app.add_option("--tp-size", a.tp_size)->group("")->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);
  if (child->count() != 0) return RunChild(a, largest);
  return RunParent(a);
}

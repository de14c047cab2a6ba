// primecache-eviction-bench: which states to keep. Replays seeded request
// traces (chat, agentic, few-shot, documents; docs/traces.md) through the
// real store in process, once per eviction/admission policy and byte budget
// (a share of the trace's whole state), and reports token hit rate, prefill
// FLOPs saved, bytes written and the TTFT hits give; with --daemon, one
// configuration also through a real primecached, checked against the same
// replay in process (docs/BENCHMARKS.md).
//
//   primecache-eviction-bench [--short] [--traces chat,agentic,...] [--budgets 0.02,0.1,...]
//       [--policies lru,utility-a1,...] [--csv FILE] [--json FILE] [--daemon PATH]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/env.h"
#include "primecache/internal/logging.h"
#include "primecache/internal/model.h"
#include "tools/common/csv.h"
#include "tools/common/daemon_process.h"
#include "tools/common/replay.h"

namespace {

using namespace primecache;  // NOLINT(google-build-using-namespace)
using replay::Boundaries;
using replay::ReplayResult;
using replay::StateGeometry;

struct Options {
  std::string config = std::string(PRIMECACHE_SOURCE_DIR) + "/configs/hrm-glm5-class.json";
  std::uint32_t scale = 32;
  std::string traces = "chat,agentic,fewshot,documents";
  std::string budgets = "0.02,0.05,0.1,0.25,0.5";
  std::string policies = "lru,utility-a0.25,utility-a1,utility-a4,marginal-a1,marginal-a4,lru-reuse,utility-reuse,lru-seen2";
  std::string boundaries = "branch";
  std::uint64_t seed = 1;
  bool short_run = false;
  std::uint32_t conversations = 0;
  double length_scale = 1.0;
  double restore_gbps = 28.9;
  double prefill_tps = 32768 / 14.9532;
  std::string csv, json;
  std::string daemon;
  std::string dir = "/tmp";
  bool no_cost = false;
};

// One policy, by name: eviction, its parameters and admission.
struct Policy {
  std::string name;
  EvictionOptions eviction;
};

// Reads the parts after a policy's eviction name: "-aALPHA" / "-wWINDOW"
// (utility and marginal only), then "-reuse", "-reuseSHARE" or "-seen2".
Status ParsePolicyPart(const std::string& part, EvictionOptions* e) {
  const bool weighs = e->policy != EvictionPolicy::kLru;
  if (part.starts_with("a") && weighs) {
    e->utility_alpha = std::stod(part.substr(1));
  } else if (part.starts_with("w") && weighs) {
    e->utility_window = std::stoul(part.substr(1));
  } else if (part == "seen2") {
    return ParseAdmission("seen-twice", e);
  } else if (part.starts_with("reuse")) {
    PC_RETURN_IF_ERROR(ParseAdmission("reuse", e));
    if (part.size() > 5) e->admit_reuse_share = std::stod(part.substr(5));
  } else {
    return Status::InvalidArgument("unknown part '" + part + "'");
  }
  return Status::Ok();
}

// "lru", "utility" or "marginal" (the daemon's --eviction names), then parts
// (ParsePolicyPart) joined by '-'.
Result<Policy> ParsePolicy(const std::string& name) {
  Policy p{name, {}};
  std::stringstream in(name);
  std::string part;
  std::getline(in, part, '-');
  PC_RETURN_IF_ERROR(ParseEvictionPolicy(part, &p.eviction));
  while (std::getline(in, part, '-')) {
    Status s;
    try {
      s = ParsePolicyPart(part, &p.eviction);
    } catch (const std::exception&) {
      s = Status::InvalidArgument("bad number in '" + part + "'");
    }
    if (!s.ok()) return Status::InvalidArgument("policy '" + name + "': " + s.message());
  }
  return p;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

int Die(const Status& s, const char* what) {
  std::fprintf(stderr, "primecache-eviction-bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

// A fresh directory under `base`, removed at the end.
struct ScratchDir {
  std::string path;
  explicit ScratchDir(const std::string& base) {
    std::string tmpl = base + "/primecache-evict-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

struct Row {
  std::string trace, policy, where = "process";
  double budget_share = 0;  // 0: unlimited
  std::uint64_t budget_bytes = 0;
  ReplayResult r;
  double seconds = 0;
};

replay::ReplayOptions ReplayOptionsFor(const Options& o, std::uint64_t budget) {
  replay::ReplayOptions ro;
  ro.boundaries = o.boundaries == "end" ? Boundaries::kEnd : Boundaries::kEndAndBranch;
  ro.budget_real_bytes = budget;
  ro.restore_bytes_per_s = o.restore_gbps * 1e9;
  ro.prefill_tokens_per_s = o.prefill_tps;
  return ro;
}

StoreOptions StoreOptionsFor(const Policy& p, const StateGeometry& g, std::uint64_t budget, const std::string& dir) {
  StoreOptions so;
  so.validator = CodecLayerValidator();
  so.path = dir + "/store";
  so.sync_commits = false;  // a throwaway store: the figures are counts, not times
  so.byte_budget = budget / g.scale;
  so.eviction = p.eviction;
  so.fetch_read_threads = 0;
  // No background segment rewriting: it would only move dead bytes around
  // (the budget counts live bytes) and take the CPU the replays need.
  so.reclaim_after_bytes = ~0ull;
  return so;
}

// One replay of `trace` through a fresh store in process.
Result<Row> RunInProcess(const Options& o, const traces::Trace& trace, const StateGeometry& g, const Policy& p,
                         double share, std::uint64_t budget) {
  ScratchDir dir(o.dir);
  if (dir.path.empty()) return Status::IOError("cannot make a directory under " + o.dir);
  PC_ASSIGN_OR_RETURN(auto store, LocalStore::Open(StoreOptionsFor(p, g, budget, dir.path)));
  replay::StoreTarget target(store.get(), g, !o.no_cost);
  Row row{std::string(traces::KindName(trace.kind)), p.name, "process", share, budget, {}, 0};
  const auto t0 = std::chrono::steady_clock::now();
  PC_ASSIGN_OR_RETURN(row.r, replay::Replay(trace, g, target, ReplayOptionsFor(o, budget)));
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return row;
}

// ---- through the daemon -----------------------------------------------------------------

class DaemonTarget final : public replay::Target {
 public:
  DaemonTarget(client::Client* c, const StateGeometry& g)
      : c_(c), id_{Checksum128(std::as_bytes(std::span(g.model.data(), g.model.size()))), g.model, "", g.cost} {}
  Result<std::uint64_t> Lookup(std::span<const std::uint32_t> tokens) override {
    PC_ASSIGN_OR_RETURN(auto hit, c_->Lookup(id_, tokens));
    return hit ? hit->length : 0;
  }
  Result<std::optional<PublishResult>> Publish(std::span<const std::uint32_t> tokens,
                                               const std::vector<LayerBytes>& layers) override {
    std::vector<client::LayerData> data;
    for (const LayerBytes& l : layers) {
      client::LayerData d;
      auto h = AsBytes(l.header);
      d.header.assign(h.begin(), h.end());
      for (const std::string& c : l.chunks) {
        auto b = AsBytes(c);
        d.chunks.emplace_back(b.begin(), b.end());
      }
      data.push_back(std::move(d));
    }
    auto r = c_->Publish(id_, tokens, data);
    if (r.status().code() == StatusCode::kAborted) return std::optional<PublishResult>();
    PC_RETURN_IF_ERROR(r.status());
    return std::optional<PublishResult>(*r);
  }
  Result<std::uint64_t> StoredBytes() override {
    PC_ASSIGN_OR_RETURN(DaemonStats st, c_->Stat());
    return st.store.stored_bytes;
  }

 private:
  client::Client* c_;
  client::ModelId id_;
};

std::vector<std::string> DaemonArgs(const Policy& p, const StateGeometry& g, std::uint64_t budget) {
  const EvictionOptions& e = p.eviction;
  return {"--capacity", std::to_string(budget / g.scale), "--log-level", "warn",
          "--eviction", std::string(EvictionPolicyName(e.policy)), "--utility-alpha", std::to_string(e.utility_alpha),
          "--utility-window", std::to_string(e.utility_window), "--admit-reuse-share",
          std::to_string(e.admit_reuse_share), "--admission", std::string(AdmissionName(e))};
}

// The same replay through a real primecached (its store's commits synced, as it serves).
Result<Row> RunThroughDaemon(const Options& o, const traces::Trace& trace, const StateGeometry& g, const Policy& p,
                             double share, std::uint64_t budget) {
  launcher::DaemonProcess d(o.daemon, DaemonArgs(p, g, budget));
  PC_RETURN_IF_ERROR(d.Start());
  client::ClientOptions co;
  co.endpoint = d.socket();
  co.client_name = "primecache-eviction-bench";
  co.timeout = std::chrono::milliseconds(60000);
  PC_ASSIGN_OR_RETURN(auto c, client::Client::Connect(co));
  DaemonTarget target(c.get(), g);
  Row row{std::string(traces::KindName(trace.kind)), p.name, "daemon", share, budget, {}, 0};
  const auto t0 = std::chrono::steady_clock::now();
  PC_ASSIGN_OR_RETURN(row.r, replay::Replay(trace, g, target, ReplayOptionsFor(o, budget)));
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.reset();
  if (int rc = d.Stop(); rc != 0) return Status::Internal("primecached exited with " + std::to_string(rc));
  return row;
}

// ---- output -----------------------------------------------------------------------------

std::string BudgetText(const Row& row) {
  if (row.budget_share == 0) return "unlimited";
  char b[32];
  std::snprintf(b, sizeof(b), "%g%%", row.budget_share * 100);
  return b;
}

void PrintHeader() {
  std::printf("| trace | policy | budget | GB | hit rate | FLOPs saved | requests hit | written GB | evictions | "
              "refused | no room | TTFT mean ms | TTFT p95 ms | no cache mean ms | where |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
}

void PrintRow(const Row& row) {
  const ReplayResult& r = row.r;
  std::printf("| %s | %s | %s | %.2f | %.3f | %.3f | %llu/%llu | %.2f | %llu | %llu | %llu | %.0f | %.0f | %.0f | %s |\n",
              row.trace.c_str(), row.policy.c_str(), BudgetText(row).c_str(),
              static_cast<double>(row.budget_share == 0 ? r.peak_stored_bytes : row.budget_bytes) / 1e9, r.HitRate(),
              r.FlopsSavedShare(), static_cast<unsigned long long>(r.hits), static_cast<unsigned long long>(r.requests),
              static_cast<double>(r.bytes_written) / 1e9, static_cast<unsigned long long>(r.evictions),
              static_cast<unsigned long long>(r.refused), static_cast<unsigned long long>(r.failed), r.ttft_mean_ms, r.ttft_p95_ms, r.ttft_nocache_mean_ms,
              row.where.c_str());
  std::fflush(stdout);
}

nlohmann::json ToJson(const Row& row) {
  const ReplayResult& r = row.r;
  return {{"trace", row.trace}, {"policy", row.policy}, {"where", row.where},
          {"budget_share", row.budget_share}, {"budget_bytes", row.budget_bytes},
          {"requests", r.requests}, {"prompt_tokens", r.prompt_tokens}, {"hit_tokens", r.hit_tokens},
          {"hit_rate", r.HitRate()}, {"requests_hit", r.hits}, {"prefill_flops", r.prefill_flops},
          {"flops_saved", r.flops_saved}, {"flops_saved_share", r.FlopsSavedShare()},
          {"publishes", r.publishes}, {"refused", r.refused}, {"failed", r.failed},
          {"bytes_written", r.bytes_written}, {"peak_stored_bytes", r.peak_stored_bytes},
          {"over_budget", r.over_budget}, {"evictions", r.evictions}, {"ttft_mean_ms", r.ttft_mean_ms},
          {"ttft_p95_ms", r.ttft_p95_ms}, {"ttft_nocache_mean_ms", r.ttft_nocache_mean_ms},
          {"seconds", row.seconds}};
}

Status WriteOutputs(const Options& o, const std::vector<Row>& rows) {
  nlohmann::json all = nlohmann::json::array();
  for (const Row& r : rows) all.push_back(ToJson(r));
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << all.dump(2) << "\n";
    if (!f) return Status::IOError("cannot write " + o.json);
  }
  if (o.csv.empty() || all.empty()) return Status::Ok();
  std::vector<std::string> columns;
  for (const auto& [k, v] : all.front().items()) columns.push_back(k);
  bench::CsvTable table(std::move(columns));
  for (const auto& rec : all) {
    std::vector<bench::CsvCell> cells;
    for (const auto& [k, v] : rec.items()) cells.emplace_back(v.is_string() ? v.get<std::string>() : v.dump());
    PC_RETURN_IF_ERROR(table.Add(std::move(cells)));
  }
  return table.WriteTo(o.csv);
}

}  // namespace

namespace {

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--config", o.config, "model config whose state geometry is published (MLA and KDA layers)");
  app.add_option("--scale", o.scale, "publish the state at 1/SCALE of its size (bytes are reported at full size)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--traces", o.traces, "comma-separated: chat, agentic, fewshot, documents");
  app.add_option("--budgets", o.budgets, "byte budgets as shares of the trace's whole state, comma-separated");
  app.add_option("--policies", o.policies,
                 "comma-separated: lru | utility[-aALPHA][-wWINDOW] | marginal[-aALPHA][-wWINDOW], then -reuse[SHARE] or -seen2 (admission)");
  app.add_option("--boundaries", o.boundaries, "end: each prompt's end only; branch: also its branch point")
      ->check(CLI::IsMember({"end", "branch"}));
  app.add_option("--seed", o.seed, "trace seed");
  app.add_flag("--short", o.short_run, "a quick run: small traces, two budgets, three policies (the ctest smoke test)");
  app.add_option("--conversations", o.conversations, "conversations per trace (0: each kind's default)");
  app.add_option("--length-scale", o.length_scale, "multiply every length distribution by this")
      ->check(CLI::Range(0.01, 10.0));
  app.add_option("--restore-gbps", o.restore_gbps,
                 "restore rate of a hit, GB/s (default: through the daemon, hot, 32K, H200; docs/BENCHMARKS.md)");
  app.add_option("--prefill-tps", o.prefill_tps,
                 "prefill rate at 32768 tokens, tokens/s (default: hrm-glm5-class on the H200, 14953 ms)");
  app.add_option("--csv", o.csv, "write every row as CSV here");
  app.add_option("--json", o.json, "write every row as JSON here");
  app.add_option("--daemon", o.daemon, "primecached: also replay the first trace, budget and policy through it");
  app.add_option("--dir", o.dir, "where the temporary stores go");
  app.add_flag("--no-cost", o.no_cost,
               "publish without the model's prefill cost (as the daemon's protocol does): the utility weighs tokens");
}

void ApplyShort(Options& o) {
  if (!o.short_run) return;
  o.budgets = "0.05,0.25";
  // The first is the one replayed through the daemon too: admission by
  // reuse there exercises the daemon's flags and its lookups' sightings.
  o.policies = "lru-reuse0.25,lru,utility-a1,marginal-a1";
  o.length_scale = 0.2;
  if (o.conversations == 0) o.conversations = 4;
}

// The unlimited replay (the trace's whole state), then every budget x policy.
Status RunTrace(const Options& o, traces::Kind kind, const StateGeometry& g, const std::vector<Policy>& policies,
                std::vector<Row>* rows) {
  const traces::Trace trace = traces::Generate(kind, {o.seed, o.conversations, o.length_scale});
  std::fprintf(stderr, "trace %s: %zu requests, %llu prompt tokens\n", std::string(traces::KindName(kind)).c_str(),
               trace.requests.size(), static_cast<unsigned long long>(trace.TotalTokens()));
  Policy all;
  all.name = "unlimited";
  PC_ASSIGN_OR_RETURN(Row top, RunInProcess(o, trace, g, all, 0, 0));
  PrintRow(top);
  const std::uint64_t total = top.r.peak_stored_bytes;
  rows->push_back(std::move(top));
  for (const std::string& b : Split(o.budgets)) {
    const double share = std::stod(b);
    for (const Policy& p : policies) {
      PC_ASSIGN_OR_RETURN(Row row, RunInProcess(o, trace, g, p, share, static_cast<std::uint64_t>(share * static_cast<double>(total))));
      if (row.r.over_budget > 0) return Status::Internal(row.policy + ": the store passed its budget after a publish");
      PrintRow(row);
      rows->push_back(std::move(row));
    }
  }
  return Status::Ok();
}

// One budgeted row again through the daemon: the same hits, or an error.
Status RunDaemon(const Options& o, const StateGeometry& g, const std::vector<Policy>& policies,
                 std::vector<Row>* rows) {
  // The first trace's largest budget with the first policy (most hits to compare).
  const Row* ref = nullptr;
  for (const Row& r : *rows) {
    if (r.trace != rows->front().trace || r.policy != policies.front().name) continue;
    if (ref == nullptr || r.budget_share > ref->budget_share) ref = &r;
  }
  if (ref == nullptr) return Status::Ok();
  PC_ASSIGN_OR_RETURN(traces::Kind kind, traces::ParseKind(ref->trace));
  const traces::Trace trace = traces::Generate(kind, {o.seed, o.conversations, o.length_scale});
  PC_ASSIGN_OR_RETURN(Row row, RunThroughDaemon(o, trace, g, policies.front(), ref->budget_share, ref->budget_bytes));
  PrintRow(row);
  const bool same = row.r.hit_lengths == ref->r.hit_lengths;
  std::printf("\nthrough the daemon: %s hits as in process (%llu of %llu tokens), %.1f s against %.1f s\n",
              same ? "the same" : "OTHER", static_cast<unsigned long long>(row.r.hit_tokens),
              static_cast<unsigned long long>(row.r.prompt_tokens), row.seconds, ref->seconds);
  rows->push_back(std::move(row));
  if (!same) return Status::Internal("the daemon's replay hit other boundaries than the store's in process");
  return Status::Ok();
}

Status Run(Options& o) {
  ApplyShort(o);
  PC_ASSIGN_OR_RETURN(auto config, model::LoadModelConfig(Env::Default(), o.config));
  PC_ASSIGN_OR_RETURN(StateGeometry g, replay::GeometryFor(config, o.scale));
  std::vector<Policy> policies;
  for (const std::string& name : Split(o.policies)) {
    PC_ASSIGN_OR_RETURN(Policy p, ParsePolicy(name));
    policies.push_back(p);
  }
  if (policies.empty()) return Status::InvalidArgument("no policy");
  std::printf("model %s at 1/%u scale, %.1f MB of state at 32768 tokens; restore %.1f GB/s, prefill %.0f tokens/s "
              "at 32K; boundaries: %s\n\n",
              g.model.c_str(), g.scale, static_cast<double>(g.RealBytes(32768)) / 1e6, o.restore_gbps, o.prefill_tps,
              o.boundaries.c_str());
  PrintHeader();
  std::vector<Row> rows;
  for (const std::string& name : Split(o.traces)) {
    PC_ASSIGN_OR_RETURN(traces::Kind kind, traces::ParseKind(name));
    PC_RETURN_IF_ERROR(RunTrace(o, kind, g, policies, &rows));
  }
  if (!o.daemon.empty()) PC_RETURN_IF_ERROR(RunDaemon(o, g, policies, &rows));
  return WriteOutputs(o, rows);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"primecache-eviction-bench: eviction and admission policies on replayed traces"};
  Options o;
  AddOptions(app, o);
  CLI11_PARSE(app, argc, argv);
  (void)InitLogging("error");  // a store closing mid-gc warns; harmless here
  if (Status s = Run(o); !s.ok()) return Die(s, "failed");
  return 0;
}

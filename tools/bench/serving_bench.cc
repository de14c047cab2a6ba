// primecache-serving-bench: the seeded request traces (docs/traces.md)
// replayed through the real serving path (PrefixCache, the real model, a
// real primecached child on a temporary directory), one fresh daemon per
// trace and boundary setting, and, side by side in the same run, the
// replay's in-process estimate of the same trace (tools/common/replay.h).
//
// For each trace and setting it measures the token hit rate (restored
// tokens over prompt tokens), the boundaries published and the chunk bytes
// they stored, and TTFT p50/p95; settings: `end` (the prompt's end only,
// what the serving path did before branch points), `branch` (the prompt's
// end and the branch point) and `gen` (those and the generation's end: the
// trace's reply to each request, chat's assistant turn or agentic's action,
// is fed through the model after the prompt as its generation, and Finish
// publishes the boundary after it, which the conversation's next request
// carries). Requests run one after another, each one's publishes drained
// before the next (the replay's assumption too). The replay knows no
// generation ends, so `gen` is set beside the replay's `branch` figure.
// Trace tokens are folded into the model's vocabulary (t mod 256, the byte
// tokens), which keeps every shared prefix shared.
//
//   primecache-serving-bench --daemon build/default/tools/primecached/primecached
//       --config configs/hrm-tiny.json --traces fewshot,agentic,chat --conversations 2 --length-scale 0.1
//
// With --check it also holds the figures to what they must show: on every
// trace `branch` hits at least as many tokens as `end` and `gen` at least as
// many as `branch` (more, where the trace gives replies), and under `end`
// and `branch` the real path's hit rate is within --max-gap of the replay's.
// Exit status: 0; 1 when a run failed; 3 when --check found a figure out.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <unistd.h>
#include <string>
#include <vector>

#include "primecache/internal/engine.h"
#include "primecache/internal/model.h"
#include "serving/prefix_cache.h"
#include "tools/common/csv.h"
#include "tools/common/daemon_process.h"
#include "tools/common/replay.h"
#include "tools/common/traces.h"

namespace primecache {
namespace {

struct Args {
  std::string daemon_bin, config_path = "configs/hrm-tiny.json", backend = "cpu", csv;
  std::vector<std::string> traces = {"fewshot", "agentic", "chat"};
  std::vector<std::string> settings = {"end", "branch", "gen"};
  std::uint64_t max_chunk_rows = kDefaultMaxChunkRows;
  std::uint32_t conversations = 2;
  double length_scale = 0.1;
  std::uint64_t seed = 1;
  std::size_t max_requests = 0;  // 0: every request of the trace
  bool check = false;
  double max_gap = 0.1;  // --check: |real - replay| hit rate at most this
};

struct Figures {
  std::uint64_t requests = 0, prompt_tokens = 0, hit_tokens = 0, published = 0, stored_bytes = 0;
  std::vector<double> ttft_ms;
  double HitRate() const { return prompt_tokens ? static_cast<double>(hit_tokens) / prompt_tokens : 0; }
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// Which boundaries a run publishes.
struct Setting {
  bool branch_points = false;
  bool generation_end = false;
};

Setting SettingNamed(const std::string& name) {
  return {name != "end", name == "gen"};
}

// One request of a trace in the model's vocabulary: its prompt and the
// reply the trace gives it (fed as its generation under `gen`).
struct Turn {
  std::vector<std::uint32_t> prompt, reply;
};

std::vector<Turn> Turns(const traces::Trace& t, std::size_t limit) {
  std::vector<Turn> out;
  for (const auto& r : t.requests) {
    if (limit != 0 && out.size() == limit) break;
    Turn turn;
    turn.prompt = {model::kBosToken};
    for (std::uint32_t x : r.tokens) turn.prompt.push_back(x % 256);
    for (std::uint32_t x : r.reply) turn.reply.push_back(x % 256);
    out.push_back(std::move(turn));
  }
  return out;
}

// One trace through the serving path under one setting, on a fresh daemon.
Result<Figures> RunServing(const Args& a, const model::ModelConfig& config, const model::Weights& weights,
                           const std::vector<Turn>& turns, Setting setting) {
  std::size_t longest = 0;
  for (const auto& t : turns) longest = std::max(longest, t.prompt.size() + t.reply.size());
  std::shared_ptr<engine::Device> device;
  if (a.backend == "cuda") {
    PC_ASSIGN_OR_RETURN(device, engine::NewCudaDevice());
  } else {
    device = engine::NewCpuDevice();
  }
  engine::ReserveRequest req;
  req.plan = model::HybridModel::PlanFor(config, weights);
  req.max_ctx = longest + 1;
  req.sessions = 1;
  req.snapshot_slots = 1;
  PC_ASSIGN_OR_RETURN(auto eng, engine::Engine::Create(device, req));
  PC_ASSIGN_OR_RETURN(auto m, model::HybridModel::Create(config, weights, eng.get(), {}));
  launcher::DaemonProcess daemon(a.daemon_bin, {});
  PC_RETURN_IF_ERROR(daemon.Start());
  client::ClientOptions o;
  o.endpoint = daemon.socket();
  o.shared_memory = true;
  o.timeout = std::chrono::milliseconds(300000);
  PC_ASSIGN_OR_RETURN(auto cl, client::Client::Connect(o));
  auto* stats_client = cl.get();
  model::PrefixCacheOptions opt;
  opt.publish_branch_points = setting.branch_points;
  opt.publish_generation_end = setting.generation_end;
  opt.encode.max_chunk_rows = a.max_chunk_rows;
  model::PrefixCache cache(m.get(), std::move(cl), model::PrefixCache::ModelIdFor(config, weights), opt);
  PC_RETURN_IF_ERROR(cache.ReserveStaging(longest));
  Figures f;
  for (const Turn& t : turns) {
    PC_ASSIGN_OR_RETURN(model::Request r, cache.Prime(t.prompt));
    f.ttft_ms.push_back(r.ttft_ms);
    ++f.requests;
    f.prompt_tokens += t.prompt.size();
    f.hit_tokens += r.restored_tokens;
    if (setting.generation_end && !t.reply.empty()) {
      std::vector<float> logits;
      PC_RETURN_IF_ERROR(m->Prime(r.session, t.reply, model::LogitsWanted::kLast, &logits));
    }
    cache.Finish(r, t.reply);
    if (cache.Drain() != 0) return Status::Internal("a publish failed (see the log)");
  }
  f.published = cache.published();
  PC_ASSIGN_OR_RETURN(DaemonStats st, stats_client->Stat());
  f.stored_bytes = st.store.stored_bytes;
  return f;
}

// The same trace through the replay's in-process store: its hit rate.
Result<double> ReplayHitRate(const model::ModelConfig& config, const traces::Trace& trace, std::size_t limit,
                             bool branch) {
  traces::Trace t = trace;
  if (limit != 0 && t.requests.size() > limit) t.requests.resize(limit);
  PC_ASSIGN_OR_RETURN(replay::StateGeometry g, replay::GeometryFor(config, 1));
  const std::string dir = std::filesystem::temp_directory_path() / ("pc-serving-replay-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  StoreOptions so;
  so.path = dir;
  so.validator = CodecLayerValidator();
  PC_ASSIGN_OR_RETURN(auto store, LocalStore::Open(so));
  replay::StoreTarget target(store.get(), g);
  replay::ReplayOptions ro;
  ro.boundaries = branch ? replay::Boundaries::kEndAndBranch : replay::Boundaries::kEnd;
  PC_ASSIGN_OR_RETURN(replay::ReplayResult r, replay::Replay(t, g, target, ro));
  store.reset();
  std::filesystem::remove_all(dir);
  return r.HitRate();
}

bool HasReplies(const std::vector<Turn>& turns) {
  return std::any_of(turns.begin(), turns.end(), [](const Turn& t) { return !t.reply.empty(); });
}

// --check's rules for one row, given the hit rates of the settings run
// before it on the same trace; false, with a line on stderr, when one fails.
bool CheckRow(const Args& a, const std::string& trace, const std::string& setting, double hit, double replay,
              const std::map<std::string, double>& before, bool replies) {
  bool ok = true;
  if (setting != "gen" && std::abs(hit - replay) > a.max_gap) {
    std::fprintf(stderr, "check: %s/%s hit rate %.3f is more than %.2f from the replay's %.3f\n", trace.c_str(),
                 setting.c_str(), hit, a.max_gap, replay);
    ok = false;
  }
  if (auto end = before.find("end"); setting == "branch" && end != before.end() && hit < end->second) {
    std::fprintf(stderr, "check: %s: branch points hit %.3f, below the prompt ends' %.3f\n", trace.c_str(), hit,
                 end->second);
    ok = false;
  }
  // Where the trace gives replies, the next turn carries one: generation
  // ends must restore more than branch points alone.
  if (auto br = before.find("branch"); setting == "gen" && br != before.end() &&
                                       (replies ? hit <= br->second : hit < br->second)) {
    std::fprintf(stderr, "check: %s: generation ends hit %.3f, not above the branch points' %.3f\n", trace.c_str(),
                 hit, br->second);
    ok = false;
  }
  return ok;
}

int Run(const Args& a) {
  auto config = model::LoadModelConfig(Env::Default(), a.config_path);
  if (!config.ok()) return std::fprintf(stderr, "%s\n", config.status().ToString().c_str()), 1;
  const model::Weights weights = model::Weights::Generate(*config, 1);
  bench::CsvTable csv({"trace", "setting", "requests", "prompt_tokens", "hit_rate", "replay_hit_rate", "published",
                       "stored_bytes", "ttft_p50_ms", "ttft_p95_ms"});
  std::printf("%-8s %-7s %9s %9s %9s %9s %10s %12s %10s %10s\n", "trace", "setting", "requests", "tokens", "hit",
              "replay", "published", "stored", "ttft_p50", "ttft_p95");
  int status = 0;
  for (const std::string& name : a.traces) {
    auto kind = traces::ParseKind(name);
    if (!kind.ok()) return std::fprintf(stderr, "%s\n", kind.status().ToString().c_str()), 1;
    traces::TraceOptions to;
    to.seed = a.seed;
    to.conversations = a.conversations;
    to.length_scale = a.length_scale;
    const traces::Trace trace = traces::Generate(*kind, to);
    const auto turns = Turns(trace, a.max_requests);
    std::map<std::string, double> rates;  // setting -> its hit rate, as they run
    for (const std::string& setting : a.settings) {
      const Setting boundaries = SettingNamed(setting);
      auto f = RunServing(a, *config, weights, turns, boundaries);
      if (!f.ok()) return std::fprintf(stderr, "%s/%s: %s\n", name.c_str(), setting.c_str(), f.status().ToString().c_str()), 1;
      auto replayed = ReplayHitRate(*config, trace, a.max_requests, boundaries.branch_points);
      if (!replayed.ok()) return std::fprintf(stderr, "replay: %s\n", replayed.status().ToString().c_str()), 1;
      const double p50 = Percentile(f->ttft_ms, 0.5), p95 = Percentile(f->ttft_ms, 0.95);
      std::printf("%-8s %-7s %9llu %9llu %9.3f %9.3f %10llu %12llu %10.1f %10.1f\n", name.c_str(), setting.c_str(),
                  static_cast<unsigned long long>(f->requests), static_cast<unsigned long long>(f->prompt_tokens),
                  f->HitRate(), *replayed, static_cast<unsigned long long>(f->published),
                  static_cast<unsigned long long>(f->stored_bytes), p50, p95);
      if (Status s = csv.Add({name, setting, f->requests, f->prompt_tokens, f->HitRate(), *replayed, f->published,
                              f->stored_bytes, p50, p95});
          !s.ok()) {
        return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
      }
      if (a.check && !CheckRow(a, name, setting, f->HitRate(), *replayed, rates, HasReplies(turns))) status = 3;
      rates[setting] = f->HitRate();
    }
  }
  if (!a.csv.empty()) {
    if (Status s = csv.WriteTo(a.csv); !s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  }
  return status;
}

}  // namespace
}  // namespace primecache

int main(int argc, char** argv) {
  primecache::Args a;
  CLI::App app("the request traces through the real serving path, side by side with the replay's estimate");
  app.add_option("--daemon", a.daemon_bin, "the primecached binary (a child on a temporary directory)")->required();
  app.add_option("--config", a.config_path, "model config (JSON)");
  app.add_option("--backend", a.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--traces", a.traces, "trace kinds (chat, agentic, fewshot, documents, mixed)")->delimiter(',');
  app.add_option("--settings", a.settings, "boundary settings: end, branch, gen (branch and generation ends)")
      ->delimiter(',')
      ->check(CLI::IsMember({"end", "branch", "gen"}));
  app.add_option("--max-chunk-rows", a.max_chunk_rows, "the most rows a chunk of an append-only plane holds")
      ->check(CLI::Range(std::uint64_t{1}, primecache::CodecLimits{}.max_tokens));  // the encoder's bound
  app.add_option("--conversations", a.conversations, "conversations (sessions, batches) per trace");
  app.add_option("--length-scale", a.length_scale, "scales every length distribution of the traces");
  app.add_option("--max-requests", a.max_requests, "replay at most this many requests of each trace (0: all)");
  app.add_option("--seed", a.seed, "trace seed");
  app.add_option("--csv", a.csv, "also write the rows to this CSV file");
  app.add_flag("--check", a.check,
               "exit 3 unless each setting hits at least the one before and the replay agrees (end, branch)");
  app.add_option("--max-gap", a.max_gap, "--check: the largest hit-rate gap to the replay");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  return primecache::Run(a);
}

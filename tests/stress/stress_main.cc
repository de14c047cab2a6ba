// primecache-stress: the reliability campaigns (docs/RELIABILITY.md). Each
// subcommand runs one campaign against the real daemon, client library,
// store and primecachectl, prints progress and one closing "RESULT" line, and
// exits 0 when every check held, 1 when one failed, 77 when it cannot run
// here. tools/stress runs them at full length; ctest (label stress) briefly.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "primecache/internal/logging.h"
#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"

namespace {

using namespace primecache::stress;  // NOLINT(google-build-using-namespace)

void AddCommon(CLI::App* sub, CommonOptions* c) {
  sub->add_option("--work-dir", c->work_dir, "where the campaign's temporary directory goes (default TMPDIR or /tmp)");
  sub->add_option("--seed", c->seed, "seed of every random choice (default: the clock; printed)");
  sub->add_flag("--keep", c->keep, "keep the campaign's directory even when it passed");
}

CLI::App* AddCrash(CLI::App& app, CrashOptions* o) {
  auto* c = app.add_subcommand("crash", "SIGKILL the daemon during concurrent publishes; check every acknowledged entry");
  AddCommon(c, &o->common);
  c->add_option(
       "--path", o->path,
       "what the workers do: plain publishes, branch (a request's boundaries sharing stems), group "
       "(rank processes; a rank or the daemon killed at each kill point of the group commit in turn), "
       "gc (evictions, deletes and compactions under concurrent fetches)")
      ->check(CLI::IsMember({"plain", "branch", "group", "gc"}));
  c->add_option("--iterations", o->iterations, "kill/restart cycles")->check(CLI::Range(1, 1000000));
  c->add_option("--publishers", o->max_publishers, "at most this many concurrent publishers (1..N each cycle)")
      ->check(CLI::Range(1, 16));
  c->add_option("--kill-max-ms", o->kill_max_ms, "the kill comes within this many ms")->check(CLI::Range(0, 60000));
  c->add_option("--epoch", o->epoch, "a fresh store every this many cycles")->check(CLI::Range(1, 1000000));
  return c;
}

CLI::App* AddPowerLoss(CLI::App& app, PowerLossOptions* o) {
  auto* p = app.add_subcommand("powerloss", "lose power (unsynced data dropped) during concurrent publishes");
  AddCommon(p, &o->common);
  p->add_option("--path", o->path,
                "what the workers do: plain publishes, branch, group (ranks as threads; one group in eight "
                "abandoned by a rank), gc")
      ->check(CLI::IsMember({"plain", "branch", "group", "gc"}));
  p->add_option("--iterations", o->iterations, "power-loss/reopen cycles")->check(CLI::Range(1, 1000000));
  p->add_option("--publishers", o->max_publishers, "at most this many concurrent publishers")->check(CLI::Range(1, 16));
  p->add_option("--freeze-max-ms", o->freeze_max_ms, "the power goes within this many ms")->check(CLI::Range(0, 60000));
  p->add_option("--epoch", o->epoch, "a fresh store every this many cycles")->check(CLI::Range(1, 1000000));
  return p;
}

CLI::App* AddSoak(CLI::App& app, SoakOptions* o) {
  auto* s = app.add_subcommand("soak", "many clients against one daemon; 0 errors, bounded memory and open files");
  AddCommon(s, &o->common);
  s->add_option("--clients", o->clients, "concurrent clients")->check(CLI::Range(1, 1000));
  s->add_option("--seconds", o->seconds, "how long")->check(CLI::Range(1.0, 86400.0));
  s->add_option("--warmup-seconds", o->warmup_seconds, "samples up to here set the baseline (default: a tenth, >= 3 s)");
  s->add_option("--rss-slack-mib", o->rss_slack_mib,
                "RSS growth allowed past its value at the warm-up's end");
  s->add_option(
       "--throughput-window-seconds", o->throughput_window_seconds,
       "publishes are counted per window this long; every window after the second must be within the "
       "tolerance of the second's (checked with three full windows or more)")
      ->check(CLI::Range(1.0, 86400.0));
  s->add_option("--throughput-tolerance", o->throughput_tolerance,
                "how far (a fraction) a later window's publishes may be from the second window's")
      ->check(CLI::Range(0.0, 10.0));
  s->add_option("--fd-slack", o->fd_slack, "open-file growth allowed past the warm-up's peak");
  s->add_option("--window", o->window, "entries each client keeps using")->check(CLI::Range(1, 1000));
  s->add_option("--capacity-mib", o->capacity_mib, "the daemon's byte budget (--capacity)")->check(CLI::Range(16, 1 << 20));
  return s;
}

CLI::App* AddFlips(CLI::App& app, FlipOptions* o) {
  auto* f = app.add_subcommand("flips", "damaged copies of an exported .pcsnap, refused by verify --file and import");
  AddCommon(f, &o->common);
  f->add_option("--copies", o->copies, "damaged copies")->check(CLI::Range(1, 10000000));
  return f;
}

CLI::App* AddDiskFull(CLI::App& app, DiskFullOptions* o) {
  auto* d = app.add_subcommand("diskfull", "fill a small tmpfs under the daemon, free it, publish again (root)");
  AddCommon(d, &o->common);
  d->add_option("--tmpfs-mib", o->tmpfs_mib, "size of the tmpfs")->check(CLI::Range(16, 4096));
  d->add_option("--recover-seconds", o->recover_seconds, "how long writes may take to come back")
      ->check(CLI::Range(1, 3600));
  return d;
}

// The crash loop's rank processes (crash --path group); not for people.
CLI::App* AddGroupRank(CLI::App& app, GroupRankOptions* o) {
  auto* g = app.add_subcommand("grouprank", "one rank process of crash --path group");
  g->group("");  // hidden from --help
  g->add_option("--socket", o->socket)->required();
  g->add_option("--entry-seed", o->entry_seed)->required();
  g->add_option("--length", o->length)->required();
  g->add_option("--layers", o->layers)->required();
  g->add_option("--rows-per-chunk", o->rows_per_chunk);
  g->add_option("--ranks", o->ranks)->check(CLI::Range(2u, 12u));
  g->add_option("--rank", o->rank);
  g->add_option("--token", o->token)->required();
  g->add_option("--kill-at", o->kill_at)
      ->check(CLI::IsMember({"none", "before_begin", "mid_stream", "streamed", "in_commit", "after_answer"}));
  g->add_option("--kill-delay-us", o->kill_delay_us);
  return g;
}

// The in-process store (powerloss) logs its expected I/O errors at warn;
// only errors are shown unless PRIMECACHE_LOG_LEVEL says otherwise.
bool SetUpLogging() {
  if (std::getenv(primecache::kLogLevelEnvVar) == nullptr) {
    primecache::SetLogLevel(primecache::LogLevel::kError);
    return true;
  }
  primecache::Status st = primecache::InitLogging("");
  if (!st.ok()) std::fprintf(stderr, "primecache-stress: %s\n", st.ToString().c_str());
  return st.ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"primecache-stress: the reliability campaigns (docs/RELIABILITY.md)"};
  app.require_subcommand(1);
  CrashOptions crash;
  PowerLossOptions power;
  SoakOptions soak;
  FlipOptions flips;
  DiskFullOptions full;
  GroupRankOptions rank;
  CLI::App* c = AddCrash(app, &crash);
  CLI::App* p = AddPowerLoss(app, &power);
  CLI::App* s = AddSoak(app, &soak);
  CLI::App* f = AddFlips(app, &flips);
  AddDiskFull(app, &full);
  CLI::App* g = AddGroupRank(app, &rank);
  CLI11_PARSE(app, argc, argv);
  if (g->parsed()) {
    primecache::SetLogLevel(primecache::LogLevel::kError);
    return RunGroupRank(rank);
  }
  if (!SetUpLogging()) return 2;

  const std::uint64_t clock_seed =
      static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  for (CommonOptions* common : {&crash.common, &power.common, &soak.common, &flips.common, &full.common}) {
    if (common->seed == 0) common->seed = clock_seed % 1000000007;
  }
  if (c->parsed()) return RunCrashLoop(crash);
  if (p->parsed()) return RunPowerLoss(power);
  if (s->parsed()) return RunSoak(soak);
  if (f->parsed()) return RunFlips(flips);
  return RunDiskFull(full);
}

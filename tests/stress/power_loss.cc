// The power-loss loop: the store on the real file system through a
// FaultInjectionEnv, 1..3 workers of the path (workload.h; for group, every
// rank a thread) publishing real entries, the disk frozen at a random moment
// (every later mutating operation fails, as when power goes), the process's
// store dropped, every write not yet synced cut away (SimulateCrash), and
// the store reopened: every acknowledged entry present and byte-exact, every
// stored entry complete, the path's own checks, the store's own cross-check
// clean, and `primecachectl --offline verify --all` exit 0.
#include <filesystem>
#include <limits>
#include <set>
#include <thread>

#include "primecache/internal/codec.h"
#include "statestore/test_hooks.h"
#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"
#include "tests/stress/workload.h"
#include "tests/support/fault_env.h"

namespace primecache::stress {
namespace {

using statestore_internal::TestHooks;

struct Tally {
  std::uint64_t losses = 0, verify_ok = 0, verify_failed = 0, open_failures = 0;
};

class PowerLossLoop {
 public:
  PowerLossLoop(const PowerLossOptions& o, Path path)
      : o_(o),
        path_(path),
        dir_(MakeWorkDir(o.common.work_dir, "pcstress-power")),
        book_(path, "power", o.common.seed, dir_ + "/acks.log"),
        rng_(o.common.seed) {}
  int Run();

 private:
  std::string DataDir() const { return dir_ + "/data"; }
  std::string StorePath() const { return DataDir() + "/store"; }
  StoreOptions Options() const;
  bool Iteration(int it);
  void LoseDuringWork(LocalStore& store, TestHooks& hooks, int it);
  void Check(LocalStore& store, int it);
  void VerifyOffline(int it);

  const PowerLossOptions o_;
  const Path path_;
  const std::string dir_;
  LoopBook book_;
  Tally t_;
  std::mt19937_64 rng_;
};

// The path's store: the gc path's under a small budget, with small segments
// and reclaim after every MiB dropped, so that segments are collected often.
StoreOptions PowerLossLoop::Options() const {
  StoreOptions so;
  so.validator = CodecLayerValidator();
  so.path = StorePath();
  if (path_ == Path::kGc) {
    so.byte_budget = std::uint64_t{kGcBudgetMib} << 20;
    so.segment_bytes = 4u << 20;
    so.reclaim_after_bytes = 1u << 20;
  }
  if (path_ == Path::kGroup) so.group_timeout_ms = 2000;
  return so;
}

// The store after the power loss against what was attempted and
// acknowledged, then its own cross-check.
void PowerLossLoop::Check(LocalStore& store, int it) {
  auto target = StoreTarget(store);
  book_.CheckSurvivors(*target, it);
  auto v = store.CheckStore({.read_chunks = true});
  if (!v.ok() || !v->problems.empty()) {
    ++book_.check.torn;
    Say("power: iteration %d: the store's cross-check: %s", it,
        !v.ok() ? v.status().ToString().c_str() : v->problems.front().c_str());
  }
}

void PowerLossLoop::VerifyOffline(int it) {
  ProcResult v = CtlOffline(DataDir(), {"verify", "--all"});
  if (v.rc == 0) {
    ++t_.verify_ok;
    return;
  }
  ++t_.verify_failed;
  Say("power: iteration %d: verify --all exit %d\n%s%s", it, v.rc, v.out.c_str(), v.err.c_str());
}

// 1..max_publishers workers of the path; the disk frozen within freeze_max_ms.
void PowerLossLoop::LoseDuringWork(LocalStore& store, TestHooks& hooks, int it) {
  const int n = std::uniform_int_distribution<int>(1, o_.max_publishers)(rng_);
  const int freeze_ms = std::uniform_int_distribution<int>(0, o_.freeze_max_ms)(rng_);
  std::atomic<bool> frozen{false};
  Work w = book_.WorkFor(it, &frozen);
  w.connect = [&store] { return StoreTarget(store); };
  w.connect_admin = w.connect;
  std::vector<std::thread> workers = StartWorkers(w, n);
  std::this_thread::sleep_for(std::chrono::milliseconds(freeze_ms));
  frozen.store(true);
  hooks.freeze_io->store(true);  // from here on nothing reaches the disk
  for (auto& th : workers) th.join();
}

bool PowerLossLoop::Iteration(int it) {
  if (it > 0 && it % o_.epoch == 0) {
    std::error_code ec;
    std::filesystem::remove_all(DataDir(), ec);
    book_.NewEpoch();
  }
  FaultInjectionEnv fenv(Env::Default());
  auto hooks = std::make_shared<TestHooks>();
  hooks->freeze_io = std::make_shared<std::atomic<bool>>(false);
  hooks->short_sleeps = true;
  StoreOptions so = Options();
  so.env = &fenv;
  if (Status s = CreateDirs(Env::Default(), DataDir()); !s.ok()) return false;
  auto store = statestore_internal::OpenWithHooks(so, hooks);
  if (!store.ok()) {
    ++t_.open_failures;
    Say("power: iteration %d: open failed: %s", it, store.status().ToString().c_str());
    return false;
  }
  LoseDuringWork(**store, *hooks, it);
  store->reset();
  ++t_.losses;
  if (Status s = fenv.SimulateCrash(); !s.ok()) {
    Say("power: iteration %d: SimulateCrash: %s", it, s.ToString().c_str());
    return false;
  }
  auto reopened = LocalStore::Open(Options());
  if (!reopened.ok()) {
    ++t_.open_failures;
    Say("power: iteration %d: reopening after the power loss failed: %s", it, reopened.status().ToString().c_str());
    return false;
  }
  Check(**reopened, it);
  reopened->reset();
  VerifyOffline(it);
  return true;
}

int PowerLossLoop::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  Say("power: path %s, %d iterations, 1..%d publishers, power lost within %d ms, a fresh store every %d; "
      "work dir "
      "%s, seed %llu",
      PathName(path_), o_.iterations, o_.max_publishers, o_.freeze_max_ms, o_.epoch, dir_.c_str(),
      U(o_.common.seed));
  int done = 0;
  for (; done < o_.iterations; ++done) {
    if (!Iteration(done)) break;
    book_.Progress(done + 1, SecondsSince(t0));
  }
  const bool ok = done == o_.iterations && book_.check.lost == 0 && book_.check.torn == 0 &&
                  book_.work.wrong_bytes == 0 && t_.verify_failed == 0 && book_.work.errors == 0 &&
                  t_.open_failures == 0;
  const std::string extra = book_.PathFigures();
  Say("RESULT power %s: path=%s iterations=%d power_losses=%llu attempted=%llu acked=%llu acked_checks=%llu "
      "lost=%llu torn=%llu unacked_present=%llu verify_all_clean=%llu/%llu errors=%llu open_failures=%llu%s "
      "seconds=%.1f",
      ok ? "PASS" : "FAIL", PathName(path_), done, U(t_.losses), U(book_.work.attempted.load()),
      U(book_.work.acked.load()), U(book_.check.acked_checked), U(book_.check.lost), U(book_.check.torn),
      U(book_.check.unacked_present), U(t_.verify_ok), U(t_.verify_ok + t_.verify_failed),
      U(book_.work.errors.load()), U(t_.open_failures), extra.c_str(), SecondsSince(t0));
  if (ok && !o_.common.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  } else {
    Say("power: kept %s (ack log: %s/acks.log)", dir_.c_str(), dir_.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

int RunPowerLoss(const PowerLossOptions& o) {
  const auto path = ParsePath(o.path);
  if (!path) {
    Say("power: unknown path '%s' (plain, branch, group, gc)", o.path.c_str());
    return 2;
  }
  return PowerLossLoop(o, *path).Run();
}

}  // namespace primecache::stress

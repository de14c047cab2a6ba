// The crash loop: the real primecached on a temporary data dir, 1..3
// workers of the path (workload.h; threads, each with its own connection)
// publishing real entries, SIGKILL at a random time, restart, then: every
// acknowledged entry present and byte-exact, every stored entry one that was
// attempted and complete, the path's own checks, and `primecachectl verify
// --all` clean. The group path kills a rank process or the daemon at each
// kill point of the group commit in turn instead (group_loop.cc). A run
// fails unless some acknowledged entry was checked after a kill.
#include <signal.h>

#include <filesystem>
#include <set>
#include <thread>

#include "tests/stress/group_loop.h"
#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"
#include "tests/stress/workload.h"

namespace primecache::stress {
namespace {

struct Tally {
  std::uint64_t kills = 0, verify_ok = 0, verify_failed = 0, restart_failures = 0;
};

std::vector<std::string> DaemonFlags(Path p) {
  if (p == Path::kGc) return {"--capacity", std::to_string(kGcBudgetMib) + "M"};
  // Long enough for a round's bystander group, short enough that a group
  // whose rank died before it began is aborted soon.
  if (p == Path::kGroup) return {"--group-timeout", "3"};
  return {};
}

class CrashLoop {
 public:
  CrashLoop(const CrashOptions& o, Path path)
      : o_(o),
        path_(path),
        dir_(MakeWorkDir(o.common.work_dir, "pcstress-crash")),
        d_(DaemonFlags(path), dir_),
        book_(path, "crash", o.common.seed, dir_ + "/acks.log"),
        rng_(o.common.seed),
        group_(d_, book_.reg, book_.log, book_.work, o.common.seed) {}

  int Run();

 private:
  bool Iteration(int it);
  void KillDuringWork(int it);
  std::unique_ptr<Target> Connect(bool admin);
  void VerifyAll(int it);
  bool NewEpoch();

  const CrashOptions o_;
  const Path path_;
  const std::string dir_;
  testing::Daemon d_;
  LoopBook book_;
  Tally t_;
  std::mt19937_64 rng_;
  std::atomic<std::uint32_t> connections_{0};
  GroupRounds group_;
};

std::unique_ptr<Target> CrashLoop::Connect(bool admin) {
  // Every second data connection through shared memory.
  auto opts = d_.Options("", /*shm=*/!admin && connections_++ % 2 == 1);
  if (admin) opts.endpoint = d_.admin_socket();
  opts.reconnect_attempts = 0;  // a call after the kill fails at once
  opts.timeout = std::chrono::seconds(120);
  auto c = client::Client::Connect(opts);
  if (!c.ok()) return nullptr;
  return ClientTarget(std::move(c).value());
}

void CrashLoop::VerifyAll(int it) {
  ProcResult v = Ctl(d_, {"verify", "--all"});
  if (v.rc == 0) {
    ++t_.verify_ok;
    return;
  }
  ++t_.verify_failed;
  Say("crash: iteration %d: verify --all exit %d\n%s%s", it, v.rc, v.out.c_str(), v.err.c_str());
}

bool CrashLoop::NewEpoch() {
  d_.Stop();
  std::error_code ec;
  std::filesystem::remove_all(d_.data_dir(), ec);
  book_.NewEpoch();
  return d_.Start();
}

// 1..max_publishers workers of the path, the daemon SIGKILLed within kill_max_ms.
void CrashLoop::KillDuringWork(int it) {
  const int n = std::uniform_int_distribution<int>(1, o_.max_publishers)(rng_);
  const int kill_ms = std::uniform_int_distribution<int>(0, o_.kill_max_ms)(rng_);
  std::atomic<bool> killed{false};
  Work w = book_.WorkFor(it, &killed);
  w.connect = [this] { return Connect(false); };
  w.connect_admin = [this] { return Connect(true); };
  std::vector<std::thread> workers = StartWorkers(w, n);
  std::this_thread::sleep_for(std::chrono::milliseconds(kill_ms));
  killed.store(true);
  d_.Kill();  // SIGKILL, then reaped
  for (auto& th : workers) th.join();
}

bool CrashLoop::Iteration(int it) {
  if (it > 0 && it % o_.epoch == 0 && !NewEpoch()) {
    ++t_.restart_failures;
    Say("crash: iteration %d: the daemon did not start on a fresh data dir", it);
    return false;
  }
  bool killed = true;
  if (path_ == Path::kGroup) {
    killed = group_.Run(it);
  } else {
    KillDuringWork(it);
  }
  if (killed) {
    ++t_.kills;
    if (!d_.Start()) {
      ++t_.restart_failures;
      Say("crash: iteration %d: the daemon did not restart", it);
      return false;
    }
  }
  auto admin = Connect(true);
  if (admin == nullptr) {
    ++book_.check.torn;
    Say("crash: iteration %d: no admin connection after the restart", it);
  } else {
    book_.CheckSurvivors(*admin, it);
  }
  VerifyAll(it);
  return true;
}

int CrashLoop::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  Say("crash: path %s, %d iterations, 1..%d publishers, kill within %d ms, a fresh store every %d; work dir "
      "%s, "
      "seed %llu",
      PathName(path_), o_.iterations, o_.max_publishers, o_.kill_max_ms, o_.epoch, dir_.c_str(),
      U(o_.common.seed));
  if (!d_.Start()) {
    Say("crash: FAIL: the daemon did not start");
    return 1;
  }
  int done = 0;
  for (; done < o_.iterations; ++done) {
    if (!Iteration(done)) break;
    book_.Progress(done + 1, SecondsSince(t0));
  }
  d_.Stop();
  // A run in which no publish was acknowledged before a kill (and checked
  // after the restart) proved nothing about acknowledged entries.
  const bool proved = book_.work.acked.load() > 0 && book_.check.acked_checked > 0;
  if (!proved) Say("crash: FAIL: no acknowledged publish was checked after a kill (kill too early?)");
  const bool ok = done == o_.iterations && proved && book_.check.lost == 0 && book_.check.torn == 0 &&
                  book_.work.wrong_bytes == 0 && t_.verify_failed == 0 && book_.work.errors == 0 &&
                  t_.restart_failures == 0;
  const std::string extra = path_ == Path::kGroup ? " " + group_.PerPoint() : book_.PathFigures();
  Say("RESULT crash %s: path=%s iterations=%d kills=%llu attempted=%llu acked=%llu acked_checks=%llu "
      "lost=%llu "
      "torn=%llu unacked_present=%llu verify_all_clean=%llu/%llu errors=%llu restart_failures=%llu%s "
      "seconds=%.1f",
      ok ? "PASS" : "FAIL", PathName(path_), done, U(t_.kills), U(book_.work.attempted.load()),
      U(book_.work.acked.load()), U(book_.check.acked_checked), U(book_.check.lost), U(book_.check.torn),
      U(book_.check.unacked_present), U(t_.verify_ok), U(t_.verify_ok + t_.verify_failed),
      U(book_.work.errors.load()), U(t_.restart_failures), extra.c_str(), SecondsSince(t0));
  if (ok && !o_.common.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  } else {
    Say("crash: kept %s (ack log: %s/acks.log)", dir_.c_str(), dir_.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

int RunCrashLoop(const CrashOptions& o) {
  const auto path = ParsePath(o.path);
  if (!path) {
    Say("crash: unknown path '%s' (plain, branch, group, gc)", o.path.c_str());
    return 2;
  }
  return CrashLoop(o, *path).Run();
}

}  // namespace primecache::stress

// The crash loop: the real primecached on a temporary data dir, 1..3 client
// processes' worth of publishers (threads, each with its own connection)
// publishing real entries of varied size, SIGKILL at a random time, restart,
// then: every acknowledged entry present and byte-exact, every stored entry
// one that was attempted and complete, and `primecachectl verify --all` clean.
// A run fails unless some acknowledged entry was checked after a kill.
#include <signal.h>

#include <filesystem>
#include <set>
#include <thread>

#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"

namespace primecache::stress {
namespace {

struct Tally {
  std::atomic<std::uint64_t> attempted{0}, acked{0}, errors{0};
  std::uint64_t kills = 0, acked_checked = 0, lost = 0, torn = 0, unacked_present = 0;
  std::uint64_t verify_ok = 0, verify_failed = 0, restart_failures = 0;
};

class CrashLoop {
 public:
  explicit CrashLoop(const CrashOptions& o)
      : o_(o),
        dir_(MakeWorkDir(o.common.work_dir, "pcstress-crash")),
        d_({}, dir_),
        log_(dir_ + "/acks.log"),
        rng_(o.common.seed) {}

  int Run();

 private:
  bool Iteration(int it);
  void Publisher(int it, int pub, const std::atomic<bool>& killed);
  void CheckEntries(int it);
  void VerifyAll(int it);
  bool NewEpoch();

  const CrashOptions o_;
  const std::string dir_;
  testing::Daemon d_;
  AckLog log_;
  Registry reg_;
  Tally t_;
  std::mt19937_64 rng_;
  std::atomic<std::uint32_t> next_seed_{1};
  std::set<std::uint64_t> unacked_seen_;
};

void CrashLoop::Publisher(int it, int pub, const std::atomic<bool>& killed) {
  auto opts = d_.Options("", /*shm=*/pub % 2 == 1);
  opts.reconnect_attempts = 0;  // a publish after the kill fails at once
  opts.timeout = std::chrono::seconds(120);
  auto c = client::Client::Connect(opts);
  if (!c.ok()) {
    if (!killed.load()) {
      ++t_.errors;
      Say("crash: iteration %d publisher %d: connect failed before the kill: %s", it, pub,
          c.status().ToString().c_str());
    }
    return;
  }
  std::mt19937_64 rng(o_.common.seed * 7919 + static_cast<std::uint64_t>(it) * 4 + static_cast<std::uint64_t>(pub));
  while (!killed.load()) {
    const EntrySpec spec = RandomSpec(rng, next_seed_++);
    const auto tokens = SpecTokens(spec);
    const auto layers = SpecLayers(spec);
    reg_.Attempted(tokens, LayersDigest(layers));
    ++t_.attempted;
    auto r = (*c)->Publish(testing::TestModel(), tokens, layers);
    if (!r.ok()) {
      if (!killed.load()) {
        ++t_.errors;
        Say("crash: iteration %d publisher %d: publish failed before the kill: %s", it, pub,
            r.status().ToString().c_str());
      }
      return;
    }
    reg_.Acked(tokens, r->id);
    ++t_.acked;
    log_.Record("ack iteration=" + std::to_string(it) + " publisher=" + std::to_string(pub) + " seed=" +
                std::to_string(spec.seed) + " length=" + std::to_string(spec.length) + " layers=" +
                std::to_string(spec.layers) + " entry=" + std::to_string(r->id) + " digest=" +
                std::to_string(LayersDigest(layers)));
  }
}

// Every stored entry complete and attempted; every acknowledged one stored.
void CrashLoop::CheckEntries(int it) {
  auto c = client::Client::Connect(d_.Options());
  auto listed = c.ok() ? ListAll(**c) : Result<std::vector<client::EntryInfo>>(c.status());
  if (!listed.ok()) {
    ++t_.torn;
    Say("crash: iteration %d: cannot list the store: %s", it, listed.status().ToString().c_str());
    return;
  }
  std::map<std::string, std::uint64_t> stored;  // tokens -> entry
  for (const auto& e : *listed) {
    const std::string key = TokensKey(e.tokens);
    stored[key] = e.id;
    auto want = reg_.Find(key);
    auto got = (*c)->FetchLayers(e.id);
    if (!want || !got.ok() || LayersDigest(*got) != want->digest) {
      ++t_.torn;
      Say("crash: iteration %d: TORN entry %llu (%s)", it, U(e.id),
          !want ? "never published" : !got.ok() ? got.status().ToString().c_str() : "bytes differ");
    } else if (!want->acked && unacked_seen_.insert(e.id).second) {
      ++t_.unacked_present;  // committed, but the kill came before the answer
    }
  }
  for (const auto& [key, a] : reg_.Snapshot()) {
    if (!a.acked) continue;
    ++t_.acked_checked;
    auto it2 = stored.find(key);
    if (it2 == stored.end() || it2->second != a.entry) {
      ++t_.lost;
      Say("crash: iteration %d: LOST acknowledged entry %llu (%u tokens)", it,
          U(a.entry), a.length);
    }
  }
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
  reg_.Clear();
  unacked_seen_.clear();
  return d_.Start();
}

bool CrashLoop::Iteration(int it) {
  if (it > 0 && it % o_.epoch == 0 && !NewEpoch()) {
    ++t_.restart_failures;
    Say("crash: iteration %d: the daemon did not start on a fresh data dir", it);
    return false;
  }
  const int n = std::uniform_int_distribution<int>(1, o_.max_publishers)(rng_);
  const int kill_ms = std::uniform_int_distribution<int>(0, o_.kill_max_ms)(rng_);
  std::atomic<bool> killed{false};
  std::vector<std::thread> pubs;
  for (int p = 0; p < n; ++p) pubs.emplace_back([&, p] { Publisher(it, p, killed); });
  std::this_thread::sleep_for(std::chrono::milliseconds(kill_ms));
  killed.store(true);
  d_.Kill();  // SIGKILL, then reaped
  ++t_.kills;
  for (auto& p : pubs) p.join();
  if (!d_.Start()) {
    ++t_.restart_failures;
    Say("crash: iteration %d: the daemon did not restart", it);
    return false;
  }
  CheckEntries(it);
  VerifyAll(it);
  return true;
}

int CrashLoop::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  Say("crash: %d iterations, 1..%d publishers, kill within %d ms, a fresh store every %d; work dir %s, seed %llu",
      o_.iterations, o_.max_publishers, o_.kill_max_ms, o_.epoch, dir_.c_str(),
      U(o_.common.seed));
  if (!d_.Start()) {
    Say("crash: FAIL: the daemon did not start");
    return 1;
  }
  int done = 0;
  for (; done < o_.iterations; ++done) {
    if (!Iteration(done)) break;
    if ((done + 1) % 50 == 0) {
      Say("crash: %d iterations, %llu acknowledged, %llu lost, %llu torn, %.0f s", done + 1,
          U(t_.acked.load()), U(t_.lost),
          U(t_.torn), SecondsSince(t0));
    }
  }
  d_.Stop();
  // A run in which no publish was acknowledged before a kill (and checked
  // after the restart) proved nothing about acknowledged entries.
  const bool proved = t_.acked.load() > 0 && t_.acked_checked > 0;
  if (!proved) Say("crash: FAIL: no acknowledged publish was checked after a kill (kill too early?)");
  const bool ok = done == o_.iterations && proved && t_.lost == 0 && t_.torn == 0 && t_.verify_failed == 0 &&
                  t_.errors == 0 && t_.restart_failures == 0;
  Say("RESULT crash %s: iterations=%d kills=%llu attempted=%llu acked=%llu acked_checks=%llu lost=%llu torn=%llu "
      "unacked_present=%llu verify_all_clean=%llu/%llu errors=%llu restart_failures=%llu seconds=%.1f",
      ok ? "PASS" : "FAIL", done, U(t_.kills),
      U(t_.attempted.load()), U(t_.acked.load()),
      U(t_.acked_checked), U(t_.lost),
      U(t_.torn), U(t_.unacked_present),
      U(t_.verify_ok),
      U(t_.verify_ok + t_.verify_failed),
      U(t_.errors.load()), U(t_.restart_failures),
      SecondsSince(t0));
  if (ok && !o_.common.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  } else {
    Say("crash: kept %s (ack log: %s/acks.log)", dir_.c_str(), dir_.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

int RunCrashLoop(const CrashOptions& o) { return CrashLoop(o).Run(); }

}  // namespace primecache::stress

// The power-loss loop: the store on the real file system through a
// FaultInjectionEnv, 1..3 threads publishing real entries of varied size, the
// disk frozen at a random moment (every later mutating operation fails, as
// when power goes), the process's store dropped, every write not yet synced
// cut away (SimulateCrash), and the store reopened: every acknowledged entry
// present and byte-exact, every stored entry complete, the store's own
// cross-check clean, and `primecachectl --offline verify --all` exit 0.
#include <filesystem>
#include <limits>
#include <set>
#include <thread>

#include "primecache/internal/codec.h"
#include "statestore/test_hooks.h"
#include "tests/support/fault_env.h"
#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"

namespace primecache::stress {
namespace {

using statestore_internal::TestHooks;

struct Tally {
  std::atomic<std::uint64_t> attempted{0}, acked{0}, errors{0};
  std::uint64_t losses = 0, acked_checked = 0, lost = 0, torn = 0, unacked_present = 0;
  std::uint64_t verify_ok = 0, verify_failed = 0, open_failures = 0;
};

PublishRequest RequestFor(const std::vector<std::uint32_t>& tokens) {
  PublishRequest r;
  r.model = testing::TestModel().digest;
  r.model_name = "stress-model";
  r.tokens = tokens;
  r.cost = {1000, 2, 64};
  return r;
}

class PowerLossLoop {
 public:
  explicit PowerLossLoop(const PowerLossOptions& o)
      : o_(o), dir_(MakeWorkDir(o.common.work_dir, "pcstress-power")), log_(dir_ + "/acks.log"), rng_(o.common.seed) {}
  int Run();

 private:
  std::string DataDir() const { return dir_ + "/data"; }
  std::string StorePath() const { return DataDir() + "/store"; }
  bool Iteration(int it);
  void Publisher(LocalStore& store, int it, int pub, const std::atomic<bool>& frozen);
  void Check(LocalStore& store, int it);
  void VerifyOffline(int it);

  const PowerLossOptions o_;
  const std::string dir_;
  AckLog log_;
  Registry reg_;
  Tally t_;
  std::mt19937_64 rng_;
  std::atomic<std::uint32_t> next_seed_{1};
  std::set<EntryId> unacked_seen_;
};

void PowerLossLoop::Publisher(LocalStore& store, int it, int pub, const std::atomic<bool>& frozen) {
  std::mt19937_64 rng(o_.common.seed * 7919 + static_cast<std::uint64_t>(it) * 4 + static_cast<std::uint64_t>(pub));
  while (!frozen.load()) {
    const EntrySpec spec = RandomSpec(rng, next_seed_++);
    const auto tokens = SpecTokens(spec);
    const auto layers = ToLayerBytes(SpecLayers(spec));
    reg_.Attempted(tokens, LayersDigest(layers));
    ++t_.attempted;
    auto r = store.Publish(RequestFor(tokens), layers);
    if (!r.ok()) {
      if (!frozen.load()) {
        ++t_.errors;
        Say("power: iteration %d publisher %d: publish failed before the power loss: %s", it, pub,
            r.status().ToString().c_str());
      }
      return;
    }
    reg_.Acked(tokens, r->id);
    ++t_.acked;
    log_.Record("ack iteration=" + std::to_string(it) + " publisher=" + std::to_string(pub) + " seed=" +
                std::to_string(spec.seed) + " entry=" + std::to_string(r->id));
  }
}

// The store after the power loss against what was attempted and acknowledged.
void PowerLossLoop::Check(LocalStore& store, int it) {
  std::map<std::string, EntryId> stored;
  ListOptions lo;
  lo.limit = 1000;
  for (;;) {
    auto page = store.List(lo);
    if (!page.ok()) {
      ++t_.torn;
      Say("power: iteration %d: cannot list: %s", it, page.status().ToString().c_str());
      return;
    }
    for (const auto& e : page->entries) {
      auto detail = store.Describe(e.id);
      const std::string key = detail.ok() ? TokensKey(detail->info.tokens) : std::string();
      stored[key] = e.id;
      auto want = reg_.Find(key);
      auto got = store.FetchAll(e.id);
      if (!want || !got.ok() || LayersDigest(*got) != want->digest) {
        ++t_.torn;
        Say("power: iteration %d: TORN entry %llu (%s)", it, U(e.id),
            !want ? "never published" : !got.ok() ? got.status().ToString().c_str() : "bytes differ");
      } else if (!want->acked && unacked_seen_.insert(e.id).second) {
        ++t_.unacked_present;
      }
    }
    if (page->next_page_token.empty()) break;
    lo.page_token = page->next_page_token;
  }
  for (const auto& [key, a] : reg_.Snapshot()) {
    if (!a.acked) continue;
    ++t_.acked_checked;
    auto at = stored.find(key);
    if (at == stored.end() || at->second != a.entry) {
      ++t_.lost;
      Say("power: iteration %d: LOST acknowledged entry %llu", it, U(a.entry));
    }
  }
  auto v = store.CheckStore({.read_chunks = true});
  if (!v.ok() || !v->problems.empty()) {
    ++t_.torn;
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

bool PowerLossLoop::Iteration(int it) {
  if (it > 0 && it % o_.epoch == 0) {
    std::error_code ec;
    std::filesystem::remove_all(DataDir(), ec);
    reg_.Clear();
    unacked_seen_.clear();
  }
  FaultInjectionEnv fenv(Env::Default());
  auto hooks = std::make_shared<TestHooks>();
  hooks->freeze_io = std::make_shared<std::atomic<bool>>(false);
  hooks->short_sleeps = true;
  StoreOptions so;
  so.validator = CodecLayerValidator();
  so.env = &fenv;
  so.path = StorePath();
  if (Status s = CreateDirs(Env::Default(), DataDir()); !s.ok()) return false;
  auto store = statestore_internal::OpenWithHooks(so, hooks);
  if (!store.ok()) {
    ++t_.open_failures;
    Say("power: iteration %d: open failed: %s", it, store.status().ToString().c_str());
    return false;
  }
  const int n = std::uniform_int_distribution<int>(1, o_.max_publishers)(rng_);
  const int freeze_ms = std::uniform_int_distribution<int>(0, o_.freeze_max_ms)(rng_);
  std::atomic<bool> frozen{false};
  std::vector<std::thread> pubs;
  for (int p = 0; p < n; ++p) pubs.emplace_back([&, p] { Publisher(**store, it, p, frozen); });
  std::this_thread::sleep_for(std::chrono::milliseconds(freeze_ms));
  frozen.store(true);
  hooks->freeze_io->store(true);  // from here on nothing reaches the disk
  for (auto& p : pubs) p.join();
  store->reset();
  ++t_.losses;
  if (Status s = fenv.SimulateCrash(); !s.ok()) {
    Say("power: iteration %d: SimulateCrash: %s", it, s.ToString().c_str());
    return false;
  }
  StoreOptions plain;
  plain.validator = CodecLayerValidator();
  plain.path = StorePath();
  auto reopened = LocalStore::Open(plain);
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
  Say("power: %d iterations, 1..%d publishers, power lost within %d ms, a fresh store every %d; work dir %s, "
      "seed %llu",
      o_.iterations, o_.max_publishers, o_.freeze_max_ms, o_.epoch, dir_.c_str(), U(o_.common.seed));
  int done = 0;
  for (; done < o_.iterations; ++done) {
    if (!Iteration(done)) break;
    if ((done + 1) % 50 == 0) {
      Say("power: %d iterations, %llu acknowledged, %llu lost, %llu torn, %.0f s", done + 1, U(t_.acked.load()),
          U(t_.lost), U(t_.torn), SecondsSince(t0));
    }
  }
  const bool ok = done == o_.iterations && t_.lost == 0 && t_.torn == 0 && t_.verify_failed == 0 &&
                  t_.errors == 0 && t_.open_failures == 0;
  Say("RESULT power %s: iterations=%d power_losses=%llu attempted=%llu acked=%llu acked_checks=%llu lost=%llu "
      "torn=%llu unacked_present=%llu verify_all_clean=%llu/%llu errors=%llu open_failures=%llu seconds=%.1f",
      ok ? "PASS" : "FAIL", done, U(t_.losses), U(t_.attempted.load()), U(t_.acked.load()), U(t_.acked_checked),
      U(t_.lost), U(t_.torn), U(t_.unacked_present), U(t_.verify_ok), U(t_.verify_ok + t_.verify_failed),
      U(t_.errors.load()), U(t_.open_failures), SecondsSince(t0));
  if (ok && !o_.common.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  } else {
    Say("power: kept %s (ack log: %s/acks.log)", dir_.c_str(), dir_.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

int RunPowerLoss(const PowerLossOptions& o) { return PowerLossLoop(o).Run(); }

}  // namespace primecache::stress

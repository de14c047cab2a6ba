// The soak: N clients (half with shared memory) in four namespaces, each
// publishing entries, looking up and fetching its own (which must hit and read
// back byte-exact), looking up another namespace's (which must miss) and
// asking for stats, against one daemon for a fixed time. The daemon runs with
// a byte budget (--capacity) several times the clients' working set, so the
// store stays bounded by evicting what the clients no longer use (LRU); an
// entry a client still uses must never be the one evicted. Any failed call
// or wrong answer is an error. The daemon's resident memory and open
// descriptors are sampled every second; past the warm-up they may not grow
// beyond the bound. Publishes are counted per window of the run; with three
// windows or more, each after the second must stay within a tolerance of
// the second's (the first holds the fill, before eviction begins).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <thread>

#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"

namespace primecache::stress {
namespace {

struct Own {
  std::vector<std::uint32_t> tokens;
  std::uint64_t entry = 0;
  std::uint64_t digest = 0;
};

struct Sample {
  double t = 0;
  ProcSample p;
  std::uint64_t publishes = 0;  // acknowledged so far
};

class Soak {
 public:
  explicit Soak(const SoakOptions& o)
      : o_(o),
        dir_(MakeWorkDir(o.common.work_dir, "pcstress-soak")),
        d_({"--capacity", std::to_string(o.capacity_mib) + "M"}, dir_),
        latest_(static_cast<std::size_t>(o.clients)) {}
  int Run();

 private:
  void ClientLoop(int i);
  bool Step(int i, client::Client& c, std::mt19937_64& rng, std::deque<Own>& own);
  bool PublishOne(int i, client::Client& c, std::mt19937_64& rng, std::deque<Own>& own);
  bool CheckOwn(int i, client::Client& c, const Own& e);
  client::ClientOptions AdminOptions() const;
  std::string StoreLine(client::Client* admin);
  void Sampler();
  void Error(int i, const std::string& what);
  bool Bounded(double warmup) const;
  bool Steady() const;

  const SoakOptions o_;
  const std::string dir_;
  testing::Daemon d_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> errors_{0}, publishes_{0}, lookups_{0}, fetches_{0}, misses_checked_{0}, stats_{0};
  std::atomic<std::uint32_t> next_seed_{1};
  std::mutex mu_;  // guards the members below
  std::vector<std::vector<std::uint32_t>> latest_;  // each client's newest tokens
  std::vector<Sample> samples_;
};

void Soak::Error(int i, const std::string& what) {
  if (errors_++ < 20) Say("soak: client %d: ERROR %s", i, what.c_str());
}

bool Soak::PublishOne(int i, client::Client& c, std::mt19937_64& rng, std::deque<Own>& own) {
  EntrySpec spec;
  spec.seed = next_seed_++;
  spec.length = std::uniform_int_distribution<std::uint32_t>(16, 512)(rng);
  spec.layers = std::uniform_int_distribution<std::uint32_t>(2, 4)(rng);
  spec.rows_per_chunk = 32;
  Own e{SpecTokens(spec), 0, 0};
  const auto layers = SpecLayers(spec);
  e.digest = LayersDigest(layers);
  auto r = c.Publish(testing::TestModel(), e.tokens, layers);
  ++publishes_;
  if (!r.ok()) {
    Error(i, "publish: " + r.status().ToString());
    return false;
  }
  e.entry = r->id;
  {
    std::lock_guard lock(mu_);
    latest_[static_cast<std::size_t>(i)] = e.tokens;
  }
  own.push_back(std::move(e));
  if (own.size() > static_cast<std::size_t>(o_.window)) own.pop_front();  // no longer used: evictable
  return true;
}

bool Soak::CheckOwn(int i, client::Client& c, const Own& e) {
  auto hit = c.Lookup(testing::TestModel(), e.tokens);
  ++lookups_;
  if (!hit.ok() || !hit->has_value() || (*hit)->id != e.entry || (*hit)->length != e.tokens.size()) {
    Error(i, "lookup of its entry " + std::to_string(e.entry) + ": " +
                 (hit.ok() ? "found=" + std::to_string(hit->has_value()) + " entry=" + std::to_string((*hit)->id)
                           : hit.status().ToString()));
    return false;
  }
  auto got = c.FetchLayers(e.entry);
  ++fetches_;
  if (!got.ok() || LayersDigest(*got) != e.digest) {
    Error(i, "fetch of entry " + std::to_string(e.entry) + ": " + (got.ok() ? "bytes differ" : got.status().ToString()));
    return false;
  }
  return true;
}

bool Soak::Step(int i, client::Client& c, std::mt19937_64& rng, std::deque<Own>& own) {
  const int r = std::uniform_int_distribution<int>(0, 99)(rng);
  if (r < 20 || own.empty()) return PublishOne(i, c, rng, own);
  if (r < 70) return CheckOwn(i, c, own[std::uniform_int_distribution<std::size_t>(0, own.size() - 1)(rng)]);
  if (r < 90) {
    // Client i^1 is in another namespace (i % 4 differs): its entries are not ours.
    std::vector<std::uint32_t> foreign;
    if (const auto j = static_cast<std::size_t>(i ^ 1); j < latest_.size()) {
      std::lock_guard lock(mu_);
      foreign = latest_[j];
    }
    if (foreign.empty()) foreign = testing::Tokens(64, 0x5eed0000u + next_seed_++);
    auto miss = c.Lookup(testing::TestModel(), foreign);
    ++misses_checked_;
    if (!miss.ok() || miss->has_value()) {
      Error(i, "lookup across namespaces: " + (miss.ok() ? "found entry " + std::to_string((*miss)->id)
                                                         : miss.status().ToString()));
      return false;
    }
    return true;
  }
  auto st = c.Stat();
  ++stats_;
  if (!st.ok()) Error(i, "stat: " + st.status().ToString());
  return st.ok();
}

void Soak::ClientLoop(int i) {
  auto opts = d_.Options("tenant-" + std::to_string(i % 4), /*shm=*/i % 2 == 1);
  opts.shared_memory_bytes = 4u << 20;
  opts.timeout = std::chrono::seconds(120);  // a loaded 2-core machine
  auto c = client::Client::Connect(opts);
  if (!c.ok()) {
    Error(i, "connect: " + c.status().ToString());
    return;
  }
  std::mt19937_64 rng(o_.common.seed * 31 + static_cast<std::uint64_t>(i));
  std::deque<Own> own;
  while (!stop_.load()) Step(i, **c, rng, own);
}

client::ClientOptions Soak::AdminOptions() const {
  auto opts = d_.Options();
  opts.endpoint = d_.admin_socket();
  opts.timeout = std::chrono::seconds(120);
  return opts;
}

// "N entries, S MiB stored, D MiB on disk, E evicted; memory: block cache
// C of K MiB (memtables M MiB), heap H MiB in use, F MiB free": where the
// daemon's memory goes, part by part (docs/operations.md "Memory").
std::string Soak::StoreLine(client::Client* admin) {
  auto st = admin != nullptr ? admin->Stat() : Result<client::DaemonStats>(Status::Unavailable("no admin client"));
  if (!st.ok()) return "store stats: " + st.status().ToString();
  const auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  const StoreStats& s = st->store;
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "%llu entries, %.1f MiB stored, %.1f MiB on disk, %llu evicted; memory: block cache %.1f of %.0f MiB "
      "(memtables %.1f MiB), heap %.1f MiB in use, %.1f MiB free",
      U(s.entries), mib(s.stored_bytes), mib(s.disk_bytes), U(s.evictions), mib(s.block_cache_used_bytes),
      mib(s.block_cache_capacity_bytes), mib(s.memtable_bytes), mib(st->heap_in_use_bytes),
      mib(st->heap_free_bytes));
  return buf;
}

void Soak::Sampler() {
  const auto t0 = std::chrono::steady_clock::now();
  while (!stop_.load()) {
    ProcSample p = SampleProcess(d_.pid());
    {
      std::lock_guard lock(mu_);
      samples_.push_back({SecondsSince(t0), p, publishes_.load()});
    }
    for (int k = 0; k < 10 && !stop_.load(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Past the warm-up, RSS may exceed its value at the warm-up's end, and open
// files the warm-up's peak, by the slacks only.
bool Soak::Bounded(double warmup) const {
  long rss_ref = 0, fds_warm = 0, rss_max = 0, fds_max = 0, rss_last = 0, fds_last = 0;
  double rss_max_at = 0, rss_ref_at = 0;
  for (const auto& s : samples_) {
    if (s.t <= warmup) {
      rss_ref = s.p.rss_kib;
      rss_ref_at = s.t;
      fds_warm = std::max(fds_warm, s.p.fds);
    } else {
      if (s.p.rss_kib > rss_max) rss_max_at = s.t;
      rss_max = std::max(rss_max, s.p.rss_kib);
      fds_max = std::max(fds_max, s.p.fds);
    }
    rss_last = s.p.rss_kib;
    fds_last = s.p.fds;
  }
  const bool ok =
      rss_ref > 0 && rss_max - rss_ref <= o_.rss_slack_mib * 1024 && fds_max - fds_warm <= o_.fd_slack;
  Say("soak: daemon RSS %.1f MiB at the warm-up's end (%.0f s), %.1f MiB peak after (at %.0f s), %.1f MiB "
      "last (bound +%ld MiB); open files %ld, %ld, %ld (bound +%ld); %zu samples",
      static_cast<double>(rss_ref) / 1024, rss_ref_at, static_cast<double>(rss_max) / 1024, rss_max_at,
      static_cast<double>(rss_last) / 1024, o_.rss_slack_mib, fds_warm, fds_max, fds_last, o_.fd_slack,
      samples_.size());
  return ok;
}

// Publishes per full window; each window after the second within the
// tolerance of the second's. Fewer than three full windows: nothing to hold.
bool Soak::Steady() const {
  const double w = o_.throughput_window_seconds;
  std::vector<std::uint64_t> at_ends;  // publishes acknowledged at each window's end
  for (const auto& s : samples_) {
    if (s.t >= w * static_cast<double>(at_ends.size() + 1)) at_ends.push_back(s.publishes);
  }
  std::vector<std::uint64_t> per;
  for (std::size_t k = 0; k < at_ends.size(); ++k) per.push_back(at_ends[k] - (k == 0 ? 0 : at_ends[k - 1]));
  std::string line;
  for (std::uint64_t n : per) line += " " + std::to_string(n);
  if (per.size() < 3) {
    Say("soak: publishes per %.0f s window:%s (fewer than 3 full windows: throughput not judged)", w,
        line.c_str());
    return true;
  }
  const double ref = static_cast<double>(per[1]);
  double worst = 0;
  for (std::size_t k = 2; k < per.size(); ++k)
    worst = std::max(worst, std::abs(static_cast<double>(per[k]) - ref) / ref);
  const bool ok = ref > 0 && worst <= o_.throughput_tolerance;
  Say("soak: publishes per %.0f s window:%s; the windows after the second are within %.1f%% of it (bound "
      "%.0f%%)",
      w, line.c_str(), 100 * worst, 100 * o_.throughput_tolerance);
  return ok;
}

int Soak::Run() {
  const double warmup = o_.warmup_seconds >= 0 ? o_.warmup_seconds : std::max(3.0, o_.seconds / 10);
  Say("soak: %d clients for %.0f s (warm-up %.0f s); work dir %s, seed %llu", o_.clients, o_.seconds, warmup,
      dir_.c_str(), U(o_.common.seed));
  if (!d_.Start()) {
    Say("soak: FAIL: the daemon did not start");
    return 1;
  }
  std::thread sampler([this] { Sampler(); });
  std::vector<std::thread> threads;
  for (int i = 0; i < o_.clients; ++i) threads.emplace_back([this, i] { ClientLoop(i); });
  auto admin = client::Client::Connect(AdminOptions());
  client::Client* stats = admin.ok() ? admin->get() : nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  for (double next = 60; SecondsSince(t0) < o_.seconds;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (SecondsSince(t0) < next) continue;
    next += 60;
    const ProcSample p = SampleProcess(d_.pid());
    Say("soak: %.0f s, %llu publishes, %llu fetches, %llu errors; daemon RSS %.1f MiB, %ld open files; store %s",
        SecondsSince(t0), U(publishes_.load()), U(fetches_.load()), U(errors_.load()),
        static_cast<double>(p.rss_kib) / 1024, p.fds, StoreLine(stats).c_str());
  }
  stop_.store(true);
  for (auto& t : threads) t.join();
  sampler.join();
  Say("soak: at the end, store %s", StoreLine(stats).c_str());
  const bool bounded = Bounded(warmup);
  const bool steady = Steady();
  ProcResult v = Ctl(d_, {"verify", "--all"});
  if (v.rc != 0) Say("soak: verify --all exit %d\n%s%s", v.rc, v.out.c_str(), v.err.c_str());
  const bool alive = d_.Alive();
  const int stop_rc = d_.Stop();
  const bool ok = errors_ == 0 && bounded && steady && v.rc == 0 && alive && stop_rc == 0;
  Say("RESULT soak %s: clients=%d seconds=%.0f errors=%llu publishes=%llu lookups=%llu fetches=%llu "
      "cross_namespace_misses=%llu stats=%llu capacity_mib=%ld memory_bounded=%d throughput_steady=%d "
      "verify_all=%d "
      "daemon_exit=%d",
      ok ? "PASS" : "FAIL", o_.clients, o_.seconds, U(errors_.load()), U(publishes_.load()),
      U(lookups_.load()), U(fetches_.load()), U(misses_checked_.load()), U(stats_.load()), o_.capacity_mib,
      bounded ? 1 : 0, steady ? 1 : 0, v.rc, stop_rc);
  std::error_code ec;
  if (ok && !o_.common.keep) std::filesystem::remove_all(dir_, ec);
  return ok ? 0 : 1;
}

}  // namespace

int RunSoak(const SoakOptions& o) { return Soak(o).Run(); }

}  // namespace primecache::stress

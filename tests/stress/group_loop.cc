// The crash loop's group path (crash --path group): each iteration one
// tensor-parallel group of 2..4 ranks, every rank a process of its own
// (primecache-stress grouprank, a real client), while a bystander group of
// the driver's connections publishes beside it. Iteration i takes kill point
// i mod 9 in turn:
//
//   rank.before_begin   a rank process SIGKILLed before it begins its part
//   rank.mid_stream     ... after half of its chunks
//   rank.streamed       ... with its part streamed, before its commit
//   rank.in_commit      ... 0..1 ms after it sends its commit
//   rank.after_answer   ... once its commit was answered
//   daemon.streamed     the daemon SIGKILLed with every part streamed
//   daemon.parked       ... with 1..ranks-1 parts committed (parked)
//   daemon.in_commit    ... 0..2 ms after the last part's commit is sent
//   daemon.committed    ... once the group's entry was acknowledged
//
// the victim rank and the commit order chosen at random. A rank killed
// leaves the daemon serving: the bystander's group must be acknowledged,
// the store's staged bytes and open groups must drain (the dead rank's
// connection, or --group-timeout, aborts its group). After each iteration
// (and the daemon's restart), the common check: an acknowledged group entry
// whole, every stored entry whole (a part alone would be an entry of other
// bytes), and verify --all clean.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "tests/stress/group_loop.h"
#include "tests/stress/stress_modes.h"

namespace primecache::stress {

const char* const kGroupKillPoints[kGroupKillPointCount] = {
    "rank.before_begin", "rank.mid_stream", "rank.streamed",    "rank.in_commit",  "rank.after_answer",
    "daemon.streamed",   "daemon.parked",   "daemon.in_commit", "daemon.committed"};

namespace {

// A rank process: its stdin takes commands, its stdout answers a line each.
class RankProcess {
 public:
  bool Start(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return false;
    std::vector<std::string> all = {"/proc/self/exe", "grouprank"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
    return pid_ > 0;
  }
  ~RankProcess() {
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  RankProcess() = default;
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  void Send(const std::string& line) {
    const std::string l = line + "\n";
    if (to_ >= 0 && write(to_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) CloseInput();
  }
  void CloseInput() {
    if (to_ >= 0) close(to_);
    to_ = -1;
  }
  // The next line it writes; nullopt at its end (or after `limit`).
  std::optional<std::string> ReadLine(std::chrono::milliseconds limit = std::chrono::milliseconds(60000)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      pollfd p{from_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char b[4096];
      const ssize_t n = read(from_, b, sizeof b);
      if (n <= 0) return std::nullopt;
      buf_.append(b, static_cast<std::size_t>(n));
    }
  }
  // Waits for its end: true when SIGKILL ended it.
  bool WaitKilled() {
    int st = 0;
    if (pid_ <= 0 || waitpid(pid_, &st, 0) != pid_) return false;
    pid_ = -1;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buf_;
};

EntrySpec GroupSpec(std::mt19937_64& rng, std::uint32_t seed) {
  EntrySpec spec;
  spec.seed = seed;
  spec.length = 16 + static_cast<std::uint32_t>(rng() % 900);
  spec.layers = 2 + static_cast<std::uint32_t>(rng() % 3);
  spec.rows_per_chunk = 1u << (4 + rng() % 4);
  return spec;
}

std::vector<std::string> RankArgs(const EntrySpec& spec, std::uint32_t ranks, std::uint32_t rank,
                                  std::uint64_t token, const std::string& socket, const std::string& kill_at,
                                  std::uint32_t kill_delay_us) {
  return {"--kill-delay-us",  std::to_string(kill_delay_us),
          "--socket",         socket,
          "--entry-seed",     std::to_string(spec.seed),
          "--length",         std::to_string(spec.length),
          "--layers",         std::to_string(spec.layers),
          "--rows-per-chunk", std::to_string(spec.rows_per_chunk),
          "--ranks",          std::to_string(ranks),
          "--rank",           std::to_string(rank),
          "--token",          std::to_string(token),
          "--kill-at",        kill_at};
}

}  // namespace

GroupRounds::GroupRounds(testing::Daemon& d, Registry& reg, AckLog& log, WorkTally& tally, std::uint64_t seed)
    : d_(d), reg_(reg), log_(log), t_(tally), seed_(seed), rng_(seed * 31 + 7) {}

bool GroupRounds::Error(int it, const std::string& what) {
  ++t_.errors;
  Say("crash: iteration %d (%s): %s", it, kGroupKillPoints[point_], what.c_str());
  return false;
}

// The bystander: a group of two ranks on the driver's own connections,
// streamed before the victim's group and committed after its rank died.
struct GroupRounds::Bystander {
  std::vector<std::unique_ptr<client::Client>> clients;
  std::vector<std::unique_ptr<client::PublishStream>> streams;
  std::vector<std::uint32_t> tokens;
  std::uint64_t digest = 0;
};

bool GroupRounds::StreamBystander(int it, Bystander* b) {
  const EntrySpec spec = GroupSpec(rng_, next_seed_++);
  const auto parts = GroupParts(spec, 2);
  b->tokens = SpecTokens(spec);
  b->digest = LayersDigest(Concat(parts));
  reg_.Attempted(b->tokens, b->digest);
  ++t_.attempted;
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto c = client::Client::Connect(d_.Options());
    if (!c.ok()) return Error(it, "the bystander cannot connect: " + c.status().ToString());
    auto s = (*c)->BeginPublish(testing::TestModel(), b->tokens, static_cast<std::uint32_t>(parts[r].size()),
                                PublishGroup{(seed_ << 24) + spec.seed, 2, r});
    if (!s.ok()) return Error(it, "the bystander's part: " + s.status().ToString());
    for (const LayerData& l : parts[r]) {
      Status st = (*s)->BeginLayer(l.header, static_cast<std::uint32_t>(l.chunks.size()));
      for (const auto& chunk : l.chunks) st = st.ok() ? (*s)->AddChunk(chunk) : st;
      if (!st.ok()) return Error(it, "the bystander's part: " + st.ToString());
    }
    b->clients.push_back(std::move(c).value());
    b->streams.push_back(std::move(s).value());
  }
  return true;
}

bool GroupRounds::CommitBystander(int it, Bystander* b) {
  std::optional<std::uint64_t> entry;
  for (auto& s : b->streams) {
    auto r = s->Commit();
    if (!r.ok()) return Error(it, "the bystander's group was refused: " + r.status().ToString());
    if (!r->group_pending) entry = r->id;
  }
  if (!entry) return Error(it, "the bystander's group was not written");
  reg_.Acked(b->tokens, *entry);
  ++t_.acked;
  RecordAck(log_, it, "bystander", *entry, b->digest);
  return true;
}

// Until the store holds no staged bytes and no open group (the dead rank's
// group aborted, or written).
bool GroupRounds::Drained(int it) {
  auto admin = testing::Admin(d_);
  if (admin == nullptr) return Error(it, "no admin connection");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  DaemonStats last;
  while (std::chrono::steady_clock::now() < until) {
    auto st = admin->Stat();
    if (!st.ok()) return Error(it, "stat: " + st.status().ToString());
    last = *st;
    if (st->store.staged_bytes == 0 && st->store.group_publishes_open == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Error(it, "the dead rank's group kept " + std::to_string(last.store.staged_bytes) +
                       " staged bytes and " + std::to_string(last.store.group_publishes_open) +
                       " open groups");
}

// Iteration `it`: true when the daemon was killed (the caller restarts it).
bool GroupRounds::Run(int it) {
  point_ = it % kGroupKillPointCount;
  ++per_point_[point_];
  const std::string point = kGroupKillPoints[point_];
  const bool daemon_kill = point.starts_with("daemon.");
  const EntrySpec spec = GroupSpec(rng_, next_seed_++);
  const auto ranks = static_cast<std::uint32_t>(2 + rng_() % 3);
  const auto victim = static_cast<std::uint32_t>(rng_() % ranks);
  std::vector<std::uint32_t> order(ranks);
  for (std::uint32_t r = 0; r < ranks; ++r) order[r] = r;
  std::shuffle(order.begin(), order.end(), rng_);
  const auto parked = static_cast<std::uint32_t>(1 + rng_() % (ranks - 1));  // daemon.parked
  const auto tokens = SpecTokens(spec);
  const std::uint64_t digest = LayersDigest(Concat(GroupParts(spec, ranks)));
  const std::uint64_t token = (seed_ << 24) + spec.seed;
  reg_.Attempted(tokens, digest);
  ++t_.attempted;

  std::vector<std::unique_ptr<RankProcess>> procs;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    procs.push_back(std::make_unique<RankProcess>());
    const std::string kill_at = !daemon_kill && r == victim ? point.substr(5) : "none";
    if (!procs.back()->Start(RankArgs(spec, ranks, r, token, d_.socket(), kill_at,
                                      static_cast<std::uint32_t>(rng_() % 1000)))) {
      Error(it, "cannot start a rank process");
      return false;
    }
  }
  for (auto& p : procs) {
    auto l = p->ReadLine();
    if (!l || *l != "READY") {
      Error(it, "a rank process did not connect: " + l.value_or("(ended)"));
      return false;
    }
  }
  Bystander bystander;
  if (!daemon_kill && !StreamBystander(it, &bystander)) return false;

  bool victim_died = false;
  auto answer = [&](std::uint32_t r, const char* want) -> std::optional<std::string> {
    auto l = procs[r]->ReadLine();
    if (!l && !daemon_kill && r == victim) {
      victim_died = procs[r]->WaitKilled();
      if (!victim_died) Error(it, "the victim rank ended without its SIGKILL");
      return std::nullopt;
    }
    if (!l || (!daemon_kill && !l->starts_with(want))) {
      Error(it, "rank " + std::to_string(r) + " answered '" + l.value_or("(ended)") + "', not " + want);
      return std::nullopt;
    }
    return l;
  };
  for (auto& p : procs) p->Send("go");
  for (std::uint32_t r = 0; r < ranks; ++r) {
    if (!answer(r, "STREAMED") && !victim_died) return false;
  }
  if (point == "daemon.streamed") d_.Kill();
  std::optional<std::uint64_t> entry;
  for (std::uint32_t i = 0; i < ranks && !(daemon_kill && !d_.Alive()); ++i) {
    const std::uint32_t r = order[i];
    if (point == "daemon.parked" && i == parked) {
      d_.Kill();
      break;
    }
    if (victim_died && r == victim) continue;
    procs[r]->Send("commit");
    if (point == "daemon.in_commit" && i + 1 == ranks) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 2000));
      d_.Kill();
      break;
    }
    auto l = answer(r, victim_died || (r == victim && !daemon_kill) ? ""
                       : i + 1 == ranks                             ? "ENTRY"
                                                                    : "PENDING");
    if (!l) {
      if (victim_died) continue;
      return false;
    }
    if (l->starts_with("ENTRY ")) entry = std::stoull(l->substr(6));
  }
  if (entry) {
    reg_.Acked(tokens, *entry);
    ++t_.acked;
    RecordAck(log_, it, "group point=" + point + " ranks=" + std::to_string(ranks), *entry, digest);
  } else if (point == "rank.after_answer" || point == "daemon.committed") {
    Error(it, "a group of live ranks was not written");
    return false;
  }
  if (point == "daemon.committed") d_.Kill();
  for (auto& p : procs) p->CloseInput();
  if (daemon_kill) return true;
  if (!victim_died) victim_died = procs[victim]->WaitKilled();  // it answered, then died
  if (!victim_died) Error(it, "the victim rank was not killed");
  // The daemon goes on serving: the bystander's group, and the dead rank's
  // staged bytes given back.
  if (!CommitBystander(it, &bystander)) return false;
  Drained(it);
  return false;
}

std::string GroupRounds::PerPoint() const {
  std::string s;
  for (int i = 0; i < kGroupKillPointCount; ++i) {
    s += std::string(i ? " " : "") + kGroupKillPoints[i] + "=" + std::to_string(per_point_[i]);
  }
  return s;
}

// ---- the rank process ----------------------------------------------------------------------

namespace {

[[noreturn]] void Die() {
  std::fflush(stdout);
  raise(SIGKILL);
  _exit(137);
}

int RankFail(const std::string& what) {
  std::printf("FAIL %s\n", what.c_str());
  std::fflush(stdout);
  return 1;
}

bool NextCommand(const char* want) {
  char line[64];
  if (std::fgets(line, sizeof line, stdin) == nullptr) return false;
  return std::strncmp(line, want, std::strlen(want)) == 0;
}

}  // namespace

int RunGroupRank(const GroupRankOptions& o) {
  client::ClientOptions co;
  co.endpoint = o.socket;
  co.reconnect_attempts = 0;
  co.timeout = std::chrono::seconds(60);
  co.tp_rank = o.rank;
  auto c = client::Client::Connect(co);
  if (!c.ok()) return RankFail("connect: " + c.status().ToString());
  EntrySpec spec;
  spec.seed = o.entry_seed;
  spec.length = o.length;
  spec.layers = o.layers;
  spec.rows_per_chunk = o.rows_per_chunk;
  const auto part = GroupParts(spec, o.ranks)[o.rank];
  const auto tokens = SpecTokens(spec);
  std::printf("READY\n");
  std::fflush(stdout);
  if (!NextCommand("go")) return 0;
  if (o.kill_at == "before_begin") Die();
  auto s = (*c)->BeginPublish(testing::TestModel(), tokens, static_cast<std::uint32_t>(part.size()),
                              PublishGroup{o.token, o.ranks, o.rank});
  if (!s.ok()) return RankFail("begin: " + s.status().ToString());
  std::size_t chunks = 0, sent = 0;
  for (const LayerData& l : part) chunks += l.chunks.size();
  for (const LayerData& l : part) {
    Status st = (*s)->BeginLayer(l.header, static_cast<std::uint32_t>(l.chunks.size()));
    for (const auto& chunk : l.chunks) {
      if (o.kill_at == "mid_stream" && sent == chunks / 2) {
        (void)(*c)->Stat();  // a round trip: what went before reached the daemon
        Die();
      }
      st = st.ok() ? (*s)->AddChunk(chunk) : st;
      ++sent;
    }
    if (!st.ok()) return RankFail("stream: " + st.ToString());
  }
  if (auto st = (*c)->Stat(); !st.ok()) return RankFail("stat: " + st.status().ToString());
  std::printf("STREAMED\n");
  std::fflush(stdout);
  if (!NextCommand("commit")) return 0;
  if (o.kill_at == "streamed") Die();
  std::thread killer;
  if (o.kill_at == "in_commit") {
    killer = std::thread([us = o.kill_delay_us] {
      std::this_thread::sleep_for(std::chrono::microseconds(us));
      Die();
    });
  }
  auto r = (*s)->Commit();
  if (!r.ok()) return RankFail("commit: " + r.status().ToString());
  if (r->group_pending) {
    std::printf("PENDING\n");
  } else {
    std::printf("ENTRY %llu\n", U(r->id));
  }
  std::fflush(stdout);
  if (o.kill_at == "after_answer" || killer.joinable()) Die();
  while (NextCommand("")) {
  }
  return 0;
}

}  // namespace primecache::stress

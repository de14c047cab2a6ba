// Crash atomicity with a real process: a child runs the crash workload on the
// POSIX file system and is killed with SIGKILL, either at a kill point (every
// named point of publish, segment appends and syncs, delete, eviction and
// segment gc, and a spread of RocksDB's own file operations) or at a random
// time. The parent reopens the
// store and checks: no torn entry, every acknowledged step durable, exact
// reference counts and index, leftovers collected, and the store usable.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "primecache/internal/codec.h"
#include "crash_workload.h"

#ifndef STATESTORE_CRASH_CHILD
#error "STATESTORE_CRASH_CHILD must name the child binary"
#endif

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)
using crash_test::Step;
using crash_test::Workload;

struct ChildRun {
  bool killed = false;  // died of SIGKILL
  int exit_code = -1;
  std::string out, err;
};

std::string ReadAll(int fd) {
  std::string s;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    s.append(buf, static_cast<std::size_t>(n));
  }
  return s;
}

// Runs the child on `dir` with extra environment; kills it after `kill_after`
// when given.
ChildRun RunChild(const std::string& dir, const std::vector<std::string>& env,
                  std::optional<std::chrono::microseconds> kill_after = std::nullopt) {
  int out[2], err[2];
  EXPECT_EQ(::pipe(out), 0);
  EXPECT_EQ(::pipe(err), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(err[0]);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    const char* child = STATESTORE_CRASH_CHILD;
    ::execl(child, child, dir.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  ChildRun r;
  std::thread killer;
  if (kill_after) {
    killer = std::thread([pid, d = *kill_after] {
      std::this_thread::sleep_for(d);
      ::kill(pid, SIGKILL);
    });
  }
  std::string o, e;
  std::thread eread([&] { e = ReadAll(err[0]); });
  o = ReadAll(out[0]);
  eread.join();
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (killer.joinable()) killer.join();
  ::close(out[0]);
  ::close(err[0]);
  r.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = std::move(o);
  r.err = std::move(e);
  return r;
}

struct Acks {
  std::map<int, EntryId> published;  // step -> id
  std::set<EntryId> deleted;         // by delete or eviction, acknowledged
  int next_step = 0;                 // the first step not acknowledged
};

Acks ParseAcks(const std::string& out) {
  Acks a;
  std::istringstream in(out);
  std::string word, kind;
  int step = 0;
  EntryId id = 0;
  while (in >> word >> step >> kind >> id) {
    if (kind == "publish") a.published[step] = id;
    if (kind == "delete" || kind == "evict") a.deleted.insert(id);
    a.next_step = std::max(a.next_step, step + 1);
  }
  return a;
}

// The pass records a crash left agree with the entries that are there: a
// query diverging a few tokens before each entry's end is answered the
// longest prefix any present entry shares with it, no more, no less.
void ExpectBranchPointsOf(LocalStore& store, const std::vector<std::vector<std::uint32_t>>& stored) {
  for (const auto& t : stored) {
    const auto query = DivergeAt(t, t.size() - 5, t.size() + 40, 77);
    std::uint64_t shared = 0;
    LookupOptions o;
    o.record = false;
    o.shared_tokens = &shared;
    auto r = store.Lookup(ModelDigest(1), "", query, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(shared, LongestSharedPrefix(query, stored)) << "the branch point of a query diverging at " << t.size() - 5;
  }
}

// Opens the store the child left and checks it against what was acknowledged.
void CheckStore(const std::string& dir, const Acks& acks, const std::string& what) {
  SCOPED_TRACE(what);
  StoreOptions o;
  o.validator = CodecLayerValidator();
  o.path = dir;
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  LocalStore& store = **s;
  ExpectConsistent(store);  // references, index, recency, counters; nothing left to collect

  const auto& steps = Workload();
  // Tokens -> the step that publishes them.
  std::map<std::vector<std::uint32_t>, int> step_of;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].kind == Step::kPublish || steps[i].kind == Step::kGroupPublish) {
      step_of[steps[i].tokens] = static_cast<int>(i);
    }
  }
  ListOptions lo;
  lo.limit = 1000;
  auto page = store.List(lo);
  ASSERT_TRUE(page.ok());
  std::set<int> present_steps;
  std::vector<std::vector<std::uint32_t>> present_tokens;
  for (const auto& e : page->entries) {
    auto tokens = StoredTokens(store, e.id);
    ASSERT_TRUE(tokens.ok());
    present_tokens.push_back(*tokens);
    auto it = step_of.find(*tokens);
    ASSERT_NE(it, step_of.end()) << "entry " << e.id << " was never published";
    int step = it->second;
    present_steps.insert(step);
    bool acked = acks.published.count(step) != 0;
    EXPECT_TRUE(acked || step == acks.next_step)
        << "entry of step " << step << " present but neither acknowledged "
        << "nor in flight (next step " << acks.next_step << ")";
    if (acked) {
      EXPECT_EQ(acks.published.at(step), e.id);
    }
    EXPECT_EQ(acks.deleted.count(e.id), 0u) << "entry " << e.id << " was deleted (acknowledged)";
    // Complete: every byte as published.
    auto back = store.FetchAll(e.id);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameLayers(*back, LayersOf(steps[step]));
  }
  for (const auto& [step, id] : acks.published) {
    if (acks.deleted.count(id) != 0) continue;
    // An acknowledged publish may only be gone through a later step in flight
    // (a delete or eviction that was not acknowledged yet).
    bool later_removal_in_flight =
        acks.next_step < static_cast<int>(steps.size()) &&
        (steps[acks.next_step].kind == Step::kDelete || steps[acks.next_step].kind == Step::kEvict);
    if (!later_removal_in_flight) {
      EXPECT_EQ(present_steps.count(step), 1u) << "acknowledged step " << step << " lost";
    }
  }
  ExpectBranchPointsOf(store, present_tokens);
  // The store goes on: the rest of the workload's kind of work succeeds.
  auto t = Conversation(150, 999);
  auto r = store.Publish(Request(t), MakeLayers(t, crash_test::Model()));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  ExpectConsistent(store);
}

// Hits of each kill point in an unarmed run, in order of first hit.
std::vector<std::pair<std::string, int>> TracePoints() {
  TempDir dir;
  ChildRun r = RunChild(dir.path + "/s", {"PRIMECACHE_KILL_TRACE=1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, int> counts;
  std::vector<std::string> order;
  std::istringstream in(r.err);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("killpoint ", 0) != 0) continue;
    std::string name = line.substr(10);
    if (counts[name]++ == 0) order.push_back(name);
  }
  std::vector<std::pair<std::string, int>> out;
  for (auto& n : order) out.emplace_back(n, counts[n]);
  return out;
}

// Occurrences of a point to kill at: all of a few, else a spread of `max`.
std::vector<int> Occurrences(int hits, int max) {
  std::vector<int> out;
  if (hits <= max) {
    for (int i = 1; i <= hits; ++i) out.push_back(i);
    return out;
  }
  for (int k = 0; k < max; ++k)
    out.push_back(1 + static_cast<int>(static_cast<long long>(k) * (hits - 1) / (max - 1)));
  return out;
}

// Kills the child at the nth hit of a point and checks the store; true when
// it was killed. Background flushes make the number of RocksDB file
// operations vary a little from run to run, so a late one may not come: the
// child then finishes, and its store is checked all the same.
bool KillAt(const std::string& point, int nth, bool must_die) {
  TempDir dir;
  std::string where = point + "@" + std::to_string(nth);
  ChildRun r = RunChild(dir.path + "/s", {"PRIMECACHE_KILL_POINT=" + where});
  if (must_die) {
    EXPECT_TRUE(r.killed) << where << ": the child was not killed (exit " << r.exit_code << ")\n" << r.err;
  }
  if (!r.killed) {
    EXPECT_EQ(r.exit_code, 0) << where << "\n" << r.err;
  }
  CheckStore(dir.path + "/s", ParseAcks(r.out), "killed at " + where);
  return r.killed;
}

TEST(Crash, KilledAtEveryNamedPoint) {
  auto points = TracePoints();
  std::set<std::string> names;
  int runs = 0;
  for (auto& [name, hits] : points) {
    if (name.rfind("fs.", 0) == 0) continue;
    names.insert(name);
    for (int nth : Occurrences(hits, 4)) {
      KillAt(name, nth, /*must_die=*/true);
      ++runs;
    }
  }
  // The points the workload must pass through.
  for (const char* must :
       {"publish.begin", "segment.append", "publish.commit.before_sync", "segment.sync.before",
        "segment.sync.after", "publish.commit.before_write", "publish.commit.after_write", "delete.before_write",
        "delete.after_write", "evict.before_write", "evict.after_write", "gc.copy", "gc.before_batch",
        "gc.after_batch", "gc.before_unlink"}) {
    EXPECT_EQ(names.count(must), 1u) << must;
  }
  std::printf("[ info     ] %d kills at %zu named points\n", runs, names.size());
}

TEST(Crash, KilledInRocksDbFileOperations) {
  auto points = TracePoints();
  int runs = 0, killed = 0;
  for (auto& [name, hits] : points) {
    if (name.rfind("fs.", 0) != 0) continue;
    int max = name == "fs.append" ? 12 : 6;
    for (int nth : Occurrences(hits, max)) {
      killed += KillAt(name, nth, /*must_die=*/false) ? 1 : 0;
      ++runs;
    }
  }
  EXPECT_GE(runs, 20);
  EXPECT_GE(killed, runs - 6) << "most kill points must be reached";
  std::printf("[ info     ] %d kills in %d runs at file operations\n", killed, runs);
}

TEST(Crash, KilledAtRandomTimes) {
  // How long an undisturbed run takes, to spread kills over it.
  auto t0 = std::chrono::steady_clock::now();
  {
    TempDir dir;
    ChildRun r = RunChild(dir.path + "/s", {});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  auto full = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  std::mt19937_64 rng(20261130);
  int killed = 0;
  for (int i = 0; i < 12; ++i) {
    TempDir dir;
    std::chrono::microseconds after(
        static_cast<long long>(rng() % static_cast<std::uint64_t>(full.count() + 1)));
    ChildRun r = RunChild(dir.path + "/s", {}, after);
    if (r.killed) ++killed;
    if (!r.killed) {
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    if (!std::filesystem::exists(dir.path + "/s/CURRENT")) continue;  // killed before the store existed
    CheckStore(dir.path + "/s", ParseAcks(r.out), "killed after " + std::to_string(after.count()) + " us");
  }
  EXPECT_GT(killed, 4);
}

}  // namespace
}  // namespace primecache

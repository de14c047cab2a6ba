// Two daemons ("hosts") with their own data directories on one Redis
// Cluster, driven by primecache-run: a prompt primed through the first is
// restored through the second, which continues it exactly as a run without
// any cache does, keeps the entry, and goes on serving it from its own store
// once the cluster is gone. A daemon whose cluster is down from the start
// serves its local store as if it had none.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "remote/cluster_client.h"
#include "remote/tier.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/remote/redis_cluster_harness.h"

namespace primecache::testing {
namespace {

using remote::testing::RedisCluster;

const char kPrompt[] =
    "The lighthouse keeper counted the ships that passed each night and wrote their names in a ledger, "
    "one line for every ship, with the hour and the weather beside it.";

ProcessResult RunPrompt(const std::string& socket, const std::string& prompt, std::vector<std::string> extra = {}) {
  std::vector<std::string> args{PRIMECACHE_RUN_PATH,  "--model",          std::string(PRIMECACHE_SOURCE_DIR) +
                                                                              "/configs/hrm-tiny.json",
                                "--prompt",           prompt,             "--max-new-tokens",
                                "12",                 "--log-level",      "warn"};
  if (socket.empty()) {
    args.push_back("--no-cache");
  } else {
    args.insert(args.end(), {"--socket", socket});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return RunProcess(args);
}

std::string Text(const std::string& out) { return out.substr(0, out.find("\nsummary: ")); }

std::uint64_t Restored(const std::string& out) {
  const auto at = out.find("restored_tokens=");
  return at == std::string::npos ? 0 : std::stoull(out.substr(at + 16));
}

// Waits until the cluster holds `n` manifests (the write-behind landed).
bool WaitForManifests(const RedisCluster& cluster, std::size_t n) {
  auto client = remote::ClusterClient::Connect(cluster.Options());
  if (!client.ok()) return false;
  for (int i = 0; i < 200; ++i) {
    auto keys = (*client)->Keys(remote::kManifestKeyPattern, 1000);
    if (keys.ok() && keys->size() >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(TwoHosts, APromptPrimedOnOneHostIsRestoredOnTheOther) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // B keeps at most 1 MiB of fetched chunk buffers (less than the entry).
  Daemon a({"--remote", cluster.url()}), b({"--remote", cluster.url(), "--remote-receive-pool", "1M"});
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  ProcessResult first = RunPrompt(a.socket(), kPrompt);
  ASSERT_EQ(first.rc, 0) << first.err;
  ASSERT_TRUE(WaitForManifests(cluster, 1)) << "host A's entry never reached the cluster";

  const std::string longer = std::string(kPrompt) + " The next night was calm.";
  ProcessResult plain = RunPrompt("", longer);
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ProcessResult on_b = RunPrompt(b.socket(), longer);
  ASSERT_EQ(on_b.rc, 0) << on_b.err;
  EXPECT_GT(Restored(on_b.out), 0u) << "host B restored nothing: " << on_b.out;
  EXPECT_EQ(Text(on_b.out), Text(plain.out)) << "the restored continuation differs from a run without cache";

  // B kept the entry: with the cluster gone it still restores, from its own store.
  cluster.StopAll();
  ProcessResult again = RunPrompt(b.socket(), longer);
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_GE(Restored(again.out), Restored(on_b.out)) << again.out;
  EXPECT_EQ(Text(again.out), Text(plain.out));
}

// A TP-2 engine's entry (a group of two parts) goes to the cluster whole
// and comes back on the other host as a TP entry, which a TP-2 engine there
// restores and continues exactly as a TP-2 run without any cache.
TEST(TwoHosts, ATensorParallelEntryCrossesToTheOtherHost) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  Daemon a({"--remote", cluster.url()}), b({"--remote", cluster.url()});
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  ProcessResult first = RunPrompt(a.socket(), kPrompt, {"--tp", "2"});
  ASSERT_EQ(first.rc, 0) << first.err;
  ASSERT_TRUE(WaitForManifests(cluster, 1)) << "host A's TP entry never reached the cluster";

  const std::string longer = std::string(kPrompt) + " The next night was calm.";
  ProcessResult plain = RunPrompt("", longer, {"--tp", "2"});
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ProcessResult on_b = RunPrompt(b.socket(), longer, {"--tp", "2"});
  ASSERT_EQ(on_b.rc, 0) << on_b.err;
  EXPECT_GT(Restored(on_b.out), 0u) << "host B restored nothing: " << on_b.out;
  EXPECT_EQ(Text(on_b.out), Text(plain.out)) << "the restored continuation differs from a run without cache";
  // B keeps it as a TP entry of four parts (hrm-tiny's 4 KDA heads at TP 2
  // make 4 head-group parts, HeadGroups).
  auto admin = Admin(b);
  auto page = admin->List();
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  bool tp = false;
  std::string seen;
  for (const EntryInfo& e : page->entries) {
    tp = tp || e.ranks == 4;
    seen += " " + std::to_string(e.length) + ":" + std::to_string(e.ranks) + ":" + std::to_string(e.layers);
  }
  EXPECT_TRUE(tp) << "host B holds no TP entry:" << seen;
}

TEST(TwoHosts, ADaemonWhoseClusterIsDownServesItsOwnStore) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string url = cluster.url();
  cluster.StopAll();  // the addresses stay, nobody answers there
  Daemon d({"--remote", url, "--remote-timeout", "0.2"});
  ASSERT_TRUE(d.Start());
  ProcessResult first = RunPrompt(d.socket(), kPrompt);
  ASSERT_EQ(first.rc, 0) << first.err;
  ProcessResult second = RunPrompt(d.socket(), std::string(kPrompt) + " More.");
  ASSERT_EQ(second.rc, 0) << second.err;
  EXPECT_GT(Restored(second.out), 0u) << second.out;
  EXPECT_EQ(Text(second.out), Text(RunPrompt("", std::string(kPrompt) + " More.").out));
}

}  // namespace
}  // namespace primecache::testing

// Daemons on a cluster that lets no one in unasked (every node requires a
// password; each tenant's daemon has an ACL user reaching its namespace's
// key prefix alone). A daemon given no credentials is refused by the
// cluster, says so, and serves its local store as if it had no tier. A
// tenant's daemon shares its entries with its other hosts; another tenant's
// daemon, even one that lets its clients ask for the first tenant's
// namespace, can neither read those entries through the tier nor replace
// them.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "remote/credentials.h"
#include "remote/tier.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/remote/redis_cluster_harness.h"
#include "tests/remote/remote_daemon_util.h"

namespace primecache::testing {
namespace {

using remote::RedisAuth;
using remote::testing::RedisCluster;
using remote::testing::TenantSecurity;

const RedisAuth kTeamA{"team-a-daemon", "password of team a"};
const RedisAuth kTeamB{"team-b-daemon", "password of team b"};

class TenantsOnTheCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.ok()) << cluster_.error();
    dir_ = std::filesystem::temp_directory_path() / ("pctenants-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The flags of a daemon on the cluster that authenticates as `auth`
  // (through a private password file).
  std::vector<std::string> FlagsAs(const RedisAuth& auth) {
    const std::string file = (dir_ / (auth.user + ".pw")).string();
    std::ofstream(file) << auth.password << "\n";
    chmod(file.c_str(), 0600);
    return {"--remote", cluster_.url(), "--remote-user", auth.user, "--remote-password-file", file};
  }
  // Manifest keys under `ns`'s prefix, as the operator sees them.
  std::vector<std::string> Manifests(const std::string& ns) {
    auto admin = remote::ClusterClient::Connect(cluster_.Options());
    if (!admin.ok()) return {};
    auto keys = (*admin)->Keys(remote::NamespaceKeyPrefix(ns) + "m:*", 1000);
    return keys.ok() ? *keys : std::vector<std::string>{};
  }
  bool WaitForManifests(const std::string& ns, std::size_t n) {
    for (int i = 0; i < 200; ++i) {
      if (Manifests(ns).size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  RedisCluster cluster_{
      TenantSecurity("the operator's password", {{kTeamA, {"team-a"}}, {kTeamB, {"team-b"}}})};
  std::filesystem::path dir_;
};

TEST_F(TenantsOnTheCluster, ADaemonWithoutCredentialsIsRefusedAndServesItsLocalStore) {
  Daemon d({"--remote", cluster_.url()});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options("team-a"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ModelId model = FingerprintedModel();
  const auto tokens = Tokens(256, 11);
  ASSERT_TRUE((*c)->Publish(model, tokens, MakeLayers(256, 2, 11)).ok());
  auto miss = (*c)->Lookup(model, Tokens(300, 12));  // asks the cluster, which refuses
  ASSERT_TRUE(miss.ok()) << miss.status().ToString();
  EXPECT_FALSE(miss->has_value());
  auto hit = (*c)->Lookup(model, tokens);
  ASSERT_TRUE(hit.ok() && hit->has_value()) << "the local store does not serve";
  auto layers = (*c)->FetchLayers((*hit)->id);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  const auto want = MakeLayers(256, 2, 11);
  ASSERT_EQ(layers->size(), want.size());
  for (std::size_t l = 0; l < want.size(); ++l) EXPECT_EQ((*layers)[l].data.chunks, want[l].chunks);
  // The write-behind and the lookup both failed; nothing reached the cluster.
  auto st = StatWhen(**c, [](const DaemonStats& s) { return s.remote && s.remote->errors >= 2; });
  ASSERT_TRUE(st && st->remote);
  EXPECT_GE(st->remote->errors, 2u);
  EXPECT_EQ(st->remote->put, 0u);
  EXPECT_TRUE(Manifests("team-a").empty());
}

TEST_F(TenantsOnTheCluster, AWrongPasswordStopsNothingButTheTier) {
  Daemon d(FlagsAs(RedisAuth{kTeamA.user, "not the password"}));
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options("team-a"));
  ASSERT_TRUE(c.ok());
  const ModelId model = FingerprintedModel();
  ASSERT_TRUE((*c)->Publish(model, Tokens(256, 13), MakeLayers(256, 2, 13)).ok());
  auto st = StatWhen(**c, [](const DaemonStats& s) { return s.remote && s.remote->errors >= 1; });
  ASSERT_TRUE(st && st->remote);
  EXPECT_EQ(st->remote->put, 0u);
  EXPECT_TRUE((*c)->Lookup(model, Tokens(256, 13)).value().has_value());
  EXPECT_TRUE(Manifests("team-a").empty());
}

TEST_F(TenantsOnTheCluster, ATenantSharesItsEntriesAndNoOtherTenantReadsOrReplacesThem) {
  const ModelId model = FingerprintedModel();
  const auto tokens = Tokens(512, 21);
  const auto original = MakeLayers(512, 2, 21);
  {
    Daemon a(FlagsAs(kTeamA));
    ASSERT_TRUE(a.Start());
    auto c = Client::Connect(a.Options("team-a"));
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Publish(model, tokens, original).ok());
    ASSERT_TRUE(WaitForManifests("team-a", 1)) << "team A's entry never reached the cluster";
  }
  const std::vector<std::string> team_a_keys = Manifests("team-a");

  // Team B's daemon serves any namespace its clients name (no --tenant), and
  // its user is given by the environment this time.
  setenv(remote::kRemotePasswordEnv, kTeamB.password.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
  Daemon b({"--remote", cluster_.url(), "--remote-user", kTeamB.user});
  const bool started = b.Start();
  unsetenv(remote::kRemotePasswordEnv);  // NOLINT(concurrency-mt-unsafe)
  ASSERT_TRUE(started);
  auto cb = Client::Connect(b.Options("team-a"));
  ASSERT_TRUE(cb.ok());
  auto stolen = (*cb)->Lookup(model, tokens);
  ASSERT_TRUE(stolen.ok()) << stolen.status().ToString();
  EXPECT_FALSE(stolen->has_value()) << "team B's daemon read team A's entry through the tier";
  // It publishes other bytes under team A's namespace and tokens: they stay in its own store.
  const auto forged = MakeLayers(512, 2, 99);
  ASSERT_TRUE((*cb)->Publish(model, tokens, forged).ok());
  auto st = StatWhen(**cb, [](const DaemonStats& s) { return s.remote && s.remote->errors >= 2; });
  ASSERT_TRUE(st && st->remote);
  EXPECT_EQ(st->remote->put, 0u) << "team B's daemon wrote under team A's prefix";
  EXPECT_EQ(st->remote->hits, 0u);
  // Its own namespace goes to the cluster as usual.
  auto own = Client::Connect(b.Options("team-b"));
  ASSERT_TRUE(own.ok());
  ASSERT_TRUE((*own)->Publish(model, Tokens(256, 22), MakeLayers(256, 2, 22)).ok());
  EXPECT_TRUE(WaitForManifests("team-b", 1)) << "team B's own entry never reached the cluster";

  // Another host of team A finds team A's entry as it was published.
  EXPECT_EQ(Manifests("team-a"), team_a_keys);
  Daemon a2(FlagsAs(kTeamA));
  ASSERT_TRUE(a2.Start());
  auto c2 = Client::Connect(a2.Options("team-a"));
  ASSERT_TRUE(c2.ok());
  auto hit = (*c2)->Lookup(model, tokens);
  ASSERT_TRUE(hit.ok() && hit->has_value()) << "team A's other host did not find its entry";
  EXPECT_EQ((*hit)->length, tokens.size());
  auto layers = (*c2)->FetchLayers((*hit)->id);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  ASSERT_EQ(layers->size(), original.size());
  for (std::size_t l = 0; l < original.size(); ++l) {
    EXPECT_EQ((*layers)[l].data.header, original[l].header);
    EXPECT_EQ((*layers)[l].data.chunks, original[l].chunks) << "layer " << l;
  }
}

}  // namespace
}  // namespace primecache::testing

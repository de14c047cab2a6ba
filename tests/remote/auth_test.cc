// The shared tier on a cluster that lets no one in unasked: every node
// requires the default user's password, and each tenant's daemon has an ACL
// user whose keys are its namespace's prefix alone (NamespaceAclRules, as
// `primecachectl remote-acl` prints them). A client without credentials or
// with wrong ones is refused with a message that says so; a tenant's user
// does everything its tier does in its own namespace and can neither read
// nor change another's entries, however it asks. And the credentials'
// sources: a private file or the environment.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "remote/credentials.h"
#include "remote/manifest.h"
#include "remote/tier.h"
#include "tests/remote/redis_cluster_harness.h"

namespace primecache::remote {
namespace {

using testing::RedisCluster;
using testing::RedisSecurity;

const RedisAuth kTeamA{"team-a-daemon", "password of team a"};
const RedisAuth kTeamB{"team-b-daemon", "password of team b"};
constexpr char kAdminPassword[] = "the operator's password";

RedisSecurity Security() {
  return testing::TenantSecurity(kAdminPassword, {{kTeamA, {"team-a"}}, {kTeamB, {"team-b"}}});
}

PublishRequest Entry(std::span<const std::uint32_t> tokens, std::string ns) {
  PublishRequest e;
  e.model = Hash128{0xabc, 0xdef};
  e.model_name = "hrm-tiny";
  e.ns = std::move(ns);
  e.tokens.assign(tokens.begin(), tokens.end());
  return e;
}

std::vector<LayerBytes> Layers(char fill) {
  std::vector<LayerBytes> layers(2);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    layers[l].header = "layer " + std::to_string(l);
    layers[l].chunks = {std::string(3000 + l, fill), std::string(700, static_cast<char>(fill + 1 + l))};
  }
  return layers;
}

std::vector<std::uint32_t> Tokens(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = rng() % 50000;
  return t;
}

// A refusal of who we are, saying which.
void ExpectRefused(const Status& s, std::string_view why) {
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(why), std::string::npos) << s.ToString();
}

class TierAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = new RedisCluster(Security()); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(cluster_->ok()) << cluster_->error(); }

  // A client that has not touched the network yet (Open), so a refusal
  // shows on its first command.
  static std::shared_ptr<ClusterClient> ClientAs(const RedisAuth& auth) {
    ClusterOptions o = cluster_->Options(auth);
    o.io_timeout = std::chrono::milliseconds(2000);
    return std::shared_ptr<ClusterClient>(ClusterClient::Open(o).value());
  }
  static std::unique_ptr<RemoteTier> TierAs(const RedisAuth& auth) {
    return std::make_unique<RemoteTier>(ClientAs(auth));
  }
  // The entry `tier` finds for `tokens` in `ns`, fetched; nullopt for none.
  static std::optional<RemoteEntry> Find(RemoteTier& tier, std::span<const std::uint32_t> tokens,
                                         const std::string& ns) {
    const PublishRequest e = Entry(tokens, ns);
    auto hit = tier.Lookup(e.model, ns, tokens);
    EXPECT_TRUE(hit.ok()) << hit.status().ToString();
    if (!hit.ok() || !*hit) return std::nullopt;
    auto got = tier.Fetch(e.model, ns, tokens, **hit);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? std::move(*got) : std::nullopt;
  }
  static void ExpectLayers(const std::optional<RemoteEntry>& got, const std::vector<LayerBytes>& want) {
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(got->layers.size(), want.size());
    for (std::size_t l = 0; l < want.size(); ++l) {
      EXPECT_EQ(got->layers[l].header, want[l].header);
      EXPECT_EQ(got->layers[l].chunks, want[l].chunks);
    }
  }

  static RedisCluster* cluster_;
};
RedisCluster* TierAuthTest::cluster_ = nullptr;

TEST_F(TierAuthTest, AClientWithoutCredentialsIsRefusedAndToldWhy) {
  auto connect = ClusterClient::Connect(cluster_->Options(RedisAuth{}));
  ExpectRefused(connect.status(), "NOAUTH");
  ExpectRefused(connect.status(), "requires a password");
  // A tier on such a client fails every call with the same refusal, at once
  // (not after its retries: a refusal is answered the same every time).
  auto tier = TierAs(RedisAuth{});
  const auto tokens = Tokens(300, 1);
  const auto start = std::chrono::steady_clock::now();
  ExpectRefused(tier->Put(Entry(tokens, "team-a"), Layers('a')), "NOAUTH");
  ExpectRefused(tier->Lookup(Hash128{0xabc, 0xdef}, "team-a", tokens).status(), "NOAUTH");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_F(TierAuthTest, WrongCredentialsAreRefusedAndToldWhy) {
  for (const RedisAuth& wrong : {RedisAuth{"", "not the password"}, RedisAuth{kTeamA.user, kTeamB.password},
                                 RedisAuth{"nobody", kTeamA.password}}) {
    auto connect = ClusterClient::Connect(cluster_->Options(wrong));
    ExpectRefused(connect.status(), "WRONGPASS");
    ExpectRefused(connect.status(), "refused the tier's user name or password");
    if (!wrong.user.empty()) ExpectRefused(connect.status(), "user " + wrong.user);
    EXPECT_EQ(connect.status().message().find(wrong.password), std::string::npos)
        << "a password in a message";
    auto tier = TierAs(wrong);
    ExpectRefused(tier->Put(Entry(Tokens(100, 2), "team-a"), Layers('w')), "WRONGPASS");
  }
}

TEST_F(TierAuthTest, ATenantsUserDoesEverythingItsTierDoesInItsOwnNamespace) {
  for (const auto& [auth, ns] :
       {std::pair{kTeamA, std::string("team-a")}, std::pair{kTeamB, std::string("team-b")}}) {
    auto tier = TierAs(auth);
    const auto tokens = Tokens(600, 3);
    ASSERT_TRUE(tier->Put(Entry(std::span(tokens).first(200), ns), Layers('p')).ok());
    ASSERT_TRUE(tier->Put(Entry(std::span(tokens).first(500), ns), Layers('q')).ok());
    auto got = Find(*tier, tokens, ns);
    ExpectLayers(got, Layers('q'));
    EXPECT_EQ(got->entry.tokens.size(), 500u);
    // A damaged chunk is found and removed with its entry, by the tenant itself.
    const RemoteManifest m = ManifestOf(Entry(std::span(tokens).first(500), ns), Layers('q'));
    ASSERT_TRUE(tier->client().Set(ChunkKey(ns, m.layers[1].chunks[0].address), "damage").ok());
    EXPECT_FALSE(Find(*tier, tokens, ns).has_value()) << "a damaged entry was served";
    EXPECT_EQ(tier->stats().damaged, 1u);
    auto after = Find(*tier, tokens, ns);
    ASSERT_TRUE(after.has_value()) << "the 200-token entry is still there";
    EXPECT_EQ(after->entry.tokens.size(), 200u);
    ASSERT_TRUE(tier->Remove(Hash128{0xabc, 0xdef}, ns, std::span(tokens).first(200)).ok());
    EXPECT_FALSE(Find(*tier, tokens, ns).has_value());
  }
}

TEST_F(TierAuthTest, ATenantCanNeitherReadNorDamageAnothersEntries) {
  auto a = TierAs(kTeamA), b = TierAs(kTeamB);
  const auto tokens = Tokens(400, 4);
  const PublishRequest mine = Entry(tokens, "team-a");
  ASSERT_TRUE(a->Put(mine, Layers('a')).ok());
  const RemoteManifest m = ManifestOf(mine, Layers('a'));
  const std::string manifest_key = ManifestKey(mine.model, "team-a", tokens);
  const std::string chunk_key = ChunkKey("team-a", m.layers[0].chunks[0].address);

  // Through its tier: team B's user can neither find, fetch, overwrite nor remove it.
  ExpectRefused(b->Lookup(mine.model, "team-a", tokens).status(), "NOPERM");
  ExpectRefused(b->Fetch(mine.model, "team-a", tokens, RemoteHit{tokens.size(), manifest_key}).status(),
                "NOPERM");
  ExpectRefused(b->Put(mine, Layers('x')), "NOPERM");
  ExpectRefused(b->Remove(mine.model, "team-a", tokens), "NOPERM");
  // Nor with its client's raw commands: a key of the prefix, a scan, a flush.
  ClusterClient& raw = b->client();
  ExpectRefused(raw.Get(manifest_key).status(), "NOPERM");
  ExpectRefused(raw.Set(chunk_key, "damage"), "NOPERM");
  ExpectRefused(raw.Del(chunk_key).status(), "NOPERM");
  ExpectRefused(raw.Keys("*", 100).status(), "NOPERM");
  ExpectRefused(raw.Command(chunk_key, {"FLUSHALL"}).status(), "NOPERM");
  ExpectRefused(raw.Command(chunk_key, {"CONFIG", "SET", "requirepass", ""}).status(), "NOPERM");
  const std::string own = NamespaceKeyPrefix("team-b") + "x";
  ExpectRefused(raw.Command(own, {"RENAME", own, chunk_key}).status(), "NOPERM");
  // A namespace's prefix is never the start of another's (a namespace that
  // begins another's name included), so no ACL pattern reaches past its own.
  EXPECT_FALSE(NamespaceKeyPrefix("team-a").starts_with(NamespaceKeyPrefix("team")));
  EXPECT_FALSE(NamespaceKeyPrefix("team").starts_with(NamespaceKeyPrefix("team-a")));

  // Team A's entry is as it was put, and only its keys exist under its prefix.
  ExpectLayers(Find(*a, tokens, "team-a"), Layers('a'));
  auto admin = ClusterClient::Connect(cluster_->Options()).value();
  auto keys = admin->Keys(NamespaceKeyPrefix("team-a") + "*", 1000).value();
  for (const std::string& k : keys) EXPECT_TRUE(k.starts_with(NamespaceKeyPrefix("team-a"))) << k;
  EXPECT_EQ(admin->Get(chunk_key).value(), std::optional<std::string>(Layers('a')[0].chunks[0]));
}

// ---- where the credentials come from -------------------------------------------------

class AuthSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv(kRemoteUserEnv);      // NOLINT(concurrency-mt-unsafe): one thread
    unsetenv(kRemotePasswordEnv);  // NOLINT(concurrency-mt-unsafe)
    dir_ = std::filesystem::temp_directory_path() / ("pcauth-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    unsetenv(kRemoteUserEnv);      // NOLINT(concurrency-mt-unsafe)
    unsetenv(kRemotePasswordEnv);  // NOLINT(concurrency-mt-unsafe)
    std::filesystem::remove_all(dir_);
  }
  std::string File(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(AuthSourceTest, APrivateFilesFirstLineIsThePassword) {
  auto auth = LoadRedisAuth({"team-a-daemon", File("pw", "s3cret pass\nsecond line\n", 0600)});
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  EXPECT_EQ(auth->user, "team-a-daemon");
  EXPECT_EQ(auth->password, "s3cret pass");
  EXPECT_EQ(LoadRedisAuth({"", File("crlf", "pw\r\n", 0400)})->password, "pw");
  EXPECT_EQ(LoadRedisAuth({"", File("bare", "pw", 0600)})->password, "pw");
}

TEST_F(AuthSourceTest, AFileOthersMayReadOrThatIsNoPasswordIsRefused) {
  for (mode_t mode : {0644, 0640, 0604, 0660, 0602}) {
    auto auth = LoadRedisAuth({"", File("open" + std::to_string(mode), "pw\n", mode)});
    EXPECT_EQ(auth.status().code(), StatusCode::kFailedPrecondition) << std::oct << mode;
    EXPECT_NE(auth.status().message().find("chmod 600"), std::string::npos) << auth.status().ToString();
  }
  EXPECT_EQ(LoadRedisAuth({"", File("empty", "\nsecond\n", 0600)}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LoadRedisAuth({"", File("huge", std::string(kMaxPasswordFileBytes + 1, 'p'), 0600)}).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadRedisAuth({"", (dir_ / "absent").string()}).status().code(), StatusCode::kFailedPrecondition);
  std::filesystem::create_directory(dir_ / "a-dir");
  chmod((dir_ / "a-dir").c_str(), 0700);
  EXPECT_EQ(LoadRedisAuth({"", (dir_ / "a-dir").string()}).status().code(), StatusCode::kFailedPrecondition);
  const std::string target = File("target", "pw\n", 0600);
  std::filesystem::create_symlink(target, dir_ / "link");
  EXPECT_FALSE(LoadRedisAuth({"", (dir_ / "link").string()}).ok()) << "a symlink is not followed";
}

TEST_F(AuthSourceTest, TheEnvironmentGivesWhatNoFlagDoes) {
  EXPECT_TRUE(LoadRedisAuth({}).value().empty()) << "nothing given: no AUTH";
  setenv(kRemotePasswordEnv, "from the environment", 1);  // NOLINT(concurrency-mt-unsafe)
  auto auth = LoadRedisAuth({});
  EXPECT_EQ(auth->password, "from the environment");
  EXPECT_EQ(auth->user, "");
  setenv(kRemoteUserEnv, "env-user", 1);  // NOLINT(concurrency-mt-unsafe)
  EXPECT_EQ(LoadRedisAuth({})->user, "env-user");
  EXPECT_EQ(LoadRedisAuth({"flag-user", ""})->user, "flag-user") << "the flag wins";
  EXPECT_EQ(LoadRedisAuth({"", File("pw", "from the file\n", 0600)})->password, "from the file")
      << "the file wins";
  unsetenv(kRemotePasswordEnv);  // NOLINT(concurrency-mt-unsafe)
  auto no_password = LoadRedisAuth({"team-a-daemon", ""});
  EXPECT_EQ(no_password.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_password.status().message().find("has no password"), std::string::npos);
}

}  // namespace
}  // namespace primecache::remote

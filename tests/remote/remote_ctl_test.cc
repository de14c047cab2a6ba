// The remote tier as an operator sees it: a daemon's remote counters in
// `stats` (over the wire and through primecachectl).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "primecache/snapshot.h"
#include "remote/tier.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/remote/redis_cluster_harness.h"

namespace primecache::testing {
namespace {

using nlohmann::json;
using remote::testing::RedisCluster;

// A model with a real fingerprint, its descriptor sent along.
ModelId FingerprintedModel() {
  ModelFingerprint fp;
  fp.architecture = "remote-model";
  fp.plan_digest = {21, 22};
  fp.weights_digest = {23, 24};
  fp.codec_versions = {"kda-recurrent/v1", "mla-latent/v1", "raw/v1"};
  return ModelId{fp.Digest(), fp.architecture, EncodeFingerprint(fp)};
}

std::vector<LayerBytes> AsLayerBytes(const std::vector<LayerData>& layers) {
  std::vector<LayerBytes> out;
  for (const LayerData& l : layers) {
    LayerBytes& b = out.emplace_back();
    b.header.assign(reinterpret_cast<const char*>(l.header.data()), l.header.size());
    for (const auto& c : l.chunks) b.chunks.emplace_back(reinterpret_cast<const char*>(c.data()), c.size());
  }
  return out;
}

PublishRequest RequestOf(const ModelId& model, std::span<const std::uint32_t> tokens, std::string ns = "") {
  PublishRequest r;
  r.model = model.digest;
  r.model_name = model.name;
  r.model_descriptor = model.descriptor;
  r.ns = std::move(ns);
  r.tokens.assign(tokens.begin(), tokens.end());
  return r;
}

// A RemoteTier of its own ("another host") on the test's cluster.
std::unique_ptr<remote::RemoteTier> OtherHost(const RedisCluster& cluster) {
  auto c = remote::ClusterClient::Connect(cluster.Options());
  if (!c.ok()) return nullptr;
  return std::make_unique<remote::RemoteTier>(std::shared_ptr<remote::ClusterClient>(std::move(c).value()));
}

struct CtlRun : ProcessResult {
  json Json() const {
    json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "stdout is not JSON:\n" << out << "\nstderr:\n" << err;
    return j;
  }
};

CtlRun Ctl(std::vector<std::string> args) {
  args.insert(args.begin(), PRIMECACHECTL_PATH);
  return CtlRun{RunProcess(std::move(args))};
}

// The daemon's counters over the wire, waiting (up to 10 s) until `done` holds.
template <typename Pred>
std::optional<DaemonStats> StatWhen(Client& c, Pred done) {
  std::optional<DaemonStats> last;
  for (int i = 0; i < 200; ++i) {
    auto s = c.Stat();
    if (s.ok()) {
      last = *s;
      if (done(*s)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return last;
}

// ---- stats ------------------------------------------------------------------------------

TEST(RemoteStats, PutHitAndMissMoveTheCountersOverTheWire) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  Daemon d({"--remote", cluster.url()});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto fresh = (*c)->Stat();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE(fresh->remote.has_value()) << "a daemon with --remote reports no remote counters";
  EXPECT_EQ(fresh->remote->hits + fresh->remote->misses + fresh->remote->errors + fresh->remote->put, 0u);

  // Another host put an entry: this daemon's lookup brings it over (a hit).
  const ModelId model = FingerprintedModel();
  const auto shared = Tokens(600, 7);
  auto other = OtherHost(cluster);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->Put(RequestOf(model, shared), AsLayerBytes(MakeLayers(600, 2, 7))).ok());
  auto hit = (*c)->Lookup(model, shared);
  ASSERT_TRUE(hit.ok() && hit->has_value()) << "the cluster's entry was not found";
  EXPECT_EQ((*hit)->length, 600u);
  // Tokens nobody stored: a remote miss.
  auto miss = (*c)->Lookup(model, Tokens(300, 99));
  ASSERT_TRUE(miss.ok() && !miss->has_value());
  // A publish here goes to the cluster behind the client's back.
  ASSERT_TRUE((*c)->Publish(model, Tokens(256, 8), MakeLayers(256, 2, 8)).ok());

  auto st = StatWhen(**c, [](const DaemonStats& s) { return s.remote && s.remote->put == 1; });
  ASSERT_TRUE(st && st->remote);
  const RemoteStats& r = *st->remote;
  EXPECT_EQ(r.hits, 1u);
  EXPECT_EQ(r.misses, 1u);
  EXPECT_EQ(r.errors, 0u);
  EXPECT_GT(r.fetched_bytes, 0u);
  EXPECT_EQ(r.queued, 1u);  // the imported entry is not written back
  EXPECT_EQ(r.put, 1u);
  EXPECT_GT(r.put_bytes, 0u);
  EXPECT_EQ(r.dropped, 0u);
  EXPECT_FALSE(r.breaker_open);

  // primecachectl shows the same figures, as JSON and as text.
  json j = Ctl({"--socket", d.admin_socket(), "stats", "--json"}).Json();
  ASSERT_TRUE(j["remote"].is_object()) << j.dump();
  EXPECT_EQ(j["remote"]["hits"], 1);
  EXPECT_EQ(j["remote"]["misses"], 1);
  EXPECT_EQ(j["remote"]["errors"], 0);
  EXPECT_EQ(j["remote"]["fetched_bytes"], r.fetched_bytes);
  EXPECT_EQ(j["remote"]["write_behind"]["put"], 1);
  EXPECT_EQ(j["remote"]["breaker"]["open"], false);
  CtlRun text = Ctl({"--socket", d.admin_socket(), "stats"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("1 hits, 1 misses, 0 errors"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("breaker closed"), std::string::npos) << text.out;
}

TEST(RemoteStats, ADaemonWithoutARemoteTierReportsNone) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto st = (*c)->Stat();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_FALSE(st->remote.has_value());
  json j = Ctl({"--socket", d.admin_socket(), "stats", "--json"}).Json();
  EXPECT_TRUE(j["remote"].is_null()) << j.dump();
  CtlRun text = Ctl({"--socket", d.admin_socket(), "stats"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("remote tier"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("remote lookups"), std::string::npos) << text.out;
}

TEST(RemoteStats, WithTheClusterDownErrorsRiseAndLocalServiceGoesOn) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  Daemon d({"--remote", cluster.url(), "--remote-timeout", "0.2"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ModelId model = FingerprintedModel();
  const auto local = Tokens(256, 5);
  ASSERT_TRUE((*c)->Publish(model, local, MakeLayers(256, 2, 5)).ok());
  ASSERT_TRUE(StatWhen(**c, [](const DaemonStats& s) { return s.remote && s.remote->put == 1; }));
  cluster.StopAll();

  constexpr int kLookups = 4;
  for (int i = 0; i < kLookups; ++i) {
    auto miss = (*c)->Lookup(model, Tokens(300, 100 + i));
    ASSERT_TRUE(miss.ok()) << miss.status().ToString();
    EXPECT_FALSE(miss->has_value());
  }
  auto hit = (*c)->Lookup(model, local);  // whole locally: the cluster is not asked
  ASSERT_TRUE(hit.ok() && hit->has_value());
  auto st = (*c)->Stat();
  ASSERT_TRUE(st.ok() && st->remote);
  EXPECT_EQ(st->remote->errors, static_cast<std::uint64_t>(kLookups));
  EXPECT_EQ(st->remote->hits, 0u);
  EXPECT_EQ(st->remote->misses, 0u);
  json j = Ctl({"--socket", d.admin_socket(), "stats", "--json"}).Json();
  EXPECT_EQ(j["remote"]["errors"], kLookups) << j.dump();
}

}  // namespace
}  // namespace primecache::testing

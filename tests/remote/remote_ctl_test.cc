// The remote tier as an operator sees it: a daemon's remote counters in
// `stats` (over the wire and through primecachectl), and primecachectl's
// `ls`, `show` and `verify` of entries in the cluster itself.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>
#include <nlohmann/json.hpp>
#include <thread>

#include "primecache/checksum.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/model.h"
#include "primecache/internal/snapshot.h"
#include "remote/manifest.h"
#include "remote/tier.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/remote/redis_cluster_harness.h"
#include "tests/remote/remote_daemon_util.h"

namespace primecache::testing {
namespace {

using nlohmann::json;
using remote::testing::RedisCluster;

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


TEST(RemoteStats, ARecentMissIsNotAskedAgainUntilItsTtlPasses) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  Daemon d({"--remote", cluster.url(), "--remote-miss-ttl", "3"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ModelId model = FingerprintedModel();
  const auto query = Tokens(400, 31);
  const auto first_miss = std::chrono::steady_clock::now();
  auto miss = (*c)->Lookup(model, query);
  ASSERT_TRUE(miss.ok() && !miss->has_value());
  // Asked again at once: answered without the cluster.
  ASSERT_TRUE((*c)->Lookup(model, query).ok());
  // Another host puts it meanwhile: within the ttl the daemon still says miss.
  auto other = OtherHost(cluster);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->Put(RequestOf(model, query), AsLayerBytes(MakeLayers(400, 2, 31))).ok());
  auto still = (*c)->Lookup(model, query);
  ASSERT_TRUE(still.ok() && !still->has_value());
  // Another query is asked as ever.
  ASSERT_TRUE((*c)->Lookup(model, Tokens(300, 32)).ok());
  auto st = (*c)->Stat();
  ASSERT_TRUE(st.ok() && st->remote);
  ASSERT_LT(std::chrono::steady_clock::now() - first_miss, std::chrono::seconds(3)) << "too slow to test a 3 s ttl";
  EXPECT_EQ(st->remote->misses, 2u);
  EXPECT_EQ(st->remote->misses_cached, 2u);
  EXPECT_EQ(st->remote->hits, 0u);
  // Once the ttl has passed the cluster is asked again, and has it.
  std::this_thread::sleep_until(first_miss + std::chrono::milliseconds(3200));
  auto hit = (*c)->Lookup(model, query);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->length, query.size());
  st = (*c)->Stat();
  ASSERT_TRUE(st.ok() && st->remote);
  EXPECT_EQ(st->remote->hits, 1u);
  EXPECT_EQ(st->remote->misses_cached, 2u);
  json j = Ctl({"--socket", d.admin_socket(), "stats", "--json"}).Json();
  EXPECT_EQ(j["remote"]["misses_cached"], 2) << j.dump();
}

TEST(RemoteStats, AZeroMissTtlAsksTheClusterEveryTime) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  Daemon d({"--remote", cluster.url(), "--remote-miss-ttl", "0"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto query = Tokens(400, 33);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*c)->Lookup(FingerprintedModel(), query).ok());
  auto st = (*c)->Stat();
  ASSERT_TRUE(st.ok() && st->remote);
  EXPECT_EQ(st->remote->misses, 3u);
  EXPECT_EQ(st->remote->misses_cached, 0u);
}

// ---- entries whose layers lie ------------------------------------------------------------

// One layer of this shape, random values, raw transform, as stored bytes.
LayerBytes RawLayer(const LayerShape& shape, std::uint32_t seed) {
  auto snap = MakeSnapshot(shape);
  EXPECT_TRUE(snap.ok()) << snap.status().ToString();
  std::mt19937 g(seed);
  for (auto plane : CodecRegistry::Default().KindFor(shape).value()->MutablePlaneData(*snap)) {
    for (float& x : plane) x = static_cast<float>(g() % 1000) * 0.5f;
  }
  EncodeOptions eo;
  eo.all_planes = TransformSpec{std::string(kRawTransform), 0};
  eo.target_chunk_bytes = 64 * 64 * sizeof(float);
  auto enc = EncodeLayer(*snap, eo);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  return AsLayerBytes({ToLayerData(*enc)}).front();
}

// Edits a stored layer's header and serializes it again (its own checksum
// made right, so that only what the edit says is wrong).
void EditHeader(LayerBytes* layer, const std::function<void(LayerHeader&)>& edit) {
  auto h = ParseLayerHeader(AsBytes(layer->header));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  edit(*h);
  layer->header = SerializeLayerHeader(*h);
}

struct Lie {
  std::string what;
  std::function<std::vector<LayerBytes>(std::size_t tokens)> layers;
};

// Entries another host put whose every chunk is there and matches its
// address, so the tier's own checks pass them, but whose layers are not what
// this model can restore. Each is refused by the daemon that brings it over:
// no hit, nothing stored, counted as refused, removed from the cluster, and
// not fetched again.
TEST(RemoteRefusal, AnEntryWhoseChunksHashRightButWhoseLayersLieIsRefused) {
  const std::vector<Lie> lies = {
      {"a geometry the model does not have (latent rows of 32 floats, not 64)",
       [](std::size_t n) { return AsLayerBytes(MakeLayers(n, 2, 41, /*width=*/32)); }},
      {"another kind (a KV layer where the model has a latent one)",
       [](std::size_t n) {
         auto layers = AsLayerBytes(MakeLayers(n, 2, 42));
         layers[0] = RawLayer(KvShape{n, 32, 32, {}, 0}, 42);
         return layers;
       }},
      {"plane sizes its shape does not give (a chunk's decoded size)",
       [](std::size_t n) {
         auto layers = AsLayerBytes(MakeLayers(n, 2, 43));
         EditHeader(&layers[0], [](LayerHeader& h) { h.planes[0].chunks[0].raw_bytes += 4; });
         return layers;
       }},
      {"chunk bytes that are not the floats the header declares (encoded checksum made to match)",
       [](std::size_t n) {
         auto layers = AsLayerBytes(MakeLayers(n, 2, 44));
         layers[0].chunks[0][5] ^= 0x40;
         const std::string& c = layers[0].chunks[0];
         const std::uint64_t sum = Checksum64(AsBytes(c));
         EditHeader(&layers[0], [&](LayerHeader& h) { h.planes[0].chunks[0].encoded_checksum = sum; });
         return layers;
       }},
  };
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  Daemon d({"--remote", cluster.url(), "--remote-miss-ttl", "60"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto other = OtherHost(cluster);
  ASSERT_NE(other, nullptr);
  const ModelId model = FingerprintedModel();

  for (std::size_t i = 0; i < lies.size(); ++i) {
    SCOPED_TRACE(lies[i].what);
    const auto tokens = Tokens(300, static_cast<std::uint32_t>(500 + i));
    ASSERT_TRUE(other->Put(RequestOf(model, tokens), lies[i].layers(tokens.size())).ok());
    const std::string key = remote::ManifestKey(model.digest, "", tokens);
    ASSERT_TRUE(other->client().Get(key).value().has_value());

    auto hit = (*c)->Lookup(model, tokens);
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    EXPECT_FALSE(hit->has_value()) << "a lying entry was served";
    auto st = (*c)->Stat();
    ASSERT_TRUE(st.ok() && st->remote);
    EXPECT_EQ(st->remote->refused, i + 1);
    EXPECT_EQ(st->remote->hits, 0u);
    EXPECT_EQ(st->store.entries, 0u) << "a refused entry was stored";
    EXPECT_FALSE(other->client().Get(key).value().has_value()) << "the refused entry stayed in the cluster";
    // Asked again: not fetched again (the query is remembered as a miss).
    auto again = (*c)->Lookup(model, tokens);
    ASSERT_TRUE(again.ok() && !again->has_value());
    st = (*c)->Stat();
    ASSERT_TRUE(st.ok() && st->remote);
    EXPECT_EQ(st->remote->refused, i + 1);
    EXPECT_EQ(st->remote->misses_cached, i + 1);
  }
  // A truthful entry of the same model is still taken.
  const auto good = Tokens(300, 600);
  ASSERT_TRUE(other->Put(RequestOf(model, good), AsLayerBytes(MakeLayers(good.size(), 2, 45))).ok());
  auto hit = (*c)->Lookup(model, good);
  ASSERT_TRUE(hit.ok() && hit->has_value()) << "the model's own entry was refused too";
  json j = Ctl({"--socket", d.admin_socket(), "stats", "--json"}).Json();
  EXPECT_EQ(j["remote"]["refused"], lies.size()) << j.dump();
  EXPECT_EQ(j["entries"], 1) << j.dump();
  CtlRun text = Ctl({"--socket", d.admin_socket(), "stats"});
  EXPECT_NE(text.out.find(std::to_string(lies.size()) + " refused (removed)"), std::string::npos) << text.out;
}

// ---- ls / show / verify --remote ---------------------------------------------------------

// The byte tokenizer's tokens of a text (BOS, then the bytes).
std::vector<std::uint32_t> TextTokens(const std::string& text) {
  std::vector<std::uint32_t> t = {model::kBosToken};
  for (unsigned char c : text) t.push_back(c);
  return t;
}

const char kText[] =
    "The ferry left the harbour at six, and the harbour master wrote down its name, its cargo and the wind.";

class RemoteCtlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.ok()) << cluster_.error();
    tier_ = OtherHost(cluster_);
    ASSERT_NE(tier_, nullptr);
    tokens_ = TextTokens(kText);
    layers_ = AsLayerBytes(MakeLayers(tokens_.size(), 2, 11));
    request_ = RequestOf(model_, tokens_, "team-a");
    ASSERT_TRUE(tier_->Put(request_, layers_).ok());
    key_ = remote::ManifestKey(model_.digest, "team-a", tokens_);
  }
  CtlRun Remote(std::vector<std::string> args) const {
    args.insert(args.begin() + 1, {"--remote", cluster_.url()});
    return Ctl(std::move(args));
  }
  // The cluster key of chunk `c` of layer `l` of the test's entry.
  std::string ChunkKeyOf(std::size_t l, std::size_t c) const {
    const remote::RemoteManifest m = remote::ManifestOf(request_, layers_);
    return remote::ChunkKey(m.entry.ns, m.layers[l].chunks[c].address);
  }
  std::string Id() const { return key_.substr(key_.size() - 32); }

  RedisCluster cluster_;
  std::unique_ptr<remote::RemoteTier> tier_;
  const ModelId model_ = FingerprintedModel();
  std::vector<std::uint32_t> tokens_;
  std::vector<LayerBytes> layers_;
  PublishRequest request_;
  std::string key_;
};

TEST_F(RemoteCtlTest, LsListsTheManifestsInTheCluster) {
  const auto other = Tokens(300, 3);
  ASSERT_TRUE(tier_->Put(RequestOf(model_, other), AsLayerBytes(MakeLayers(300, 2, 3))).ok());
  CtlRun r = Remote({"ls", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = r.Json();
  ASSERT_EQ(j["entries"].size(), 2u) << j.dump();
  json e;
  for (const auto& x : j["entries"]) {
    if (x["namespace"] == "team-a") e = x;
  }
  ASSERT_FALSE(e.is_null()) << j.dump();
  EXPECT_EQ(e["key"], key_);
  EXPECT_EQ(e["id"], Id());
  EXPECT_EQ(e["model"]["name"], "remote-model");
  EXPECT_EQ(e["length"], tokens_.size());
  EXPECT_EQ(e["layers"], 2);
  std::uint64_t chunks = 0, bytes = 0;
  for (const auto& l : layers_) {
    chunks += l.chunks.size();
    for (const auto& c : l.chunks) bytes += c.size();
  }
  EXPECT_EQ(e["chunks"], chunks);
  EXPECT_EQ(e["bytes"], bytes);
  EXPECT_TRUE(j["unreadable"].empty());

  j = Remote({"ls", "--json", "--namespace", "team-a"}).Json();
  ASSERT_EQ(j["entries"].size(), 1u);
  j = Remote({"ls", "--json", "--min-length", "200", "--sort", "length"}).Json();
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["length"], 300);
  CtlRun text = Remote({"ls"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find(Id().substr(0, 12)), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("team-a"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("2 remote entries"), std::string::npos) << text.out;
  EXPECT_EQ(Remote({"ls", "--quarantined"}).rc, 2);
}

TEST_F(RemoteCtlTest, ShowPrintsOneManifest) {
  CtlRun r = Remote({"show", Id().substr(0, 8), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = r.Json();
  EXPECT_EQ(j["entry"]["key"], key_);
  EXPECT_EQ(j["entry"]["namespace"], "team-a");
  EXPECT_EQ(j["tokens"]["count"], tokens_.size());
  EXPECT_NE(j["tokens"]["text"].get<std::string>().find("harbour master"), std::string::npos) << j.dump();
  EXPECT_EQ(j["fingerprint"]["architecture"], "remote-model");
  ASSERT_EQ(j["layers"].size(), 2u);
  EXPECT_EQ(j["layers"][0]["kind"], "mla-latent/v1");
  EXPECT_EQ(j["layers"][1]["kind"], "kda-recurrent/v1");
  EXPECT_EQ(j["layers"][0]["chunk_refs"].size(), layers_[0].chunks.size());
  EXPECT_EQ(j["layers"][0]["chunk_refs"][0]["key"], ChunkKeyOf(0, 0));

  CtlRun text = Remote({"show", key_});  // the full key names it too
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("remote entry " + Id()), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("team-a"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("mla-latent"), std::string::npos) << text.out;

  EXPECT_EQ(Remote({"show", "0123456789abcdef0123"}).rc, 3);  // no such id
  EXPECT_EQ(Remote({"verify", "0123456789abcdef0123"}).rc, 3);
  EXPECT_EQ(Remote({"show", "zz"}).rc, 2);
}

// A tensor-parallel entry in the cluster (manifest version 2) shows its
// rank count, as a local one does.
TEST_F(RemoteCtlTest, ShowGivesATensorParallelEntrysRanks) {
  const auto tokens = Tokens(300, 9);
  const auto parts = MakeGroupParts(tokens.size(), 9);
  std::vector<LayerData> all = parts[0];
  all.insert(all.end(), parts[1].begin(), parts[1].end());
  PublishRequest req = RequestOf(model_, tokens, "team-b");
  req.ranks = 2;
  ASSERT_TRUE(tier_->Put(req, AsLayerBytes(all)).ok());
  const std::string key = remote::ManifestKey(model_.digest, "team-b", tokens);
  CtlRun r = Remote({"show", key, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["entry"]["ranks"], 2) << r.out;
  EXPECT_EQ(r.Json()["layers"].size(), 3u);
  CtlRun text = Remote({"show", key});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("ranks      2 (tensor-parallel"), std::string::npos) << text.out;
}

TEST_F(RemoteCtlTest, VerifyPassesAGoodEntryAndFindsACorruptedOrMissingChunk) {
  CtlRun r = Remote({"verify", Id()});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ok: remote entry"), std::string::npos) << r.out;

  remote::ClusterClient& c = tier_->client();
  const std::string chunk = ChunkKeyOf(0, 0);
  std::string bytes = layers_[0].chunks[0];
  bytes[bytes.size() / 2] ^= 0x5a;
  ASSERT_TRUE(c.Set(chunk, bytes).ok());
  r = Remote({"verify", Id(), "--json"});
  EXPECT_EQ(r.rc, 1) << r.out;
  json j = r.Json();
  EXPECT_FALSE(j["ok"].get<bool>());
  ASSERT_EQ(j["problems"].size(), 1u) << j.dump();
  EXPECT_NE(j["problems"][0]["where"].get<std::string>().find("layer 0, chunk 0 (" + chunk + ")"), std::string::npos)
      << j.dump();
  EXPECT_NE(j["problems"][0]["what"].get<std::string>().find("corrupted"), std::string::npos) << j.dump();

  ASSERT_TRUE(c.Set(chunk, layers_[0].chunks[0].substr(1)).ok());  // truncated
  r = Remote({"verify", Id()});
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;

  ASSERT_TRUE(c.Set(chunk, layers_[0].chunks[0]).ok());  // mended
  ASSERT_EQ(Remote({"verify", Id()}).rc, 0);
  const std::string gone = ChunkKeyOf(1, 0);
  ASSERT_TRUE(c.Del(gone).ok());
  r = Remote({"verify", Id()});
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("DAMAGE: remote entry " + key_), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 1, chunk 0 (" + gone + "): missing"), std::string::npos) << r.out;
  // verify only reads: the damage is still there to be seen.
  EXPECT_EQ(Remote({"verify", Id()}).rc, 1);
}

TEST_F(RemoteCtlTest, VerifyValidatesLayersWhoseChunksMatchTheirAddresses) {
  // Another entry whose manifest agrees with its chunks, but whose layer 0
  // chunk holds other bytes than its header describes: only decoding and
  // validating the layer finds it.
  const auto tokens = TextTokens(std::string(kText) + " Then it rained.");
  auto layers = AsLayerBytes(MakeLayers(tokens.size(), 2, 12));
  layers[0].chunks[0][0] ^= 0x01;
  ASSERT_TRUE(tier_->Put(RequestOf(model_, tokens, "team-a"), layers).ok());
  const std::string key = remote::ManifestKey(model_.digest, "team-a", tokens);
  CtlRun r = Remote({"verify", key, "--json"});
  EXPECT_EQ(r.rc, 1) << r.out;
  json j = r.Json();
  ASSERT_FALSE(j["problems"].empty()) << j.dump();
  const std::string where = j["problems"][0]["where"];
  EXPECT_NE(where.find("layer 0"), std::string::npos) << j.dump();
  EXPECT_EQ(where.find("chunk"), std::string::npos) << "the chunk matches its address; the layer is what fails";

  // An index member removed: the entry is there but no lookup can reach it.
  ASSERT_TRUE(tier_->Remove(model_.digest, "team-a", tokens_).ok());
  ASSERT_TRUE(tier_->client().Set(key_, remote::EncodeManifest(remote::ManifestOf(request_, layers_))).ok());
  r = Remote({"verify", Id()});
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("lookups never find it"), std::string::npos) << r.out;
}

TEST(RemoteCtl, AClusterNobodyAnswersIsUnavailable) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string url = cluster.url();
  cluster.StopAll();
  CtlRun r = Ctl({"ls", "--remote", url, "--timeout", "1"});
  EXPECT_EQ(r.rc, 4) << r.out << r.err;
  EXPECT_NE(r.err.find("no node of the cluster"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace primecache::testing

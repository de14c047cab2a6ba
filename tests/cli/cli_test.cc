// primecachectl against a real primecached (and against its stopped store):
// every command, its --json documents, its exit statuses; verify finding
// damage planted in the database and in .pcsnap files; export -> import ->
// export byte-exact.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "daemon_harness.h"
#include "primecache/internal/model.h"
#include "primecache/internal/snapshot.h"
#include "raw_db.h"
#include "segment_util.h"
#include "tests/codecs/codec_test_util.h"
#include "statestore/format.h"

namespace primecache::testing {
namespace {

namespace si = statestore_internal;
using nlohmann::json;
constexpr int kExitRefusedCode = 5;  // docs/cli.md

struct CtlRun : ProcessResult {
  json Json() const {
    json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "stdout is not JSON:\n" << out << "\nstderr:\n" << err;
    return j;
  }
};

// Runs a program with these arguments (as another uid when given).
CtlRun Spawn(const std::string& program, const std::vector<std::string>& args,
             std::optional<uid_t> as_uid = std::nullopt) {
  std::vector<std::string> all = {program};
  all.insert(all.end(), args.begin(), args.end());
  return CtlRun{RunProcess(std::move(all), as_uid)};
}

// Runs primecachectl with these arguments (as another uid when given).
CtlRun Ctl(const std::vector<std::string>& args, std::optional<uid_t> as_uid = std::nullopt) {
  return Spawn(PRIMECACHECTL_PATH, args, as_uid);
}

// The model a test publishes for: a real fingerprint, its descriptor sent,
// whose plan is that of MakeLayers' entries of `layers` layers.
ModelFingerprint Fingerprint(std::string arch = "cli-model", std::uint32_t layers = 2) {
  ModelFingerprint fp;
  fp.architecture = std::move(arch);
  fp.plan_digest = MakeLayersPlan(layers);
  fp.weights_digest = {13, 14};
  fp.codec_versions = {"kda-recurrent/v1", "mla-latent/v1", "raw/v1"};
  return fp;
}
ModelId IdOf(const ModelFingerprint& fp) {
  return ModelId{fp.Digest(), fp.architecture, EncodeFingerprint(fp), {}};
}

// The byte tokenizer's tokens of a text (BOS, then the bytes).
std::vector<std::uint32_t> TextTokens(const std::string& text) {
  std::vector<std::uint32_t> t = {model::kBosToken};
  for (unsigned char c : text) t.push_back(c);
  return t;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()); }

  std::vector<std::string> At(std::vector<std::string> args) const {
    std::vector<std::string> a = {"--data-dir", d_.data_dir(), "--socket", d_.admin_socket(), "--no-progress"};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  CtlRun Ctl(std::vector<std::string> args) const { return testing::Ctl(At(std::move(args))); }

  std::unique_ptr<Client> Connect(const std::string& ns = "") {
    auto c = Client::Connect(d_.Options(ns));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::uint64_t Publish(const ModelId& m, const std::vector<std::uint32_t>& tokens, std::uint32_t layers,
                        std::uint32_t seed, const std::string& ns = "") {
    auto c = Connect(ns);
    if (!c) return 0;
    auto r = c->Publish(m, tokens, MakeLayers(tokens.size(), layers, seed));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->id : 0;
  }

  Daemon d_;
};

TEST_F(CliTest, LsFiltersSortsAndPrintsJson) {
  const auto fp_a = Fingerprint("model-a"), fp_b = Fingerprint("model-b");
  const std::uint64_t e1 = Publish(IdOf(fp_a), TextTokens("short prompt"), 2, 1);
  const std::uint64_t e2 = Publish(IdOf(Fingerprint("model-a", 4)), TextTokens(std::string(300, 'x')), 4, 2, "tenant");
  const std::uint64_t e3 = Publish(IdOf(fp_b), TextTokens("another prompt of middle size"), 2, 3);

  CtlRun r = Ctl({"ls", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = r.Json();
  ASSERT_EQ(j["entries"].size(), 3u);
  std::set<std::uint64_t> ids;
  for (const auto& e : j["entries"]) ids.insert(e["id"].get<std::uint64_t>());
  EXPECT_EQ(ids, (std::set<std::uint64_t>{e1, e2, e3}));
  const json& first = j["entries"][0];
  EXPECT_EQ(first["id"], e1);
  EXPECT_EQ(first["state"], "live");
  EXPECT_EQ(first["model"]["name"], "model-a");
  EXPECT_EQ(first["model"]["digest"].get<std::string>().size(), 32u);
  EXPECT_EQ(first["namespace"], "");
  EXPECT_EQ(first["length"], TextTokens("short prompt").size());
  EXPECT_EQ(first["layers"], 2);
  EXPECT_GT(first["stored_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(first["raw_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(first["exportable"], true);
  EXPECT_TRUE(first.contains("age_seconds") && first.contains("hits") && first.contains("created_unix_ms"));

  j = Ctl({"ls", "--json", "--namespace", "tenant"}).Json();
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["id"], e2);
  j = Ctl({"ls", "--json", "--model", "model-b"}).Json();
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["id"], e3);
  const std::string digest = Ctl({"ls", "--json"}).Json()["entries"][2]["model"]["digest"];
  j = Ctl({"ls", "--json", "--model", digest.substr(0, 8)}).Json();
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["id"], e3);
  j = Ctl({"ls", "--json", "--sort", "length", "--reverse"}).Json();
  ASSERT_EQ(j["entries"].size(), 3u);
  EXPECT_EQ(j["entries"][0]["id"], e2);
  EXPECT_EQ(j["entries"][2]["id"], e1);
  j = Ctl({"ls", "--json", "--min-length", "20", "--sort", "length", "--limit", "1"}).Json();
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["id"], e3);

  // For people: a table with a header and one row per entry.
  r = Ctl({"ls"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("FINGERPRINT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model-b"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tenant"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 entries"), std::string::npos) << r.out;
  EXPECT_EQ(Ctl({"ls", "--sort", "colour"}).rc, 2);
}

TEST_F(CliTest, ShowGivesLayersFingerprintAndText) {
  const auto fp = Fingerprint("cli-model", 4);
  const std::string prompt = "The quick brown fox\tjumps over the lazy dog";
  const std::uint64_t id = Publish(IdOf(fp), TextTokens(prompt), 4, 5);
  CtlRun r = Ctl({"show", std::to_string(id), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = r.Json();
  EXPECT_EQ(j["entry"]["id"], id);
  EXPECT_EQ(j["tokens"]["count"], TextTokens(prompt).size());
  EXPECT_EQ(j["tokens"]["text"], "<bos>The quick brown fox\\tjumps over the lazy dog");
  EXPECT_EQ(j["tokens"]["shortened"], false);
  EXPECT_EQ(j["fingerprint"]["architecture"], "cli-model");
  EXPECT_EQ(j["fingerprint"]["codec_versions"].size(), 3u);
  ASSERT_EQ(j["layers"].size(), 4u);
  EXPECT_EQ(j["layers"][0]["kind"], "mla-latent/v1");
  EXPECT_EQ(j["layers"][0]["geometry"]["len"], TextTokens(prompt).size());
  EXPECT_EQ(j["layers"][0]["geometry"]["width"], 64);
  EXPECT_EQ(j["layers"][1]["kind"], "kda-recurrent/v1");
  EXPECT_EQ(j["layers"][1]["geometry"]["heads"], 2);
  EXPECT_EQ(j["layers"][0]["planes"][0]["transform"], "raw/v1");
  EXPECT_EQ(j["layers"][0]["checksum"].get<std::string>().size(), 16u);
  std::uint64_t encoded = 0;
  for (const auto& l : j["layers"]) encoded += l["encoded_bytes"].get<std::uint64_t>();
  EXPECT_EQ(encoded, j["entry"]["stored_bytes"].get<std::uint64_t>());

  // Long text is shortened in the middle, keeping both ends.
  j = Ctl({"show", std::to_string(id), "--json", "--text-chars", "20"}).Json();
  EXPECT_EQ(j["tokens"]["shortened"], true);
  const std::string text = j["tokens"]["text"];
  EXPECT_EQ(text.rfind("<bos>The", 0), 0u) << text;
  EXPECT_NE(text.find("more tokens"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("dog")) << text;

  r = Ctl({"show", std::to_string(id)});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("mla-latent/v1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("jumps over"), std::string::npos) << r.out;

  r = Ctl({"show", "9999", "--json"});
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_EQ(r.Json()["error"]["code"], "not_found");
  EXPECT_EQ(Ctl({"show"}).rc, 2);
  EXPECT_EQ(Ctl({"show", "abc"}).rc, 2);
}

// A tensor-parallel entry of two ranks (a group publish through the daemon,
// checked against the whole model's plan) shows its rank count and, for
// each layer, which model layer and rank it is.
TEST_F(CliTest, ShowGivesATensorParallelEntrysRanksAndParts) {
  const ModelId m = IdOf(Fingerprint("tp-model", 2));
  const auto tokens = TextTokens("a prompt served by two tensor-parallel ranks");
  const auto parts = MakeGroupParts(tokens.size(), 9);
  auto rank0 = Connect(), rank1 = Connect();
  std::vector<std::unique_ptr<PublishStream>> streams;
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto& c = r == 0 ? rank0 : rank1;
    auto s = c->BeginPublish(m, tokens, static_cast<std::uint32_t>(parts[r].size()), PublishGroup{5, 2, r});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (const LayerData& l : parts[r]) {
      ASSERT_TRUE((*s)->BeginLayer(l.header, static_cast<std::uint32_t>(l.chunks.size())).ok());
      for (const auto& chunk : l.chunks) ASSERT_TRUE((*s)->AddChunk(chunk).ok());
    }
    streams.push_back(std::move(s).value());
  }
  ASSERT_TRUE(streams[1]->Commit().value().group_pending);
  auto done = streams[0]->Commit();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  CtlRun r = Ctl({"show", std::to_string(done->id), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = r.Json();
  EXPECT_EQ(j["entry"]["ranks"], 2);
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_EQ(j["layers"][0]["part"], (json{{"model_layer", 0}, {"rank", 0}, {"shard", false}}));
  EXPECT_EQ(j["layers"][1]["part"], (json{{"model_layer", 1}, {"rank", 0}, {"shard", true}}));
  EXPECT_EQ(j["layers"][2]["part"], (json{{"model_layer", 1}, {"rank", 1}, {"shard", true}}));
  EXPECT_EQ(j["layers"][2]["geometry"]["heads"], 1);
  r = Ctl({"show", std::to_string(done->id)});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("ranks      2 (tensor-parallel"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 (L1 r1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 (L0 replicated)"), std::string::npos) << r.out;
  EXPECT_EQ(Ctl({"ls", "--json"}).Json()["entries"][0]["ranks"], 2);
}

// The kinds only PyTorch engines store (primecache.hf) show their geometry
// and element types like the others.
TEST_F(CliTest, ShowGivesTheLinearStateAndIndexedKvGeometry) {
  LinearStateShape linear{40, 4, 2, 8, 6};
  linear.conv_dtype = ElementType::kBf16;
  KvShape indexed{30, 12, 20, KvFormat{.index_width = 16}};
  indexed.dtype = indexed.index_dtype = ElementType::kBf16;
  std::vector<LayerData> layers;
  for (const LayerShape& shape : std::vector<LayerShape>{linear, indexed}) {
    auto planes = (*CodecRegistry::Default().KindFor(shape))->Planes(shape, CodecLimits{});
    ASSERT_TRUE(planes.ok()) << planes.status().ToString();
    std::vector<std::vector<std::byte>> bytes;
    std::vector<ElementSpan> spans;
    for (const PlaneLayout& p : *planes) bytes.emplace_back(p.raw_bytes(), std::byte{0x3c});
    for (std::size_t i = 0; i < planes->size(); ++i) spans.emplace_back(bytes[i], (*planes)[i].dtype);
    auto enc = testing_util::EncodeSpans(shape, spans);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    auto bytes_of = [](std::string_view s) {
      const auto* b = reinterpret_cast<const std::byte*>(s.data());
      return std::vector<std::byte>(b, b + s.size());
    };
    LayerData& data = layers.emplace_back();
    data.header = bytes_of(SerializeLayerHeader(enc->header));
    for (const std::string& c : enc->chunks) data.chunks.push_back(bytes_of(c));
  }
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto published = c->Publish(TestModel(9), Tokens(30, 9), layers);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  json j = Ctl({"show", std::to_string(published->id), "--json"}).Json();
  ASSERT_EQ(j["layers"].size(), 2u);
  EXPECT_EQ(j["layers"][0]["kind"], "linear-state/v1");
  EXPECT_EQ(j["layers"][0]["geometry"],
            (json{{"conv_channels", 40}, {"conv_width", 4}, {"state_heads", 2}, {"state_k_dim", 8},
                  {"state_v_dim", 6}, {"conv_dtype", "bf16"}, {"state_dtype", "f32"}}));
  EXPECT_EQ(j["layers"][1]["kind"], "kv-indexed/v1");
  EXPECT_EQ(j["layers"][1]["geometry"]["index_width"], 16);
  EXPECT_EQ(j["layers"][1]["geometry"]["index_dtype"], "bf16");
  EXPECT_EQ(j["layers"][1]["planes"][2]["plane"], "index_keys");
  CtlRun r = Ctl({"show", std::to_string(published->id)});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("conv 40 x 4, state 2 x 8 x 6, conv bf16, state f32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("len 30, k 12, v 20, index keys 16, bf16"), std::string::npos) << r.out;
}

// The reference model with attention layers through the daemon: the first
// run publishes its boundary, the second restores it; show prints each KV
// kind with its geometry.
TEST_F(CliTest, ModelRunsWithAttnLayersRestoreAndShowTheirKinds) {
  struct Case {
    const char* config;
    const char* kind;
    std::uint32_t window;
    std::uint32_t bits;
  };
  const Case cases[] = {{"hrm-tiny-swa.json", "kv-rotating/v1", 64, 0},
                        {"hrm-tiny-tq.json", "turboquant4/v1(kv-plain/v1)", 0, 4},
                        {"hrm-tiny-swa-tq2.json", "turboquant2/v1(kv-rotating/v1)", 32, 2}};
  const std::string prompt(90, 'q');
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config);
    const std::string ns = std::string("run-") + c.config;
    auto run = [&](const std::string& text) {
      return Spawn(PRIMECACHE_RUN_PATH, {"--model", std::string(PRIMECACHE_SOURCE_DIR) + "/configs/" + c.config,
                                         "--socket", d_.socket(), "--namespace", ns, "--prompt", text,
                                         "--max-new-tokens", "3", "--log-level", "warn"});
    };
    CtlRun first = run(prompt);
    ASSERT_EQ(first.rc, 0) << first.err;
    EXPECT_NE(first.out.find("restored_tokens=0 "), std::string::npos) << first.out;
    CtlRun second = run(prompt + " and then some more");
    ASSERT_EQ(second.rc, 0) << second.err;
    // The first run's boundary: BOS + the prompt (the generated tokens are not published).
    EXPECT_NE(second.out.find("restored_tokens=" + std::to_string(prompt.size() + 1) + " "), std::string::npos)
        << second.out;

    json ls = Ctl({"ls", "--namespace", ns, "--json"}).Json();
    ASSERT_FALSE(ls["entries"].empty()) << ls.dump();
    const std::string id = std::to_string(ls["entries"][0]["id"].get<std::uint64_t>());
    json j = Ctl({"show", id, "--json"}).Json();
    ASSERT_EQ(j["layers"].size(), 6u) << j.dump();
    for (std::size_t l : {2u, 5u}) {
      const json& layer = j["layers"][l];
      EXPECT_EQ(layer["kind"], c.kind);
      const json& g = layer["geometry"];
      EXPECT_EQ(g["len"], prompt.size() + 1);
      if (c.window != 0) {
        EXPECT_EQ(g["window"], c.window);
        EXPECT_EQ(g["rows"], std::min<std::size_t>(c.window, prompt.size() + 1));
      } else {
        EXPECT_FALSE(g.contains("window"));
      }
      if (c.bits != 0) {
        EXPECT_EQ(g["turboquant_bits"], c.bits);
        EXPECT_EQ(g["head_dim"], 16);
        EXPECT_EQ(g["k_width"], 2 * (1 + 16 * c.bits / 32));
      } else {
        EXPECT_EQ(g["k_width"], 32);
      }
    }
    CtlRun text = Ctl({"show", id});
    ASSERT_EQ(text.rc, 0) << text.err;
    EXPECT_NE(text.out.find(c.kind), std::string::npos) << text.out;
  }
}

// lookup: the hit and the branch point of a query given as text or ids,
// through the daemon and read-only; unknown and ambiguous models refused.
TEST_F(CliTest, LookupShowsTheHitAndTheSharedLength) {
  const std::string system(200, 's');  // a shared "system prompt" of 200 bytes
  const auto fp = Fingerprint("lookup-model");
  Publish(IdOf(fp), TextTokens(system + " and the first question"), 2, 1);
  const std::uint64_t second = Publish(IdOf(fp), TextTokens(system), 2, 2);
  const std::string query = system + " and another question";
  json j = Ctl({"lookup", "--model", "lookup-model", "--text", query, "--json"}).Json();
  EXPECT_EQ(j["query_tokens"], TextTokens(query).size()) << j.dump();
  ASSERT_TRUE(j["hit"].is_object()) << j.dump();
  EXPECT_EQ(j["hit"]["id"], second);
  EXPECT_EQ(j["hit"]["length"], 201);  // <bos> and the system prompt
  EXPECT_EQ(j["shared_tokens"], TextTokens(system + " and ").size()) << j.dump();
  // Token ids, another namespace, and the text for people.
  j = Ctl({"lookup", "--model", "lookup-model", "--tokens", "256,115,115,120", "--json"}).Json();
  EXPECT_TRUE(j["hit"].is_null());
  EXPECT_EQ(j["shared_tokens"], 0);
  j = Ctl({"lookup", "--model", "lookup-model", "--namespace", "tenant", "--text", query, "--json"}).Json();
  EXPECT_TRUE(j["hit"].is_null());
  EXPECT_EQ(j["shared_tokens"], 0);
  CtlRun text = Ctl({"lookup", "--model", "lookup-model", "--text", query});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("hit     entry " + std::to_string(second) + ": its 201 tokens restore"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("shared  206 tokens"), std::string::npos) << text.out;
  // Read-only, with the daemon stopped: the same answer.
  d_.Stop();
  j = testing::Ctl({"--data-dir", d_.data_dir(), "lookup", "--model", "lookup-model", "--text", query, "--json"}).Json();
  EXPECT_EQ(j["shared_tokens"], 206) << j.dump();
  EXPECT_EQ(testing::Ctl({"--data-dir", d_.data_dir(), "lookup", "--model", "nobody", "--text", "x"}).rc, 3);
  EXPECT_EQ(testing::Ctl({"--data-dir", d_.data_dir(), "lookup", "--model", "lookup-model"}).rc, 2);
}

TEST_F(CliTest, StatsCountHitsBytesAndDedup) {
  const auto fp = Fingerprint();
  auto tokens = Tokens(512, 9);
  // Two boundaries of one conversation share their leading latent rows.
  auto c = Connect();
  ASSERT_TRUE(c);
  const ModelId m = IdOf(fp);
  auto full = MakeLayers(512, 2, 4, 64, 64);
  ASSERT_TRUE(c->Publish(m, tokens, full).ok());
  auto half = MakeLayers(256, 2, 4, 64, 64);
  std::vector<std::uint32_t> prefix(tokens.begin(), tokens.begin() + 256);
  ASSERT_TRUE(c->Publish(m, prefix, half).ok());
  ASSERT_TRUE(c->Lookup(m, tokens).ok());
  ASSERT_TRUE(c->Lookup(m, Tokens(40, 77)).ok());

  CtlRun r = Ctl({"stats", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = r.Json();
  EXPECT_EQ(j["entries"], 2);
  EXPECT_EQ(j["quarantined"], 0);
  EXPECT_EQ(j["hits"], 1);
  EXPECT_EQ(j["misses"], 1);
  EXPECT_DOUBLE_EQ(j["hit_rate"].get<double>(), 0.5);
  EXPECT_GT(j["stored_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["dedup_saved_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["dedup_ratio"].get<double>(), 1.0);
  EXPECT_EQ(j["logical_bytes"].get<std::uint64_t>() - j["stored_bytes"].get<std::uint64_t>(),
            j["dedup_saved_bytes"].get<std::uint64_t>());
  EXPECT_GT(j["disk_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(j["daemon"].is_object());
  r = Ctl({"stats"});
  ASSERT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("hit rate 50.0%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dedup savings"), std::string::npos) << r.out;
}

// Chunk bytes overwritten in their segment and a reference count altered behind the store's
// back: verify finds both, says where, and exits 1; gc then clears the
// quarantine and verify passes again.
TEST_F(CliTest, VerifyFindsDamagePlantedInTheDatabase) {
  const auto fp = Fingerprint();
  const ModelId m = IdOf(fp);
  auto tokens_a = Tokens(300, 21), tokens_b = Tokens(200, 22);
  auto layers_a = MakeLayers(tokens_a.size(), 2, 31), layers_b = MakeLayers(tokens_b.size(), 2, 32);
  auto c = Connect();
  ASSERT_TRUE(c);
  auto a = c->Publish(m, tokens_a, layers_a);
  auto b = c->Publish(m, tokens_b, layers_b);
  ASSERT_TRUE(a.ok() && b.ok());
  c.reset();

  CtlRun r = Ctl({"verify", "--all", "--json"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.Json()["ok"], true);
  EXPECT_EQ(r.Json()["checked"]["entries"], 2);
  EXPECT_EQ(r.Json()["checked"]["layers"], 4);

  ASSERT_EQ(d_.Stop(), 0);
  const auto& bad = layers_a[0].chunks[1];
  const Hash128 bad_hash = Checksum128(bad);
  const auto& counted = layers_b[0].chunks[0];
  const Hash128 counted_hash = Checksum128(counted);
  std::string flipped(reinterpret_cast<const char*>(bad.data()), bad.size());
  flipped[flipped.size() / 2] ^= 0x10;
  store_test::OverwriteChunk(Env::Default(), d_.data_dir() + "/store", bad_hash, flipped);
  {
    store_test::RawDb db(Env::Default(), d_.data_dir() + "/store");
    auto rec = si::DecodeChunkRef(db.Get(si::kCfChunkRefs, si::HashKey(counted_hash)));
    ASSERT_TRUE(rec.ok());
    rec->refs += 3;
    db.Put(si::kCfChunkRefs, si::HashKey(counted_hash), si::EncodeChunkRef(*rec));
  }
  const std::string a_name = "entry " + std::to_string(a->id);
  auto mentions = [](const json& problems, const std::string& where, const std::string& what) {
    for (const auto& p : problems) {
      if (p["where"].get<std::string>().find(where) != std::string::npos &&
          p["what"].get<std::string>().find(what) != std::string::npos)
        return true;
    }
    return false;
  };

  // The daemon is down: read-only, damage reported, nothing quarantined.
  r = Ctl({"verify", "--all", "--json"});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  json j = r.Json();
  EXPECT_EQ(j["ok"], false);
  EXPECT_TRUE(mentions(j["problems"], a_name, "does not match its address")) << j.dump(2);
  EXPECT_TRUE(mentions(j["problems"], "store", si::HashHex(counted_hash))) << j.dump(2);
  EXPECT_NE(r.err.find("no daemon answers"), std::string::npos) << r.err;
  r = Ctl({"verify", std::to_string(b->id), "--json"});
  EXPECT_EQ(r.rc, 0) << r.out;  // entry b's own bytes are intact
  r = Ctl({"verify", std::to_string(a->id)});
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("DAMAGE"), std::string::npos) << r.out;

  // Through the daemon: the fetch quarantines entry a.
  ASSERT_TRUE(d_.Start());
  r = Ctl({"verify", "--all", "--json"});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(mentions(r.Json()["problems"], a_name, "quarantined")) << r.out;
  j = Ctl({"ls", "--quarantined", "--json"}).Json();
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["id"], a->id);
  EXPECT_EQ(j["entries"][0]["state"], "quarantined");
  EXPECT_NE(j["entries"][0]["reason"].get<std::string>().find("chunk"), std::string::npos);
  // Still damage until gc removes it.
  EXPECT_EQ(Ctl({"verify", "--all"}).rc, 1);

  j = Ctl({"gc", "--json"}).Json();
  ASSERT_EQ(j["removed"].size(), 1u);
  EXPECT_EQ(j["removed"][0]["id"], a->id);
  EXPECT_EQ(j["compacted"], true);
  EXPECT_TRUE(Ctl({"ls", "--quarantined", "--json"}).Json()["entries"].empty());
  // The altered count remains (a store-level problem gc does not hide).
  r = Ctl({"verify", "--all", "--json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(mentions(r.Json()["problems"], "store", si::HashHex(counted_hash))) << r.out;
}

TEST_F(CliTest, VerifyFindsDamageInFiles) {
  const auto fp = Fingerprint();
  const std::uint64_t id = Publish(IdOf(fp), Tokens(150, 3), 2, 8);
  const std::string file = d_.dir() + "/e.pcsnap";
  CtlRun r = Ctl({"export", std::to_string(id), file, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["layers"], 2);
  r = Ctl({"verify", "--file", file, "--json"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.Json()["checked"]["layers"], 2);

  const std::string good = ReadFile(file);
  ASSERT_GT(good.size(), 1000u);
  const std::string damaged = d_.dir() + "/damaged.pcsnap";
  for (std::size_t at : {std::size_t{3}, std::size_t{40}, good.size() / 2, good.size() - 1}) {
    std::string bytes = good;
    bytes[at] ^= 0x01;
    WriteFile(damaged, bytes);
    r = Ctl({"verify", "--file", damaged, "--json"});
    EXPECT_EQ(r.rc, 1) << "flip at " << at << ": " << r.out;
    json j = r.Json();
    EXPECT_EQ(j["ok"], false);
    ASSERT_FALSE(j["problems"].empty());
    EXPECT_NE(j["problems"][0]["where"].get<std::string>().find(damaged), std::string::npos);
  }
  WriteFile(damaged, good.substr(0, good.size() - 7));
  EXPECT_EQ(Ctl({"verify", "--file", damaged}).rc, 1);
  EXPECT_EQ(Ctl({"verify", "--file", d_.dir() + "/absent.pcsnap"}).rc, 3);
  // A damaged file is refused by import before anything is stored.
  r = Ctl({"import", damaged, "--json"});
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(r.Json().contains("error"));
  EXPECT_EQ(Ctl({"ls", "--json"}).Json()["entries"].size(), 1u);
  EXPECT_EQ(Ctl({"verify"}).rc, 2);
  EXPECT_EQ(Ctl({"verify", "1", "--all"}).rc, 2);
}

// A damaged .pcsnap is named once in what verify --file and import say.
TEST_F(CliTest, ADamagedFileIsNamedOnceInTheMessage) {
  const std::uint64_t id = Publish(IdOf(Fingerprint()), Tokens(150, 3), 2, 8);
  const std::string file = d_.dir() + "/named.pcsnap";
  ASSERT_EQ(Ctl({"export", std::to_string(id), file}).rc, 0);
  std::string bytes = ReadFile(file);
  bytes[bytes.size() / 2] ^= 0x01;  // inside a layer's section
  WriteFile(file, bytes);
  const std::string name = std::regex_replace(file, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
  const std::string mismatch = ": section [0-9]+ checksum mismatch";
  CtlRun r = Ctl({"verify", "--file", file});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\n  file " + name + mismatch + "\n"))) << r.out;
  const json j = Ctl({"verify", "--file", file, "--json"}).Json();
  ASSERT_EQ(j["problems"].size(), 1u) << j.dump();
  EXPECT_EQ(j["problems"][0]["where"], "file " + file);
  EXPECT_TRUE(std::regex_match(j["problems"][0]["what"].get<std::string>(), std::regex("section [0-9]+ checksum mismatch")))
      << j.dump();
  r = Ctl({"import", file});
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(std::regex_match(r.err, std::regex("primecachectl: corruption: " + name + mismatch + "\n"))) << r.err;
}

// export -> import into another daemon -> export: the same bytes, and the
// imported entry serves the same layers.
TEST_F(CliTest, ExportImportRoundTripIsByteExact) {
  const auto fp = Fingerprint("cli-model", 4);
  auto tokens = TextTokens("a prompt whose snapshot moves between stores");
  const std::uint64_t id = Publish(IdOf(fp), tokens, 4, 12, "tenant-x");
  const std::string f1 = d_.dir() + "/one.pcsnap", f2 = d_.dir() + "/two.pcsnap";
  ASSERT_EQ(Ctl({"export", std::to_string(id), f1}).rc, 0);
  EXPECT_EQ(Ctl({"export", std::to_string(id), f1}).rc, 5);  // exists, no --force
  ASSERT_EQ(Ctl({"export", std::to_string(id), f1, "--force"}).rc, 0);

  Daemon other;
  ASSERT_TRUE(other.Start());
  auto at_other = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {"--data-dir", other.data_dir(), "--socket", other.admin_socket()};
    a.insert(a.end(), args.begin(), args.end());
    return testing::Ctl(a);
  };
  CtlRun r = at_other({"import", f1, "--json"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  json j = r.Json();
  EXPECT_EQ(j["existed"], false);
  EXPECT_EQ(j["namespace"], "tenant-x");
  const std::uint64_t imported = j["entry"];
  ASSERT_EQ(at_other({"export", std::to_string(imported), f2}).rc, 0);
  EXPECT_EQ(ReadFile(f1), ReadFile(f2));
  // Importing again stores nothing new.
  EXPECT_EQ(at_other({"import", f1, "--json"}).Json()["existed"], true);

  // The imported entry is found by lookup in its namespace and serves the same layers.
  auto oc = Client::Connect(other.Options("tenant-x"));
  ASSERT_TRUE(oc.ok());
  auto hit = (*oc)->Lookup(IdOf(fp), tokens);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->id, imported);
  auto mine = Connect("tenant-x");
  auto x = mine->FetchLayers(id);
  auto y = (*oc)->FetchLayers(imported);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ(x->size(), y->size());
  for (std::size_t i = 0; i < x->size(); ++i) {
    EXPECT_EQ((*x)[i].data.header, (*y)[i].data.header);
    EXPECT_EQ((*x)[i].data.chunks, (*y)[i].data.chunks);
  }
  // Into another namespace on request.
  j = at_other({"import", f1, "--namespace", "elsewhere", "--json"}).Json();
  EXPECT_EQ(j["namespace"], "elsewhere");
  EXPECT_EQ(j["existed"], false);

  // An entry published without a descriptor cannot be exported whole.
  const std::uint64_t bare = Publish(TestModel(5), Tokens(50, 5), 2, 13);
  r = Ctl({"export", std::to_string(bare), d_.dir() + "/bare.pcsnap", "--json"});
  EXPECT_EQ(r.rc, 5) << r.out;
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("descriptor"), std::string::npos);
  EXPECT_EQ(Ctl({"show", std::to_string(bare), "--json"}).Json()["entry"]["exportable"], false);
  // Published without a descriptor by one client, then again by one that
  // sends it: the stored entry becomes exportable.
  const ModelFingerprint late = Fingerprint("late");
  ModelId without = IdOf(late);
  without.descriptor.clear();
  const std::uint64_t first = Publish(without, Tokens(60, 6), 2, 14);
  EXPECT_EQ(Ctl({"export", std::to_string(first), d_.dir() + "/late.pcsnap"}).rc, 5);
  EXPECT_EQ(Publish(IdOf(late), Tokens(60, 6), 2, 14), first);
  EXPECT_EQ(Ctl({"export", std::to_string(first), d_.dir() + "/late.pcsnap"}).rc, 0);
}

TEST_F(CliTest, RmGcAndCompact) {
  const auto fp = Fingerprint();
  const std::uint64_t e1 = Publish(IdOf(fp), Tokens(100, 1), 2, 1);
  const std::uint64_t e2 = Publish(IdOf(fp), Tokens(100, 2), 2, 2);
  const std::uint64_t e3 = Publish(IdOf(fp), Tokens(100, 3), 2, 3);

  CtlRun r = Ctl({"rm", std::to_string(e1), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["removed"], json::array({e1}));
  r = Ctl({"rm", std::to_string(e1), "--json"});
  EXPECT_EQ(r.rc, 3);
  EXPECT_EQ(r.Json()["failed"][0]["id"], e1);
  EXPECT_EQ(Ctl({"ls", "--json"}).Json()["entries"].size(), 2u);

  // --dry-run removes nothing; --older-than 0s removes every entry.
  json j = Ctl({"gc", "--older-than", "0s", "--dry-run", "--json"}).Json();
  EXPECT_EQ(j["dry_run"], true);
  EXPECT_EQ(j["removed"].size(), 2u);
  EXPECT_EQ(Ctl({"ls", "--json"}).Json()["entries"].size(), 2u);
  j = Ctl({"gc", "--older-than", "1d", "--json"}).Json();
  EXPECT_TRUE(j["removed"].empty());
  EXPECT_EQ(Ctl({"gc", "--older-than", "soon"}).rc, 2);
  r = Ctl({"gc", "--older-than", "0s", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  j = r.Json();
  std::set<std::uint64_t> gone;
  for (const auto& x : j["removed"]) gone.insert(x["id"].get<std::uint64_t>());
  EXPECT_EQ(gone, (std::set<std::uint64_t>{e2, e3}));
  EXPECT_LT(j["stored_bytes_after"].get<std::uint64_t>(), j["stored_bytes_before"].get<std::uint64_t>());
  EXPECT_TRUE(Ctl({"ls", "--json"}).Json()["entries"].empty());

  r = Ctl({"compact", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  j = r.Json();
  EXPECT_TRUE(j.contains("disk_bytes_before") && j.contains("disk_bytes_after"));
  EXPECT_EQ(Ctl({"verify", "--all"}).rc, 0);
}

// With the daemon stopped, reading works from the store itself; changes are
// refused with exit 5 and nothing on disk moves.
TEST_F(CliTest, ReadOnlyWhenTheDaemonIsStopped) {
  const auto fp = Fingerprint();
  const std::uint64_t id = Publish(IdOf(fp), TextTokens("kept while the daemon sleeps"), 2, 4);
  const std::string file = d_.dir() + "/ro.pcsnap";
  ASSERT_EQ(d_.Stop(), 0);

  CtlRun r = Ctl({"ls", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["entries"].size(), 1u);
  EXPECT_NE(r.Json()["source"].get<std::string>().find("read-only"), std::string::npos);
  EXPECT_NE(r.err.find("no daemon answers"), std::string::npos);
  EXPECT_EQ(Ctl({"show", std::to_string(id), "--json"}).Json()["tokens"]["text"], "<bos>kept while the daemon sleeps");
  EXPECT_EQ(Ctl({"stats", "--json"}).Json()["daemon"], nullptr);
  EXPECT_EQ(Ctl({"verify", "--all"}).rc, 0);
  EXPECT_EQ(Ctl({"export", std::to_string(id), file}).rc, 0);
  EXPECT_EQ(Ctl({"--offline", "ls", "--json"}).Json()["entries"].size(), 1u);
  for (const auto& args : std::vector<std::vector<std::string>>{{"rm", std::to_string(id)},
                                                                {"gc"},
                                                                {"compact"},
                                                                {"import", file}}) {
    r = Ctl(args);
    EXPECT_EQ(r.rc, 5) << args[0] << ": " << r.err;
    EXPECT_NE(r.err.find("daemon"), std::string::npos) << r.err;
  }
  EXPECT_EQ(Ctl({"gc", "--dry-run"}).rc, 0);

  // Back up: the entry is there, unharmed.
  ASSERT_TRUE(d_.Start());
  EXPECT_EQ(Ctl({"ls", "--json"}).Json()["entries"].size(), 1u);
  EXPECT_EQ(Ctl({"verify", std::to_string(id)}).rc, 0);
}

TEST(CliUsage, HelpUsageErrorsAndNoStore) {
  CtlRun r = Ctl({"--help"});
  EXPECT_EQ(r.rc, 0);
  for (const char* word : {"ls", "show", "verify", "rm", "gc", "stats", "export", "import", "compact", "Exit status"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << "\n" << r.out;
  }
  EXPECT_EQ(Ctl({}).rc, 2);
  EXPECT_EQ(Ctl({"frobnicate"}).rc, 2);
  const std::string empty = MakeTempDir();
  r = Ctl({"--data-dir", empty, "ls", "--json"});
  EXPECT_EQ(r.rc, 4) << r.err;
  EXPECT_EQ(r.Json()["error"]["code"], "unavailable");
  std::filesystem::remove_all(empty);
}

// The tenant socket is not the admin socket: refused, not half-served.
TEST_F(CliTest, RefusesANonAdminSocket) {
  CtlRun r = testing::Ctl({"--data-dir", d_.data_dir(), "--socket", d_.socket(), "ls"});
  EXPECT_EQ(r.rc, 5) << r.err;
  EXPECT_NE(r.err.find("admin"), std::string::npos) << r.err;
}

// With every data connection held by silent peers, the operator is served.
TEST(CliLimits, StatsAnswersWhileSilentClientsHoldEveryDataConnection) {
  Daemon d({"--max-connections", "4", "--hello-timeout", "0"});
  ASSERT_TRUE(d.Start());
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int i = 0; i < 4; ++i) {
    silent.push_back(std::make_unique<RawConn>(d.socket()));
    ASSERT_TRUE(silent.back()->ok());
  }
  const auto t0 = std::chrono::steady_clock::now();
  CtlRun r = Ctl({"--data-dir", d.data_dir(), "--socket", d.admin_socket(), "--timeout", "5", "stats", "--json"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["daemon"]["connections"], 5);  // the 4 silent ones and the CLI's
}

// A uid that reaches the admin socket (its mode loosened) but is not an
// admin is told so, and the CLI exits 5 ("refused").
TEST_F(CliTest, ARefusedUidOnTheAdminSocketIsToldWhy) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the CLI as a second uid";
  ASSERT_EQ(chmod(d_.dir().c_str(), 0711), 0);
  ASSERT_EQ(chmod(d_.admin_socket().c_str(), 0666), 0);
  CtlRun r = testing::Ctl({"--data-dir", d_.data_dir(), "--socket", d_.admin_socket(), "stats"}, 65534);
  EXPECT_EQ(r.rc, 5) << r.err;
  EXPECT_NE(r.err.find("permission denied"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("may not use the admin socket"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("reset by peer"), std::string::npos) << r.err;
}

// A schema-2 store (a fixture written by the build before segment files):
// the read-only commands refuse it naming `primecachectl migrate`, which
// migrates it; after that it reads and verifies, and migrate has nothing
// left to do.
TEST(CliMigrate, MigratesAnOlderStoreThatReadOnlyCommandsRefuse) {
  char tmpl[] = "/tmp/primecache-cli-migrate-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::filesystem::copy(std::string(STATESTORE_FIXTURES) + "/schema2-pieces/store", dir + "/store",
                        std::filesystem::copy_options::recursive);
  const std::vector<std::string> at = {"--data-dir", dir, "--socket", dir + "/none.sock", "--no-progress"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = at;
    a.insert(a.end(), more.begin(), more.end());
    return Ctl(a);
  };
  CtlRun r = with({"ls"});
  EXPECT_EQ(r.rc, kExitRefusedCode) << r.out << r.err;
  EXPECT_NE(r.err.find("primecachectl migrate"), std::string::npos) << r.err;
  r = with({"migrate", "--json"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.Json()["migrated"], true);
  EXPECT_EQ(r.Json()["entries"], 4);
  r = with({"verify", "--all", "--json"});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(r.Json()["checked"]["entries"], 4);
  r = with({"migrate"});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("nothing to migrate"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

// The subcommands the top-level --help lists (its "Subcommands:" section).
std::vector<std::string> ListedSubcommands() {
  const CtlRun r = Ctl({"--help"});
  std::vector<std::string> names;
  const std::size_t at = r.out.find("Subcommands:\n");
  EXPECT_NE(at, std::string::npos) << r.out;
  std::istringstream lines(r.out.substr(at + 13));
  for (std::string line; std::getline(lines, line) && line.starts_with("  ");) {
    names.push_back(line.substr(2, line.find(' ', 2) - 2));
  }
  return names;
}

TEST(CliUsage, EverySubcommandsHelpEndsWithExamplesOfItself) {
  const std::vector<std::string> subs = ListedSubcommands();
  EXPECT_GE(subs.size(), 10u);
  // `completion` is hidden from the list but has its own help too.
  for (const std::string& sub : [&] { auto all = subs; all.push_back("completion"); return all; }()) {
    const CtlRun r = Ctl({sub, "--help"});
    EXPECT_EQ(r.rc, 0) << sub;
    const std::size_t at = r.out.find("Examples:\n");
    ASSERT_NE(at, std::string::npos) << sub << ":\n" << r.out;
    const std::string examples = r.out.substr(at);
    EXPECT_NE(examples.find(" " + sub + " "), std::string::npos) << sub << ":\n" << examples;
    EXPECT_NE(examples.find("  primecachectl "), std::string::npos) << sub << ":\n" << examples;
  }
}

// Runs `script` in bash after sourcing the generated completion and
// completing the words `line` (the cursor after the last word); the
// candidates, space-separated.
std::string Complete(const std::string& completion_file, const std::string& line) {
  const std::string script = "source '" + completion_file + "'; COMP_WORDS=(" + line +
                             "); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _primecachectl; echo \"${COMPREPLY[*]}\"";
  const CtlRun r = Spawn("/bin/bash", {"--norc", "--noprofile", "-c", script});
  EXPECT_EQ(r.rc, 0) << r.err;
  return r.out.empty() ? r.out : r.out.substr(0, r.out.size() - 1);
}

TEST(CliCompletion, GeneratedBashScriptIsValidAndCompletesCommandsOptionsAndChoices) {
  const CtlRun gen = Ctl({"completion", "bash"});
  ASSERT_EQ(gen.rc, 0) << gen.err;
  const std::string dir = MakeTempDir(), file = dir + "/primecachectl.bash";
  WriteFile(file, gen.out);
  const CtlRun syntax = Spawn("/bin/bash", {"-n", file});
  EXPECT_EQ(syntax.rc, 0) << syntax.err;
  EXPECT_NE(gen.out.find("complete -F _primecachectl primecachectl"), std::string::npos);
  // Every listed subcommand is offered, the hidden one not.
  const std::string top = " " + Complete(file, "primecachectl ''") + " ";
  for (const std::string& sub : ListedSubcommands()) EXPECT_NE(top.find(" " + sub + " "), std::string::npos) << sub;
  EXPECT_EQ(top.find(" completion "), std::string::npos) << top;
  EXPECT_NE(top.find(" --data-dir "), std::string::npos) << top;
  EXPECT_EQ(Complete(file, "primecachectl ver"), "verify");
  EXPECT_EQ(Complete(file, "primecachectl --data-dir /tmp --json ex"), "export");
  EXPECT_EQ(Complete(file, "primecachectl ls --so"), "--socket --sort");  // a global one too
  EXPECT_EQ(Complete(file, "primecachectl ls --sort r"), "raw recent");
  EXPECT_EQ(Complete(file, "primecachectl gc --dr"), "--dry-run");
  EXPECT_EQ(Complete(file, "primecachectl --log-level w"), "warn");
  EXPECT_EQ(Complete(file, "primecachectl ls --limit ''"), "");  // a number: nothing to guess
  EXPECT_EQ(Complete(file, "primecachectl gc --js"), "--json");  // global options after the command
  EXPECT_EQ(Complete(file, "primecachectl verify --file " + dir + "/primecachectl.ba"), file);
  EXPECT_EQ(Complete(file, "primecachectl stats --sort"), "");  // ls's option is not stats'
  std::filesystem::remove_all(dir);
}

// Progress goes to stderr on a terminal only: with stderr a pipe (as here)
// and progress not turned off, the long commands write no bar, and their
// --json stdout is one JSON document.
TEST_F(CliTest, LongCommandsWriteNoProgressOffATerminalAndKeepJsonValid) {
  const std::uint64_t id = Publish(IdOf(Fingerprint("cli-model", 6)), Tokens(300, 1), 6, 1);
  Publish(IdOf(Fingerprint("cli-model", 4)), Tokens(200, 2), 4, 2);
  const std::string file = d_.dir() + "/p.pcsnap";
  const std::vector<std::vector<std::string>> commands = {
      {"verify", "--all"}, {"verify", std::to_string(id)}, {"export", std::to_string(id), file},
      {"import", file, "--namespace", "again"}, {"gc", "--older-than", "1d"}, {"compact"},
      {"ls"}, {"show", std::to_string(id)}, {"stats"}, {"rm", std::to_string(id)}};
  for (const auto& args : commands) {
    std::vector<std::string> a = {"--data-dir", d_.data_dir(), "--socket", d_.admin_socket(), "--json"};
    a.insert(a.end(), args.begin(), args.end());
    const CtlRun r = testing::Ctl(a);
    EXPECT_EQ(r.rc, 0) << args[0] << ": " << r.err;
    EXPECT_EQ(r.err.find('\r'), std::string::npos) << args[0] << " drew progress: " << r.err;
    EXPECT_EQ(r.err.find('#'), std::string::npos) << args[0] << ": " << r.err;
    EXPECT_TRUE(r.Json().is_object()) << args[0];
  }
}

}  // namespace
}  // namespace primecache::testing

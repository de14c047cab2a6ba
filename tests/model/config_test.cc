#include <gtest/gtest.h>

#include "primecache/internal/model.h"

namespace primecache::model {
namespace {

const char* kTiny = R"({
  "name": "hrm-tiny", "vocab": 258, "hidden": 64, "mlp_hidden": 128, "norm_eps": 1e-6,
  "layers": ["kda", "mla", "kda", "mla"],
  "mla": {"heads": 4, "kv_rank": 32, "rope_dim": 8, "nope_dim": 16, "v_dim": 16, "rope_theta": 10000.0,
          "indexer": {"heads": 2, "head_dim": 16, "pool": 4, "topk": 4}},
  "kda": {"heads": 4, "head_dim": 16, "conv_kernel": 4, "gate_lower_bound": -5.0}})";

TEST(ModelConfigTest, ParsesTheSpecExample) {
  auto c = ModelConfig::FromJson(kTiny);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->name, "hrm-tiny");
  EXPECT_EQ(c->layers.size(), 4u);
  EXPECT_EQ(c->layers[0], LayerType::kKda);
  EXPECT_EQ(c->layers[1], LayerType::kMla);
  EXPECT_EQ(c->mla.row_width(), 40u);
  ASSERT_TRUE(c->mla.indexer.has_value());
  EXPECT_EQ(c->mla.indexer->pool, 4u);
  EXPECT_EQ(c->kda.channels(), 64u);
  EXPECT_FLOAT_EQ(c->kda.gate_lower_bound, -5.0f);
}

TEST(ModelConfigTest, JsonRoundTrip) {
  auto c = ModelConfig::FromJson(kTiny);
  ASSERT_TRUE(c.ok());
  auto again = ModelConfig::FromJson(c->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *c);
}

TEST(ModelConfigTest, NullIndexerAndNoPe) {
  auto c = ModelConfig::FromJson(R"({"vocab": 300, "hidden": 8, "mlp_hidden": 8, "layers": ["mla"],
    "mla": {"heads": 1, "kv_rank": 4, "rope_dim": 0, "nope_dim": 2, "v_dim": 2, "indexer": null}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->mla.indexer.has_value());
  EXPECT_EQ(c->mla.row_width(), 4u);
}

TEST(ModelConfigTest, RefusesBadConfigsWithTheReason) {
  struct Case {
    const char* json;
    const char* needle;
  } cases[] = {
      {"not json", "not valid JSON"},
      {"[1,2]", "JSON object"},
      {R"({"vocab": 100, "hidden": 8, "mlp_hidden": 8, "layers": ["kda"], "kda": {"heads":1,"head_dim":2,"conv_kernel":2}})", "vocab"},
      {R"({"vocab": 258, "hidden": -1, "mlp_hidden": 8, "layers": []})", "hidden"},
      {R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["gru"]})", "unknown layer type"},
      {R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": []})", "layers"},
      {R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["mla"]})", "config.mla"},
      {R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["mla"],
           "mla": {"heads": 1, "kv_rank": 4, "rope_dim": 3, "nope_dim": 2, "v_dim": 2}})", "rope_dim must be even"},
      {R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["kda"],
           "kda": {"heads": 1, "head_dim": 2, "conv_kernel": 0}})", "kda.conv_kernel"},
      {R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["kda"],
           "kda": {"heads": 1, "head_dim": 2, "conv_kernel": 2, "gate_lower_bound": 1.0}})", "negative"},
      {R"({"vocab": 258, "hidden": 99999999, "mlp_hidden": 8, "layers": ["kda"],
           "kda": {"heads": 1, "head_dim": 2, "conv_kernel": 2}})", "hidden"},
      {R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["mla"],
           "mla": {"heads": 1, "kv_rank": 4, "rope_dim": 2, "nope_dim": 2, "v_dim": 2,
                   "indexer": {"heads": 1, "head_dim": 2, "pool": 0, "topk": 1}}})", "pool"},
  };
  for (const auto& c : cases) {
    auto r = ModelConfig::FromJson(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_TRUE(r.status().IsInvalidArgument());
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
}

TEST(ModelConfigTest, ShippedConfigsLoad) {
  for (const char* name : {"hrm-tiny.json", "hrm-glm5-class.json", "hrm-tiny-swa.json", "hrm-tiny-tq.json",
                           "hrm-tiny-swa-tq2.json", "hrm-glm5-class-swa.json", "hrm-glm5-class-tq4.json",
                           "hrm-glm5-class-swa-tq4.json"}) {
    auto c = LoadModelConfig(Env::Default(), std::string(PRIMECACHE_SOURCE_DIR) + "/configs/" + name);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().ToString();
  }
  EXPECT_TRUE(LoadModelConfig(Env::Default(), "/nonexistent/x.json").status().IsNotFound());
}

TEST(ModelConfigTest, AttnBlockRoundTripsAndEveryBadValueIsNamed) {
  auto c = ModelConfig::FromJson(R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["attn", "kda"],
      "kda": {"heads": 1, "head_dim": 2, "conv_kernel": 2},
      "attn": {"heads": 4, "kv_heads": 2, "head_dim": 16, "window": 12, "rope_theta": 500.0,
               "kv_quant": {"kind": "turboquant", "bits": 2}}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layers[0], LayerType::kAttn);
  EXPECT_EQ(c->attn, (AttnConfig{4, 2, 16, 12, 500.0f, 2}));
  auto back = ModelConfig::FromJson(c->ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *c);
  auto plain = ModelConfig::FromJson(R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["attn"],
      "attn": {"heads": 2, "kv_heads": 2, "head_dim": 6, "window": null, "kv_quant": null}})");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->attn.window, 0u);
  EXPECT_EQ(plain->attn.kv_quant_bits, 0u);

  const std::string head = R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["attn"], "attn": )";
  const std::pair<const char*, const char*> bad[] = {
      {R"({"heads": 3, "kv_heads": 2, "head_dim": 16})", "multiple of attn.kv_heads"},
      {R"({"heads": 2, "kv_heads": 2, "head_dim": 15})", "even"},
      {R"({"heads": 2, "kv_heads": 2, "head_dim": 16, "window": 0})", "attn.window"},
      {R"({"heads": 2, "kv_heads": 2, "head_dim": 24, "kv_quant": {"kind": "turboquant", "bits": 4}})",
       "power of two"},
      {R"({"heads": 2, "kv_heads": 2, "head_dim": 8, "kv_quant": {"kind": "turboquant", "bits": 4}})",
       "power of two"},
      {R"({"heads": 2, "kv_heads": 2, "head_dim": 16, "kv_quant": {"kind": "turboquant", "bits": 3}})", "bits"},
      {R"({"heads": 2, "kv_heads": 2, "head_dim": 16, "kv_quant": {"kind": "int8", "bits": 4}})", "turboquant"},
      {R"({"heads": 0, "kv_heads": 2, "head_dim": 16})", "attn.heads"},
  };
  for (const auto& [attn, needle] : bad) {
    auto r = ModelConfig::FromJson(head + attn + "}");
    ASSERT_FALSE(r.ok()) << attn;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(ModelConfig::FromJson(R"({"vocab": 258, "hidden": 8, "mlp_hidden": 8, "layers": ["attn"]})").ok());
}

TEST(ModelConfigTest, SignVectorsAreRefusedUnlessEveryValueIsPlusOrMinusOne) {
  ModelConfig c;
  c.vocab = 258;
  c.hidden = 8;
  c.mlp_hidden = 8;
  c.layers = {LayerType::kAttn};
  c.attn = {2, 1, 16, 0, 10000.0f, 4};
  Weights w = Weights::Generate(c, 1);
  const Tensor* signs = w.Find("layers.0.attn.tq_signs");
  ASSERT_NE(signs, nullptr);
  for (float v : signs->data) EXPECT_TRUE(v == 1.0f || v == -1.0f);
  EXPECT_TRUE(w.CheckAgainst(c).ok());
  auto tensors = w.tensors();
  tensors["layers.0.attn.tq_signs"].data[3] = 0.5f;
  Status s = Weights(tensors).CheckAgainst(c);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("+1 or -1"), std::string::npos) << s.message();
}

// The prefill cost a publish carries: two FLOPs per layer parameter a
// token, MLA and full attention layers as attention layers, and a sliding
// window's bounded attention per token.
TEST(ModelConfigTest, PrefillCostCountsLayerParametersAndAttention) {
  auto c = ModelConfig::FromJson(kTiny);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  double params = 0;
  for (const auto& [name, shape] : ExpectedTensors(*c)) {
    if (!name.starts_with("layers.")) continue;
    double n = 1;
    for (auto d : shape) n *= static_cast<double>(d);
    params += n;
  }
  const ModelCost tiny = PrefillCost(*c);
  EXPECT_EQ(tiny.flops_per_token, static_cast<std::uint64_t>(2 * params));
  EXPECT_EQ(tiny.attention_layers, 2u);
  EXPECT_EQ(tiny.attention_flops_per_pair, 2u * (16 + 8 + 16) * 4);
  // Attention layers: a full one counts as attention, a windowed one per token.
  ModelConfig full = *c, windowed = *c;
  full.layers = windowed.layers = {LayerType::kKda, LayerType::kAttn};
  full.attn = windowed.attn = {4, 2, 16, 0, 10000.0f, 0};
  windowed.attn.window = 32;
  const ModelCost f = PrefillCost(full), w = PrefillCost(windowed);
  EXPECT_EQ(f.attention_layers, 1u);
  EXPECT_EQ(f.attention_flops_per_pair, 2u * 2 * 16 * 4);
  EXPECT_EQ(w.attention_layers, 0u);
  EXPECT_EQ(w.flops_per_token, f.flops_per_token + 32u * (2 * 2 * 16 * 4));
}

TEST(TokenizerTest, BosThenBytes) {
  auto t = Tokenize("hé");
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0], kBosToken);
  EXPECT_EQ(t[1], 'h');
  EXPECT_EQ(t[2], 0xC3u);
  EXPECT_EQ(t[3], 0xA9u);
  t.push_back(kEosToken);
  t.push_back(300);
  EXPECT_EQ(Detokenize(t), "hé");
}

}  // namespace
}  // namespace primecache::model

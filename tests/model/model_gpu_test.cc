// The CUDA model held to the CPU reference: logits and every state plane
// within 1e-4 relative (norm-wise), for mixed stacks, dense NoPE MLA, KDA
// alone, and flat and ring index planes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "tests/gpu/cuda_test_util.h"
#include "tests/model/model_test_util.h"

namespace primecache::model {
namespace {

struct Case {
  const char* name;
  ModelConfig config;
  std::size_t tokens;
  std::uint64_t ring_rows;
};

ModelConfig Medium() {
  ModelConfig c;
  c.name = "medium";
  c.vocab = 300;
  c.hidden = 256;
  c.mlp_hidden = 512;
  c.layers = {LayerType::kKda, LayerType::kMla, LayerType::kKda, LayerType::kMla};
  c.mla = {8, 128, 32, 32, 32, 10000.0f, IndexerConfig{4, 64, 4, 8}};
  c.kda = {4, 64, 4, -5.0f};
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  auto tiny = ModelConfig::FromJson(R"({"name": "hrm-tiny", "vocab": 258, "hidden": 64, "mlp_hidden": 128,
    "layers": ["kda", "mla", "kda", "mla"],
    "mla": {"heads": 4, "kv_rank": 32, "rope_dim": 8, "nope_dim": 16, "v_dim": 16, "rope_theta": 10000.0,
            "indexer": {"heads": 2, "head_dim": 16, "pool": 4, "topk": 4}},
    "kda": {"heads": 4, "head_dim": 16, "conv_kernel": 4, "gate_lower_bound": -5.0}})");
  out.push_back({"tiny", *tiny, 300, 0});
  out.push_back({"medium_flat", Medium(), 400, 0});
  out.push_back({"medium_ring", Medium(), 400, 64});
  ModelConfig dense = Medium();
  dense.name = "dense-nope";
  dense.layers = {LayerType::kMla, LayerType::kMla};
  dense.mla.rope_dim = 0;
  dense.mla.indexer.reset();
  out.push_back({"dense_nope", dense, 300, 0});
  ModelConfig kda = Medium();
  kda.name = "kda";
  kda.layers = {LayerType::kKda, LayerType::kKda, LayerType::kKda};
  out.push_back({"kda_only", kda, 300, 0});
  // One MLA layer at a time, to tell the indexer, RoPE and selection apart.
  ModelConfig one = Medium();
  one.layers = {LayerType::kMla};
  one.name = "mla_idx_rope";
  out.push_back({"mla_idx_rope", one, 300, 0});
  ModelConfig norope = one;
  norope.name = "mla_idx_nope";
  norope.mla.rope_dim = 0;
  out.push_back({"mla_idx_nope", norope, 300, 0});
  ModelConfig allpools = one;
  allpools.name = "mla_idx_allpools";
  allpools.mla.indexer->topk = 1000;
  out.push_back({"mla_idx_allpools", allpools, 300, 0});
  ModelConfig two = Medium();
  two.name = "mla_mla";
  two.layers = {LayerType::kMla, LayerType::kMla};
  out.push_back({"mla_mla", two, 300, 0});
  ModelConfig kda_mla = Medium();
  kda_mla.name = "kda_mla";
  kda_mla.layers = {LayerType::kKda, LayerType::kMla};
  out.push_back({"kda_mla", kda_mla, 300, 0});
  ModelConfig dense_rope = one;
  dense_rope.name = "mla_dense_rope";
  dense_rope.mla.indexer.reset();
  out.push_back({"mla_dense_rope", dense_rope, 300, 0});
  // Attention layers: full and sliding (windows shorter than the prompt, so
  // the rotating buffer wraps inside the 64-token chunks), f32 and TurboQuant.
  for (auto [name, window, bits] : {std::tuple{"attn_full", 0u, 0u}, {"attn_swa", 100u, 0u}, {"attn_tq4", 0u, 4u},
                                    {"attn_swa_tq2", 48u, 2u}, {"attn_swa_tq4", 100u, 4u}}) {
    ModelConfig a = Medium();
    a.name = name;
    a.layers = {LayerType::kKda, LayerType::kAttn, LayerType::kMla, LayerType::kAttn};
    a.attn = {8, 2, 64, window, 10000.0f, bits};
    out.push_back({name, a, 300, 0});
  }
  return out;
}

double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

std::vector<float> Fetch(engine::Device& dev, const float* src, std::size_t n) {
  std::vector<float> v(n);
  EXPECT_TRUE(dev.Download(v.data(), src, n * sizeof(float), engine::Lane::kCompute).ok());
  return v;
}

// A KV layer's held rows on both backends. f32 rows within 1e-4 relative.
// TurboQuant words: the norms within 1e-4 relative; a code may differ only
// where the two backends' inputs fall on either side of a decision boundary
// (they come from GEMMs that round differently), so a differing code must be
// a neighbouring level, and such codes must be rare.
double CompareKv(engine::Device& gd, const engine::KvLayer& kc, const engine::KvLayer& kg, std::size_t l) {
  EXPECT_EQ(kg.len(), kc.len());
  EXPECT_EQ(kg.first_held(), kc.first_held());
  const engine::KvPlan& p = kc.plan();
  const std::size_t n = kc.capacity() * p.k_width;
  double worst = 0;
  for (bool key : {true, false}) {
    const float* cpu_rows = key ? kc.k_rows() : kc.v_rows();
    std::vector<float> want(cpu_rows, cpu_rows + n), got = Fetch(gd, key ? kg.k_rows() : kg.v_rows(), n);
    // Only the held rows are compared (the rest of the buffer is unwritten).
    std::vector<float> w, g;
    for (std::uint64_t pos = kc.first_held(); pos < kc.len(); ++pos) {
      const std::size_t row = pos % kc.capacity();
      w.insert(w.end(), want.begin() + row * p.k_width, want.begin() + (row + 1) * p.k_width);
      g.insert(g.end(), got.begin() + row * p.k_width, got.begin() + (row + 1) * p.k_width);
    }
    if (!p.format.quantized()) {
      const double e = RelErr(g, w);
      EXPECT_LE(e, 1e-4) << "layer " << l << (key ? " K" : " V") << " rows";
      worst = std::max(worst, e);
      continue;
    }
    const std::size_t bits = p.format.quant_bits, entry = 1 + p.format.head_dim * bits / 32;
    std::vector<float> norms_w, norms_g;
    std::size_t codes = 0, differ = 0;
    for (std::size_t e = 0; e < w.size() / entry; ++e) {
      norms_w.push_back(w[e * entry]);
      norms_g.push_back(g[e * entry]);
      for (std::size_t i = 0; i < p.format.head_dim; ++i) {
        const std::size_t word = e * entry + 1 + i * bits / 32, shift = (i * bits) % 32;
        std::uint32_t a, b;
        std::memcpy(&a, &w[word], 4);
        std::memcpy(&b, &g[word], 4);
        const int ca = static_cast<int>((a >> shift) & ((1u << bits) - 1));
        const int cb = static_cast<int>((b >> shift) & ((1u << bits) - 1));
        ++codes;
        if (ca != cb) {
          ++differ;
          EXPECT_EQ(std::abs(ca - cb), 1) << "layer " << l << " entry " << e << " code " << i;
        }
      }
    }
    const double e = RelErr(norms_g, norms_w);
    EXPECT_LE(e, 1e-4) << "layer " << l << " TurboQuant norms";
    EXPECT_LE(double(differ), 1e-3 * double(codes) + 1) << "layer " << l << ": " << differ << " of " << codes
                                                         << " TurboQuant codes differ";
    std::printf("[ model-gpu ] layer %zu %s: %zu of %zu TurboQuant codes differ\n", l, key ? "K" : "V", differ, codes);
    worst = std::max(worst, e);
  }
  return worst;
}

class ModelGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(ModelGpuTest, CudaMatchesCpuOnLogitsAndEveryPlane) {
  PC_SKIP_WITHOUT_CUDA();
  const Case& k = GetParam();
  const ModelConfig& c = k.config;
  Weights w = Weights::Generate(c, 21);
  std::vector<std::uint32_t> tokens = Tokenize(std::string(k.tokens - 1, ' '));
  // Pseudo-random bytes. A periodic prompt would make the indexer's pool
  // scores nearly tie between a pool and its copy one period back (equal but
  // for the decayed recurrent state), and the top-k is discontinuous there:
  // rounding, not arithmetic, would pick the pool.
  std::mt19937 rng(1234);
  for (std::size_t i = 1; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(rng() % 256);

  auto cpu = testing::MakeCpuModel(c, w, 512, 64, 1, k.ring_rows);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto dev = engine::NewCudaDevice();
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  engine::ReserveRequest req;
  req.plan = HybridModel::PlanFor(c, w);
  req.max_ctx = 512;
  req.sessions = 1;
  req.snapshot_slots = 1;
  req.index_ring_rows = k.ring_rows;
  auto gpu_engine = engine::Engine::Create(*dev, req);
  ASSERT_TRUE(gpu_engine.ok()) << gpu_engine.status().ToString();
  auto gpu = HybridModel::Create(c, w, gpu_engine->get(), {64});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();

  auto cs = cpu->model->NewSession();
  auto gs = (*gpu)->NewSession();
  ASSERT_TRUE(cs.ok() && gs.ok());
  std::vector<float> cl, gl;
  ASSERT_TRUE(cpu->model->Prime(*cs, tokens, LogitsWanted::kAll, &cl).ok());
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*gpu)->Prime(*gs, tokens, LogitsWanted::kAll, &gl).ok());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(cl.size(), gl.size());
  const double logit_err = RelErr(gl, cl);
  EXPECT_LE(logit_err, 1e-4);
  {
    // Where the logits part ways, position by position (a diagnosis aid).
    const std::size_t V = c.vocab;
    std::size_t first_bad = SIZE_MAX, bad = 0;
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      std::vector<float> a(gl.begin() + t * V, gl.begin() + (t + 1) * V), b(cl.begin() + t * V, cl.begin() + (t + 1) * V);
      if (RelErr(a, b) > 1e-4) {
        ++bad;
        first_bad = std::min(first_bad, t);
      }
    }
    if (bad) std::printf("[ model-gpu ] %s: %zu positions differ, the first at %zu\n", k.name, bad, first_bad);
  }

  engine::Device& gd = (*gpu_engine)->device();
  double worst_plane = 0;
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    if (auto* lc = cs->cache->latent(l)) {
      auto* lg = gs->cache->latent(l);
      ASSERT_EQ(lg->len(), lc->len());
      ASSERT_EQ(lg->pools_ready(), lc->pools_ready());
      std::vector<float> rows_c(lc->rows(), lc->rows() + lc->len() * lc->width());
      double e = RelErr(Fetch(gd, lg->rows(), rows_c.size()), rows_c);
      EXPECT_LE(e, 1e-4) << "layer " << l << " latent rows";
      worst_plane = std::max(worst_plane, e);
      if (lc->pools_ready() > 0) {
        const std::size_t nk = lc->pools_ready() * lc->index_width() / 2;
        std::vector<float> keys_c(lc->pool_keys(), lc->pool_keys() + nk);
        e = RelErr(Fetch(gd, lg->pool_keys(), nk), keys_c);
        EXPECT_LE(e, 1e-4) << "layer " << l << " pool keys";
        worst_plane = std::max(worst_plane, e);
      }
    } else if (auto* kc = cs->cache->kv(l)) {
      const double e = CompareKv(gd, *kc, *gs->cache->kv(l), l);
      worst_plane = std::max(worst_plane, e);
    } else {
      auto* rc = cs->cache->recurrent(l);
      auto* rg = gs->cache->recurrent(l);
      std::vector<float> st(rc->state(), rc->state() + rc->plan().state_values());
      double e = RelErr(Fetch(gd, rg->state(), st.size()), st);
      EXPECT_LE(e, 1e-4) << "layer " << l << " recurrent state";
      worst_plane = std::max(worst_plane, e);
      std::vector<float> ring(rc->conv_ring(), rc->conv_ring() + rc->plan().conv_values());
      e = RelErr(Fetch(gd, rg->conv_ring(), ring.size()), ring);
      EXPECT_LE(e, 1e-4) << "layer " << l << " conv ring";
      worst_plane = std::max(worst_plane, e);
    }
  }
  std::printf("[ model-gpu ] %-12s %zu tokens: logits rel err %.3g, worst plane rel err %.3g, cuda prime %.1f ms\n",
              k.name, tokens.size(), logit_err, worst_plane, ms);
}

INSTANTIATE_TEST_SUITE_P(Configs, ModelGpuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace primecache::model

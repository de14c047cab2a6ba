// The CPU reference model against an independent, naive evaluation of the spec
// in double precision that keeps the whole history (no rings, no incremental
// pool keys), plus the structural properties restore exactness relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tests/model/model_test_util.h"

namespace primecache::model {
namespace {

using Vec = std::vector<double>;

class Oracle {
 public:
  Oracle(const ModelConfig& c, const Weights& w) : c_(c), w_(w), hist_(c.layers.size()) {}

  Vec Step(std::uint32_t token) {
    const std::size_t H = c_.hidden;
    Vec x(H);
    for (std::size_t i = 0; i < H; ++i) x[i] = T("embed")[token * H + i];
    for (std::size_t l = 0; l < c_.layers.size(); ++l) {
      Vec u = Norm(x, L(l, "attn_norm.weight"));
      Vec o = c_.layers[l] == LayerType::kMla ? Mla(l, u) : c_.layers[l] == LayerType::kKda ? Kda(l, u) : Attn(l, u);
      for (std::size_t i = 0; i < H; ++i) x[i] += o[i];
      u = Norm(x, L(l, "mlp_norm.weight"));
      Vec a = Mv(L(l, "mlp.w1"), u), b = Mv(L(l, "mlp.w3"), u);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
      Vec m = Mv(L(l, "mlp.w2"), a);
      for (std::size_t i = 0; i < H; ++i) x[i] += m[i];
    }
    ++t_;
    return Mv(T("lm_head"), Norm(x, T("final_norm.weight")));
  }

 private:
  const std::vector<float>& T(const std::string& n) const { return w_.Find(n)->data; }
  const std::vector<float>& L(std::size_t l, const std::string& n) const {
    return T("layers." + std::to_string(l) + "." + n);
  }
  static Vec Mv(const std::vector<float>& W, const Vec& x) {
    Vec y(W.size() / x.size(), 0.0);
    for (std::size_t o = 0; o < y.size(); ++o)
      for (std::size_t i = 0; i < x.size(); ++i) y[o] += double(W[o * x.size() + i]) * x[i];
    return y;
  }
  Vec Norm(const Vec& x, const std::vector<float>& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    double inv = 1 / std::sqrt(ss / double(x.size()) + c_.norm_eps);
    Vec y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
    return y;
  }
  static Vec Slice(const Vec& v, std::size_t a, std::size_t n) { return Vec(v.begin() + a, v.begin() + a + n); }
  void Rope(Vec& v, std::size_t t) const { Rope(v, t, c_.mla.rope_theta); }
  static void Rope(Vec& v, std::size_t t, float theta) {
    const std::size_t n = v.size();
    for (std::size_t i = 0; i < n / 2; ++i) {
      double ang = double(t) * std::pow(double(theta), -2.0 * double(i) / double(n));
      double a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * std::cos(ang) - b * std::sin(ang);
      v[2 * i + 1] = a * std::sin(ang) + b * std::cos(ang);
    }
  }
  static double Dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
  }
  static double Sig(double z) { return 1 / (1 + std::exp(-z)); }

  Vec Mla(std::size_t l, const Vec& u) {
    const MlaConfig& m = c_.mla;
    const std::size_t r = m.kv_rank, dr = m.rope_dim, dn = m.nope_dim, dv = m.v_dim;
    auto& h = hist_[l];
    Vec a = Mv(L(l, "mla.wdkv"), u);
    Vec c = Norm(Slice(a, 0, r), L(l, "mla.kv_norm.weight"));
    Vec kpe = Slice(a, r, dr);
    Rope(kpe, t_);
    h.c.push_back(c);
    h.kpe.push_back(kpe);
    std::vector<std::size_t> S;
    if (!m.indexer) {
      for (std::size_t s = 0; s <= t_; ++s) S.push_back(s);
    } else {
      const auto& ix = *m.indexer;
      const std::size_t di = ix.head_dim, P = ix.pool;
      h.kidx.push_back(Norm(Mv(L(l, "mla.idx.wk"), u), L(l, "mla.idx.k_norm.weight")));
      h.g.push_back(Mv(L(l, "mla.idx.wg"), u));
      const auto& ape = L(l, "mla.idx.ape");
      Vec qi = Mv(L(l, "mla.idx.wq"), u), wt = Mv(L(l, "mla.idx.ww"), u);
      const std::size_t visible = (t_ + 1) / P;
      std::vector<std::pair<double, std::size_t>> score;
      for (std::size_t p = 0; p < visible; ++p) {
        Vec K(di, 0.0);
        for (std::size_t ch = 0; ch < di; ++ch) {
          double mx = -1e300, z = 0;
          for (std::size_t j = 0; j < P; ++j) mx = std::max(mx, h.g[p * P + j][ch] + ape[j * di + ch]);
          for (std::size_t j = 0; j < P; ++j) z += std::exp(h.g[p * P + j][ch] + ape[j * di + ch] - mx);
          for (std::size_t j = 0; j < P; ++j)
            K[ch] += std::exp(h.g[p * P + j][ch] + ape[j * di + ch] - mx) / z * h.kidx[p * P + j][ch];
        }
        double I = 0;
        for (std::size_t hh = 0; hh < ix.heads; ++hh) I += wt[hh] * std::max(0.0, Dot(Slice(qi, hh * di, di), K));
        score.push_back({I, p});
      }
      std::stable_sort(score.begin(), score.end(), [](auto& x, auto& y) { return x.first > y.first; });
      std::vector<std::size_t> pools;
      for (std::size_t i = 0; i < std::min<std::size_t>(ix.topk, score.size()); ++i) pools.push_back(score[i].second);
      std::sort(pools.begin(), pools.end());
      for (std::size_t p : pools)
        for (std::size_t j = 0; j < P; ++j) S.push_back(p * P + j);
      for (std::size_t s = visible * P; s <= t_; ++s) S.push_back(s);
    }
    Vec q = Mv(L(l, "mla.wq"), u), cat;
    const auto& wuk = L(l, "mla.wuk");
    const auto& wuv = L(l, "mla.wuv");
    for (std::size_t hh = 0; hh < m.heads; ++hh) {
      Vec qn = Slice(q, hh * (dn + dr), dn), qp = Slice(q, hh * (dn + dr) + dn, dr);
      Rope(qp, t_);
      Vec qt(r, 0.0);
      for (std::size_t j = 0; j < r; ++j)
        for (std::size_t i = 0; i < dn; ++i) qt[j] += wuk[(hh * dn + i) * r + j] * qn[i];
      Vec sc;
      double mx = -1e300;
      for (std::size_t s : S) {
        sc.push_back((Dot(qt, h.c[s]) + Dot(qp, h.kpe[s])) / std::sqrt(double(dn + dr)));
        mx = std::max(mx, sc.back());
      }
      double z = 0;
      for (double& v : sc) z += (v = std::exp(v - mx));
      Vec o(r, 0.0);
      for (std::size_t k = 0; k < S.size(); ++k)
        for (std::size_t j = 0; j < r; ++j) o[j] += sc[k] / z * h.c[S[k]][j];
      for (std::size_t i = 0; i < dv; ++i) {
        double s = 0;
        for (std::size_t j = 0; j < r; ++j) s += wuv[(hh * dv + i) * r + j] * o[j];
        cat.push_back(s);
      }
    }
    return Mv(L(l, "mla.wo"), cat);
  }

  Vec Kda(std::size_t l, const Vec& u) {
    const KdaConfig& k = c_.kda;
    const std::size_t n = k.heads, d = k.head_dim, nd = n * d, K = k.conv_kernel;
    auto& h = hist_[l];
    Vec raw = Mv(L(l, "kda.wq"), u), rk = Mv(L(l, "kda.wk"), u), rv = Mv(L(l, "kda.wv"), u);
    raw.insert(raw.end(), rk.begin(), rk.end());
    raw.insert(raw.end(), rv.begin(), rv.end());
    h.raw.push_back(raw);
    if (h.S.empty()) h.S.assign(n * d * d, 0.0);
    const std::vector<float>* taps[3] = {&L(l, "kda.conv_q"), &L(l, "kda.conv_k"), &L(l, "kda.conv_v")};
    Vec cv(3 * nd);
    for (std::size_t ch = 0; ch < 3 * nd; ++ch) {
      double y = 0;
      for (std::size_t i = 0; i < K; ++i) {
        long src = long(t_) - long(K - 1) + long(i);
        if (src >= 0) y += (*taps[ch / nd])[(ch % nd) * K + i] * h.raw[std::size_t(src)][ch];
      }
      cv[ch] = y * Sig(y);
    }
    Vec g = Mv(L(l, "kda.wg"), u), b = Mv(L(l, "kda.wb"), u), og = Mv(L(l, "kda.wog"), u), out;
    for (std::size_t hh = 0; hh < n; ++hh) {
      Vec q = Slice(cv, hh * d, d), kk = Slice(cv, nd + hh * d, d), v = Slice(cv, 2 * nd + hh * d, d);
      double nq = std::sqrt(Dot(q, q) + 1e-6), nk = std::sqrt(Dot(kk, kk) + 1e-6);
      for (auto& e : q) e /= nq;
      for (auto& e : kk) e /= nk;
      double* S = h.S.data() + hh * d * d;
      for (std::size_t i = 0; i < d; ++i)
        for (std::size_t j = 0; j < d; ++j) S[i * d + j] *= std::exp(k.gate_lower_bound * Sig(g[hh * d + i]));
      Vec pred(d, 0.0);
      for (std::size_t j = 0; j < d; ++j)
        for (std::size_t i = 0; i < d; ++i) pred[j] += S[i * d + j] * kk[i];
      for (std::size_t i = 0; i < d; ++i)
        for (std::size_t j = 0; j < d; ++j) S[i * d + j] += Sig(b[hh]) * kk[i] * (v[j] - pred[j]);
      Vec o(d, 0.0);
      for (std::size_t j = 0; j < d; ++j) {
        for (std::size_t i = 0; i < d; ++i) o[j] += S[i * d + j] * q[i];
        o[j] /= std::sqrt(double(d));
      }
      o = Norm(o, L(l, "kda.o_norm.weight"));
      for (std::size_t j = 0; j < d; ++j) out.push_back(o[j] * Sig(og[hh * d + j]));
    }
    return Mv(L(l, "kda.wo"), out);
  }

  // The spec's Walsh-Hadamard product, written as its recursion
  // H2n = [[Hn, Hn], [Hn, -Hn]] in f32 (the encoder's arithmetic is f32).
  static std::vector<float> Sylvester(std::vector<float> x) {
    if (x.size() == 1) return x;
    const std::size_t h = x.size() / 2;
    std::vector<float> top = Sylvester({x.begin(), x.begin() + h}), bot = Sylvester({x.begin() + h, x.end()});
    for (std::size_t i = 0; i < h; ++i) {
      x[i] = top[i] + bot[i];
      x[i + h] = top[i] - bot[i];
    }
    return x;
  }
  // A stored row's TurboQuant read-back: encode as the spec says (f32), then
  // decode in double with the Hadamard matrix written out (H[j][i] = -1 when
  // popcount(i & j) is odd).
  static Vec TurboQuantReadBack(const Vec& xd, const std::vector<float>& signs, std::uint32_t bits) {
    static const std::vector<float> c2 = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
    static const std::vector<float> c4 = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f,
                                          -0.3881f, -0.1284f, 0.1284f,  0.3881f,  0.6568f,  0.9424f,
                                          1.2562f,  1.6181f,  2.0690f,  2.7326f};
    const std::vector<float>& C = bits == 2 ? c2 : c4;
    const std::size_t n = xd.size();
    std::vector<float> x(n);
    float ss = 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(xd[i]);
      ss += x[i] * x[i];
    }
    const float norm = std::sqrt(ss);
    Vec out(n, 0.0);
    if (norm == 0.0f) return out;
    for (std::size_t i = 0; i < n; ++i) x[i] *= signs[i];
    std::vector<float> y = Sylvester(x);
    const float root = std::sqrt(static_cast<float>(n));
    Vec yhat(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float z = y[i] / root * root / norm;
      std::size_t best = 0;
      for (std::size_t j = 1; j < C.size(); ++j)
        if (std::fabs(z - C[j]) < std::fabs(z - C[best])) best = j;
      yhat[i] = double(norm) * C[best] / std::sqrt(double(n));
    }
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t i = 0; i < n; ++i) s += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * yhat[i];
      out[j] = signs[j] * s / std::sqrt(double(n));
    }
    return out;
  }

  Vec Attn(std::size_t l, const Vec& u) {
    const AttnConfig& a = c_.attn;
    const std::size_t hd = a.head_dim;
    auto& h = hist_[l];
    Vec q = Mv(L(l, "attn.wq"), u), k = Mv(L(l, "attn.wk"), u), v = Mv(L(l, "attn.wv"), u);
    Vec krow, vrow;
    for (std::size_t g = 0; g < a.kv_heads; ++g) {
      Vec kg = Slice(k, g * hd, hd), vg = Slice(v, g * hd, hd);
      Rope(kg, t_, a.rope_theta);
      if (a.kv_quant_bits != 0) {
        kg = TurboQuantReadBack(kg, L(l, "attn.tq_signs"), a.kv_quant_bits);
        vg = TurboQuantReadBack(vg, L(l, "attn.tq_signs"), a.kv_quant_bits);
      }
      krow.insert(krow.end(), kg.begin(), kg.end());
      vrow.insert(vrow.end(), vg.begin(), vg.end());
    }
    h.c.push_back(krow);
    h.kpe.push_back(vrow);
    const std::size_t lo = a.window != 0 && t_ + 1 > a.window ? t_ + 1 - a.window : 0;
    Vec cat;
    for (std::size_t hh = 0; hh < a.heads; ++hh) {
      const std::size_t g = hh * a.kv_heads / a.heads;
      Vec qh = Slice(q, hh * hd, hd);
      Rope(qh, t_, a.rope_theta);
      Vec sc;
      double mx = -1e300;
      for (std::size_t s = lo; s <= t_; ++s) {
        sc.push_back(Dot(qh, Slice(h.c[s], g * hd, hd)) / std::sqrt(double(hd)));
        mx = std::max(mx, sc.back());
      }
      double z = 0;
      for (double& e : sc) z += (e = std::exp(e - mx));
      Vec o(hd, 0.0);
      for (std::size_t s = lo; s <= t_; ++s)
        for (std::size_t j = 0; j < hd; ++j) o[j] += sc[s - lo] / z * h.kpe[s][g * hd + j];
      cat.insert(cat.end(), o.begin(), o.end());
    }
    return Mv(L(l, "attn.wo"), cat);
  }

  struct History {
    std::vector<Vec> c, kpe, kidx, g, raw;  // attn layers keep K rows in c, V rows in kpe
    Vec S;
  };
  const ModelConfig& c_;
  const Weights& w_;
  std::vector<History> hist_;
  std::size_t t_ = 0;
};

using testing::Mixed;

std::vector<std::uint32_t> Text(std::size_t n) {
  std::vector<std::uint32_t> t = Tokenize(std::string(n - 1, 'x'));
  for (std::size_t i = 1; i < t.size(); ++i) t[i] = static_cast<std::uint32_t>((i * 37 + i * i) % 256);
  return t;
}

using testing::MakeCpuModel;

// Primes n tokens through the CPU model (weights from `seed`, a cache of
// max_ctx tokens, `chunk` tokens per call) and holds every position's logits
// to the double-precision oracle.
void ExpectMatchesOracle(const ModelConfig& c, std::size_t n, std::uint64_t ring_rows = 0, std::uint64_t seed = 11,
                         std::uint64_t max_ctx = 128, std::size_t chunk = 7) {
  Weights w = Weights::Generate(c, seed);
  auto m = MakeCpuModel(c, w, max_ctx, chunk, 1, ring_rows);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto session = m->model->NewSession();
  ASSERT_TRUE(session.ok());
  Oracle oracle(c, w);
  auto tokens = Text(n);
  std::vector<float> logits;
  ASSERT_TRUE(m->model->Prime(*session, tokens, LogitsWanted::kAll, &logits).ok());
  double num = 0, den = 0;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    Vec want = oracle.Step(tokens[t]);
    for (std::size_t v = 0; v < c.vocab; ++v) {
      double d = logits[t * c.vocab + v] - want[v];
      num += d * d;
      den += want[v] * want[v];
    }
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5) << c.name;
}

TEST(HybridModelCpuTest, MixedStackMatchesOracle) { ExpectMatchesOracle(Mixed(), 40); }

TEST(HybridModelCpuTest, MixedStackOverARingIndexPlaneMatchesOracle) {
  ExpectMatchesOracle(Mixed(), 45, /*ring_rows=*/10);  // effective ring 8 rows (pool 4), chunks of 7
}

TEST(HybridModelCpuTest, DenseNoPeMatchesOracle) {
  ModelConfig c = Mixed();
  c.name = "dense-nope";
  c.layers = {LayerType::kMla, LayerType::kMla};
  c.mla.rope_dim = 0;
  c.mla.indexer.reset();
  ExpectMatchesOracle(c, 30);
}

TEST(HybridModelCpuTest, KdaOnlyMatchesOracle) {
  ModelConfig c = Mixed();
  c.name = "kda";
  c.layers = {LayerType::kKda, LayerType::kKda};
  c.kda.conv_kernel = 2;
  ExpectMatchesOracle(c, 30);
}

TEST(HybridModelCpuTest, SparseIndexerMatchesOracle) {
  ModelConfig c = Mixed();
  c.name = "sparse";
  c.layers = {LayerType::kMla};
  c.mla.indexer = IndexerConfig{2, 8, 3, 1};  // one pool of three selected out of many
  ExpectMatchesOracle(c, 45);
}

// Attention layers: full and sliding, f32 and TurboQuant, windows shorter
// and longer than the prompt, chunks that straddle the window.
ModelConfig WithAttn(const char* name, std::uint32_t window, std::uint32_t bits) {
  ModelConfig c = Mixed();
  c.name = name;
  c.layers = {LayerType::kKda, LayerType::kAttn, LayerType::kMla, LayerType::kAttn};
  c.attn = {4, 2, 16, window, 10000.0f, bits};
  return c;
}

TEST(HybridModelCpuTest, FullAttentionMatchesOracle) { ExpectMatchesOracle(WithAttn("attn-full", 0, 0), 40); }

TEST(HybridModelCpuTest, SlidingWindowShorterThanThePromptMatchesOracle) {
  ExpectMatchesOracle(WithAttn("attn-swa", 9, 0), 45);  // chunks of 7 straddle the window of 9
}

TEST(HybridModelCpuTest, SlidingWindowLongerThanThePromptMatchesOracle) {
  ExpectMatchesOracle(WithAttn("attn-swa-long", 100, 0), 45);
}

TEST(HybridModelCpuTest, SlidingWindowOfOneAndMultiQueryMatchOracle) {
  ModelConfig c = WithAttn("attn-w1-mqa", 1, 0);
  c.attn.kv_heads = 1;
  ExpectMatchesOracle(c, 20);
}

TEST(HybridModelCpuTest, TurboQuant4FullAttentionMatchesOracle) {
  ExpectMatchesOracle(WithAttn("attn-tq4", 0, 4), 40);
}

TEST(HybridModelCpuTest, TurboQuant2SlidingWindowMatchesOracle) {
  ExpectMatchesOracle(WithAttn("attn-swa-tq2", 8, 2), 45);
}

TEST(HybridModelCpuTest, TurboQuantWiderHeadsMatchOracle) {
  ModelConfig c = WithAttn("attn-tq4-hd64", 16, 4);
  c.attn = {2, 1, 64, 16, 10000.0f, 4};
  ExpectMatchesOracle(c, 30);
}

// One call of 37 tokens in chunks of 64, and calls of 13 + 24 tokens in
// chunks of `chunk`, give bit-identical logits.
void ExpectChunkingBitIdentical(const ModelConfig& c, std::size_t chunk) {
  Weights w = Weights::Generate(c, 3);
  auto tokens = Text(37);
  auto one = MakeCpuModel(c, w, 128, /*chunk=*/64);
  auto two = MakeCpuModel(c, w, 128, chunk);
  ASSERT_TRUE(one.ok() && two.ok());
  auto s1 = one->model->NewSession();
  auto s2 = two->model->NewSession();
  ASSERT_TRUE(s1.ok() && s2.ok());
  std::vector<float> a, b;
  ASSERT_TRUE(one->model->Prime(*s1, tokens, LogitsWanted::kAll, &a).ok());
  ASSERT_TRUE(two->model->Prime(*s2, std::span(tokens).first(13), LogitsWanted::kAll, &b).ok());
  ASSERT_TRUE(two->model->Prime(*s2, std::span(tokens).subspan(13), LogitsWanted::kAll, &b).ok());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  EXPECT_EQ(s1->position, 37u);
  EXPECT_EQ(s2->position, 37u);
}

TEST(HybridModelCpuTest, AttnChunkingIsBitIdenticalAcrossWindowsAndQuantization) {
  for (auto [window, bits] : {std::pair{0u, 0u}, {5u, 0u}, {5u, 4u}, {0u, 2u}}) {
    SCOPED_TRACE("window " + std::to_string(window) + " bits " + std::to_string(bits));
    ExpectChunkingBitIdentical(WithAttn("attn-chunks", window, bits), 3);
  }
}

TEST(HybridModelCpuTest, ChunkingAndSplitCallsAreBitIdentical) { ExpectChunkingBitIdentical(Mixed(), 5); }

TEST(HybridModelCpuTest, LastLogitsEqualTheLastRowOfAll) {
  ModelConfig c = Mixed();
  Weights w = Weights::Generate(c, 3);
  auto m = MakeCpuModel(c, w, 128, 8);
  ASSERT_TRUE(m.ok());
  auto s1 = m->model->NewSession();
  auto s2 = m->model->NewSession();
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto tokens = Text(20);
  std::vector<float> all, last;
  ASSERT_TRUE(m->model->Prime(*s1, tokens, LogitsWanted::kAll, &all).ok());
  ASSERT_TRUE(m->model->Prime(*s2, tokens, LogitsWanted::kLast, &last).ok());
  ASSERT_EQ(last.size(), c.vocab);
  EXPECT_EQ(std::memcmp(last.data(), all.data() + 19 * c.vocab, c.vocab * 4), 0);
}

TEST(HybridModelCpuTest, TopkCoveringEveryPoolEqualsDense) {
  ModelConfig sparse = Mixed();
  sparse.layers = {LayerType::kMla, LayerType::kMla};
  sparse.mla.indexer->topk = 1000;
  ModelConfig dense = sparse;
  dense.mla.indexer.reset();
  Weights ws = Weights::Generate(sparse, 5);
  std::map<std::string, Tensor> kept;
  for (const auto& [name, t] : ws.tensors())
    if (name.find(".idx.") == std::string::npos) kept.emplace(name, t);
  Weights wd(std::move(kept));
  auto a = MakeCpuModel(sparse, ws);
  auto b = MakeCpuModel(dense, wd);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  auto sa = a->model->NewSession();
  auto sb = b->model->NewSession();
  ASSERT_TRUE(sa.ok() && sb.ok());
  std::vector<float> la, lb;
  auto tokens = Text(30);
  ASSERT_TRUE(a->model->Prime(*sa, tokens, LogitsWanted::kAll, &la).ok());
  ASSERT_TRUE(b->model->Prime(*sb, tokens, LogitsWanted::kAll, &lb).ok());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
}

TEST(HybridModelCpuTest, RefusesBadTokensAndOverflowWithoutSideEffects) {
  ModelConfig c = Mixed();
  Weights w = Weights::Generate(c, 3);
  auto m = MakeCpuModel(c, w, 16, 8);
  ASSERT_TRUE(m.ok());
  auto s = m->model->NewSession();
  ASSERT_TRUE(s.ok());
  std::vector<std::uint32_t> bad = {kBosToken, 65, 258};
  std::vector<float> logits;
  EXPECT_TRUE(m->model->Prime(*s, bad, LogitsWanted::kAll, &logits).IsInvalidArgument());
  EXPECT_TRUE(m->model->Prime(*s, Text(17), LogitsWanted::kAll, &logits).IsResourceExhausted());
  EXPECT_EQ(s->position, 0u);
  EXPECT_TRUE(logits.empty());
  EXPECT_TRUE(s->cache->fresh());
}

TEST(HybridModelCpuTest, CreateRefusesMismatchedWeightsAndPlans) {
  ModelConfig c = Mixed();
  ModelConfig other = c;
  other.hidden = 16;
  Weights w = Weights::Generate(other, 3);
  EXPECT_TRUE(MakeCpuModel(c, w).status().IsInvalidArgument());
  // An engine planned for a model whose latent rows are narrower.
  ModelConfig narrow = c;
  narrow.mla.kv_rank = 8;
  auto m = MakeCpuModel(narrow, Weights::Generate(narrow, 3));
  ASSERT_TRUE(m.ok());
  Status s = HybridModel::Create(c, Weights::Generate(c, 3), m->engine.get()).status();
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("state plan"), std::string::npos);
}

TEST(HybridModelCpuTest, GreedyGenerationFeedsWhatItPicks) {
  ModelConfig c = Mixed();
  Weights w = Weights::Generate(c, 9);
  auto m = MakeCpuModel(c, w, 128, 16);
  ASSERT_TRUE(m.ok());
  auto s = m->model->NewSession();
  ASSERT_TRUE(s.ok());
  auto prompt = Text(10);
  std::vector<float> last;
  ASSERT_TRUE(m->model->Prime(*s, prompt, LogitsWanted::kLast, &last).ok());
  std::vector<float> gen_logits;
  auto gen = m->model->Generate(*s, last, 6, &gen_logits);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  ASSERT_FALSE(gen->empty());
  // Replaying prompt + generated tokens in one session gives the same picks.
  auto r = m->model->NewSession();
  ASSERT_TRUE(r.ok());
  std::vector<std::uint32_t> all = prompt;
  all.insert(all.end(), gen->begin(), gen->end());
  std::vector<float> replay;
  ASSERT_TRUE(m->model->Prime(*r, all, LogitsWanted::kAll, &replay).ok());
  for (std::size_t i = 0; i < gen->size(); ++i) {
    const float* row = replay.data() + (prompt.size() - 1 + i) * c.vocab;
    std::uint32_t best = 0;
    for (std::uint32_t v = 1; v < c.vocab; ++v)
      if (row[v] > row[best]) best = v;
    EXPECT_EQ(best, (*gen)[i]) << "step " << i;
  }
  EXPECT_EQ(s->position, prompt.size() + gen->size() - ((*gen).back() == kEosToken ? 1 : 0));
}

}  // namespace
}  // namespace primecache::model

namespace primecache::model {
namespace {

TEST(HybridModelCpuTest, MediumStackAtRealCapacityMatchesOracle) {
  ExpectMatchesOracle(testing::Medium(), 200, /*ring_rows=*/0, /*seed=*/21, /*max_ctx=*/512, /*chunk=*/64);
}

}  // namespace
}  // namespace primecache::model

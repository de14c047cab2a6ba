#include "engine/model/hybrid_model.h"

#include "engine/model/collective.h"

#include <cmath>
#include <string>

#include "kernels/cpu_math.h"
#include "kernels/kv_attention.h"
#include "primecache/checksum.h"

namespace primecache::model {

using engine::Lane;

engine::StatePlan HybridModel::PlanFor(const ModelConfig& c, const Weights& weights) {
  engine::StatePlan plan;
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const LayerType t = c.layers[l];
    if (t == LayerType::kMla) {
      engine::LatentPlan p;
      p.kv_rank = c.mla.kv_rank;
      p.rope_dim = c.mla.rope_dim;
      if (c.mla.indexer) {
        p.index_head_dim = c.mla.indexer->head_dim;
        p.pool = c.mla.indexer->pool;
      }
      plan.layers.emplace_back(p);
    } else if (t == LayerType::kAttn) {
      const AttnConfig& a = c.attn;
      engine::KvPlan p;
      p.format.window = a.window;
      p.format.quant_bits = a.kv_quant_bits;
      std::uint32_t entry = a.head_dim;
      if (a.kv_quant_bits != 0) {
        p.format.head_dim = a.head_dim;
        entry = static_cast<std::uint32_t>(kernels::KvEntryWords(a.head_dim, a.kv_quant_bits));
        if (const Tensor* signs = weights.Find("layers." + std::to_string(l) + ".attn.tq_signs")) {
          p.format.signs_digest = Checksum64(std::as_bytes(std::span(signs->data)));
        }
      }
      p.k_width = p.v_width = a.kv_heads * entry;
      plan.layers.emplace_back(p);
    } else {
      plan.layers.emplace_back(RecurrentShape{c.kda.heads, c.kda.head_dim, c.kda.conv_kernel});
    }
  }
  return plan;
}

HybridModel::HybridModel(ModelConfig config, engine::Engine* engine, HybridModelOptions options)
    : config_(std::move(config)), engine_(engine), device_(&engine->device()), options_(options) {}

HybridModel::~HybridModel() = default;

Result<std::unique_ptr<HybridModel>> HybridModel::Create(const ModelConfig& config, const Weights& weights,
                                                         engine::Engine* engine, const HybridModelOptions& options) {
  PC_RETURN_IF_ERROR(config.Validate());
  PC_RETURN_IF_ERROR(weights.CheckAgainst(config));
  if (engine == nullptr) return Status::InvalidArgument("model: no engine");
  if (!(engine->reserve().request.plan == PlanFor(config, weights))) {
    return Status::InvalidArgument("model: the engine's state plan is not the one model " + config.name + " needs");
  }
  if (options.chunk_tokens == 0) return Status::InvalidArgument("model: chunk_tokens must be > 0");
  if (options.collective != nullptr && options.collective->memory() != engine->device().kind()) {
    return Status::InvalidArgument("model: a TP group summing in " +
                                   std::string(engine::DeviceKindName(options.collective->memory())) +
                                   " memory cannot serve a rank on " +
                                   std::string(engine::DeviceKindName(engine->device().kind())));
  }
  std::unique_ptr<HybridModel> m(new HybridModel(config, engine, options));
  if (m->device_->kind() == engine::DeviceKind::kCuda) {
    PC_ASSIGN_OR_RETURN(m->compute_, Compute::NewCuda(m->device_->native_stream(Lane::kCompute)));
  } else {
    m->compute_ = Compute::NewCpu();
  }
  PC_RETURN_IF_ERROR(m->UploadWeights(weights));
  PC_RETURN_IF_ERROR(m->AllocateScratch());
  return m;
}

Status HybridModel::UploadWeights(const Weights& weights) {
  for (const auto& [name, t] : weights.tensors()) {
    const std::size_t bytes = t.data.size() * sizeof(float);
    PC_ASSIGN_OR_RETURN(engine::Memory m, device_->Allocate(bytes));
    PC_RETURN_IF_ERROR(device_->Upload(m.data(), t.data.data(), bytes, Lane::kCompute));
    weights_.emplace(name, std::move(m));
  }
  fused_taps_.resize(config_.layers.size());
  for (std::size_t l = 0; l < config_.layers.size(); ++l) {
    if (config_.layers[l] != LayerType::kKda) continue;
    std::vector<float> taps;
    for (const char* plane : {"kda.conv_q", "kda.conv_k", "kda.conv_v"}) {
      const Tensor* t = weights.Find("layers." + std::to_string(l) + "." + plane);
      taps.insert(taps.end(), t->data.begin(), t->data.end());
    }
    PC_ASSIGN_OR_RETURN(fused_taps_[l], device_->Allocate(taps.size() * sizeof(float)));
    PC_RETURN_IF_ERROR(device_->Upload(fused_taps_[l].data(), taps.data(), taps.size() * sizeof(float), Lane::kCompute));
  }
  return device_->Synchronize(Lane::kCompute);
}

Status HybridModel::AllocateScratch() {
  const std::size_t T = options_.chunk_tokens, H = config_.hidden, F = config_.mlp_hidden, V = config_.vocab;
  std::vector<std::pair<const char*, std::size_t>> sizes = {
      {"x", T * H}, {"u", T * H}, {"out", T * H}, {"mlp_a", T * F}, {"mlp_b", T * F}, {"logits", T * V}, {"tokens", T}};
  if (config_.HasLayer(LayerType::kMla)) {
    const MlaConfig& m = config_.mla;
    const std::size_t nh = m.heads, w = m.row_width();
    sizes.insert(sizes.end(), {{"mla_a", T * w},
                               {"mla_rows", T * w},
                               {"q", T * nh * (m.nope_dim + m.rope_dim)},
                               {"qt", T * nh * m.kv_rank},
                               {"o", T * nh * m.kv_rank},
                               {"ho", T * nh * m.v_dim}});
    if (m.indexer) {
      const IndexerConfig& ix = *m.indexer;
      sizes.insert(sizes.end(), {{"irows", T * 2 * ix.head_dim},
                                 {"kraw", T * ix.head_dim},
                                 {"qi", T * ix.heads * ix.head_dim},
                                 {"wt", T * ix.heads},
                                 {"sel", T * ix.topk},
                                 {"sel_count", T}});
      if (device_->kind() == engine::DeviceKind::kCuda) {
        kernels::IndexerSelectArgs probe;
        probe.count = T;
        probe.first_pos = engine_->reserve().request.max_ctx;
        probe.pool = ix.pool;
        sizes.push_back({"sel_scratch", (kernels::IndexerSelectScratchBytes(probe) + 3) / 4});
      }
    }
  }
  if (config_.HasLayer(LayerType::kKda)) {
    const std::size_t n = config_.kda.heads, nd = config_.kda.channels();
    sizes.insert(sizes.end(), {{"raw", T * 3 * nd}, {"conv", T * 3 * nd}, {"g", T * nd}, {"b", T * n}, {"og", T * nd},
                               {"ko", T * nd}});
  }
  if (config_.HasLayer(LayerType::kAttn)) {
    const AttnConfig& at = config_.attn;
    const std::size_t qw = at.q_width(), kw = at.kv_width();
    // Encoded rows are never wider than f32 ones.
    sizes.insert(sizes.end(), {{"aq", T * qw}, {"ak", T * kw}, {"av", T * kw}, {"ek", T * kw}, {"ev", T * kw},
                               {"ao", T * qw}});
  }
  for (const auto& [name, floats] : sizes) {
    auto m = device_->Allocate(floats * sizeof(float));
    if (!m.ok()) return m.status().WithContext(std::string("model scratch '") + name + "'");
    scratch_.emplace(name, std::move(m).value());
  }
  return Status::Ok();
}

float* HybridModel::S(const char* name) const { return scratch_.at(name).at<float>(0); }
const float* HybridModel::W(const std::string& name) const { return weights_.at(name).at<float>(0); }
const float* HybridModel::L(std::size_t layer, const char* name) const {
  return W("layers." + std::to_string(layer) + "." + name);
}

Result<ModelSession> HybridModel::NewSession() {
  PC_ASSIGN_OR_RETURN(auto cache, engine_->NewSession());
  return ModelSession{std::move(cache), 0};
}

Status HybridModel::Prime(ModelSession& session, std::span<const std::uint32_t> tokens, LogitsWanted wanted,
                          std::vector<float>* logits) {
  if (session.cache == nullptr) return Status::InvalidArgument("model: session without a cache");
  for (std::uint32_t t : tokens) {
    if (t >= config_.vocab) {
      return Status::InvalidArgument("token " + std::to_string(t) + " is outside the vocabulary of " +
                                     std::to_string(config_.vocab));
    }
  }
  if (session.position + tokens.size() > session.cache->max_ctx()) {
    return Status::ResourceExhausted("model: " + std::to_string(tokens.size()) + " tokens after " +
                                     std::to_string(session.position) + " pass the session's capacity of " +
                                     std::to_string(session.cache->max_ctx()));
  }
  if (wanted != LogitsWanted::kNone && logits == nullptr) return Status::InvalidArgument("model: logits wanted, no output");
  for (std::size_t off = 0; off < tokens.size(); off += options_.chunk_tokens) {
    const std::size_t n = std::min(options_.chunk_tokens, tokens.size() - off);
    const bool last = off + n == tokens.size();
    const LogitsWanted here = wanted == LogitsWanted::kLast && !last ? LogitsWanted::kNone : wanted;
    PC_RETURN_IF_ERROR(Forward(session, tokens.data() + off, n, here, logits));
  }
  return Status::Ok();
}

Status HybridModel::Forward(ModelSession& s, const std::uint32_t* tokens, std::size_t count, LogitsWanted wanted,
                            std::vector<float>* logits) {
  Compute& c = *compute_;
  const std::size_t H = config_.hidden, F = config_.mlp_hidden, V = config_.vocab;
  const float eps = config_.norm_eps;
  auto* tok = reinterpret_cast<std::uint32_t*>(S("tokens"));
  float *x = S("x"), *u = S("u"), *out = S("out"), *a = S("mlp_a"), *b = S("mlp_b");
  PC_RETURN_IF_ERROR(device_->Upload(tok, tokens, count * sizeof(std::uint32_t), Lane::kCompute));
  PC_RETURN_IF_ERROR(c.GatherRows(W("embed"), V, H, tok, count, x));
  for (std::size_t l = 0; l < config_.layers.size(); ++l) {
    PC_RETURN_IF_ERROR(c.RmsNormRows({x, u, L(l, "attn_norm.weight"), count, H, H, H, eps}));
    Status mixed;
    switch (config_.layers[l]) {
      case LayerType::kMla:
        mixed = MlaMixer(s, l, count);
        break;
      case LayerType::kKda:
        mixed = KdaMixer(s, l, count);
        break;
      case LayerType::kAttn:
        mixed = AttnMixer(s, l, count);
        break;
    }
    if (!mixed.ok()) return mixed.WithContext("layer " + std::to_string(l));
    PC_RETURN_IF_ERROR(SumAcrossRanks(out, count * H));
    PC_RETURN_IF_ERROR(c.Add(x, out, count * H));
    PC_RETURN_IF_ERROR(c.RmsNormRows({x, u, L(l, "mlp_norm.weight"), count, H, H, H, eps}));
    PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mlp.w1"), a, F, count, H, F));
    PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mlp.w3"), b, F, count, H, F));
    PC_RETURN_IF_ERROR(c.SiluMul(a, b, count * F));
    PC_RETURN_IF_ERROR(c.Gemm(a, F, L(l, "mlp.w2"), out, H, count, F, H));
    PC_RETURN_IF_ERROR(SumAcrossRanks(out, count * H));
    PC_RETURN_IF_ERROR(c.Add(x, out, count * H));
  }
  s.position += count;
  if (wanted != LogitsWanted::kNone) {
    const std::size_t rows = wanted == LogitsWanted::kAll ? count : 1, first = count - rows;
    PC_RETURN_IF_ERROR(c.RmsNormRows({x + first * H, u, W("final_norm.weight"), rows, H, H, H, eps}));
    PC_RETURN_IF_ERROR(c.Gemm(u, H, W("lm_head"), S("logits"), V, rows, H, V));
    const std::size_t old = logits->size();
    logits->resize(old + rows * V);
    PC_RETURN_IF_ERROR(device_->Download(logits->data() + old, S("logits"), rows * V * sizeof(float), Lane::kCompute));
  }
  return device_->Synchronize(Lane::kCompute);
}

Status HybridModel::SumAcrossRanks(float* out, std::size_t floats) {
  if (options_.collective == nullptr) return Status::Ok();
  return options_.collective->AllReduceSum(out, floats);
}

Status HybridModel::MlaMixer(ModelSession& s, std::size_t l, std::size_t count) {
  Compute& c = *compute_;
  const MlaConfig& m = config_.mla;
  const std::size_t H = config_.hidden, nh = m.heads, r = m.kv_rank, dr = m.rope_dim, dn = m.nope_dim, dv = m.v_dim;
  const std::size_t width = r + dr, qw = nh * (dn + dr);
  const float eps = config_.norm_eps;
  const std::uint64_t p0 = s.position;
  engine::LatentCacheLayer* lat = s.cache->latent(l);
  if (lat == nullptr) return Status::Internal("the cache's layer is not a latent layer");
  if (lat->len() != p0) {
    return Status::FailedPrecondition("latent len " + std::to_string(lat->len()) + " != session position " +
                                      std::to_string(p0));
  }
  const float* u = S("u");
  float *mla_a = S("mla_a"), *rows = S("mla_rows"), *q = S("q"), *qt = S("qt"), *o = S("o"), *ho = S("ho");

  // This run's latent rows (and index rows), appended in one call.
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mla.wdkv"), mla_a, width, count, H, width));
  PC_RETURN_IF_ERROR(c.MlaRows({mla_a, L(l, "mla.kv_norm.weight"), rows, count, r, dr, width, p0, eps, m.rope_theta}));
  if (m.indexer) {
    const std::size_t di = m.indexer->head_dim;
    float *kraw = S("kraw"), *irows = S("irows");
    PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mla.idx.wk"), kraw, di, count, H, di));
    PC_RETURN_IF_ERROR(c.RmsNormRows({kraw, irows, L(l, "mla.idx.k_norm.weight"), count, di, di, 2 * di, eps}));
    PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mla.idx.wg"), irows + di, 2 * di, count, H, di));
    engine::IndexerInputs in{m.indexer->pool, L(l, "mla.idx.ape")};
    PC_RETURN_IF_ERROR(lat->Append(rows, irows, count, &in));
  } else {
    PC_RETURN_IF_ERROR(lat->Append(rows, nullptr, count, nullptr));
  }

  // Queries: roped q_pe in place, absorbed q_nope.
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mla.wq"), q, qw, count, H, qw));
  PC_RETURN_IF_ERROR(c.Rope({q, count, nh, qw, dn + dr, dn, dr, p0, m.rope_theta}));
  PC_RETURN_IF_ERROR(c.AbsorbQuery(q, L(l, "mla.wuk"), qt, count, nh, dn, dr, r));

  kernels::MlaAttentionArgs attn;
  attn.qt = qt;
  attn.qp = q + dn;
  attn.qp_token_stride = qw;
  attn.qp_head_stride = dn + dr;
  attn.rows = lat->rows();
  attn.out = o;
  attn.count = count;
  attn.first_pos = p0;
  attn.heads = nh;
  attn.kv_rank = r;
  attn.rope_dim = dr;
  attn.scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));
  if (m.indexer) {
    const IndexerConfig& ix = *m.indexer;
    float *qi = S("qi"), *wt = S("wt");
    PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mla.idx.wq"), qi, ix.heads * ix.head_dim, count, H, ix.heads * ix.head_dim));
    PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "mla.idx.ww"), wt, ix.heads, count, H, ix.heads));
    kernels::IndexerSelectArgs sel;
    sel.qi = qi;
    sel.wt = wt;
    sel.keys = lat->pool_keys();
    sel.selected = reinterpret_cast<std::uint32_t*>(S("sel"));
    sel.selected_count = reinterpret_cast<std::uint32_t*>(S("sel_count"));
    sel.count = count;
    sel.first_pos = p0;
    sel.heads = ix.heads;
    sel.head_dim = ix.head_dim;
    sel.pool = ix.pool;
    sel.topk = ix.topk;
    if (auto it = scratch_.find("sel_scratch"); it != scratch_.end()) sel.scratch = it->second.data();
    PC_RETURN_IF_ERROR(c.IndexerSelect(sel));
    attn.pools = sel.selected;
    attn.pool_count = sel.selected_count;
    attn.pool = ix.pool;
    attn.pool_stride = ix.topk;
  }
  PC_RETURN_IF_ERROR(c.MlaAttention(attn));
  PC_RETURN_IF_ERROR(c.HeadsOut(o, L(l, "mla.wuv"), ho, count, nh, r, dv));
  return c.Gemm(ho, nh * dv, L(l, "mla.wo"), S("out"), H, count, nh * dv, H);
}

Status HybridModel::KdaMixer(ModelSession& s, std::size_t l, std::size_t count) {
  Compute& c = *compute_;
  const KdaConfig& k = config_.kda;
  const std::size_t H = config_.hidden, n = k.heads, d = k.head_dim, nd = n * d, K = k.conv_kernel;
  engine::RecurrentCacheLayer* rec = s.cache->recurrent(l);
  if (rec == nullptr) return Status::Internal("the cache's layer is not a recurrent layer");
  const float* u = S("u");
  float *raw = S("raw"), *conv = S("conv"), *g = S("g"), *b = S("b"), *og = S("og"), *ko = S("ko");

  // Pre-conv inputs of the fused q, k, v planes, token-major [count, 3*n*d].
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "kda.wq"), raw, 3 * nd, count, H, nd));
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "kda.wk"), raw + nd, 3 * nd, count, H, nd));
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "kda.wv"), raw + 2 * nd, 3 * nd, count, H, nd));
  PC_RETURN_IF_ERROR(c.KdaConv({raw, fused_taps_[l].at<float>(0), rec->conv_ring(), conv, 3 * nd, K, count}));
  PC_RETURN_IF_ERROR(c.L2NormRows({conv, count, 2 * n, d, 3 * nd}));  // the q and k heads
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "kda.wg"), g, nd, count, H, nd));
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "kda.wb"), b, n, count, H, n));
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "kda.wog"), og, nd, count, H, nd));

  // The recurrence runs from state() into next_state(); Step makes it current
  // and pushes this run's inputs into the conv ring.
  const std::size_t state_bytes = rec->plan().state_values() * sizeof(float);
  PC_RETURN_IF_ERROR(device_->CopyOnDevice(rec->next_state(), rec->state(), state_bytes, Lane::kCompute));
  kernels::KdaScanArgs scan;
  scan.q = conv;
  scan.k = conv + nd;
  scan.v = conv + 2 * nd;
  scan.g = g;
  scan.b = b;
  scan.state = rec->next_state();
  scan.out = ko;
  scan.heads = n;
  scan.head_dim = d;
  scan.count = count;
  scan.gate_lower_bound = k.gate_lower_bound;
  scan.qkv_token_stride = 3 * nd;
  PC_RETURN_IF_ERROR(c.KdaScan(scan));
  if (s.cache->round_armed()) {
    // What a rollback replays: the scan's own inputs.
    PC_RETURN_IF_ERROR(rec->StashScanInputs({conv, g, b, k.gate_lower_bound}, count));
  }
  PC_RETURN_IF_ERROR(rec->Step(raw, count));
  PC_RETURN_IF_ERROR(c.KdaOutput(ko, og, L(l, "kda.o_norm.weight"), count, n, d, config_.norm_eps));
  return c.Gemm(ko, nd, L(l, "kda.wo"), S("out"), H, count, nd, H);
}

// Grouped-query attention over the layer's plain or rotating KV rows, f32 or
// TurboQuant. The call's own rows are read from scratch (encoded first when
// quantized, so every position reads back what is stored), and appended only
// after the queries have read the cache: a rotating buffer never loses a row
// a query of the same call still needs.
Status HybridModel::AttnMixer(ModelSession& s, std::size_t l, std::size_t count) {
  Compute& c = *compute_;
  const AttnConfig& at = config_.attn;
  const std::size_t H = config_.hidden, hd = at.head_dim, qw = at.q_width(), kw = at.kv_width();
  engine::KvCacheLayer* kv = s.cache->kv(l);
  if (kv == nullptr) return Status::Internal("the cache's layer is not a KV layer");
  if (kv->len() != s.position) {
    return Status::FailedPrecondition("KV len " + std::to_string(kv->len()) + " != session position " +
                                      std::to_string(s.position));
  }
  const float* u = S("u");
  float *q = S("aq"), *k = S("ak"), *v = S("av"), *o = S("ao");
  const std::uint64_t p0 = s.position;
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "attn.wq"), q, qw, count, H, qw));
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "attn.wk"), k, kw, count, H, kw));
  PC_RETURN_IF_ERROR(c.Gemm(u, H, L(l, "attn.wv"), v, kw, count, H, kw));
  PC_RETURN_IF_ERROR(c.Rope({q, count, at.heads, qw, hd, 0, hd, p0, at.rope_theta}));
  PC_RETURN_IF_ERROR(c.Rope({k, count, at.kv_heads, kw, hd, 0, hd, p0, at.rope_theta}));
  const float* new_k = k;
  const float* new_v = v;
  const float* signs = at.kv_quant_bits != 0 ? L(l, "attn.tq_signs") : nullptr;
  if (signs != nullptr) {
    auto* ek = reinterpret_cast<std::uint32_t*>(S("ek"));
    auto* ev = reinterpret_cast<std::uint32_t*>(S("ev"));
    PC_RETURN_IF_ERROR(c.TurboQuantEncode({k, ek, signs, count, at.kv_heads, hd, kw, at.kv_quant_bits}));
    PC_RETURN_IF_ERROR(c.TurboQuantEncode({v, ev, signs, count, at.kv_heads, hd, kw, at.kv_quant_bits}));
    PC_RETURN_IF_ERROR(c.HadamardRows({q, signs, count, at.heads, hd, qw, /*inverse=*/false}));
    new_k = S("ek");
    new_v = S("ev");
  }
  kernels::KvAttentionArgs a;
  a.q = q;
  a.cache_k = kv->k_rows();
  a.cache_v = kv->v_rows();
  a.cache_rows = kv->capacity();
  a.new_k = new_k;
  a.new_v = new_v;
  a.out = o;
  a.count = count;
  a.first_pos = p0;
  a.heads = at.heads;
  a.kv_heads = at.kv_heads;
  a.head_dim = hd;
  a.window = at.window;
  a.bits = at.kv_quant_bits;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  PC_RETURN_IF_ERROR(c.KvAttention(a));
  if (signs != nullptr) PC_RETURN_IF_ERROR(c.HadamardRows({o, signs, count, at.heads, hd, qw, /*inverse=*/true}));
  PC_RETURN_IF_ERROR(kv->Append(new_k, new_v, count));
  return c.Gemm(o, qw, L(l, "attn.wo"), S("out"), H, count, qw, H);
}

Status HybridModel::VerifyDraft(ModelSession& s, std::span<const std::uint32_t> tokens, std::vector<float>* logits) {
  if (s.cache == nullptr) return Status::InvalidArgument("model: session without a cache");
  if (tokens.empty()) return Status::InvalidArgument("model: a verify call needs tokens");
  PC_RETURN_IF_ERROR(s.cache->ArmRound(tokens.size()));
  s.round_base = s.position;
  Status st = Prime(s, tokens, LogitsWanted::kAll, logits);
  if (st.ok()) return st;
  // Nothing of a failed call stays: back to the round's start.
  if (Status back = ResolveRound(s, 0); !back.ok()) return st.WithContext("and its rollback: " + back.ToString());
  return st;
}

Status HybridModel::ResolveRound(ModelSession& s, std::uint64_t keep) {
  if (s.cache == nullptr) return Status::InvalidArgument("model: session without a cache");
  PC_ASSIGN_OR_RETURN(std::uint64_t appended, s.cache->RoundAppended());
  if (keep == appended) {
    PC_RETURN_IF_ERROR(s.cache->CommitRound());
  } else {
    PC_RETURN_IF_ERROR(s.cache->RollbackRound(keep));
  }
  s.position = s.round_base + keep;
  return device_->Synchronize(Lane::kCompute);
}

Result<std::vector<std::uint32_t>> HybridModel::Generate(ModelSession& s, std::span<const float> last_logits,
                                                         std::size_t max_new, std::vector<float>* logits) {
  const std::size_t V = config_.vocab;
  if (last_logits.size() != V) return Status::InvalidArgument("model: last_logits must hold one row of vocab logits");
  std::vector<std::uint32_t> out;
  std::vector<float> row(last_logits.begin(), last_logits.end());
  for (std::size_t i = 0; i < max_new; ++i) {
    std::uint32_t next = 0;
    PC_RETURN_IF_ERROR(kernels::ArgmaxRowsCpu(row.data(), 1, V, &next));
    out.push_back(next);
    if (next == kEosToken) break;
    row.clear();
    PC_RETURN_IF_ERROR(Prime(s, std::span(&next, 1), LogitsWanted::kLast, &row));
    if (logits != nullptr) logits->insert(logits->end(), row.begin(), row.end());
  }
  return out;
}

}  // namespace primecache::model

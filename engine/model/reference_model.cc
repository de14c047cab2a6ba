#include "engine/model/reference_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "kernels/cpu_math.h"
#include "kernels/indexer_select.h"
#include "kernels/kda_scan.h"
#include "kernels/mla_attention.h"
#include "kernels/model_ops.h"
#include "kernels/pool_keys.h"

namespace primecache::model {

namespace cpu = kernels::cpu;
using cpu::MatVec;
using cpu::RmsNorm;

Result<ReferenceModel> ReferenceModel::Create(ModelConfig config, const Weights* weights) {
  PC_RETURN_IF_ERROR(config.Validate());
  PC_RETURN_IF_ERROR(weights->CheckAgainst(config));
  return ReferenceModel(std::move(config), weights);
}

ReferenceModel::ReferenceModel(ModelConfig config, const Weights* weights)
    : config_(std::move(config)), weights_(weights) {
  for (std::size_t l = 0; l < config_.layers.size(); ++l) {
    if (config_.layers[l] == LayerType::kMla) {
      slot_.push_back(mla_.size());
      mla_.emplace_back();
    } else {
      slot_.push_back(kda_.size());
      // The three planes' conv taps, fused into one [3*n*d, K] table.
      std::vector<float> taps;
      for (const char* name : {"kda.conv_q", "kda.conv_k", "kda.conv_v"}) {
        const Tensor* t = weights_->Find("layers." + std::to_string(l) + "." + name);
        taps.insert(taps.end(), t->data.begin(), t->data.end());
      }
      fused_taps_.push_back(std::move(taps));
      KdaState s;
      const std::size_t nd = config_.kda.channels(), d = config_.kda.head_dim;
      s.conv_ring.assign(3 * nd * (config_.kda.conv_kernel - 1), 0.0f);
      s.state.assign(config_.kda.heads * d * d, 0.0f);
      kda_.push_back(std::move(s));
    }
  }
}

const float* ReferenceModel::W(std::size_t layer, const char* name) const {
  std::string full = layer == SIZE_MAX ? name : "layers." + std::to_string(layer) + "." + name;
  return weights_->Find(full)->data.data();  // presence checked by Create
}

Status ReferenceModel::Prime(std::span<const std::uint32_t> tokens, std::vector<float>* logits) {
  for (std::uint32_t t : tokens) {
    if (t >= config_.vocab) {
      return Status::InvalidArgument("token " + std::to_string(t) + " is outside the vocabulary of " +
                                     std::to_string(config_.vocab));
    }
  }
  std::vector<float> row(config_.vocab);
  for (std::uint32_t t : tokens) {
    Step(t, logits ? row.data() : nullptr);
    if (logits) logits->insert(logits->end(), row.begin(), row.end());
  }
  return Status::Ok();
}

void ReferenceModel::Step(std::uint32_t token, float* logits) {
  const std::size_t H = config_.hidden;
  std::vector<float> x(W(SIZE_MAX, "embed") + std::size_t{token} * H, W(SIZE_MAX, "embed") + (token + 1) * H);
  std::vector<float> u(H), out(H);
  for (std::size_t l = 0; l < config_.layers.size(); ++l) {
    RmsNorm(x.data(), W(l, "attn_norm.weight"), H, config_.norm_eps, u.data());
    if (config_.layers[l] == LayerType::kMla) {
      MlaMixer(l, u.data(), out.data());
    } else {
      KdaMixer(l, u.data(), out.data());
    }
    for (std::size_t i = 0; i < H; ++i) x[i] += out[i];
    RmsNorm(x.data(), W(l, "mlp_norm.weight"), H, config_.norm_eps, u.data());
    Mlp(l, u.data(), out.data());
    for (std::size_t i = 0; i < H; ++i) x[i] += out[i];
  }
  if (logits != nullptr) {
    RmsNorm(x.data(), W(SIZE_MAX, "final_norm.weight"), H, config_.norm_eps, u.data());
    MatVec(W(SIZE_MAX, "lm_head"), config_.vocab, H, u.data(), logits);
  }
  ++position_;
}

void ReferenceModel::Mlp(std::size_t l, const float* u, float* out) {
  const std::size_t H = config_.hidden, F = config_.mlp_hidden;
  std::vector<float> a(F), b(F);
  MatVec(W(l, "mlp.w1"), F, H, u, a.data());
  MatVec(W(l, "mlp.w3"), F, H, u, b.data());
  (void)kernels::SiluMulCpu(a.data(), b.data(), F);
  MatVec(W(l, "mlp.w2"), H, F, a.data(), out);
}

void ReferenceModel::MlaMixer(std::size_t l, const float* u, float* out) {
  const MlaConfig& m = config_.mla;
  const std::size_t H = config_.hidden, r = m.kv_rank, dr = m.rope_dim, dn = m.nope_dim, dv = m.v_dim;
  const std::size_t nh = m.heads, width = r + dr;
  const std::uint64_t t = position_;
  MlaState& st = mla_[slot_[l]];

  // The latent row of this token.
  std::vector<float> a(width);
  MatVec(W(l, "mla.wdkv"), width, H, u, a.data());
  st.rows.resize(st.rows.size() + width);
  (void)kernels::MlaRowsCpu(
      {a.data(), W(l, "mla.kv_norm.weight"), st.rows.data() + t * width, 1, r, dr, width, t, config_.norm_eps, m.rope_theta});

  // Queries: roped q_pe and the absorbed q_nope (wuk[h]^T q_nope, kv_rank wide).
  std::vector<float> q(nh * (dn + dr)), qt(nh * r), qp(nh * dr), o(nh * r), heads_out(nh * dv);
  MatVec(W(l, "mla.wq"), nh * (dn + dr), H, u, q.data());
  const float* wuk = W(l, "mla.wuk");
  for (std::size_t h = 0; h < nh; ++h) {
    const float* qn = q.data() + h * (dn + dr);
    std::copy(qn + dn, qn + dn + dr, qp.begin() + static_cast<std::ptrdiff_t>(h * dr));
    cpu::Rope(qp.data() + h * dr, dr, t, m.rope_theta);
    const float* wk = wuk + h * dn * r;  // [dn, r]
    for (std::size_t j = 0; j < r; ++j) {
      float s = 0.0f;
      for (std::size_t i = 0; i < dn; ++i) s += wk[i * r + j] * qn[i];
      qt[h * r + j] = s;
    }
  }
  kernels::MlaAttentionArgs attn;
  attn.qt = qt.data();
  attn.qp = qp.data();
  attn.rows = st.rows.data();
  attn.out = o.data();
  attn.count = 1;
  attn.first_pos = t;
  attn.heads = nh;
  attn.kv_rank = r;
  attn.rope_dim = dr;
  attn.scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));

  std::vector<std::uint32_t> pools;
  std::uint32_t pool_count = 0;
  if (m.indexer) {
    // The indexer: this token's index row, keys of pools it completes, and
    // the top-k visible pools (ties to the lower pool), sorted ascending.
    const IndexerConfig& ix = *m.indexer;
    const std::size_t di = ix.head_dim, P = ix.pool;
    std::vector<float> irow(2 * di), kraw(di);
    MatVec(W(l, "mla.idx.wk"), di, H, u, kraw.data());
    RmsNorm(kraw.data(), W(l, "mla.idx.k_norm.weight"), di, config_.norm_eps, irow.data());
    MatVec(W(l, "mla.idx.wg"), di, H, u, irow.data() + di);
    st.index_rows.insert(st.index_rows.end(), irow.begin(), irow.end());
    const std::uint64_t ready = (t + 1) / P;
    if (ready > st.pools_ready) {
      st.pool_keys.resize(ready * di);
      kernels::PoolKeyArgs args{st.index_rows.data(), 0, W(l, "mla.idx.ape"), st.pool_keys.data(), di, P,
                                st.pools_ready, ready - st.pools_ready};
      (void)kernels::BuildPoolKeysCpu(args);  // geometry validated with the config
      st.pools_ready = ready;
    }
    std::vector<float> qi(ix.heads * di), wt(ix.heads);
    MatVec(W(l, "mla.idx.wq"), ix.heads * di, H, u, qi.data());
    MatVec(W(l, "mla.idx.ww"), ix.heads, H, u, wt.data());
    pools.resize(ix.topk);
    kernels::IndexerSelectArgs sel;
    sel.qi = qi.data();
    sel.wt = wt.data();
    sel.keys = st.pool_keys.data();
    sel.selected = pools.data();
    sel.selected_count = &pool_count;
    sel.count = 1;
    sel.first_pos = t;
    sel.heads = ix.heads;
    sel.head_dim = di;
    sel.pool = P;
    sel.topk = ix.topk;
    (void)kernels::IndexerSelectCpu(sel);
    attn.pools = pools.data();
    attn.pool_count = &pool_count;
    attn.pool = P;
    attn.pool_stride = pools.size();
  }
  (void)kernels::MlaAttentionCpu(attn);  // shapes fixed by the validated config
  const float* wuv = W(l, "mla.wuv");
  for (std::size_t h = 0; h < nh; ++h) MatVec(wuv + h * dv * r, dv, r, o.data() + h * r, heads_out.data() + h * dv);
  MatVec(W(l, "mla.wo"), H, nh * dv, heads_out.data(), out);
  ++st.len;
}

void ReferenceModel::KdaMixer(std::size_t l, const float* u, float* out) {
  const KdaConfig& k = config_.kda;
  const std::size_t H = config_.hidden, n = k.heads, d = k.head_dim, nd = n * d, K = k.conv_kernel;
  KdaState& st = kda_[slot_[l]];

  // Projections, then the short causal conv over the three fused planes.
  std::vector<float> raw(3 * nd), conv(3 * nd);
  MatVec(W(l, "kda.wq"), nd, H, u, raw.data());
  MatVec(W(l, "kda.wk"), nd, H, u, raw.data() + nd);
  MatVec(W(l, "kda.wv"), nd, H, u, raw.data() + 2 * nd);
  (void)kernels::KdaConvCpu({raw.data(), fused_taps_[slot_[l]].data(), st.conv_ring.data(), conv.data(), 3 * nd, K, 1});
  for (std::size_t ch = 0; ch < 3 * nd; ++ch) {
    float* ring = st.conv_ring.data() + ch * (K - 1);
    for (std::size_t i = 0; i + 2 < K; ++i) ring[i] = ring[i + 1];
    ring[K - 2] = raw[ch];
  }

  std::vector<float> g(nd), b(n), og(nd), o(nd);
  MatVec(W(l, "kda.wg"), nd, H, u, g.data());
  MatVec(W(l, "kda.wb"), n, H, u, b.data());
  MatVec(W(l, "kda.wog"), nd, H, u, og.data());
  (void)kernels::L2NormRowsCpu({conv.data(), 1, 2 * n, d, 3 * nd});  // the q and k heads
  kernels::KdaScanArgs scan{conv.data(), conv.data() + nd, conv.data() + 2 * nd, g.data(), b.data(),
                            st.state.data(), o.data(), n, d, 1, k.gate_lower_bound};
  (void)kernels::KdaScanCpu(scan);  // shapes fixed by the validated config
  (void)kernels::KdaOutputCpu(o.data(), og.data(), W(l, "kda.o_norm.weight"), 1, n, d, config_.norm_eps);
  MatVec(W(l, "kda.wo"), H, nd, o.data(), out);
}

}  // namespace primecache::model

// Tensor names and shapes of the reference model, deterministic weight
// generation, the weights digest, and the byte tokenizer.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "primecache/checksum.h"
#include "primecache/internal/model.h"

namespace primecache::model {
namespace {

using Shape = std::vector<std::int64_t>;

std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform value in [-1, 1) that depends only on (stream, i).
float UniformAt(std::uint64_t stream, std::uint64_t i) {
  std::uint64_t bits = SplitMix64(stream ^ SplitMix64(i));
  return static_cast<float>(static_cast<double>(bits >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

std::string ShapeString(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

ModelCost PrefillCost(const ModelConfig& c) {
  double params = 0;
  for (const auto& [name, shape] : ExpectedTensors(c)) {
    if (!name.starts_with("layers.")) continue;
    double n = 1;
    for (std::int64_t d : shape) n *= static_cast<double>(d);
    params += n;
  }
  double per_token = 2 * params;
  // One (query, key) pair: the q.k product and the weighted v, per head.
  const double mla_pair = 2.0 * (c.mla.nope_dim + c.mla.rope_dim + c.mla.v_dim) * c.mla.heads;
  const double attn_pair = 2.0 * (2.0 * c.attn.head_dim) * c.attn.heads;
  double pairs = 0;
  std::uint32_t attention = 0;
  for (LayerType t : c.layers) {
    if (t == LayerType::kMla) {
      pairs += mla_pair;
      ++attention;
    } else if (t == LayerType::kAttn && c.attn.window == 0) {
      pairs += attn_pair;
      ++attention;
    } else if (t == LayerType::kAttn) {
      per_token += attn_pair * c.attn.window;  // at most `window` keys a query
    }
  }
  ModelCost cost;
  cost.flops_per_token = static_cast<std::uint64_t>(per_token);
  cost.attention_layers = attention;
  cost.attention_flops_per_pair = attention == 0 ? 0 : static_cast<std::uint64_t>(pairs / attention + 0.5);
  return cost;
}

std::vector<std::pair<std::string, Shape>> ExpectedTensors(const ModelConfig& c) {
  const std::int64_t H = c.hidden, F = c.mlp_hidden, V = c.vocab;
  std::vector<std::pair<std::string, Shape>> t = {
      {"embed", {V, H}}, {"final_norm.weight", {H}}, {"lm_head", {V, H}}};
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {H}});
    t.push_back({p + "mlp_norm.weight", {H}});
    t.push_back({p + "mlp.w1", {F, H}});
    t.push_back({p + "mlp.w3", {F, H}});
    t.push_back({p + "mlp.w2", {H, F}});
    if (c.layers[l] == LayerType::kMla) {
      const MlaConfig& m = c.mla;
      const std::int64_t nh = m.heads, r = m.kv_rank, dr = m.rope_dim, dn = m.nope_dim, dv = m.v_dim;
      t.push_back({p + "mla.wq", {nh * (dn + dr), H}});
      t.push_back({p + "mla.wdkv", {r + dr, H}});
      t.push_back({p + "mla.kv_norm.weight", {r}});
      t.push_back({p + "mla.wuk", {nh, dn, r}});
      t.push_back({p + "mla.wuv", {nh, dv, r}});
      t.push_back({p + "mla.wo", {H, nh * dv}});
      if (m.indexer) {
        const std::int64_t di = m.indexer->head_dim, ih = m.indexer->heads, P = m.indexer->pool;
        t.push_back({p + "mla.idx.wk", {di, H}});
        t.push_back({p + "mla.idx.k_norm.weight", {di}});
        t.push_back({p + "mla.idx.wg", {di, H}});
        t.push_back({p + "mla.idx.ape", {P, di}});
        t.push_back({p + "mla.idx.wq", {ih * di, H}});
        t.push_back({p + "mla.idx.ww", {ih, H}});
      }
    } else if (c.layers[l] == LayerType::kAttn) {
      const AttnConfig& a = c.attn;
      t.push_back({p + "attn.wq", {std::int64_t{a.q_width()}, H}});
      t.push_back({p + "attn.wk", {std::int64_t{a.kv_width()}, H}});
      t.push_back({p + "attn.wv", {std::int64_t{a.kv_width()}, H}});
      t.push_back({p + "attn.wo", {H, std::int64_t{a.q_width()}}});
      if (a.kv_quant_bits != 0) t.push_back({p + "attn.tq_signs", {std::int64_t{a.head_dim}}});
    } else {
      const KdaConfig& k = c.kda;
      const std::int64_t nd = std::int64_t{k.heads} * k.head_dim, K = k.conv_kernel;
      for (const char* w : {"kda.wq", "kda.wk", "kda.wv"}) t.push_back({p + w, {nd, H}});
      for (const char* w : {"kda.conv_q", "kda.conv_k", "kda.conv_v"}) t.push_back({p + w, {nd, K}});
      t.push_back({p + "kda.wg", {nd, H}});
      t.push_back({p + "kda.wb", {std::int64_t{k.heads}, H}});
      t.push_back({p + "kda.wog", {nd, H}});
      t.push_back({p + "kda.o_norm.weight", {std::int64_t{k.head_dim}}});
      t.push_back({p + "kda.wo", {H, nd}});
    }
  }
  return t;
}

Weights Weights::Generate(const ModelConfig& c, std::uint64_t seed) {
  auto expected = ExpectedTensors(c);
  std::vector<Tensor> made(expected.size());
  // Each value depends on (seed, name, index) alone, so tensors can be made
  // in any order, on any number of threads, with the same result.
  auto make = [&](std::size_t k) {
    const auto& [name, shape] = expected[k];
    Tensor& t = made[k];
    t.shape = shape;
    std::size_t n = 1;
    for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
    t.data.resize(n);
    const std::uint64_t stream = seed ^ Checksum64(std::string_view(name));
    const bool is_norm = name.find("norm.weight") != std::string::npos;
    const bool is_conv = name.find("conv_") != std::string::npos;
    const bool is_signs = name.find("tq_signs") != std::string::npos;
    // Matrices get variance ~1/fan_in so activations stay O(1) through depth;
    // norm weights sit near 1; conv taps in ±0.5; the embedding and ape O(1).
    float scale = 1.0f;
    if (shape.size() > 1 && name != "embed" && name.find("ape") == std::string::npos && !is_conv) {
      scale = std::sqrt(3.0f / static_cast<float>(shape.back()));
    }
    if (is_conv) scale = 0.5f;
    for (std::size_t i = 0; i < n; ++i) {
      const float u = UniformAt(stream, i);
      if (is_signs) {
        t.data[i] = u < 0.0f ? -1.0f : 1.0f;
      } else {
        t.data[i] = is_norm ? 1.0f + 0.1f * u : scale * u;
      }
    }
  };
  const std::size_t threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  for (std::size_t w = 0; w < threads; ++w) {
    pool.emplace_back([&] {
      for (std::size_t k = next++; k < expected.size(); k = next++) make(k);
    });
  }
  for (auto& th : pool) th.join();
  std::map<std::string, Tensor> out;
  for (std::size_t k = 0; k < expected.size(); ++k) out.emplace(expected[k].first, std::move(made[k]));
  return Weights(std::move(out));
}

Status Weights::CheckAgainst(const ModelConfig& c) const {
  auto expected = ExpectedTensors(c);
  for (const auto& [name, shape] : expected) {
    const Tensor* t = Find(name);
    if (t == nullptr) return Status::InvalidArgument("weights lack tensor " + name + " " + ShapeString(shape));
    if (t->shape != shape) {
      return Status::InvalidArgument("tensor " + name + " has shape " + ShapeString(t->shape) + ", the config needs " +
                                     ShapeString(shape));
    }
    const bool signs = name.ends_with("tq_signs");
    for (float v : t->data) {
      if (!std::isfinite(v)) return Status::InvalidArgument("tensor " + name + " holds a non-finite value");
      if (signs && v != 1.0f && v != -1.0f) {
        return Status::InvalidArgument("tensor " + name + " holds " + std::to_string(v) + "; every sign is +1 or -1");
      }
    }
  }
  if (tensors_.size() != expected.size()) {
    for (const auto& [name, t] : tensors_) {
      bool known = false;
      for (const auto& e : expected) known = known || e.first == name;
      if (!known) return Status::InvalidArgument("weights hold unexpected tensor " + name);
    }
  }
  return Status::Ok();
}

const Tensor* Weights::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Hash128 Weights::Digest() const {
  std::string record;
  for (const auto& [name, t] : tensors_) {
    const std::uint64_t name_len = name.size(), rank = t.shape.size(), values = Checksum64(std::as_bytes(std::span(t.data)));
    record.append(reinterpret_cast<const char*>(&name_len), sizeof name_len);
    record += name;
    record.append(reinterpret_cast<const char*>(&rank), sizeof rank);
    record.append(reinterpret_cast<const char*>(t.shape.data()), t.shape.size() * sizeof(std::int64_t));
    record.append(reinterpret_cast<const char*>(&values), sizeof values);
  }
  return Checksum128(std::as_bytes(std::span(record.data(), record.size())));
}

std::vector<std::uint32_t> Tokenize(std::string_view text) {
  std::vector<std::uint32_t> out;
  out.reserve(text.size() + 1);
  out.push_back(kBosToken);
  for (unsigned char ch : text) out.push_back(ch);
  return out;
}

std::string Detokenize(const std::vector<std::uint32_t>& tokens) {
  std::string out;
  for (std::uint32_t t : tokens)
    if (t < 256) out.push_back(static_cast<char>(t));
  return out;
}

}  // namespace primecache::model

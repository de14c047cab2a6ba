// ModelConfig <-> JSON, with every value checked before use.
#include <nlohmann/json.hpp>

#include <cmath>

#include "primecache/internal/model.h"

namespace primecache::model {
namespace {

using Json = nlohmann::json;

// Reads obj[key] as an unsigned 32-bit integer.
Status ReadU32(const Json& obj, const char* key, std::uint32_t* out, std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::InvalidArgument(std::string(where) + "." + key + " is missing");
  if (!it->is_number_integer() || it->get<std::int64_t>() < 0 ||
      it->get<std::int64_t>() > std::int64_t{UINT32_MAX}) {
    return Status::InvalidArgument(std::string(where) + "." + key + " must be a non-negative integer");
  }
  *out = static_cast<std::uint32_t>(it->get<std::int64_t>());
  return Status::Ok();
}

Status ReadFloat(const Json& obj, const char* key, float* out, std::string_view where, bool required) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return Status::InvalidArgument(std::string(where) + "." + key + " is missing");
    return Status::Ok();
  }
  if (!it->is_number()) return Status::InvalidArgument(std::string(where) + "." + key + " must be a number");
  double v = it->get<double>();
  if (!std::isfinite(v)) return Status::InvalidArgument(std::string(where) + "." + key + " must be finite");
  *out = static_cast<float>(v);
  return Status::Ok();
}

Status CheckDim(std::uint32_t v, std::uint32_t max, const char* name, bool allow_zero = false) {
  if ((!allow_zero && v == 0) || v > max) {
    return Status::InvalidArgument(std::string(name) + " = " + std::to_string(v) + " is out of range (" +
                                   (allow_zero ? "0" : "1") + ".." + std::to_string(max) + ")");
  }
  return Status::Ok();
}

// Reads an integer that may be null (0).
Status ReadOptionalU32(const Json& obj, const char* key, std::uint32_t* out, std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    *out = 0;
    return Status::Ok();
  }
  return ReadU32(obj, key, out, where);
}

Status ReadAttn(const Json& j, AttnConfig* a) {
  auto it = j.find("attn");
  if (it == j.end() || !it->is_object()) return Status::InvalidArgument("config.attn must be an object");
  const Json& o = *it;
  PC_RETURN_IF_ERROR(ReadU32(o, "heads", &a->heads, "attn"));
  PC_RETURN_IF_ERROR(ReadU32(o, "kv_heads", &a->kv_heads, "attn"));
  PC_RETURN_IF_ERROR(ReadU32(o, "head_dim", &a->head_dim, "attn"));
  PC_RETURN_IF_ERROR(ReadOptionalU32(o, "window", &a->window, "attn"));
  if (auto w = o.find("window"); w != o.end() && !w->is_null() && a->window == 0) {
    return Status::InvalidArgument("attn.window must be null or >= 1");
  }
  PC_RETURN_IF_ERROR(ReadFloat(o, "rope_theta", &a->rope_theta, "attn", /*required=*/false));
  a->kv_quant_bits = 0;
  if (auto q = o.find("kv_quant"); q != o.end() && !q->is_null()) {
    if (!q->is_object()) return Status::InvalidArgument("attn.kv_quant must be an object or null");
    auto kind = q->find("kind");
    if (kind == q->end() || *kind != "turboquant") {
      return Status::InvalidArgument("attn.kv_quant.kind must be \"turboquant\"");
    }
    PC_RETURN_IF_ERROR(ReadU32(*q, "bits", &a->kv_quant_bits, "attn.kv_quant"));
    if (a->kv_quant_bits != 2 && a->kv_quant_bits != 4) {
      return Status::InvalidArgument("attn.kv_quant.bits must be 2 or 4");
    }
  }
  return Status::Ok();
}

}  // namespace

bool ModelConfig::HasLayer(LayerType t) const {
  for (LayerType l : layers)
    if (l == t) return true;
  return false;
}

Status ModelConfig::Validate(const ConfigLimits& lim) const {
  if (vocab < 258 || vocab > lim.max_vocab) {
    return Status::InvalidArgument("vocab = " + std::to_string(vocab) + " must be in 258.." +
                                   std::to_string(lim.max_vocab) + " (bytes, BOS and EOS)");
  }
  PC_RETURN_IF_ERROR(CheckDim(hidden, lim.max_dim, "hidden"));
  PC_RETURN_IF_ERROR(CheckDim(mlp_hidden, lim.max_dim, "mlp_hidden"));
  if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps)) return Status::InvalidArgument("norm_eps must be > 0");
  if (layers.empty() || layers.size() > lim.max_layers) {
    return Status::InvalidArgument("layers must list 1.." + std::to_string(lim.max_layers) + " layers");
  }
  if (HasLayer(LayerType::kMla)) {
    PC_RETURN_IF_ERROR(CheckDim(mla.heads, lim.max_heads, "mla.heads"));
    PC_RETURN_IF_ERROR(CheckDim(mla.kv_rank, lim.max_dim, "mla.kv_rank"));
    PC_RETURN_IF_ERROR(CheckDim(mla.rope_dim, lim.max_dim, "mla.rope_dim", /*allow_zero=*/true));
    PC_RETURN_IF_ERROR(CheckDim(mla.nope_dim, lim.max_dim, "mla.nope_dim"));
    PC_RETURN_IF_ERROR(CheckDim(mla.v_dim, lim.max_dim, "mla.v_dim"));
    if (mla.rope_dim % 2 != 0) return Status::InvalidArgument("mla.rope_dim must be even");
    if (!(mla.rope_theta > 0.0f) || !std::isfinite(mla.rope_theta)) {
      return Status::InvalidArgument("mla.rope_theta must be > 0");
    }
    if (mla.indexer) {
      PC_RETURN_IF_ERROR(CheckDim(mla.indexer->heads, lim.max_heads, "mla.indexer.heads"));
      PC_RETURN_IF_ERROR(CheckDim(mla.indexer->head_dim, lim.max_dim, "mla.indexer.head_dim"));
      PC_RETURN_IF_ERROR(CheckDim(mla.indexer->pool, lim.max_pool, "mla.indexer.pool"));
      PC_RETURN_IF_ERROR(CheckDim(mla.indexer->topk, 1u << 20, "mla.indexer.topk"));
    }
  }
  if (HasLayer(LayerType::kKda)) {
    PC_RETURN_IF_ERROR(CheckDim(kda.heads, lim.max_heads, "kda.heads"));
    PC_RETURN_IF_ERROR(CheckDim(kda.head_dim, lim.max_dim, "kda.head_dim"));
    PC_RETURN_IF_ERROR(CheckDim(kda.conv_kernel, lim.max_conv_kernel, "kda.conv_kernel"));
    if (!std::isfinite(kda.gate_lower_bound) || kda.gate_lower_bound >= 0.0f) {
      return Status::InvalidArgument("kda.gate_lower_bound must be negative");
    }
  }
  if (HasLayer(LayerType::kAttn)) PC_RETURN_IF_ERROR(ValidateAttn(attn, lim));
  return Status::Ok();
}

Status ValidateAttn(const AttnConfig& a, const ConfigLimits& lim) {
  PC_RETURN_IF_ERROR(CheckDim(a.heads, lim.max_heads, "attn.heads"));
  PC_RETURN_IF_ERROR(CheckDim(a.kv_heads, lim.max_heads, "attn.kv_heads"));
  PC_RETURN_IF_ERROR(CheckDim(a.head_dim, lim.max_dim, "attn.head_dim"));
  if (a.heads % a.kv_heads != 0) return Status::InvalidArgument("attn.heads must be a multiple of attn.kv_heads");
  if (a.head_dim % 2 != 0) return Status::InvalidArgument("attn.head_dim must be even");
  if (a.window > lim.max_window) {
    return Status::InvalidArgument("attn.window = " + std::to_string(a.window) + " is above " +
                                   std::to_string(lim.max_window));
  }
  if (!(a.rope_theta > 0.0f) || !std::isfinite(a.rope_theta)) {
    return Status::InvalidArgument("attn.rope_theta must be > 0");
  }
  if (a.kv_quant_bits != 0) {
    if (a.kv_quant_bits != 2 && a.kv_quant_bits != 4) return Status::InvalidArgument("attn.kv_quant.bits must be 2 or 4");
    if (a.head_dim < 16 || a.head_dim > 512 || (a.head_dim & (a.head_dim - 1)) != 0) {
      return Status::InvalidArgument("attn.head_dim must be a power of two in 16..512 with TurboQuant rows");
    }
  }
  return Status::Ok();
}

Result<ModelConfig> ModelConfig::FromJson(std::string_view text, const ConfigLimits& limits) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("model config is not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("model config must be a JSON object");
  ModelConfig c;
  if (auto it = j.find("name"); it != j.end()) {
    if (!it->is_string()) return Status::InvalidArgument("name must be a string");
    c.name = it->get<std::string>();
  }
  PC_RETURN_IF_ERROR(ReadU32(j, "vocab", &c.vocab, "config"));
  PC_RETURN_IF_ERROR(ReadU32(j, "hidden", &c.hidden, "config"));
  PC_RETURN_IF_ERROR(ReadU32(j, "mlp_hidden", &c.mlp_hidden, "config"));
  PC_RETURN_IF_ERROR(ReadFloat(j, "norm_eps", &c.norm_eps, "config", /*required=*/false));
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) return Status::InvalidArgument("config.layers must be an array");
  if (layers->size() > limits.max_layers) return Status::InvalidArgument("config.layers lists too many layers");
  for (const Json& l : *layers) {
    if (l == "kda") {
      c.layers.push_back(LayerType::kKda);
    } else if (l == "mla") {
      c.layers.push_back(LayerType::kMla);
    } else if (l == "attn") {
      c.layers.push_back(LayerType::kAttn);
    } else {
      return Status::InvalidArgument("config.layers: unknown layer type " + l.dump() +
                                     " (expected \"kda\", \"mla\" or \"attn\")");
    }
  }
  if (c.HasLayer(LayerType::kMla)) {
    auto m = j.find("mla");
    if (m == j.end() || !m->is_object()) return Status::InvalidArgument("config.mla must be an object");
    PC_RETURN_IF_ERROR(ReadU32(*m, "heads", &c.mla.heads, "mla"));
    PC_RETURN_IF_ERROR(ReadU32(*m, "kv_rank", &c.mla.kv_rank, "mla"));
    PC_RETURN_IF_ERROR(ReadU32(*m, "rope_dim", &c.mla.rope_dim, "mla"));
    PC_RETURN_IF_ERROR(ReadU32(*m, "nope_dim", &c.mla.nope_dim, "mla"));
    PC_RETURN_IF_ERROR(ReadU32(*m, "v_dim", &c.mla.v_dim, "mla"));
    PC_RETURN_IF_ERROR(ReadFloat(*m, "rope_theta", &c.mla.rope_theta, "mla", /*required=*/false));
    auto ix = m->find("indexer");
    if (ix != m->end() && !ix->is_null()) {
      if (!ix->is_object()) return Status::InvalidArgument("mla.indexer must be an object or null");
      IndexerConfig ic;
      PC_RETURN_IF_ERROR(ReadU32(*ix, "heads", &ic.heads, "mla.indexer"));
      PC_RETURN_IF_ERROR(ReadU32(*ix, "head_dim", &ic.head_dim, "mla.indexer"));
      PC_RETURN_IF_ERROR(ReadU32(*ix, "pool", &ic.pool, "mla.indexer"));
      PC_RETURN_IF_ERROR(ReadU32(*ix, "topk", &ic.topk, "mla.indexer"));
      c.mla.indexer = ic;
    }
  }
  if (c.HasLayer(LayerType::kKda)) {
    auto k = j.find("kda");
    if (k == j.end() || !k->is_object()) return Status::InvalidArgument("config.kda must be an object");
    PC_RETURN_IF_ERROR(ReadU32(*k, "heads", &c.kda.heads, "kda"));
    PC_RETURN_IF_ERROR(ReadU32(*k, "head_dim", &c.kda.head_dim, "kda"));
    PC_RETURN_IF_ERROR(ReadU32(*k, "conv_kernel", &c.kda.conv_kernel, "kda"));
    PC_RETURN_IF_ERROR(ReadFloat(*k, "gate_lower_bound", &c.kda.gate_lower_bound, "kda", /*required=*/false));
  }
  if (c.HasLayer(LayerType::kAttn)) PC_RETURN_IF_ERROR(ReadAttn(j, &c.attn));
  PC_RETURN_IF_ERROR(c.Validate(limits));
  return c;
}

std::string ModelConfig::ToJson() const {
  Json j;
  j["name"] = name;
  j["vocab"] = vocab;
  j["hidden"] = hidden;
  j["mlp_hidden"] = mlp_hidden;
  j["norm_eps"] = norm_eps;
  Json ls = Json::array();
  for (LayerType l : layers) ls.push_back(l == LayerType::kKda ? "kda" : l == LayerType::kMla ? "mla" : "attn");
  j["layers"] = ls;
  if (HasLayer(LayerType::kMla)) {
    Json m = {{"heads", mla.heads},       {"kv_rank", mla.kv_rank}, {"rope_dim", mla.rope_dim},
              {"nope_dim", mla.nope_dim}, {"v_dim", mla.v_dim},     {"rope_theta", mla.rope_theta}};
    if (mla.indexer) {
      m["indexer"] = {{"heads", mla.indexer->heads},
                      {"head_dim", mla.indexer->head_dim},
                      {"pool", mla.indexer->pool},
                      {"topk", mla.indexer->topk}};
    } else {
      m["indexer"] = nullptr;
    }
    j["mla"] = m;
  }
  if (HasLayer(LayerType::kKda)) {
    j["kda"] = {{"heads", kda.heads},
                {"head_dim", kda.head_dim},
                {"conv_kernel", kda.conv_kernel},
                {"gate_lower_bound", kda.gate_lower_bound}};
  }
  if (HasLayer(LayerType::kAttn)) {
    Json a = {{"heads", attn.heads}, {"kv_heads", attn.kv_heads}, {"head_dim", attn.head_dim},
              {"rope_theta", attn.rope_theta}};
    a["window"] = attn.window == 0 ? Json(nullptr) : Json(attn.window);
    a["kv_quant"] = attn.kv_quant_bits == 0 ? Json(nullptr)
                                            : Json{{"kind", "turboquant"}, {"bits", attn.kv_quant_bits}};
    j["attn"] = a;
  }
  return j.dump(2);
}

Result<ModelConfig> LoadModelConfig(Env* env, const std::string& path) {
  auto text = ReadFileToString(env, path);
  if (!text.ok()) return text.status().WithContext("reading model config");
  auto c = ModelConfig::FromJson(*text);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

}  // namespace primecache::model

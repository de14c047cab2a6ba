// The reference hybrid model (HRM): its configuration, its weights, and the
// byte tokenizer. The arithmetic is fixed by docs/model.md; this header holds
// what a caller needs to describe and load a model.
//
// ModelConfig and Weights are plain values: immutable once built, safe to read
// from many threads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/entry.h"
#include "primecache/internal/env.h"
#include "primecache/status.h"

namespace primecache::model {

enum class LayerType : std::uint8_t { kKda, kMla, kAttn };

struct IndexerConfig {
  std::uint32_t heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t pool = 0;
  std::uint32_t topk = 0;
  friend bool operator==(const IndexerConfig&, const IndexerConfig&) = default;
};

struct MlaConfig {
  std::uint32_t heads = 0;
  std::uint32_t kv_rank = 0;
  std::uint32_t rope_dim = 0;  // 0: NoPE, the latent row is kv_rank wide
  std::uint32_t nope_dim = 0;
  std::uint32_t v_dim = 0;
  float rope_theta = 10000.0f;
  std::optional<IndexerConfig> indexer;  // none: dense MLA
  std::uint32_t row_width() const { return kv_rank + rope_dim; }
  friend bool operator==(const MlaConfig&, const MlaConfig&) = default;
};

struct KdaConfig {
  std::uint32_t heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t conv_kernel = 0;
  float gate_lower_bound = -5.0f;
  std::uint32_t channels() const { return heads * head_dim; }
  friend bool operator==(const KdaConfig&, const KdaConfig&) = default;
};

// The attention of every "attn" layer: grouped KV heads, RoPE over the whole
// head, full causal (window 0, a plain KV cache) or sliding-window (window W,
// a rotating buffer of W rows), rows stored f32 (kv_quant_bits 0) or as
// TurboQuant rows of 2 or 4 bits (head_dim then a power of two >= 16).
struct AttnConfig {
  std::uint32_t heads = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t window = 0;         // 0: null (full attention)
  float rope_theta = 10000.0f;
  std::uint32_t kv_quant_bits = 0;  // 0: null; 2 or 4: TurboQuant
  std::uint32_t q_width() const { return heads * head_dim; }
  std::uint32_t kv_width() const { return kv_heads * head_dim; }
  friend bool operator==(const AttnConfig&, const AttnConfig&) = default;
};

// Bounds applied to every configuration read from outside.
struct ConfigLimits {
  std::uint32_t max_vocab = 1u << 20;
  std::uint32_t max_dim = 1u << 16;   // hidden, mlp_hidden, kv_rank, head dims, ...
  std::uint32_t max_heads = 1024;
  std::uint32_t max_layers = 1024;
  std::uint32_t max_pool = 1024;
  std::uint32_t max_conv_kernel = 64;
  std::uint32_t max_window = 1u << 24;
};

struct ModelConfig {
  std::string name;
  std::uint32_t vocab = 0;
  std::uint32_t hidden = 0;
  std::uint32_t mlp_hidden = 0;
  float norm_eps = 1e-6f;
  std::vector<LayerType> layers;
  MlaConfig mla;  // used by every "mla" layer
  KdaConfig kda;  // used by every "kda" layer
  AttnConfig attn;  // used by every "attn" layer

  // Parses the JSON form (see docs/model.md) and validates it.
  static Result<ModelConfig> FromJson(std::string_view json, const ConfigLimits& limits = {});
  std::string ToJson() const;
  // Every dimension positive and within limits; rope_dim even; vocab >= 258.
  Status Validate(const ConfigLimits& limits = {}) const;
  bool HasLayer(LayerType t) const;
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// The attn block's own checks (what Validate runs when an attn layer exists).
Status ValidateAttn(const AttnConfig& attn, const ConfigLimits& limits = {});

Result<ModelConfig> LoadModelConfig(Env* env, const std::string& path);

// One f32 tensor, row-major.
struct Tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
  std::size_t numel() const { return data.size(); }
};

// The tensors a configuration needs, by name, with their shapes.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> ExpectedTensors(const ModelConfig& config);

// What a prefill of this model costs (ModelCost, primecache/entry.h): two
// FLOPs per parameter of its layers per token, plus each sliding-window attn
// layer's bounded attention; MLA and full-attention layers as attention
// layers, their per-pair costs averaged.
ModelCost PrefillCost(const ModelConfig& config);

// A named set of tensors, checked against a configuration.
class Weights {
 public:
  Weights() = default;
  explicit Weights(std::map<std::string, Tensor> tensors) : tensors_(std::move(tensors)) {}

  // Deterministic weights for `config` from `seed`: every tensor the config
  // needs, each value a function of (seed, name, index) only.
  static Weights Generate(const ModelConfig& config, std::uint64_t seed);

  // Every expected tensor present with its exact shape, no unexpected tensor,
  // every value finite.
  Status CheckAgainst(const ModelConfig& config) const;

  const Tensor* Find(const std::string& name) const;
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  // The weights digest that goes into a model fingerprint: XXH3-128 over each
  // tensor's name, shape and the XXH3-64 of its values, in name order.
  Hash128 Digest() const;

 private:
  std::map<std::string, Tensor> tensors_;
};

// Bounds applied to a safetensors file read from outside.
struct SafetensorsLimits {
  std::uint64_t max_header_bytes = 64ull << 20;
  std::uint64_t max_tensors = 1u << 16;
  std::uint64_t max_rank = 8;
  std::uint64_t max_file_bytes = 64ull << 30;
};

// Reads f32 tensors from a safetensors file; any other dtype, a bad header,
// out-of-range or overlapping offsets, or bytes not covered by a tensor are
// refused with the reason.
Result<Weights> LoadSafetensors(Env* env, const std::string& path, const SafetensorsLimits& limits = {});
Status SaveSafetensors(Env* env, const std::string& path, const Weights& weights);

// The byte tokenizer: ids 0..255 are bytes, 256 BOS, 257 EOS.
inline constexpr std::uint32_t kBosToken = 256;
inline constexpr std::uint32_t kEosToken = 257;
// BOS followed by the UTF-8 bytes of text.
std::vector<std::uint32_t> Tokenize(std::string_view text);
// The bytes of the byte tokens; BOS, EOS and padding ids are left out.
std::string Detokenize(const std::vector<std::uint32_t>& tokens);

}  // namespace primecache::model

// The CPU reference implementation of the hybrid model (docs/model.md):
// token-by-token, f32, one reduction order. It owns one session's state:
// per MLA layer the latent rows, the index rows and pool keys, per KDA layer
// the conv ring and recurrent state.
//
// Not thread-safe: one thread drives one ReferenceModel at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "primecache/model.h"
#include "primecache/status.h"

namespace primecache::model {

// The state one MLA layer carries for a session.
struct MlaState {
  std::vector<float> rows;        // [len, width] latent rows
  std::vector<float> index_rows;  // [len, 2*di] index rows (flat)
  std::vector<float> pool_keys;   // [pools_ready, di]
  std::uint64_t len = 0;
  std::uint64_t pools_ready = 0;
};

// The state one KDA layer carries.
struct KdaState {
  std::vector<float> conv_ring;  // [3*n*d, K-1], oldest input first
  std::vector<float> state;      // [n, d, d]
};

class ReferenceModel {
 public:
  // Checks the weights against the config.
  static Result<ReferenceModel> Create(ModelConfig config, const Weights* weights);

  // Runs tokens through the model from the current position; appends one row
  // of vocab logits per token to *logits when it is not null.
  Status Prime(std::span<const std::uint32_t> tokens, std::vector<float>* logits);

  std::uint64_t position() const { return position_; }
  const ModelConfig& config() const { return config_; }
  std::vector<MlaState>& mla_states() { return mla_; }
  std::vector<KdaState>& kda_states() { return kda_; }
  // Layer l's slot in mla_states() or kda_states().
  std::size_t slot(std::size_t layer) const { return slot_[layer]; }

 private:
  ReferenceModel(ModelConfig config, const Weights* weights);
  const float* W(std::size_t layer, const char* name) const;
  void Step(std::uint32_t token, float* logits);
  void MlaMixer(std::size_t layer, const float* u, float* out);
  void KdaMixer(std::size_t layer, const float* u, float* out);
  void Mlp(std::size_t layer, const float* u, float* out);

  ModelConfig config_;
  const Weights* weights_;
  std::vector<std::size_t> slot_;
  std::vector<MlaState> mla_;
  std::vector<KdaState> kda_;
  std::vector<std::vector<float>> fused_taps_;  // per KDA layer: [3*n*d, K]
  std::uint64_t position_ = 0;
};

}  // namespace primecache::model

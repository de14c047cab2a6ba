// HybridModel: the reference hybrid model (docs/model.md) running on an
// engine's device, its state in the engine's session caches. One forward
// pass, written once against Compute: on the CPU backend it is the CPU
// reference (the twins, in the reference order), on CUDA the CUDA model
// (kernels and cuBLAS, f32). Prime runs many tokens per call, layer by layer,
// in chunks of at most chunk_tokens.
//
// Thread-safety: one thread drives a HybridModel at a time (it owns the
// scratch buffers every call uses).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/model/compute.h"
#include "primecache/internal/engine.h"
#include "primecache/internal/model.h"

namespace primecache::model {

// One conversation of the model: its cache, and how many tokens it has seen.
// position equals the len of every latent layer at a call boundary.
struct ModelSession {
  std::unique_ptr<engine::SessionCache> cache;
  std::uint64_t position = 0;
  std::uint64_t round_base = 0;  // position when the armed round (if any) was armed
};

enum class LogitsWanted : std::uint8_t { kNone, kLast, kAll };

class Collective;

struct HybridModelOptions {
  std::size_t chunk_tokens = 1024;  // tokens per forward call inside Prime
  // A rank of a tensor-parallel group (tensor_parallel.h): the model is then
  // that rank's share (RankConfig, RankWeights), and each block's partial
  // output is summed across the ranks. Null: the whole model (TP 1).
  Collective* collective = nullptr;
};

class HybridModel {
 public:
  // The state plan a configuration needs: a latent plan per MLA layer, a
  // recurrent plan per KDA layer, a KV plan per attn layer (its format: the
  // window, the TurboQuant bits and head_dim, and the digest of the layer's
  // attn.tq_signs from `weights`, 0 when absent).
  static engine::StatePlan PlanFor(const ModelConfig& config, const Weights& weights);

  // Checks the weights against the config and the engine's plan against
  // PlanFor(config, weights), uploads the weights to the engine's device and books
  // the scratch buffers for one chunk.
  static Result<std::unique_ptr<HybridModel>> Create(const ModelConfig& config, const Weights& weights,
                                                     engine::Engine* engine, const HybridModelOptions& options = {});
  ~HybridModel();

  const ModelConfig& config() const { return config_; }
  engine::Engine& engine() const { return *engine_; }
  // This rank's collective (HybridModelOptions::collective); null at TP 1.
  Collective* collective() const { return options_.collective; }

  // A fresh session (a fresh cache from the engine).
  Result<ModelSession> NewSession();

  // Runs tokens through the model from the session's position. Appends f32
  // logits rows (vocab wide) to *logits: one per token (kAll), or one for the
  // last token (kLast). Tokens are checked against the vocabulary and the
  // session's capacity before anything runs.
  Status Prime(ModelSession& session, std::span<const std::uint32_t> tokens, LogitsWanted wanted,
               std::vector<float>* logits);

  // A speculative verify call: arms a round of tokens.size() positions on
  // the session's cache (the engine's reserve must book rounds that long:
  // ReserveRequest::round_tokens) and runs the tokens, appending one logits
  // row per token to *logits. On the CPU each row is bit-identical to the
  // row a one-token call at that position gives. A failed call leaves no
  // round armed (rolled back to the start).
  Status VerifyDraft(ModelSession& session, std::span<const std::uint32_t> tokens, std::vector<float>* logits);
  // Resolves the armed round: keeps the first `keep` verified positions
  // (all of them: a commit) and moves the session's position there. The
  // cache is then bit-identical to one that was given only those tokens.
  Status ResolveRound(ModelSession& session, std::uint64_t keep);

  // Greedy generation: picks the argmax of `last_logits` (lowest id on
  // ties), feeds it, and repeats until max_new tokens or EOS. Every generated
  // token but EOS is fed, so the session ends holding them all. Returns the
  // generated ids; appends each fed token's logits row to *logits if given.
  Result<std::vector<std::uint32_t>> Generate(ModelSession& session, std::span<const float> last_logits,
                                              std::size_t max_new, std::vector<float>* logits);

 private:
  HybridModel(ModelConfig config, engine::Engine* engine, HybridModelOptions options);
  Status UploadWeights(const Weights& weights);
  Status AllocateScratch();
  const float* W(const std::string& name) const;
  const float* L(std::size_t layer, const char* name) const;
  Status Forward(ModelSession& session, const std::uint32_t* tokens, std::size_t count, LogitsWanted wanted,
                 std::vector<float>* logits);
  Status MlaMixer(ModelSession& session, std::size_t layer, std::size_t count);
  Status KdaMixer(ModelSession& session, std::size_t layer, std::size_t count);
  Status AttnMixer(ModelSession& session, std::size_t layer, std::size_t count);
  // The sum of a block's partial outputs across the ranks (none at TP 1).
  Status SumAcrossRanks(float* out, std::size_t floats);

  ModelConfig config_;
  engine::Engine* engine_;
  engine::Device* device_;
  HybridModelOptions options_;
  std::unique_ptr<Compute> compute_;
  std::map<std::string, engine::Memory> weights_;
  std::vector<engine::Memory> fused_taps_;  // per layer (KDA only): [3*n*d, K]
  std::map<std::string, engine::Memory> scratch_;
  float* S(const char* name) const;
};

}  // namespace primecache::model

// The reference model at tensor-parallel size n (docs/engine.md, "Tensor
// parallelism"): n ranks, each a HybridModel over its own engine, holding
// its share of the heads and of the MLP's inner dimension, the partial block
// outputs summed by a Collective after every mixer and every MLP.
//
// What a rank holds of the whole model (RankConfig, RankWeights):
//  - split by head: the MLA query, absorbed-key, value and output
//    projections (mla.wq, wuk, wuv, wo); every KDA projection, conv tap and
//    output (kda.*, the output norm excepted); the attn layers' wq, wk, wv
//    and wo (a rank's query heads read its own kv heads: tp divides both);
//  - split on the inner dimension: mlp.w1 and mlp.w3 (rows), mlp.w2 (columns);
//  - replicated: the embedding, every norm, lm_head, the MLA latent
//    projection (mla.wdkv, kv_norm) and the whole DSA indexer (mla.idx.*),
//    and TurboQuant's signs. So every rank computes the same latent rows,
//    index rows and pool keys, bit for bit.
// TP 1 is the whole model on today's code path, bit for bit.
//
// TensorParallelModel runs the ranks in lockstep, one thread each, on the
// CPU backend (an in-process group) or on CUDA (one device per rank, NCCL).
// Every rank computes the same logits (the sums are bit-identical on every
// rank and the head is replicated), so rank 0's are the answer and every rank
// feeds the same greedy token.
//
// Thread-safety: one caller at a time; it owns the rank threads of a call.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/collective.h"
#include "engine/model/hybrid_model.h"
#include "engine/model/speculative.h"

namespace primecache::model {

// The configuration of one rank of TP `tp`: heads of every mixer and the
// MLP's inner dimension divided by tp. InvalidArgument naming the first
// dimension tp does not divide (only the mixers the model has count).
Result<ModelConfig> RankConfig(const ModelConfig& whole, std::uint32_t tp);

// The tensors rank `rank` of TP `tp` holds (above). The weights must match
// `whole` (CheckAgainst).
Result<Weights> RankWeights(const ModelConfig& whole, const Weights& weights, std::uint32_t tp,
                            std::uint32_t rank);

// One conversation at TP n: a session on every rank, at one position.
struct TpSession {
  std::vector<ModelSession> ranks;
  std::uint64_t position() const { return ranks.empty() ? 0 : ranks[0].position; }
};

struct TpModelOptions {
  std::uint32_t tp = 1;
  engine::ReserveRequest reserve;  // every rank's; its plan is ignored (each rank's is PlanFor(its share))
  HybridModelOptions model;        // its collective is ignored: the group's is used
  engine::DeviceKind backend = engine::DeviceKind::kCpu;
  std::vector<int> cuda_devices;  // CUDA: rank r's device ordinal (default 0..tp-1)
};

class TensorParallelModel {
 public:
  static Result<std::unique_ptr<TensorParallelModel>> Create(const ModelConfig& whole, const Weights& weights,
                                                             TpModelOptions options);
  ~TensorParallelModel();

  std::uint32_t tp() const { return static_cast<std::uint32_t>(ranks_.size()); }
  const ModelConfig& config() const { return whole_; }
  HybridModel& rank(std::uint32_t r) const { return *ranks_.at(r).model; }

  Result<TpSession> NewSession();
  // HybridModel's calls, on every rank at once; logits are rank 0's.
  Status Prime(TpSession& session, std::span<const std::uint32_t> tokens, LogitsWanted wanted,
               std::vector<float>* logits);
  Result<std::vector<std::uint32_t>> Generate(TpSession& session, std::span<const float> last_logits,
                                              std::size_t max_new, std::vector<float>* logits);
  // Speculative decoding (speculative.h) on every rank; stats are rank 0's.
  Result<std::vector<std::uint32_t>> GenerateSpeculative(TpSession& session,
                                                         std::span<const std::uint32_t> context,
                                                         std::span<const float> last_logits,
                                                         std::size_t max_new, const SpeculateOptions& options,
                                                         SpeculateStats* stats, std::vector<float>* logits);

  // Every rank's full snapshot, rank r at index r (its shard of the sharded
  // planes, its copy of the replicated ones).
  Result<std::vector<std::vector<LayerSnapshot>>> CaptureFull(TpSession& session);
  // Restores rank r from shards[r], a boundary of `len` tokens, into fresh
  // sessions: every rank validates first, and no rank is restored unless
  // every rank's shard passes.
  Status Restore(TpSession& session, std::span<const std::vector<LayerSnapshot>> shards, std::uint64_t len);

 private:
  struct Rank {
    std::unique_ptr<engine::Engine> engine;
    std::unique_ptr<HybridModel> model;
  };
  TensorParallelModel(ModelConfig whole, std::unique_ptr<CollectiveGroup> group);
  // Runs fn(r) for every rank at once (a thread each when tp > 1) and
  // returns the lowest rank's error; a failing rank aborts the group so that
  // no rank waits for it, and the group is reset once every rank is back.
  Status OnEveryRank(const std::function<Status(std::uint32_t rank)>& fn);

  ModelConfig whole_;
  std::unique_ptr<CollectiveGroup> group_;
  std::vector<Rank> ranks_;
};

}  // namespace primecache::model

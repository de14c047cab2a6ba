// TpPrefixCache: a tensor-parallel model (TensorParallelModel, every rank in
// this process) served through the store.
//
//  - Restore: one lookup for every rank; the hit's layers are fetched once
//    and decoded, gathered into the whole boundary (the replicated layers
//    from rank 0's part, each sharded layer from its shards: an entry of
//    any TP size, TP 1 included) and sliced for this model's TP size; every
//    rank validates its shard before any rank is restored
//    (TensorParallelModel::Restore), so every rank restores the same
//    boundary or none does, and a refusal primes in full.
//  - Publish: at TP 1 an entry of its own; at TP n a group publish of every
//    rank's head-group parts (part 0 every replicated layer, each part one
//    run of the sharded layers' heads), part 0's last, whose commit writes
//    the entry.
// The fingerprint is the whole model's (PrefixCache::ModelIdFor), not the TP
// size: an entry of one TP size serves every other that divides its heads.
//
// Unlike PrefixCache (the single-rank engine's path) there is no eager and
// deferred capture, no staging on the device and no publishing thread: the
// boundary is captured whole (CaptureFull) and published on the caller's
// thread, and the fetched layers are decoded in this process, which holds
// every rank.
//
// Thread-safety: one thread drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/tensor_parallel.h"
#include "primecache/client.h"
#include "primecache/internal/codec.h"

namespace primecache::model {

struct TpPrefixCacheOptions {
  EncodeOptions encode;        // how published layers are encoded
  std::size_t min_prefix = 1;  // shortest stored prefix worth restoring
};

// One request: its session and what it cost.
struct TpRequest {
  TpSession session;
  std::vector<float> last_logits;  // the prompt's last position
  std::vector<float> all_logits;   // every primed position, when asked for
  std::uint64_t restored_tokens = 0;
  std::uint64_t prefilled_tokens = 0;
  std::uint32_t restored_ranks = 0;  // the restored entry's TP size (0: nothing restored)
  double ttft_ms = 0;
};

// Every rank's shards, for TP `tp`, of the fetched layers of an entry of
// `stored_ranks` parts (1: an entry of one publisher): decoded (every byte
// checked by the codec), gathered into the whole boundary (EntryLayerParts,
// GatherEntry) and sliced for each rank (SliceLayers; `kv_heads` of every
// KV layer).
Result<std::vector<std::vector<LayerSnapshot>>> ShardsForTp(std::span<const client::FetchedLayer> fetched,
                                                            std::uint32_t stored_ranks,
                                                            std::uint32_t kv_heads, std::uint32_t tp);

// Whether each layer of a rank's state plan splits among the ranks (its
// shards are per-rank) or is replicated: what PlanRankParts takes.
std::vector<bool> ShardedLayers(const engine::StatePlan& plan);

// Rank `rank` of TP `tp`'s snapshots of the entry `hit`, of any stored TP
// size: only the entry layers that hold its heads are fetched
// (PlanRankParts), decoded (every byte checked by the codec) and assembled
// into its shards (AssembleRankParts). `sharded` is ShardedLayers of the
// restoring rank's plan, `kv_heads` the whole model's.
Result<std::vector<LayerSnapshot>> FetchRankParts(client::Client& c, const LookupHit& hit,
                                                  const std::vector<bool>& sharded, std::uint32_t kv_heads,
                                                  std::uint32_t tp, std::uint32_t rank);

// Publishes a boundary held as every rank's snapshots (rank r's at index r,
// each its full list, as CaptureFull gives them; `kv_heads` the whole
// model's): one rank, an entry of its own; more, a group under `token` (not
// 0) of every rank's head-group parts (serving/head_groups.h), streamed and
// committed one at a time from the last to part 0, whose commit writes the
// entry (so one publish at a time is in flight on `c`).
Result<PublishResult> PublishRanks(client::Client& c, const client::ModelId& id,
                                   std::span<const std::uint32_t> tokens,
                                   std::vector<std::vector<LayerSnapshot>> ranks, std::uint32_t kv_heads,
                                   std::uint64_t token, const EncodeOptions& encode);

class TpPrefixCache {
 public:
  // `client` may be null: the model then runs without the store.
  TpPrefixCache(TensorParallelModel* model, std::unique_ptr<client::Client> client, client::ModelId model_id,
                TpPrefixCacheOptions options = {});

  // Runs a prompt in a fresh session: the longest stored prefix restored,
  // the rest primed.
  Result<TpRequest> Prime(std::span<const std::uint32_t> prompt, bool all_logits = false);
  // Publishes the session's boundary: `tokens` are every token it holds.
  Result<PublishResult> Publish(TpSession& session, std::span<const std::uint32_t> tokens);

  bool connected() const { return client_ != nullptr; }

 private:
  // Restores the longest stored prefix of `tokens` into the fresh session;
  // 0 when nothing was (the session is then fresh).
  Result<std::uint64_t> TryRestore(TpSession& session, std::span<const std::uint32_t> tokens,
                                   std::uint32_t* ranks);

  TensorParallelModel* model_;
  std::unique_ptr<client::Client> client_;
  client::ModelId model_id_;
  TpPrefixCacheOptions options_;
  std::uint64_t next_group_ = 1;
};

}  // namespace primecache::model

// Replays a request trace (tools/common/traces.h) through a store: for each
// request, the longest stored boundary is looked up and its tokens counted
// as a hit, then the request's boundaries are published with real encoded
// layers ([codecs]) of a model's state geometry. What it measures: token hit
// rate, prefill FLOPs saved, bytes written, and the time to first token a hit
// would give (docs/traces.md, docs/BENCHMARKS.md).
//
// The state is published at 1/scale of the model's size (every plane's width
// divided by `scale`, which must divide each evenly), so that a replay of
// millions of tokens runs in seconds; the byte figures reported are the
// store's measured bytes times `scale`, and the append-only planes keep the
// same proportion to the recurrent states as in the real model.
//
// Thread-safety: Replay runs on the calling thread; targets are used by it alone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "primecache/internal/model.h"
#include "primecache/internal/statestore.h"
#include "tools/common/traces.h"

namespace primecache::replay {

// The per-boundary state of a hybrid model of MLA (latent rows, a DSA
// indexer's pool keys and tail) and KDA (conv ring and state) layers, as
// published (already divided by `scale`).
struct StateGeometry {
  std::string model;
  std::uint32_t latent_layers = 0;
  std::uint32_t latent_width = 0;    // kv_rank + rope_dim
  std::uint32_t index_head_dim = 0;  // 0: no indexer
  std::uint32_t pool = 0;
  std::uint32_t recurrent_layers = 0;
  std::uint32_t heads = 0, head_dim = 0, kernel = 0;
  std::uint64_t chunk_bytes = 1ull << 20;  // the codec's target chunk size
  std::uint32_t scale = 1;
  ModelCost cost;  // of the real model (for the utility policy and FLOPs saved)

  // Decoded state bytes of a boundary of `tokens` at the real model's size.
  std::uint64_t RealBytes(std::uint64_t tokens) const;
};

// From a model config: its MLA and KDA layers (other layer kinds are
// refused), widths divided by `scale`, and its prefill cost: 2 FLOPs per
// layer weight per token, and per attention pair 2 x (qk + v width) x heads
// per MLA layer (dense; the DSA indexer's sparsity is not counted).
Result<StateGeometry> GeometryFor(const model::ModelConfig& config, std::uint32_t scale);

// Real encoded layers (raw/v1) of the boundary `tokens`: each latent row and
// pool key is a function of the tokens up to it, so two boundaries of one
// conversation share their leading chunks exactly; the recurrent state is a
// function of the whole boundary.
std::vector<LayerBytes> EncodeBoundary(const StateGeometry& g, std::span<const std::uint32_t> tokens);

// Where a replay sends its lookups and publishes: the store in process, or
// the daemon (tools/bench/eviction_bench.cc).
class Target {
 public:
  virtual ~Target() = default;
  // The longest stored prefix's length (0: a miss).
  virtual Result<std::uint64_t> Lookup(std::span<const std::uint32_t> tokens) = 0;
  // nullopt: not admitted (the store's admission refused it).
  virtual Result<std::optional<PublishResult>> Publish(std::span<const std::uint32_t> tokens,
                                                       const std::vector<LayerBytes>& layers) = 0;
  virtual Result<std::uint64_t> StoredBytes() = 0;
};

// The store in process.
class StoreTarget final : public Target {
 public:
  // send_cost false: publishes carry no ModelCost (as from a client that
  // sends none), so the store weighs an entry's tokens.
  StoreTarget(Store* store, const StateGeometry& g, bool send_cost = true)
      : store_(store), g_(g), send_cost_(send_cost) {}
  Result<std::uint64_t> Lookup(std::span<const std::uint32_t> tokens) override;
  Result<std::optional<PublishResult>> Publish(std::span<const std::uint32_t> tokens,
                                               const std::vector<LayerBytes>& layers) override;
  Result<std::uint64_t> StoredBytes() override;

 private:
  PublishRequest RequestFor(std::span<const std::uint32_t> tokens) const;
  Store* store_;
  StateGeometry g_;
  bool send_cost_;
};

// Which boundaries a request publishes: its prompt's end (what PrefixCache
// does), and also where it leaves the longest prefix an earlier request
// shared (a branch point, rounded down to 32 tokens; Marconi's speculative
// insertion), when that is longer than the hit.
enum class Boundaries : std::uint8_t { kEnd, kEndAndBranch };

struct ReplayOptions {
  Boundaries boundaries = Boundaries::kEndAndBranch;
  // Byte budget of the store (real bytes; 0: none): only checked against
  // after every acknowledged publish.
  std::uint64_t budget_real_bytes = 0;
  double restore_bytes_per_s = 28.9e9;     // a hit's restore
  double prefill_flops_per_s = 0;          // 0: from prefill_tokens_per_s at 32768 tokens
  double prefill_tokens_per_s = 32768 / 14.9532;
};

struct ReplayResult {
  std::uint64_t requests = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t hit_tokens = 0;
  std::uint64_t hits = 0;  // requests with any hit
  double prefill_flops = 0;  // of every prompt, without a cache
  double flops_saved = 0;
  std::uint64_t publishes = 0;
  std::uint64_t refused = 0;              // not admitted
  std::uint64_t failed = 0;               // refused for space (nothing evictable)
  std::uint64_t bytes_written = 0;        // new chunk bytes, real size
  std::uint64_t peak_stored_bytes = 0;    // real size
  std::uint64_t over_budget = 0;          // acknowledged publishes after which stored > budget
  std::uint64_t evictions = 0;
  double ttft_mean_ms = 0, ttft_p95_ms = 0;
  double ttft_nocache_mean_ms = 0;
  std::vector<std::uint64_t> hit_lengths;  // per request, in trace order

  double HitRate() const { return prompt_tokens ? static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens) : 0; }
  double FlopsSavedShare() const { return prefill_flops > 0 ? flops_saved / prefill_flops : 0; }
};

Result<ReplayResult> Replay(const traces::Trace& trace, const StateGeometry& g, Target& target,
                            const ReplayOptions& options);

}  // namespace primecache::replay

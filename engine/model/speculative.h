// Speculative greedy decoding with a prompt-lookup (n-gram) drafter: no
// second model. Each round feeds the next greedy token and up to gamma
// drafted ones in one verify call (HybridModel::VerifyDraft), keeps the drafts
// the model's own argmax agrees with, and rolls the rest back
// (HybridModel::ResolveRound). The output is the plain greedy output token
// for token, and the session ends holding the same tokens; on the CPU the
// logits rows are bit-identical too (docs/model.md, "Speculative decoding").
//
// Thread-safety: as HybridModel (one thread drives a session).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/model/hybrid_model.h"

namespace primecache::model {

// Prompt lookup: the continuation of the most recent earlier occurrence of
// the history's last n tokens, for n from max_ngram down to min_ngram.
struct NgramDrafterOptions {
  std::size_t max_ngram = 3;
  std::size_t min_ngram = 1;
};
// Up to `max` tokens that followed the latest earlier match of the longest
// matching suffix of `history`; empty when no suffix of min_ngram tokens
// occurs earlier.
std::vector<std::uint32_t> NgramDraft(std::span<const std::uint32_t> history, std::size_t max,
                                      const NgramDrafterOptions& options = {});

// A drafter: up to `max` tokens expected to follow `history`.
using Drafter =
    std::function<std::vector<std::uint32_t>(std::span<const std::uint32_t> history, std::size_t max)>;

struct SpeculateOptions {
  std::size_t gamma = 4;  // drafted tokens per round (the round verifies gamma + 1)
  Drafter drafter;        // null: NgramDraft with default options
};

struct SpeculateStats {
  std::uint64_t rounds = 0;       // verify calls
  std::uint64_t drafted = 0;      // drafted tokens verified
  std::uint64_t accepted = 0;     // of those, kept
  std::uint64_t plain_steps = 0;  // one-token calls (nothing drafted)
  double verify_ms = 0;           // time in verify calls
  double resolve_ms = 0;          // time committing and rolling back
  double acceptance() const { return drafted == 0 ? 0.0 : static_cast<double>(accepted) / drafted; }
};

// Greedy generation as HybridModel::Generate, speculatively. `context` is
// every token the session holds (the prompt, BOS included): the drafter
// looks up in it and in what is generated. The engine's reserve must book
// rounds of gamma + 1 positions. Appends each fed token's logits row to
// *logits when given (the rows Generate would give).
Result<std::vector<std::uint32_t>> GenerateSpeculative(HybridModel& model, ModelSession& session,
                                                       std::span<const std::uint32_t> context,
                                                       std::span<const float> last_logits,
                                                       std::size_t max_new, const SpeculateOptions& options,
                                                       SpeculateStats* stats, std::vector<float>* logits);

}  // namespace primecache::model

#include "engine/model/speculative.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "kernels/cpu_math.h"

namespace primecache::model {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Result<std::uint32_t> Argmax(std::span<const float> row) {
  std::uint32_t id = 0;
  PC_RETURN_IF_ERROR(kernels::ArgmaxRowsCpu(row.data(), 1, row.size(), &id));
  return id;
}

// What one verify round decided.
struct RoundOutcome {
  std::size_t accepted = 0;  // drafts kept (an accepted EOS included)
  bool eos = false;          // the last accepted draft is EOS (not fed)
  std::uint32_t next = 0;    // the greedy token after the kept ones (unless eos)
};

// Verifies [pending, drafts...] in one call, keeps the drafts the model's
// argmax agrees with (as greedy decoding would have produced and fed them),
// resolves the round and appends the kept positions' logits rows.
Result<RoundOutcome> VerifyRound(HybridModel& model, ModelSession& session, std::uint32_t pending,
                                 const std::vector<std::uint32_t>& drafts, SpeculateStats& stats,
                                 std::vector<float>* logits) {
  const std::size_t V = model.config().vocab;
  std::vector<std::uint32_t> tokens{pending};
  tokens.insert(tokens.end(), drafts.begin(), drafts.end());
  std::vector<float> rows;
  auto t0 = Clock::now();
  PC_RETURN_IF_ERROR(model.VerifyDraft(session, tokens, &rows));
  stats.verify_ms += MsSince(t0);
  RoundOutcome r;
  for (std::size_t j = 0; j < drafts.size(); ++j) {
    PC_ASSIGN_OR_RETURN(std::uint32_t g, Argmax(std::span(rows).subspan(j * V, V)));
    if (g != drafts[j]) break;
    ++r.accepted;
    if (g == kEosToken) {
      r.eos = true;
      break;
    }
  }
  const std::size_t keep = 1 + r.accepted - (r.eos ? 1 : 0);
  if (!r.eos) {
    PC_ASSIGN_OR_RETURN(r.next, Argmax(std::span(rows).subspan(r.accepted * V, V)));
  }
  t0 = Clock::now();
  PC_RETURN_IF_ERROR(model.ResolveRound(session, keep));
  stats.resolve_ms += MsSince(t0);
  ++stats.rounds;
  stats.drafted += drafts.size();
  stats.accepted += r.accepted;
  if (logits != nullptr) logits->insert(logits->end(), rows.begin(), rows.begin() + keep * V);
  return r;
}

}  // namespace

std::vector<std::uint32_t> NgramDraft(std::span<const std::uint32_t> history, std::size_t max,
                                      const NgramDrafterOptions& options) {
  const std::size_t len = history.size(), lo = std::max<std::size_t>(options.min_ngram, 1);
  if (max == 0 || len < 2) return {};
  const std::size_t hi = std::min(options.max_ngram, len - 1);
  for (std::size_t n = hi; n >= lo; --n) {
    const auto suffix = history.subspan(len - n);
    for (std::size_t i = len - n; i-- > 0;) {  // the latest earlier occurrence first
      if (std::equal(suffix.begin(), suffix.end(), history.begin() + static_cast<std::ptrdiff_t>(i))) {
        const std::size_t from = i + n, to = std::min(from + max, len);
        return {history.begin() + static_cast<std::ptrdiff_t>(from),
                history.begin() + static_cast<std::ptrdiff_t>(to)};
      }
    }
  }
  return {};
}

Result<std::vector<std::uint32_t>> GenerateSpeculative(HybridModel& model, ModelSession& session,
                                                       std::span<const std::uint32_t> context,
                                                       std::span<const float> last_logits,
                                                       std::size_t max_new, const SpeculateOptions& options,
                                                       SpeculateStats* stats, std::vector<float>* logits) {
  const std::size_t V = model.config().vocab;
  if (last_logits.size() != V)
    return Status::InvalidArgument("model: last_logits must hold one row of vocab logits");
  if (options.gamma == 0) return Status::InvalidArgument("speculate: gamma must be > 0");
  const std::uint64_t booked = model.engine().reserve().request.round_tokens;
  if (options.gamma + 1 > booked) {
    return Status::InvalidArgument("speculate: rounds of gamma + 1 = " + std::to_string(options.gamma + 1) +
                                   " positions; the engine's reserve books " + std::to_string(booked) +
                                   " (ReserveRequest::round_tokens)");
  }
  SpeculateStats local;
  SpeculateStats& st = stats != nullptr ? *stats : local;
  std::vector<std::uint32_t> history(context.begin(), context.end()), out;
  PC_ASSIGN_OR_RETURN(std::uint32_t pending, Argmax(last_logits));
  while (out.size() < max_new) {
    out.push_back(pending);
    history.push_back(pending);
    if (pending == kEosToken) break;
    const std::size_t want = std::min(options.gamma, max_new - out.size());
    std::vector<std::uint32_t> drafts = want == 0         ? std::vector<std::uint32_t>{}
                                        : options.drafter ? options.drafter(history, want)
                                                          : NgramDraft(history, want);
    if (drafts.size() > want) drafts.resize(want);
    if (drafts.empty()) {  // nothing to verify: a plain one-token step
      std::vector<float> row;
      PC_RETURN_IF_ERROR(model.Prime(session, std::span(&pending, 1), LogitsWanted::kLast, &row));
      ++st.plain_steps;
      if (logits != nullptr) logits->insert(logits->end(), row.begin(), row.end());
      PC_ASSIGN_OR_RETURN(pending, Argmax(row));
      continue;
    }
    PC_ASSIGN_OR_RETURN(RoundOutcome r, VerifyRound(model, session, pending, drafts, st, logits));
    out.insert(out.end(), drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(r.accepted));
    history.insert(history.end(), drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(r.accepted));
    if (r.eos) break;
    pending = r.next;
  }
  return out;
}

}  // namespace primecache::model

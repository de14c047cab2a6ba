// Request traces for the eviction benchmark: seeded, deterministic streams
// of prompts whose prefixes really share tokens (docs/traces.md gives every
// distribution).
//
//  - chat: conversations growing turn by turn (a short shared system prompt,
//    user messages and assistant replies), many active at once, think times
//    between turns, abandonment after any turn;
//  - agentic: coding-agent sessions on one long shared system prompt, each
//    step appending the agent's action and a tool's output, sometimes
//    branching back to an earlier step and retrying from there;
//  - fewshot: batches of requests sharing a long prefix (instructions and
//    examples), each with a short suffix of its own;
//  - documents: one-off long documents, each with a short question;
//  - mixed: chat and documents interleaved (one-off uploads among
//    conversations: what admission is for).
//
// A trace is a function of (kind, options) alone: the same seed gives the
// same bytes on every platform (the sampler is integer splitmix64 and
// Box-Muller, not <random>'s distributions, whose output is unspecified).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/status.h"

namespace primecache::traces {

enum class Kind : std::uint8_t { kChat, kAgentic, kFewShot, kDocuments, kMixed };

std::string_view KindName(Kind kind);
Result<Kind> ParseKind(std::string_view name);
inline constexpr Kind kAllKinds[] = {Kind::kChat, Kind::kAgentic, Kind::kFewShot, Kind::kDocuments, Kind::kMixed};

// A lognormal length: exp(N(ln median, sigma)), rounded, clamped to [min, max].
struct LogNormal {
  double median = 1;
  double sigma = 0;
  std::uint64_t min = 1;
  std::uint64_t max = 1;
};

// A deterministic sampler (splitmix64). Uniform() is in [0, 1).
class Sampler {
 public:
  explicit Sampler(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next();
  double Uniform();
  double Normal();                       // Box-Muller, one value per call
  double Exponential(double mean);       // mean > 0
  std::uint64_t Draw(const LogNormal& d);
  // Turns until the first success of a Bernoulli(p), at least 1, at most cap.
  std::uint64_t Geometric(double p, std::uint64_t cap);

 private:
  std::uint64_t state_;
};

struct Request {
  double arrival_s = 0;            // seconds from the trace's start
  std::uint64_t conversation = 0;  // conversation / session / batch / document id
  std::uint32_t turn = 0;          // 0-based request number within it
  bool last = false;               // no later request of this conversation follows
  std::vector<std::uint32_t> tokens;
  // What the model answers it, as the conversation's next request carries it
  // after `tokens` (chat: the assistant's reply; agentic: the agent's
  // action); empty where the trace generates none (few-shot, documents).
  std::vector<std::uint32_t> reply;
};

struct Trace {
  Kind kind = Kind::kChat;
  std::uint64_t seed = 0;
  std::vector<Request> requests;  // by arrival time (ties: generation order)

  std::uint64_t TotalTokens() const;
};

// How big a trace is: the number of conversations (sessions, batches,
// documents) it starts; `scale` < 1 shortens every length distribution's
// median and cap by that factor (for a quick run), keeping at least 1 token.
struct TraceOptions {
  std::uint64_t seed = 1;
  std::uint32_t conversations = 0;  // 0: the kind's default (docs/traces.md)
  double length_scale = 1.0;
};

// The distributions of one kind, as docs/traces.md states them.
struct ChatParams {
  std::uint32_t conversations = 240;
  double start_gap_mean_s = 4;   // exponential gaps between conversation starts
  std::uint64_t system_tokens = 320;
  double abandon_p = 0.25;       // after each turn
  std::uint32_t max_turns = 24;
  LogNormal user{60, 1.0, 4, 2000};
  LogNormal reply{250, 0.8, 8, 2000};
  LogNormal think_s{20, 1.0, 2, 600};
};
struct AgenticParams {
  std::uint32_t sessions = 48;
  double start_gap_mean_s = 20;
  std::uint64_t system_tokens = 6000;
  LogNormal task{300, 0.8, 20, 4000};
  double stop_p = 1.0 / 12;  // after each step
  std::uint32_t max_steps = 40;
  LogNormal action{150, 0.7, 10, 2000};
  LogNormal tool_output{800, 1.2, 10, 8000};
  LogNormal tool_s{3, 1.0, 1, 120};
  double branch_p = 0.15;  // a step retries from an earlier step instead
};
struct FewShotParams {
  std::uint32_t batches = 24;
  double batch_gap_mean_s = 30;
  LogNormal prefix{3000, 0.5, 500, 12000};
  LogNormal requests{24, 0.6, 2, 200};
  LogNormal suffix{80, 0.7, 4, 1000};
  double request_gap_mean_s = 0.05;
};
struct DocumentParams {
  std::uint32_t documents = 120;
  double gap_mean_s = 1;
  LogNormal document{8000, 0.8, 500, 64000};
  LogNormal question{50, 0.5, 4, 400};
};

Trace GenerateChat(const ChatParams& p, std::uint64_t seed);
Trace GenerateAgentic(const AgenticParams& p, std::uint64_t seed);
Trace GenerateFewShot(const FewShotParams& p, std::uint64_t seed);
Trace GenerateDocuments(const DocumentParams& p, std::uint64_t seed);
// Both traces' requests by arrival; the documents' conversation ids follow the chat's.
Trace GenerateMixed(const ChatParams& chat, const DocumentParams& docs, std::uint64_t seed);
// The kind's default parameters adjusted by `options`.
Trace Generate(Kind kind, const TraceOptions& options);

// A canonical byte encoding (for digests and determinism checks).
std::string Serialize(const Trace& trace);

}  // namespace primecache::traces

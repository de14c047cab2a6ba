#include "tools/common/traces.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

namespace primecache::traces {

namespace {

constexpr std::uint32_t kVocab = 1u << 17;

// Seeds of independent streams (one per conversation) from the trace's seed.
std::uint64_t SubSeed(std::uint64_t seed, std::uint64_t kind, std::uint64_t n) {
  Sampler s(seed * 0x9E3779B97F4A7C15ull + kind * 0xD1B54A32D192ED03ull + n);
  return s.Next();
}

void AppendFresh(Sampler& s, std::uint64_t n, std::vector<std::uint32_t>* out) {
  for (std::uint64_t i = 0; i < n; ++i) out->push_back(static_cast<std::uint32_t>(s.Next() % kVocab));
}

std::vector<std::uint32_t> Prefix(const std::vector<std::uint32_t>& t, std::size_t n) {
  return {t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)};
}
std::vector<std::uint32_t> Suffix(const std::vector<std::uint32_t>& t, std::size_t from) {
  return {t.begin() + static_cast<std::ptrdiff_t>(from), t.end()};
}

std::vector<std::uint32_t> Fresh(Sampler& s, std::uint64_t n) {
  std::vector<std::uint32_t> t;
  t.reserve(n);
  AppendFresh(s, n, &t);
  return t;
}

// Orders by arrival (stable, so a conversation's requests keep their order
// at equal times) and marks each conversation's last request.
Trace Finish(Kind kind, std::uint64_t seed, std::vector<Request> reqs) {
  std::stable_sort(reqs.begin(), reqs.end(),
                   [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
  std::vector<std::size_t> last;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const std::uint64_t c = reqs[i].conversation;
    if (c >= last.size()) last.resize(c + 1, SIZE_MAX);
    last[c] = i;
  }
  for (std::size_t i : last) {
    if (i != SIZE_MAX) reqs[i].last = true;
  }
  return Trace{kind, seed, std::move(reqs)};
}

LogNormal Scaled(LogNormal d, double f) {
  d.median *= f;
  d.min = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(static_cast<double>(d.min) * f));
  d.max = std::max<std::uint64_t>(d.min, static_cast<std::uint64_t>(static_cast<double>(d.max) * f));
  return d;
}

std::uint64_t ScaledTokens(std::uint64_t n, double f) {
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(static_cast<double>(n) * f));
}

}  // namespace

// ---- Sampler --------------------------------------------------------------------------------

std::uint64_t Sampler::Next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Sampler::Uniform() {
  return static_cast<double>(Next() >> 11) * 0x1.0p-53;
}

double Sampler::Normal() {
  const double u1 = 1.0 - Uniform();  // (0, 1]
  const double u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double Sampler::Exponential(double mean) {
  return -mean * std::log(1.0 - Uniform());
}

std::uint64_t Sampler::Draw(const LogNormal& d) {
  const double x = std::exp(std::log(d.median) + d.sigma * Normal());
  const double r = std::round(std::clamp(x, static_cast<double>(d.min), static_cast<double>(d.max)));
  return static_cast<std::uint64_t>(r);
}

std::uint64_t Sampler::Geometric(double p, std::uint64_t cap) {
  std::uint64_t n = 1;
  while (n < cap && Uniform() >= p) ++n;
  return n;
}

// ---- names ----------------------------------------------------------------------------------

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kChat: return "chat";
    case Kind::kAgentic: return "agentic";
    case Kind::kFewShot: return "fewshot";
    case Kind::kDocuments: return "documents";
    case Kind::kMixed: return "mixed";
  }
  return "?";
}

Result<Kind> ParseKind(std::string_view name) {
  for (Kind k : kAllKinds) {
    if (KindName(k) == name) return k;
  }
  return Status::InvalidArgument("unknown trace '" + std::string(name) +
                                 "' (chat, agentic, fewshot, documents, mixed)");
}

std::uint64_t Trace::TotalTokens() const {
  std::uint64_t n = 0;
  for (const auto& r : requests) n += r.tokens.size();
  return n;
}

// ---- the kinds ------------------------------------------------------------------------------

Trace GenerateChat(const ChatParams& p, std::uint64_t seed) {
  Sampler top(SubSeed(seed, 1, 0));
  const std::vector<std::uint32_t> system = Fresh(top, p.system_tokens);
  std::vector<Request> reqs;
  double start = 0;
  for (std::uint32_t c = 0; c < p.conversations; ++c) {
    start += top.Exponential(p.start_gap_mean_s);
    Sampler s(SubSeed(seed, 1, c + 1));
    const std::uint64_t turns = s.Geometric(p.abandon_p, p.max_turns);
    std::vector<std::uint32_t> history = system;
    double t = start;
    for (std::uint32_t k = 0; k < turns; ++k) {
      AppendFresh(s, s.Draw(p.user), &history);
      const std::size_t asked = history.size();
      AppendFresh(s, s.Draw(p.reply), &history);
      reqs.push_back({t, c, k, false, Prefix(history, asked), Suffix(history, asked)});
      t += static_cast<double>(s.Draw(p.think_s));
    }
  }
  return Finish(Kind::kChat, seed, std::move(reqs));
}

Trace GenerateAgentic(const AgenticParams& p, std::uint64_t seed) {
  Sampler top(SubSeed(seed, 2, 0));
  const std::vector<std::uint32_t> system = Fresh(top, p.system_tokens);
  std::vector<Request> reqs;
  double start = 0;
  for (std::uint32_t c = 0; c < p.sessions; ++c) {
    start += top.Exponential(p.start_gap_mean_s);
    Sampler s(SubSeed(seed, 2, c + 1));
    const std::uint64_t steps = s.Geometric(p.stop_p, p.max_steps);
    std::vector<std::uint32_t> history = system;
    AppendFresh(s, s.Draw(p.task), &history);
    std::vector<std::size_t> step_lengths;  // each earlier request's prompt length
    double t = start;
    for (std::uint32_t k = 0; k < steps; ++k) {
      if (step_lengths.size() >= 2 && s.Uniform() < p.branch_p) {
        // Back to an earlier step's prompt, and a different attempt from there.
        history.resize(step_lengths[s.Next() % step_lengths.size()]);
        AppendFresh(s, s.Draw(p.action), &history);
      }
      step_lengths.push_back(history.size());
      const std::size_t asked = history.size();
      AppendFresh(s, s.Draw(p.action), &history);
      reqs.push_back({t, c, k, false, Prefix(history, asked), Suffix(history, asked)});
      AppendFresh(s, s.Draw(p.tool_output), &history);
      t += static_cast<double>(s.Draw(p.tool_s));
    }
  }
  return Finish(Kind::kAgentic, seed, std::move(reqs));
}

Trace GenerateFewShot(const FewShotParams& p, std::uint64_t seed) {
  Sampler top(SubSeed(seed, 3, 0));
  std::vector<Request> reqs;
  double start = 0;
  for (std::uint32_t b = 0; b < p.batches; ++b) {
    start += top.Exponential(p.batch_gap_mean_s);
    Sampler s(SubSeed(seed, 3, b + 1));
    const std::vector<std::uint32_t> prefix = Fresh(s, s.Draw(p.prefix));
    const std::uint64_t n = s.Draw(p.requests);
    double t = start;
    for (std::uint32_t i = 0; i < n; ++i) {
      std::vector<std::uint32_t> tokens = prefix;
      AppendFresh(s, s.Draw(p.suffix), &tokens);
      reqs.push_back({t, b, i, false, std::move(tokens), {}});
      t += s.Exponential(p.request_gap_mean_s);
    }
  }
  return Finish(Kind::kFewShot, seed, std::move(reqs));
}

Trace GenerateDocuments(const DocumentParams& p, std::uint64_t seed) {
  Sampler top(SubSeed(seed, 4, 0));
  std::vector<Request> reqs;
  double t = 0;
  for (std::uint32_t d = 0; d < p.documents; ++d) {
    t += top.Exponential(p.gap_mean_s);
    Sampler s(SubSeed(seed, 4, d + 1));
    std::vector<std::uint32_t> tokens = Fresh(s, s.Draw(p.document));
    AppendFresh(s, s.Draw(p.question), &tokens);
    reqs.push_back({t, d, 0, false, std::move(tokens), {}});
  }
  return Finish(Kind::kDocuments, seed, std::move(reqs));
}

Trace GenerateMixed(const ChatParams& chat, const DocumentParams& docs, std::uint64_t seed) {
  Trace c = GenerateChat(chat, seed);
  Trace d = GenerateDocuments(docs, seed);
  std::vector<Request> reqs = std::move(c.requests);
  for (Request& r : d.requests) {
    r.conversation += chat.conversations;
    reqs.push_back(std::move(r));
  }
  return Finish(Kind::kMixed, seed, std::move(reqs));
}

namespace {

ChatParams ChatFor(const TraceOptions& o) {
  ChatParams p;
  if (o.conversations) p.conversations = o.conversations;
  p.system_tokens = ScaledTokens(p.system_tokens, o.length_scale);
  p.user = Scaled(p.user, o.length_scale);
  p.reply = Scaled(p.reply, o.length_scale);
  return p;
}

DocumentParams DocumentsFor(const TraceOptions& o) {
  DocumentParams p;
  if (o.conversations) p.documents = o.conversations;
  p.document = Scaled(p.document, o.length_scale);
  p.question = Scaled(p.question, o.length_scale);
  return p;
}

}  // namespace

Trace Generate(Kind kind, const TraceOptions& o) {
  const double f = o.length_scale;
  switch (kind) {
    case Kind::kChat: return GenerateChat(ChatFor(o), o.seed);
    case Kind::kAgentic: {
      AgenticParams p;
      if (o.conversations) p.sessions = o.conversations;
      p.system_tokens = ScaledTokens(p.system_tokens, f);
      p.task = Scaled(p.task, f);
      p.action = Scaled(p.action, f);
      p.tool_output = Scaled(p.tool_output, f);
      return GenerateAgentic(p, o.seed);
    }
    case Kind::kFewShot: {
      FewShotParams p;
      if (o.conversations) p.batches = o.conversations;
      p.prefix = Scaled(p.prefix, f);
      p.suffix = Scaled(p.suffix, f);
      return GenerateFewShot(p, o.seed);
    }
    case Kind::kDocuments: return GenerateDocuments(DocumentsFor(o), o.seed);
    case Kind::kMixed: {
      // Documents arrive as often as conversations start (one upload per conversation).
      DocumentParams d = DocumentsFor(o);
      const ChatParams c = ChatFor(o);
      d.documents = c.conversations;
      d.gap_mean_s = c.start_gap_mean_s;
      return GenerateMixed(c, d, o.seed);
    }
  }
  return {};
}

// ---- serialization ------------------------------------------------------------------------

namespace {
void PutLE(std::string* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void Put64(std::string* out, std::uint64_t v) {
  PutLE(out, v, 8);
}
}  // namespace

std::string Serialize(const Trace& trace) {
  std::string out;
  Put64(&out, static_cast<std::uint64_t>(trace.kind));
  Put64(&out, trace.seed);
  Put64(&out, trace.requests.size());
  for (const auto& r : trace.requests) {
    std::uint64_t bits = 0;
    static_assert(sizeof(bits) == sizeof(r.arrival_s));
    std::memcpy(&bits, &r.arrival_s, sizeof(bits));
    Put64(&out, bits);
    Put64(&out, r.conversation);
    Put64(&out, (std::uint64_t{r.turn} << 1) | (r.last ? 1 : 0));
    Put64(&out, r.tokens.size());
    for (std::uint32_t t : r.tokens) PutLE(&out, t, 4);
    Put64(&out, r.reply.size());
    for (std::uint32_t t : r.reply) PutLE(&out, t, 4);
  }
  return out;
}

}  // namespace primecache::traces

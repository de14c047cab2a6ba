// Speculative verify rounds through the CPU reference model: the verify call
// is row-for-row bit-identical to one-token decode calls; a rollback to
// every keep leaves the cache bit-identical to a session given only the kept
// tokens, for every layer kind and mixes; speculative greedy decoding equals
// plain greedy decoding token for token (and logits row for row), with the
// n-gram drafter and with random accept/reject sequences over long
// generations; a restore of a boundary captured right after a rollback
// continues identically.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "engine/model/speculative.h"
#include "tests/engine/engine_test_util.h"
#include "tests/model/model_test_util.h"

namespace primecache::model {
namespace {

using engine::testing::ExpectSnapshotsEqual;
using testing::MakeCpuModel;

constexpr std::uint32_t kGamma = 4, kRound = kGamma + 1;

struct Named {
  ModelConfig config;
  std::uint64_t ring = 0;
};

ModelConfig WithAttn(const char* name, std::uint32_t window, std::uint32_t bits) {
  ModelConfig c = testing::Mixed();
  c.name = name;
  c.layers = {LayerType::kKda, LayerType::kAttn, LayerType::kMla, LayerType::kAttn};
  c.attn = {4, 2, 16, window, 10000.0f, bits};
  return c;
}

std::vector<Named> Configs() {
  ModelConfig kda = testing::Mixed();
  kda.name = "kda";
  kda.layers = {LayerType::kKda, LayerType::kKda};
  ModelConfig dense = testing::Mixed();
  dense.name = "dense-mla";
  dense.layers = {LayerType::kMla, LayerType::kMla};
  dense.mla.indexer.reset();
  return {{testing::Mixed(), 0},
          {testing::Mixed(), 8},  // an index ring of MinRingRows(4, 5)
          {kda, 0},
          {dense, 0},
          {WithAttn("attn-full", 0, 0), 0},
          {WithAttn("attn-swa", 9, 0), 0},
          {WithAttn("attn-tq4", 0, 4), 0},
          {WithAttn("attn-swa-tq2", 8, 2), 0}};
}

std::string Trace(const Named& n) {
  return n.config.name + (n.ring ? " ring " + std::to_string(n.ring) : "");
}

std::vector<std::uint32_t> Prompt(std::size_t n, std::uint32_t salt = 0) {
  std::vector<std::uint32_t> t{kBosToken};
  for (std::size_t i = 1; i < n; ++i) t.push_back(static_cast<std::uint32_t>((i * 37 + i * i + salt) % 256));
  return t;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<LayerSnapshot> Capture(const ModelSession& s) {
  auto c = s.cache->CaptureFull();
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : std::vector<LayerSnapshot>{};
}

Result<testing::CpuModel> Make(const Named& n, std::uint64_t max_ctx = 256) {
  return MakeCpuModel(n.config, Weights::Generate(n.config, 21), max_ctx, /*chunk=*/64, /*sessions=*/2,
                      n.ring, kRound);
}

TEST(SpeculativeTest, VerifyRowsAreBitIdenticalToOneTokenDecodeCalls) {
  for (const Named& n : Configs()) {
    SCOPED_TRACE(Trace(n));
    auto m = Make(n);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto a = m->model->NewSession().value(), b = m->model->NewSession().value();
    const auto prompt = Prompt(23), draft = Prompt(kRound + 1, 7);
    std::vector<float> ignore, verify, decode;
    ASSERT_TRUE(m->model->Prime(a, prompt, LogitsWanted::kLast, &ignore).ok());
    ASSERT_TRUE(m->model->Prime(b, prompt, LogitsWanted::kLast, &ignore).ok());
    const std::span<const std::uint32_t> tokens = std::span(draft).subspan(1);
    ASSERT_TRUE(m->model->VerifyDraft(a, tokens, &verify).ok());
    for (std::uint32_t t : tokens)
      ASSERT_TRUE(m->model->Prime(b, std::span(&t, 1), LogitsWanted::kLast, &decode).ok());
    EXPECT_TRUE(SameBits(verify, decode)) << "verify rows differ from one-token calls";
    ASSERT_TRUE(m->model->ResolveRound(a, kRound).ok());
    EXPECT_EQ(a.position, b.position);
    ExpectSnapshotsEqual(Capture(a), Capture(b));
  }
}

TEST(SpeculativeTest, RollbackToEveryKeepEqualsASessionGivenOnlyTheKeptTokens) {
  for (const Named& n : Configs()) {
    for (std::uint64_t keep = 0; keep <= kRound; ++keep) {
      SCOPED_TRACE(Trace(n) + " keep " + std::to_string(keep));
      auto m = Make(n);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      auto a = m->model->NewSession().value(), b = m->model->NewSession().value();
      const auto prompt = Prompt(18), more = Prompt(kRound + 4, 3);
      const std::span<const std::uint32_t> round = std::span(more).subspan(1, kRound);
      std::vector<float> la, lb;
      ASSERT_TRUE(m->model->Prime(a, prompt, LogitsWanted::kLast, &la).ok());
      ASSERT_TRUE(m->model->Prime(b, prompt, LogitsWanted::kLast, &lb).ok());
      ASSERT_TRUE(m->model->VerifyDraft(a, round, &la).ok());
      ASSERT_TRUE(m->model->ResolveRound(a, keep).ok());
      if (keep != 0) {
        ASSERT_TRUE(m->model->VerifyDraft(b, round.first(keep), &lb).ok());  // armed, given only the kept tokens
        ASSERT_TRUE(m->model->ResolveRound(b, keep).ok());
      }
      ASSERT_EQ(a.position, b.position);
      ExpectSnapshotsEqual(Capture(a), Capture(b));
      // Both go on from there with the same tokens: the same logits, bit for bit.
      std::vector<float> na, nb;
      ASSERT_TRUE(m->model->Prime(a, std::span(more).subspan(2, 3), LogitsWanted::kAll, &na).ok());
      ASSERT_TRUE(m->model->Prime(b, std::span(more).subspan(2, 3), LogitsWanted::kAll, &nb).ok());
      EXPECT_TRUE(SameBits(na, nb));
      if (HasFailure()) return;
    }
  }
}

struct Decoded {
  std::vector<std::uint32_t> tokens;
  std::vector<float> logits;
  std::vector<LayerSnapshot> state;
  SpeculateStats stats;
};

// Primes `prompt` in a fresh session and decodes max_new tokens greedily,
// plainly (options null) or speculatively.
Decoded Decode(testing::CpuModel& m, const std::vector<std::uint32_t>& prompt, std::size_t max_new,
               const SpeculateOptions* options) {
  Decoded r;
  auto s = m.model->NewSession().value();
  std::vector<float> last;
  EXPECT_TRUE(m.model->Prime(s, prompt, LogitsWanted::kLast, &last).ok());
  auto out = options == nullptr
                 ? m.model->Generate(s, last, max_new, &r.logits)
                 : GenerateSpeculative(*m.model, s, prompt, last, max_new, *options, &r.stats, &r.logits);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (out.ok()) r.tokens = std::move(out).value();
  r.state = Capture(s);
  return r;
}

void ExpectSameRun(const Decoded& spec, const Decoded& plain) {
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_TRUE(SameBits(spec.logits, plain.logits)) << "logits rows differ";
  ExpectSnapshotsEqual(spec.state, plain.state);
}

TEST(SpeculativeTest, NgramSpeculationEqualsPlainGreedyTokenForToken) {
  const std::vector<std::uint32_t> repetitive =
      Tokenize(std::string(4, ' ') + "abcabcabcabcabcabcabcabc abc abc");
  for (const Named& n : Configs()) {
    for (std::size_t gamma : {std::size_t{1}, std::size_t{kGamma}}) {
      SCOPED_TRACE(Trace(n) + " gamma " + std::to_string(gamma));
      auto m = Make(n);
      ASSERT_TRUE(m.ok());
      for (const auto& prompt : {repetitive, Prompt(30)}) {
        const Decoded plain = Decode(*m, prompt, 48, nullptr);
        SpeculateOptions o;
        o.gamma = gamma;
        const Decoded spec = Decode(*m, prompt, 48, &o);
        ExpectSameRun(spec, plain);
        EXPECT_GT(spec.stats.rounds, 0u);
      }
    }
  }
}

// A drafter that proposes the plain run's continuation, cut to a random
// length and corrupted at a random place (or not): every accept length from
// 0 to gamma occurs, in random order, over a long generation.
Drafter RandomOracle(const std::vector<std::uint32_t>& truth, std::size_t prompt_len, std::uint32_t seed) {
  auto rng = std::make_shared<std::mt19937>(seed);
  return [truth, prompt_len, rng](std::span<const std::uint32_t> history, std::size_t max) {
    const std::size_t at = history.size() - prompt_len;  // generated tokens so far
    std::vector<std::uint32_t> d;
    const std::size_t len = (*rng)() % (max + 1);
    for (std::size_t i = 0; i < len && at + i < truth.size(); ++i) d.push_back(truth[at + i]);
    if (!d.empty() && (*rng)() % 3 != 0) {
      std::uint32_t& t = d[(*rng)() % d.size()];
      t = (t + 1 + (*rng)() % 200) % 256;  // another byte
    }
    return d;
  };
}

TEST(SpeculativeTest, RandomAcceptRejectSequencesOverLongGenerationsNeverDrift) {
  for (const Named& n : {Configs()[1], Configs()[7]}) {
    SCOPED_TRACE(Trace(n));
    auto m = Make(n, 400);
    ASSERT_TRUE(m.ok());
    const auto prompt = Prompt(25, 5);
    const Decoded plain = Decode(*m, prompt, 200, nullptr);
    for (std::uint32_t seed : {1u, 2u}) {
      SpeculateOptions o;
      o.drafter = RandomOracle(plain.tokens, prompt.size(), seed);
      const Decoded spec = Decode(*m, prompt, 200, &o);
      ExpectSameRun(spec, plain);
      EXPECT_GT(spec.stats.accepted, 0u);
      EXPECT_LT(spec.stats.accepted, spec.stats.drafted);
    }
  }
}

TEST(SpeculativeTest, RestoreOfABoundaryCapturedRightAfterARollbackContinuesIdentically) {
  for (const Named& n : Configs()) {
    SCOPED_TRACE(Trace(n));
    auto m = Make(n);
    ASSERT_TRUE(m.ok());
    auto a = m->model->NewSession().value(), r = m->model->NewSession().value();
    const auto prompt = Prompt(21), more = Prompt(20, 9);
    std::vector<float> ignore;
    ASSERT_TRUE(m->model->Prime(a, prompt, LogitsWanted::kLast, &ignore).ok());
    ASSERT_TRUE(m->model->VerifyDraft(a, std::span(more).subspan(1, kRound), &ignore).ok());
    ASSERT_TRUE(m->model->ResolveRound(a, 2).ok());
    ASSERT_TRUE(r.cache->Restore(Capture(a)).ok());
    r.position = a.position;
    std::vector<float> la, lr;
    for (ModelSession* s : {&a, &r}) {
      std::vector<float>& l = s == &a ? la : lr;
      ASSERT_TRUE(m->model->Prime(*s, std::span(more).subspan(6, 3), LogitsWanted::kAll, &l).ok());
      ASSERT_TRUE(m->model->VerifyDraft(*s, std::span(more).subspan(9, kRound), &l).ok());
      ASSERT_TRUE(m->model->ResolveRound(*s, 3).ok());
      ASSERT_TRUE(m->model->Prime(*s, std::span(more).subspan(12, 2), LogitsWanted::kAll, &l).ok());
    }
    EXPECT_TRUE(SameBits(la, lr));
    ExpectSnapshotsEqual(Capture(a), Capture(r));
  }
}

TEST(SpeculativeTest, NgramDraftTakesTheLongestSuffixAtItsLatestOccurrence) {
  const std::vector<std::uint32_t> h{1, 2, 3, 9, 1, 2, 4, 5, 1, 2};
  EXPECT_EQ(NgramDraft(h, 3), (std::vector<std::uint32_t>{4, 5, 1}));  // "1 2" last seen before 4
  EXPECT_EQ(NgramDraft(h, 1), (std::vector<std::uint32_t>{4}));
  EXPECT_EQ(NgramDraft(h, 0), (std::vector<std::uint32_t>{}));
  const std::vector<std::uint32_t> tri{7, 8, 9, 1, 5, 8, 9, 2, 7, 8, 9};
  EXPECT_EQ(NgramDraft(tri, 2), (std::vector<std::uint32_t>{1, 5}));  // "7 8 9" beats the later "8 9"
  EXPECT_EQ(NgramDraft(tri, 2, {2, 1}), (std::vector<std::uint32_t>{2, 7}));
  const std::vector<std::uint32_t> none{1, 2, 3, 4};
  EXPECT_TRUE(NgramDraft(none, 4).empty());
  EXPECT_TRUE(NgramDraft(std::vector<std::uint32_t>{5}, 4).empty());
  // The draft stops at the history's end.
  EXPECT_EQ(NgramDraft(std::vector<std::uint32_t>{6, 6, 6}, 5), (std::vector<std::uint32_t>{6}));
}

TEST(SpeculativeTest, VerifyRefusesWithoutARoundReserveAndLeavesTheSessionAsItWas) {
  ModelConfig c = testing::Mixed();
  auto m = MakeCpuModel(c, Weights::Generate(c, 3), 128, 64, 1, 0, /*round_tokens=*/0);
  ASSERT_TRUE(m.ok());
  auto s = m->model->NewSession().value();
  std::vector<float> l;
  ASSERT_TRUE(m->model->Prime(s, Prompt(9), LogitsWanted::kLast, &l).ok());
  const auto before = Capture(s);
  Status st = m->model->VerifyDraft(s, Prompt(3), &l);
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("round_tokens"), std::string::npos) << st.message();
  EXPECT_EQ(s.position, 9u);
  ExpectSnapshotsEqual(Capture(s), before);
  EXPECT_TRUE(m->model->ResolveRound(s, 0).IsFailedPrecondition());
  // Speculation refuses up front when the reserve books no rounds that long.
  auto spec =
      GenerateSpeculative(*m->model, s, Prompt(9), std::vector<float>(c.vocab), 4, {}, nullptr, nullptr);
  EXPECT_TRUE(spec.status().IsInvalidArgument());
  EXPECT_NE(spec.status().message().find("rounds of gamma + 1 = 5 positions"), std::string::npos)
      << spec.status().message();
  EXPECT_EQ(s.position, 9u);
}

}  // namespace
}  // namespace primecache::model

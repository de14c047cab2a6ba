// The reference model at TP n on the CPU backend: what a rank holds, TP 1
// bit-identical to the plain model, TP 2 and 4 within the spec's tolerance
// of TP 1, runs deterministic, a restore at one TP exact, a boundary
// resharded in memory from TP a to TP b continuing as TP b does, and a
// failing rank stopping every rank without a hang.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <thread>

#include "engine/model/tensor_parallel.h"
#include "primecache/internal/shard.h"
#include "tests/model/model_test_util.h"
#include "tests/model/step_compare.h"

namespace primecache::model {
namespace {

using testing::MakeCpuModel;
using testing::RandomPrompt;
using testing::RelErr;

using testing::MakeTp;
using testing::TpMixed;

// The spec's tolerance, on every plane of two whole boundaries.
void ExpectStatesClose(const std::vector<LayerSnapshot>& got, const std::vector<LayerSnapshot>& want,
                       double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t l = 0; l < want.size(); ++l) {
    ASSERT_EQ(got[l].index(), want[l].index()) << "layer " << l;
    std::visit(
        [&](const auto& w) {
          const auto& g = std::get<std::decay_t<decltype(w)>>(got[l]);
          ASSERT_EQ(g.shape, w.shape) << "layer " << l;
          if constexpr (std::is_same_v<std::decay_t<decltype(w)>, LatentSnapshot>) {
            EXPECT_LE(RelErr(g.latent_rows, w.latent_rows), tol) << "layer " << l;
            EXPECT_LE(RelErr(g.index_tail_rows, w.index_tail_rows), tol) << "layer " << l;
            EXPECT_LE(RelErr(g.pool_keys, w.pool_keys), tol) << "layer " << l;
          } else if constexpr (std::is_same_v<std::decay_t<decltype(w)>, RecurrentSnapshot>) {
            EXPECT_LE(RelErr(g.state, w.state), tol) << "layer " << l;
            EXPECT_LE(RelErr(g.conv_ring, w.conv_ring), tol) << "layer " << l;
          } else if (w.shape.format.quant_bits == 0) {  // TurboQuant words are codes, not values
            EXPECT_LE(RelErr(g.k_rows, w.k_rows), tol) << "layer " << l;
            EXPECT_LE(RelErr(g.v_rows, w.v_rows), tol) << "layer " << l;
          }
        },
        want[l]);
  }
}

constexpr double kTolerance = 1e-4;  // spec/hybrid-model.md, "What the same means"

TEST(TpConfig, ARankHoldsItsShareOfEveryHeadSplitDimension) {
  const ModelConfig c = TpMixed();
  const ModelConfig r = RankConfig(c, 4).value();
  EXPECT_EQ(r.mlp_hidden, 12u);
  EXPECT_EQ(r.mla.heads, 1u);
  EXPECT_EQ(r.kda.heads, 1u);
  EXPECT_EQ(r.attn.heads, 2u);
  EXPECT_EQ(r.attn.kv_heads, 1u);
  EXPECT_EQ(r.mla.kv_rank, c.mla.kv_rank);  // the latent is replicated
  EXPECT_EQ(r.mla.indexer, c.mla.indexer);  // and so is the indexer
  EXPECT_EQ(RankConfig(c, 1).value(), c);
  EXPECT_EQ(RankConfig(testing::Mixed(), 2).status().message(), "TP 2 does not divide mla.heads = 3");
  EXPECT_EQ(RankConfig(c, 5).status().message(), "TP 5 does not divide mlp_hidden = 48");
  EXPECT_EQ(RankConfig(c, 8).status().message(), "TP 8 does not divide mla.heads = 4");
  EXPECT_FALSE(RankConfig(c, 0).ok());
}

// Concatenating every rank's tensor along its cut gives the whole tensor
// back, and a replicated tensor is the whole one on every rank.
TEST(TpConfig, TheRanksTensorsTileTheWholeModel) {
  const ModelConfig c = TpMixed();
  const Weights w = Weights::Generate(c, 5);
  constexpr std::uint32_t kTp = 4;
  std::vector<Weights> ranks;
  for (std::uint32_t r = 0; r < kTp; ++r) {
    ranks.push_back(RankWeights(c, w, kTp, r).value());
    ASSERT_TRUE(ranks.back().CheckAgainst(RankConfig(c, kTp).value()).ok());
  }
  std::size_t split = 0;
  for (const auto& [name, whole] : w.tensors()) {
    const Tensor& first = *ranks[0].Find(name);
    if (first.shape == whole.shape) {
      for (const Weights& rw : ranks) EXPECT_EQ(rw.Find(name)->data, whole.data) << name;
      continue;
    }
    ++split;
    std::vector<float> joined;
    if (first.shape[0] != whole.shape[0]) {  // rows
      for (const Weights& rw : ranks)
        joined.insert(joined.end(), rw.Find(name)->data.begin(), rw.Find(name)->data.end());
    } else {  // columns
      const std::size_t rows = whole.shape[0], width = first.shape[1];
      for (std::size_t row = 0; row < rows; ++row) {
        for (const Weights& rw : ranks) {
          const auto& d = rw.Find(name)->data;
          joined.insert(joined.end(), d.begin() + row * width, d.begin() + (row + 1) * width);
        }
      }
    }
    EXPECT_EQ(joined, whole.data) << name;
  }
  // Per layer: MLP 3; MLA wq, wuk, wuv, wo; KDA 10; attn 4.
  EXPECT_EQ(split, 5 * 3 + 2 * 4 + 2 * 10 + 4);
  EXPECT_FALSE(RankWeights(c, w, 4, 4).ok());
}

struct TpRun {
  std::vector<float> logits;
  std::vector<LayerSnapshot> whole;  // the gathered boundary at the end
};

// Primes the prompt in two calls (prefix, then the rest) at TP `tp`.
TpRun RunAt(const ModelConfig& c, const Weights& w, std::uint32_t tp,
            const std::vector<std::uint32_t>& prompt, std::size_t split) {
  auto m = MakeTp(c, w, tp);
  TpSession s = m->NewSession().value();
  TpRun run;
  EXPECT_TRUE(m->Prime(s, std::span(prompt).first(split), LogitsWanted::kAll, &run.logits).ok());
  EXPECT_TRUE(m->Prime(s, std::span(prompt).subspan(split), LogitsWanted::kAll, &run.logits).ok());
  auto shards = m->CaptureFull(s).value();
  auto whole = GatherLayers(shards);
  EXPECT_TRUE(whole.ok()) << whole.status().ToString();  // the ranks' replicated planes agree bit for bit
  run.whole = std::move(whole).value();
  return run;
}

TEST(TensorParallel, TpOneIsThePlainModelBitForBit) {
  const ModelConfig c = TpMixed();
  const Weights w = Weights::Generate(c, 7);
  const auto prompt = RandomPrompt(41, 3);
  auto plain = MakeCpuModel(c, w, 128, 16).value();
  ModelSession s = plain.model->NewSession().value();
  std::vector<float> want;
  ASSERT_TRUE(plain.model->Prime(s, std::span(prompt).first(20), LogitsWanted::kAll, &want).ok());
  ASSERT_TRUE(plain.model->Prime(s, std::span(prompt).subspan(20), LogitsWanted::kAll, &want).ok());
  const TpRun tp1 = RunAt(c, w, 1, prompt, 20);
  EXPECT_EQ(tp1.logits, want);
  ExpectStatesClose(tp1.whole, s.cache->CaptureFull().value(), 0.0);
}

// The attn layers' kind in a case of TpMixed.
struct AttnCase {
  const char* name;
  std::uint32_t window, bits;
  friend void PrintTo(const AttnCase& a, std::ostream* os) { *os << a.name; }
};

class TpSizes : public ::testing::TestWithParam<AttnCase> {};

TEST_P(TpSizes, TwoAndFourRanksAgreeWithOneWithinTheSpecsTolerance) {
  const ModelConfig c = TpMixed(GetParam().window, GetParam().bits);
  const Weights w = Weights::Generate(c, 11);
  const auto prompt = RandomPrompt(45, 9);
  const TpRun one = RunAt(c, w, 1, prompt, 23);
  for (std::uint32_t tp : {2u, 4u}) {
    SCOPED_TRACE("TP " + std::to_string(tp));
    const TpRun run = RunAt(c, w, tp, prompt, 23);
    ASSERT_EQ(run.logits.size(), one.logits.size());
    EXPECT_LE(RelErr(run.logits, one.logits), kTolerance);
    EXPECT_NE(run.logits, one.logits);  // another order of sums: close, not equal
    ExpectStatesClose(run.whole, one.whole, kTolerance);
    EXPECT_EQ(RunAt(c, w, tp, prompt, 23).logits, run.logits);  // deterministic
  }
}

INSTANTIATE_TEST_SUITE_P(Mixers, TpSizes,
                         ::testing::Values(AttnCase{"full_f32", 0, 0}, AttnCase{"sliding_f32", 9, 0},
                                           AttnCase{"full_tq4", 0, 4}),
                         [](const auto& info) { return std::string(info.param.name); });

// A boundary of TP a, gathered and sliced for TP b, restored at TP b, primed
// on: the continuation of a TP b that restored (in memory) what TP a
// captured. At a == b it is bit-identical to TP a going on without a restore.
std::vector<float> ContinueResharded(const ModelConfig& c, const Weights& w, std::uint32_t from,
                                     std::uint32_t to, const std::vector<std::uint32_t>& prompt,
                                     std::size_t split) {
  auto a = MakeTp(c, w, from);
  TpSession sa = a->NewSession().value();
  std::vector<float> ignored;
  EXPECT_TRUE(a->Prime(sa, std::span(prompt).first(split), LogitsWanted::kLast, &ignored).ok());
  const auto whole = GatherLayers(a->CaptureFull(sa).value()).value();
  std::vector<std::vector<LayerSnapshot>> shards;
  for (std::uint32_t r = 0; r < to; ++r) shards.push_back(SliceLayers(whole, c.attn.kv_heads, to, r).value());
  auto b = MakeTp(c, w, to);
  TpSession sb = b->NewSession().value();
  Status restored = b->Restore(sb, shards, split);
  EXPECT_TRUE(restored.ok()) << restored.ToString();
  std::vector<float> logits;
  EXPECT_TRUE(b->Prime(sb, std::span(prompt).subspan(split), LogitsWanted::kAll, &logits).ok());
  return logits;
}

TEST(TensorParallel, ARestoreAtTheSameTpContinuesBitForBit) {
  const ModelConfig c = TpMixed(9, 4);
  const Weights w = Weights::Generate(c, 13);
  const auto prompt = RandomPrompt(40, 21);
  for (std::uint32_t tp : {1u, 2u, 4u}) {
    const TpRun straight = RunAt(c, w, tp, prompt, 25);
    const std::vector<float> tail(straight.logits.end() - 15 * c.vocab, straight.logits.end());
    EXPECT_EQ(ContinueResharded(c, w, tp, tp, prompt, 25), tail) << "TP " << tp;
  }
}

TEST(TensorParallel, ABoundaryReshardedToAnotherTpContinuesAsThatTpDoes) {
  const ModelConfig c = TpMixed(9, 0);
  const Weights w = Weights::Generate(c, 17);
  const auto prompt = RandomPrompt(40, 23);
  for (auto [from, to] : {std::pair{2u, 4u}, {2u, 1u}, {4u, 2u}, {1u, 4u}}) {
    SCOPED_TRACE("TP " + std::to_string(from) + " to " + std::to_string(to));
    const TpRun uncached = RunAt(c, w, to, prompt, 25);
    const std::vector<float> tail(uncached.logits.end() - 15 * c.vocab, uncached.logits.end());
    const std::vector<float> got = ContinueResharded(c, w, from, to, prompt, 25);
    EXPECT_LE(RelErr(got, tail), kTolerance);
  }
}

TEST(TensorParallel, GreedyTokensAtTpTwoAreTpOnes) {
  // For these weights no greedy pick is near a tie, so the tokens agree
  // exactly although the logits differ in the last bits.
  const ModelConfig c = TpMixed();
  const Weights w = Weights::Generate(c, 19);
  const auto prompt = RandomPrompt(30, 5);
  std::vector<std::vector<std::uint32_t>> out;
  for (std::uint32_t tp : {1u, 2u}) {
    auto m = MakeTp(c, w, tp);
    TpSession s = m->NewSession().value();
    std::vector<float> last;
    ASSERT_TRUE(m->Prime(s, prompt, LogitsWanted::kLast, &last).ok());
    out.push_back(m->Generate(s, last, 12, nullptr).value());
    EXPECT_EQ(s.position(), prompt.size() + out.back().size() - (out.back().back() == kEosToken ? 1 : 0));
    for (const ModelSession& rank : s.ranks) EXPECT_EQ(rank.position, s.position());
  }
  EXPECT_EQ(out[0].size(), 12u);
  EXPECT_EQ(out[1], out[0]);
}

TEST(TensorParallel, ADamagedShardOnOneRankIsRefusedOnEveryRank) {
  const ModelConfig c = TpMixed();
  const Weights w = Weights::Generate(c, 23);
  auto m = MakeTp(c, w, 2);
  TpSession s = m->NewSession().value();
  std::vector<float> ignored;
  ASSERT_TRUE(m->Prime(s, RandomPrompt(20, 1), LogitsWanted::kNone, &ignored).ok());
  auto shards = m->CaptureFull(s).value();
  std::get<RecurrentSnapshot>(shards[1][3]).state.pop_back();
  TpSession fresh = m->NewSession().value();
  Status st = m->Restore(fresh, shards, 20);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("TP rank 1"), std::string::npos) << st.ToString();
  for (const ModelSession& rank : fresh.ranks)
    EXPECT_TRUE(rank.cache->fresh());  // rank 0 restored nothing either
}

TEST(TensorParallel, AFailingRankStopsEveryRankWithItsCause) {
  const ModelConfig c = TpMixed();
  const Weights w = Weights::Generate(c, 29);
  auto m = MakeTp(c, w, 4);
  TpSession s = m->NewSession().value();
  s.ranks[2].position = 5;  // its MLA layer refuses; the others wait in the sum after it
  std::vector<float> logits;
  Status st = m->Prime(s, RandomPrompt(10, 2), LogitsWanted::kLast, &logits);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  // The group is usable again.
  TpSession good = m->NewSession().value();
  EXPECT_TRUE(m->Prime(good, RandomPrompt(10, 2), LogitsWanted::kLast, &logits).ok());
}

TEST(InProcessGroup, SumsInRankOrderAndEveryRankGetsTheSameBits) {
  auto group = NewInProcessGroup(3).value();
  // (1e8 + 1) - 1e8 is 0 in f32 in rank order; another order gives 1.
  std::vector<std::vector<float>> data = {{1e8f, 2.0f}, {1.0f, 3.0f}, {-1e8f, 4.0f}};
  std::vector<Status> done(3);
  {
    std::vector<std::jthread> ranks;
    for (std::uint32_t r = 0; r < 3; ++r) {
      ranks.emplace_back([&, r] { done[r] = group->rank(r).AllReduceSum(data[r].data(), 2); });
    }
  }
  for (std::uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(done[r].ok()) << done[r].ToString();
    EXPECT_EQ(data[r], (std::vector<float>{0.0f, 9.0f})) << "rank " << r;
  }
}

TEST(InProcessGroup, AnAbortWakesEveryWaitingRankAndResetClearsIt) {
  auto group = NewInProcessGroup(3).value();
  std::vector<float> a(4, 1.0f), b(4, 1.0f);
  Status sa, sb;
  {
    std::jthread r0([&] { sa = group->rank(0).AllReduceSum(a.data(), 4); });
    std::jthread r1([&] { sb = group->rank(1).AllReduceSum(b.data(), 4); });
    group->rank(2).Abort(Status::IOError("rank 2 lost its device"));
  }
  EXPECT_EQ(sa.code(), StatusCode::kAborted);
  EXPECT_NE(sa.message().find("rank 2 lost its device"), std::string::npos);
  EXPECT_EQ(sb.code(), StatusCode::kAborted);
  EXPECT_EQ(a, std::vector<float>(4, 1.0f));  // untouched
  EXPECT_EQ(group->rank(0).AllReduceSum(a.data(), 4).code(), StatusCode::kAborted);
  group->Reset();
  std::vector<float> c(4, 1.0f);
  std::vector<Status> done(3);
  {
    std::jthread r0([&] { done[0] = group->rank(0).AllReduceSum(a.data(), 4); });
    std::jthread r1([&] { done[1] = group->rank(1).AllReduceSum(b.data(), 4); });
    done[2] = group->rank(2).AllReduceSum(c.data(), 4);
  }
  for (const Status& s : done) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c, std::vector<float>(4, 3.0f));
}

TEST(InProcessGroup, RankZerosWordsReachEveryRankAndOneRefusalIsEveryRanks) {
  auto group = NewInProcessGroup(3).value();
  auto device = engine::NewCpuDevice();
  // Words that a float could not carry whole: the broadcast sends 16-bit pieces.
  const std::vector<std::uint64_t> sent = {0, 1, (1ull << 24) + 1, 0xfedcba9876543210ull, UINT64_MAX};
  std::vector<std::vector<std::uint64_t>> words(3, std::vector<std::uint64_t>(sent.size(), 7));
  words[0] = sent;
  std::vector<Status> done(3);
  std::vector<int> agreed(3, -1), refused(3, -1);
  {
    std::vector<std::jthread> ranks;
    for (std::uint32_t r = 0; r < 3; ++r) {
      ranks.emplace_back([&, r] {
        done[r] = BroadcastWords(group->rank(r), *device, words[r]);
        if (!done[r].ok()) return;
        auto all = AllRanksOk(group->rank(r), *device, true);
        auto one = AllRanksOk(group->rank(r), *device, r != 2);  // rank 2 refuses
        if (!all.ok() || !one.ok()) {
          done[r] = all.ok() ? one.status() : all.status();
          return;
        }
        agreed[r] = *all ? 1 : 0;
        refused[r] = *one ? 0 : 1;
      });
    }
  }
  for (std::uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(done[r].ok()) << done[r].ToString();
    EXPECT_EQ(words[r], sent) << "rank " << r;
    EXPECT_EQ(agreed[r], 1) << "rank " << r;
    EXPECT_EQ(refused[r], 1) << "rank " << r;
  }
}

TEST(InProcessGroup, RanksThatDisagreeOnTheCountFailInsteadOfReadingPastABuffer) {
  auto group = NewInProcessGroup(2).value();
  std::vector<float> a(4, 1.0f), b(2, 1.0f);
  Status sa, sb;
  {
    std::jthread r0([&] { sa = group->rank(0).AllReduceSum(a.data(), 4); });
    std::jthread r1([&] { sb = group->rank(1).AllReduceSum(b.data(), 2); });
  }
  EXPECT_FALSE(sa.ok());
  EXPECT_FALSE(sb.ok());
  EXPECT_FALSE(NewInProcessGroup(0).ok());
}

}  // namespace
}  // namespace primecache::model

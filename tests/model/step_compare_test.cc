// CompareStep (step_compare.h), the rule of the state-forced CUDA test, held
// to what it must refuse: two CPU sessions run a step from one restored
// state (identical, so the step is strict and clean), then one side is
// corrupted the ways a wrong GPU result would be.
#include "tests/model/step_compare.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <span>
#include <utility>

#include "tests/model/model_test_util.h"

namespace primecache::model {
namespace {

using testing::CompareStep;
using testing::StepReport;

class StepCompareTest : public ::testing::Test {
 protected:
  // KDA, TurboQuant-4 attn, MLA, TurboQuant-4 attn; 30 tokens, then a
  // 1-token step on two sessions from the first one's restored state.
  void SetUp() override {
    ModelConfig c = testing::Mixed();
    c.name = "step-compare";
    c.layers = {LayerType::kKda, LayerType::kAttn, LayerType::kMla, LayerType::kAttn};
    c.attn = {4, 2, 16, 0, 10000.0f, 4};
    Weights w = Weights::Generate(c, 5);
    auto m = testing::MakeCpuModel(c, w, 64, 16, 2);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(m).value();
    std::mt19937 rng(7);
    std::vector<std::uint32_t> prompt = {kBosToken};
    while (prompt.size() < 30) prompt.push_back(rng() % 256);
    auto a = m_.model->NewSession();
    auto b = m_.model->NewSession();
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<float> unused;
    ASSERT_TRUE(m_.model->Prime(*a, prompt, LogitsWanted::kNone, &unused).ok());
    auto state = a->cache->CaptureFull();
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    ASSERT_TRUE(b->cache->Restore(std::span<const LayerSnapshot>(*state)).ok());
    b->position = a->position;
    first_new_ = a->position;
    const std::uint32_t step[] = {42};
    ASSERT_TRUE(m_.model->Prime(*a, step, LogitsWanted::kAll, &la_).ok());
    ASSERT_TRUE(m_.model->Prime(*b, step, LogitsWanted::kAll, &lb_).ok());
    auto sa = a->cache->CaptureFull();
    auto sb = b->cache->CaptureFull();
    ASSERT_TRUE(sa.ok() && sb.ok());
    got_ = std::move(sa).value();
    want_ = std::move(sb).value();
  }

  StepReport Compare() const { return CompareStep(got_, want_, la_, lb_, first_new_); }

  // Moves code 0 of TurboQuant entry `entry` of layer l's V plane by `levels`
  // (downwards when upwards would leave the code range).
  void ShiftCode(std::size_t l, std::size_t entry, int levels) {
    auto& kv = std::get<KvSnapshot>(got_[l]);
    const std::size_t bits = kv.shape.format.quant_bits, words = 1 + kv.shape.format.head_dim * bits / 32;
    std::uint32_t word;
    std::memcpy(&word, &kv.v_rows[entry * words + 1], 4);
    const int max = (1 << bits) - 1, code = static_cast<int>(word & std::uint32_t(max));
    const int moved = code + levels <= max ? code + levels : code - levels;
    word = (word & ~std::uint32_t(max)) | std::uint32_t(moved);
    std::memcpy(&kv.v_rows[entry * words + 1], &word, 4);
  }
  std::size_t Entries(std::size_t l) const {
    const auto& kv = std::get<KvSnapshot>(got_[l]);
    return kv.v_rows.size() / (1 + kv.shape.format.head_dim * kv.shape.format.quant_bits / 32);
  }
  std::vector<float>& LatentRows() { return std::get<LatentSnapshot>(got_[2]).latent_rows; }

  testing::CpuModel m_;
  std::uint64_t first_new_ = 0;
  std::vector<float> la_, lb_;
  std::vector<LayerSnapshot> got_, want_;
};

TEST_F(StepCompareTest, IdenticalStepIsStrictAndClean) {
  const StepReport r = Compare();
  EXPECT_TRUE(r.failures.empty()) << r.failures.front();
  EXPECT_TRUE(r.strict);
  EXPECT_EQ(r.flips, 0u);
  // The step's own rows of both TurboQuant layers: 2 layers x K,V x 2 heads x 16 codes.
  EXPECT_EQ(r.codes, 2u * 2 * 2 * 16);
  EXPECT_EQ(r.logit_err, 0.0);
  EXPECT_EQ(r.plane_err, 0.0);
}

TEST_F(StepCompareTest, PerturbedLogitFailsAStrictStep) {
  la_[3] += 1e-2f * (std::abs(la_[3]) + 1.0f);
  const StepReport r = Compare();
  EXPECT_TRUE(r.strict);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("logits"), std::string::npos) << r.failures[0];
}

TEST_F(StepCompareTest, PerturbedPlaneOrNormFailsAStrictStep) {
  std::get<RecurrentSnapshot>(got_[0]).state[5] += 1.0f;
  auto& kv = std::get<KvSnapshot>(got_[3]);
  kv.k_rows[kv.k_rows.size() - 3] *= 1.01f;  // the norm of the new row's last K entry
  const StepReport r = Compare();
  EXPECT_TRUE(r.strict);
  ASSERT_EQ(r.failures.size(), 2u);
  EXPECT_NE(r.failures[0].find("layer 0 planes"), std::string::npos) << r.failures[0];
  EXPECT_NE(r.failures[1].find("layer 3 planes"), std::string::npos) << r.failures[1];
}

TEST_F(StepCompareTest, OneLevelFlipInTheStepsOwnRowIsAFlipStep) {
  ShiftCode(3, Entries(3) - 1, 1);
  const StepReport r = Compare();
  EXPECT_TRUE(r.failures.empty()) << r.failures.front();
  EXPECT_FALSE(r.strict);
  EXPECT_EQ(r.flips, 1u);
}

TEST_F(StepCompareTest, FlipRelaxesOnlyTheLayersAfterIt) {
  for (float& x : LatentRows()) x *= 1.001f;  // layer 2: after a flip in layer 1, before one in layer 3
  ShiftCode(1, Entries(1) - 1, 1);
  const StepReport relaxed = Compare();
  EXPECT_TRUE(relaxed.failures.empty()) << relaxed.failures.front();
  EXPECT_EQ(relaxed.flips, 1u);
  got_[1] = want_[1];  // undone: the first flip is now layer 3's
  ShiftCode(3, Entries(3) - 1, 1);
  const StepReport r = Compare();
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("layer 2 planes"), std::string::npos) << r.failures[0];
}

TEST_F(StepCompareTest, TwoLevelsApartFails) {
  ShiftCode(3, Entries(3) - 1, 2);
  const StepReport r = Compare();
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures[0].find("not one level apart"), std::string::npos) << r.failures[0];
}

TEST_F(StepCompareTest, AnyDifferenceInAnOlderRowFails) {
  ShiftCode(1, 0, 1);
  const StepReport r = Compare();
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures[0].find("held before the step"), std::string::npos) << r.failures[0];
}

TEST_F(StepCompareTest, ShapeMismatchFails) {
  std::get<KvSnapshot>(got_[1]).shape.len += 1;
  const StepReport r = Compare();
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("shape"), std::string::npos);
}

// The state-forced driver itself, CPU against CPU: every step restores the
// leader's state into a fresh follower session (rotating windows wrapped,
// calls longer than the window), and since the backends are the same the
// comparison must be strict and bit-exact at every step.
TEST(StateForcedDriverTest, CpuAgainstCpuIsStrictAndExactAtEveryStep) {
  for (auto [window, bits] : {std::pair{9u, 4u}, {0u, 2u}}) {
    ModelConfig c = testing::Mixed();
    c.name = "forced-driver";
    c.layers = {LayerType::kKda, LayerType::kAttn, LayerType::kMla, LayerType::kAttn};
    c.attn = {4, 2, 16, window, 10000.0f, bits};
    Weights w = Weights::Generate(c, 9);
    auto leader = testing::MakeCpuModel(c, w, 128, 16, 1);
    auto follower = testing::MakeCpuModel(c, w, 128, 16, 1);
    ASSERT_TRUE(leader.ok() && follower.ok());
    auto ls = leader->model->NewSession();
    auto fs = follower->model->NewSession();
    ASSERT_TRUE(ls.ok() && fs.ok());
    std::mt19937 rng(3);
    std::vector<std::uint32_t> tokens = {kBosToken};
    while (tokens.size() < 70) tokens.push_back(rng() % 256);
    testing::StepTally t;
    ASSERT_NO_FATAL_FAILURE(testing::RunStateForced(*leader->model, *ls, *follower->model, *fs, tokens, &t));
    EXPECT_EQ(t.steps, 34u);  // 3 rounds of nine 1-token calls and a 13-token one, then 4 more
    EXPECT_EQ(t.strict, t.steps) << "window " << window;
    EXPECT_EQ(t.flips, 0u);
    EXPECT_GT(t.codes, 0u);
    EXPECT_EQ(t.worst_logits, 0.0);
    EXPECT_EQ(t.worst_plane, 0.0);
  }
}

}  // namespace
}  // namespace primecache::model

// The round fuzz target's programs replayed deterministically in the default
// build (the libFuzzer target builds only with clang): every committed seed
// of tests/fuzz/corpus/engine_rounds, then random programs from a fixed seed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "tests/engine/round_program.h"

namespace primecache::engine::testing {
namespace {

void ExpectClean(const std::vector<std::uint8_t>& program, const std::string& name) {
  const auto errors = RoundProgram().Run(program.data(), program.size());
  EXPECT_TRUE(errors.empty()) << name << ": " << (errors.empty() ? "" : errors.front());
}

TEST(RoundProgramTest, TheSeedCorpusHoldsEveryInvariant) {
  const std::filesystem::path dir =
      std::filesystem::path(PRIMECACHE_SOURCE_DIR) / "tests/fuzz/corpus/engine_rounds";
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    ExpectClean({std::istreambuf_iterator<char>(in), {}}, entry.path().filename().string());
    ++n;
  }
  EXPECT_GE(n, 5u);
}

TEST(RoundProgramTest, RandomProgramsHoldEveryInvariant) {
  std::mt19937 rng(2026);
  for (int i = 0; i < 150; ++i) {
    std::vector<std::uint8_t> p(2 + 2 * (20 + rng() % 120));
    for (auto& b : p) b = static_cast<std::uint8_t>(rng());
    ExpectClean(p, "random program " + std::to_string(i));
    if (HasFailure()) return;
  }
}

// A program that breaks an invariant is reported: a rollback that is said to
// be refused (keep past the appended count) really is.
TEST(RoundProgramTest, TheCorpusExercisesRollbacksAndCaptures) {
  const std::vector<std::uint8_t> p{0, 1, 0, 6, 1, 4, 0, 4, 4, 0, 3, 2, 5, 0};
  ExpectClean(p, "arm, append, capture, rollback, complete");
}

}  // namespace
}  // namespace primecache::engine::testing

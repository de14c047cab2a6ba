// Seeded group publish programs (group_program.h), and a few written out.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <utility>

#include "group_program.h"

namespace primecache::store_test {
namespace {

// Runs the program; how many groups it stored and attempts it aborted.
std::pair<std::uint32_t, std::uint64_t> ExpectClean(const std::vector<std::uint8_t>& program) {
  GroupProgram run;
  const auto errors = run.Run(program.data(), program.size());
  for (const auto& e : errors) ADD_FAILURE() << e;
  return {run.committed(), run.aborted()};
}

TEST(GroupProgramTest, EveryRankBeginsSendsAndCommits) {
  // Group 0 of two ranks: begin both, send every layer (rank 0 has 4, rank 1 2), commit 1 then 0.
  std::vector<std::uint8_t> p = {0, 0, 0, 0x00, 0x10, 0x01, 0x01, 0x01, 0x01, 0x11, 0x11, 0x12, 0x02};
  EXPECT_EQ(ExpectClean(p).first, 1u);
}

TEST(GroupProgramTest, SeededProgramsKeepTheProtocolsPromises) {
  std::mt19937 rng(20261204);
  std::uint32_t committed = 0;
  std::uint64_t aborted = 0;
  for (int run = 0; run < 40; ++run) {
    std::vector<std::uint8_t> p(40 + rng() % 200);
    // Mostly begins, sends and commits; ends without a commit and reopens rarely.
    for (std::uint8_t& b : p) {
      b = static_cast<std::uint8_t>(rng());
      if ((b & 3) == 2 && rng() % 12 != 0) b &= 0x7f;
      if ((b & 3) == 3 && (b & 0xf0) == 0xf0 && rng() % 4 != 0) b &= 0xef;
    }
    SCOPED_TRACE("program " + std::to_string(run));
    const auto [c, a] = ExpectClean(p);
    committed += c;
    aborted += a;
  }
  // The programs reach both ends of the protocol, often.
  EXPECT_GE(committed, 20u);
  EXPECT_GE(aborted, 20u);
  std::printf("[ info     ] %u groups committed, %llu attempts aborted\n", committed,
              static_cast<unsigned long long>(aborted));
}

}  // namespace
}  // namespace primecache::store_test

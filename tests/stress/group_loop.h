// The crash loop's group path: one group of rank processes an iteration,
// a rank or the daemon SIGKILLed at each kill point of the group commit in
// turn (group_loop.cc).
#pragma once

#include <array>
#include <random>
#include <string>

#include "tests/stress/stress_util.h"
#include "tests/stress/workload.h"

namespace primecache::stress {

inline constexpr int kGroupKillPointCount = 9;
extern const char* const kGroupKillPoints[kGroupKillPointCount];

class GroupRounds {
 public:
  GroupRounds(testing::Daemon& d, Registry& reg, AckLog& log, WorkTally& tally, std::uint64_t seed);
  // Iteration `it`'s round; true when it killed the daemon (to restart).
  bool Run(int it);
  // "point=iterations ..." for the RESULT line.
  std::string PerPoint() const;

 private:
  struct Bystander;
  bool StreamBystander(int it, Bystander* b);
  bool CommitBystander(int it, Bystander* b);
  bool Drained(int it);
  bool Error(int it, const std::string& what);

  testing::Daemon& d_;
  Registry& reg_;
  AckLog& log_;
  WorkTally& t_;
  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::uint32_t next_seed_ = 1;
  int point_ = 0;
  std::array<std::uint64_t, kGroupKillPointCount> per_point_{};
};

}  // namespace primecache::stress

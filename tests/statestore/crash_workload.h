// The workload of the crash tests, shared by the child that runs it (and is
// killed) and the parent that checks what survived.
#pragma once

#include <string>
#include <vector>

#include "store_test_util.h"

namespace primecache::crash_test {

struct Step {
  // kGroupPublish: the entry of two TP ranks, rank 1's part committed
  // (and parked) first, then rank 0's, which writes the entry.
  enum Kind { kPublish, kDelete, kEvict, kCompact, kGroupPublish } kind = kPublish;
  std::vector<std::uint32_t> tokens;  // kPublish, kGroupPublish
  int target = -1;                    // kDelete: the step whose entry goes
};

inline const store_test::TestModel& Model() {
  static const store_test::TestModel m = [] {
    store_test::TestModel t;
    t.chunk_bytes = 1024;
    return t;
  }();
  return m;
}

// Boundaries of two conversations that share chunks, a delete of a boundary
// whose chunks a longer one keeps, a Compact that rewrites the segment its
// dead chunks are in (gc), a larger publish, what the serving path publishes
// for a request that branches off a stored conversation (the branch point,
// a shorter boundary sharing its chunks, then the request's own prompt end),
// an eviction, a group publish of two ranks, a last publish and a last
// Compact.
inline const std::vector<Step>& Workload() {
  static const std::vector<Step> steps = [] {
    using store_test::Conversation;
    using store_test::Prefix;
    auto a = Conversation(800, 501), b = Conversation(400, 502), c = Conversation(600, 503);
    std::vector<Step> s;
    s.push_back({Step::kPublish, Prefix(a, 200), -1});
    s.push_back({Step::kPublish, Prefix(b, 300), -1});
    s.push_back({Step::kPublish, Prefix(a, 450), -1});
    s.push_back({Step::kDelete, {}, 0});
    s.push_back({Step::kCompact, {}, -1});
    s.push_back({Step::kPublish, Prefix(a, 700), -1});
    s.push_back({Step::kPublish, Prefix(a, 320), -1});  // the branch point of d and a
    s.push_back({Step::kPublish, store_test::DivergeAt(a, 320, 520, 504), -1});
    s.push_back({Step::kPublish, Prefix(b, 260), -1});
    s.push_back({Step::kEvict, {}, -1});
    s.push_back({Step::kGroupPublish, Prefix(c, 350), -1});
    s.push_back({Step::kPublish, Prefix(c, 500), -1});
    s.push_back({Step::kCompact, {}, -1});
    return s;
  }();
  return steps;
}

inline constexpr std::uint32_t kGroupRanks = 2;

// The layers a step's entry holds.
inline std::vector<LayerBytes> LayersOf(const Step& step) {
  if (step.kind == Step::kGroupPublish) {
    return store_test::Concat(store_test::MakeGroupParts(step.tokens, kGroupRanks, Model()));
  }
  return store_test::MakeLayers(step.tokens, Model());
}

// Segments sealed past 1 MiB, the smallest allowed: the workload fills more than one.
inline constexpr std::uint64_t kSegmentBytes = 1u << 20;

}  // namespace primecache::crash_test

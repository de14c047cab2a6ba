// MissCache, the remote tier's negative cache: a miss is remembered for its
// ttl and no longer, at most `capacity` of them (the oldest forgotten
// first), and its key tells model, namespace and tokens apart.
#include <gtest/gtest.h>

#include <vector>

#include "remote/miss_cache.h"

namespace primecache::remote {
namespace {

using std::chrono::milliseconds;

Hash128 Key(std::uint32_t i) {
  const std::vector<std::uint32_t> tokens = {i, i + 1, i + 2};
  return MissCache::KeyOf(Hash128{1, 2}, "ns", tokens);
}

TEST(MissCache, RemembersAMissForItsTtlOnly) {
  MissCache c(milliseconds(100), 16);
  const auto t0 = MissCache::Clock::now();
  EXPECT_FALSE(c.Contains(Key(1), t0));
  c.Add(Key(1), t0);
  EXPECT_TRUE(c.Contains(Key(1), t0));
  EXPECT_TRUE(c.Contains(Key(1), t0 + milliseconds(99)));
  EXPECT_FALSE(c.Contains(Key(1), t0 + milliseconds(100)));
  EXPECT_FALSE(c.Contains(Key(2), t0));
  c.Add(Key(1), t0 + milliseconds(150));  // missed again: remembered from then
  EXPECT_TRUE(c.Contains(Key(1), t0 + milliseconds(200)));
}

TEST(MissCache, KeepsAtMostItsCapacityForgettingTheOldestFirst) {
  MissCache c(milliseconds(60000), 4);
  const auto t0 = MissCache::Clock::now();
  for (std::uint32_t i = 0; i < 1000; ++i) {
    c.Add(Key(i), t0);
    ASSERT_LE(c.size(), 4u);
  }
  for (std::uint32_t i = 996; i < 1000; ++i) EXPECT_TRUE(c.Contains(Key(i), t0)) << i;
  EXPECT_FALSE(c.Contains(Key(995), t0));
  EXPECT_FALSE(c.Contains(Key(0), t0));
  // A key added again is kept by its newer record, not dropped with its older one.
  MissCache d(milliseconds(60000), 3);
  d.Add(Key(1), t0);
  d.Add(Key(2), t0);
  d.Add(Key(1), t0 + milliseconds(1));
  d.Add(Key(3), t0 + milliseconds(2));  // pushes out Key(1)'s first record
  EXPECT_TRUE(d.Contains(Key(1), t0 + milliseconds(3)));
  EXPECT_LE(d.size(), 3u);
}

TEST(MissCache, AZeroTtlOrCapacityRemembersNothing) {
  const auto t0 = MissCache::Clock::now();
  MissCache off(milliseconds(0), 16), none(milliseconds(1000), 0);
  off.Add(Key(1), t0);
  none.Add(Key(1), t0);
  EXPECT_FALSE(off.Contains(Key(1), t0));
  EXPECT_FALSE(none.Contains(Key(1), t0));
  EXPECT_EQ(off.size() + none.size(), 0u);
}

TEST(MissCache, TheKeyTellsModelNamespaceAndTokensApart) {
  const std::vector<std::uint32_t> a = {1, 2, 3}, b = {1, 2, 4}, shorter = {1, 2};
  const Hash128 k = MissCache::KeyOf(Hash128{1, 2}, "ns", a);
  EXPECT_EQ(k, MissCache::KeyOf(Hash128{1, 2}, "ns", a));
  EXPECT_FALSE(k == MissCache::KeyOf(Hash128{1, 3}, "ns", a));
  EXPECT_FALSE(k == MissCache::KeyOf(Hash128{1, 2}, "other", a));
  EXPECT_FALSE(k == MissCache::KeyOf(Hash128{1, 2}, "ns", b));
  EXPECT_FALSE(k == MissCache::KeyOf(Hash128{1, 2}, "ns", shorter));
}

}  // namespace
}  // namespace primecache::remote

// The remote tier's receive pool: buffers of exactly the size asked, reused
// once given back, and never more than its bound kept.
#include "remote/receive_pool.h"

#include <gtest/gtest.h>

namespace primecache::remote {
namespace {

TEST(ReceivePool, GivesBackBuffersOfExactlyTheSizeAskedAndReusesThem) {
  ReceivePool pool(1 << 20);
  std::string a = pool.Take(4096);
  EXPECT_EQ(a.size(), 4096u);
  const char* where = a.data();
  pool.Give(std::move(a));
  EXPECT_GE(pool.stats().kept_bytes, 4096u);
  std::string b = pool.Take(4000);  // within half of its capacity: reused
  EXPECT_EQ(b.size(), 4000u);
  EXPECT_EQ(b.data(), where);
  EXPECT_EQ(pool.stats().reused, 1u);
  EXPECT_EQ(pool.stats().kept_bytes, 0u);
  pool.Give(std::move(b));
  std::string small = pool.Take(100);  // would waste most of it: a new one
  EXPECT_EQ(small.size(), 100u);
  EXPECT_NE(small.data(), where);
  std::string big = pool.Take(8192);  // larger than any kept
  EXPECT_EQ(big.size(), 8192u);
  EXPECT_EQ(pool.stats().allocated, 3u);
}

TEST(ReceivePool, KeepsNoMoreThanItsBoundAndMakesRoomForANewSize) {
  ReceivePool pool(3 * 4096);
  std::vector<std::string> taken;
  for (int i = 0; i < 5; ++i) taken.push_back(pool.Take(4096));
  for (auto& t : taken) pool.Give(std::move(t));
  EXPECT_LE(pool.stats().kept_bytes, 3u * 4096 + 3 * 64) << "capacity may round up a little";
  EXPECT_GE(pool.stats().kept_bytes, 2u * 4096);
  // Fetches of another chunk size: the old buffers make room.
  std::string other = pool.Take(8000);
  pool.Give(std::move(other));
  std::string again = pool.Take(8000);
  EXPECT_EQ(pool.stats().reused, 1u);
  EXPECT_LE(pool.stats().kept_bytes, 3u * 4096 + 3 * 64);
  ReceivePool none(0);
  none.Give(std::string(100, 'x'));
  EXPECT_EQ(none.stats().kept_bytes, 0u);
  std::vector<LayerBytes> layers(2);
  layers[0].chunks = {std::string(10, 'a'), std::string(20, 'b')};
  layers[1].chunks = {std::string(30, 'c')};
  ReceivePool some(1 << 20);
  some.Give(layers);
  EXPECT_TRUE(layers[0].chunks.empty() && layers[1].chunks.empty());
  EXPECT_GE(some.stats().kept_bytes, 60u);
}

}  // namespace
}  // namespace primecache::remote

// WindowRing: the ring a fetch streams through a window (shared or device):
// space comes back only once a chunk and every chunk placed before it were
// released, releases may name chunks in any order, each once, and a place
// waits for room only when no placed chunk is still unsent.
#include <gtest/gtest.h>

#include <thread>

#include "ipc/fetch_sender.h"

namespace primecache::ipc {
namespace {

const std::function<bool()> kGoOn = [] { return false; };

// Until `ring` has begun `n` waits (at most 10 s): a waiter is known waiting.
bool WaitsReach(const WindowRing& ring, std::uint64_t n) {
  for (int i = 0; i < 10000 && ring.waits() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return ring.waits() >= n;
}

TEST(WindowRingTest, SpaceComesBackInPlacingOrderWhateverTheReleaseOrder) {
  WindowRing ring;
  ring.Open(1000, 300);
  auto a = ring.Place(100, false, kGoOn);
  auto b = ring.Place(100, false, kGoOn);
  auto c = ring.Place(100, false, kGoOn);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(a->has_value() && b->has_value() && c->has_value());
  EXPECT_EQ(**a, 0u);
  EXPECT_EQ(**b, 100u);
  EXPECT_EQ(**c, 200u);
  EXPECT_FALSE(ring.Release(0, 100)) << "not sent yet";
  ring.Sent(**b);  // b was placed after a but sent first
  ring.Sent(**a);
  ring.Sent(**c);
  EXPECT_TRUE(ring.Release(100, 100));
  EXPECT_FALSE(ring.Release(100, 100)) << "released twice";
  auto full = ring.Place(100, false, kGoOn);
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->has_value()) << "b's space returns only after a's";
  EXPECT_FALSE(ring.Release(0, 99)) << "a length that no chunk has";
  EXPECT_TRUE(ring.Release(0, 100));
  auto again = ring.Place(150, false, kGoOn);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ(**again, 0u) << "a and b's 200 bytes at the front";
}

TEST(WindowRingTest, WaitsOnlyWhenEveryPlacedChunkWasSent) {
  WindowRing ring;
  ring.Open(0, 200);
  auto a = ring.Place(150, false, kGoOn);
  ASSERT_TRUE(a.ok() && a->has_value());
  // a is placed but unsent: the room a wait needs could come only after a
  // chunk sent later, so no wait.
  auto b = ring.Place(100, true, kGoOn);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->has_value());
  ring.Sent(**a);
  EXPECT_EQ(ring.waits(), 0u) << "no room was waited for yet";
  std::thread releaser([&] {
    EXPECT_TRUE(WaitsReach(ring, 1)) << "the place never waited";
    EXPECT_TRUE(ring.Release(**a, 150));
  });
  auto c = ring.Place(100, true, kGoOn);  // waits for the release
  releaser.join();
  EXPECT_EQ(ring.waits(), 1u) << "the place got its room by waiting, once";
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ(**c, 0u) << "an empty ring starts over at its front";
}

TEST(WindowRingTest, DroppedPlaceGivesItsSpaceBackAndStopEndsAWait) {
  WindowRing ring;
  ring.Open(0, 100);
  auto a = ring.Place(100, false, kGoOn);
  ASSERT_TRUE(a.ok() && a->has_value());
  ring.Drop(**a);
  auto b = ring.Place(100, false, kGoOn);
  ASSERT_TRUE(b.ok() && b->has_value());
  ring.Sent(**b);
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    EXPECT_TRUE(WaitsReach(ring, 1)) << "the place never waited";
    stop = true;
    ring.Wake();
  });
  auto c = ring.Place(10, true, [&] { return stop.load(); });
  stopper.join();
  EXPECT_EQ(c.status().code(), StatusCode::kAborted);
  EXPECT_EQ(ring.waits(), 1u) << "the stop ended a wait";
}

// Placements joined into one (an extent) are sent and released as one; a
// placement that skipped the ring's tail, or one already sent, joins none.
TEST(WindowRingTest, JoinedPlacementsAreOneExtent) {
  WindowRing ring;
  ring.Open(0, 300);
  auto a = ring.Place(100, false, kGoOn);
  auto b = ring.Place(80, false, kGoOn);
  auto c = ring.Place(60, false, kGoOn);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && a->has_value() && b->has_value() && c->has_value());
  EXPECT_FALSE(ring.Join(**b, **a)) << "a does not follow b";
  EXPECT_TRUE(ring.Join(**a, **b));
  EXPECT_TRUE(ring.Join(**a, **c));
  ring.Sent(**a);
  EXPECT_FALSE(ring.Release(**a, 100)) << "the extent is released whole or not at all";
  EXPECT_FALSE(ring.Release(**b, 80)) << "b is no placement of its own any more";
  // 60 bytes left at the end: a placement of 100 skips them to the front.
  auto d = ring.Place(100, false, kGoOn);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->has_value()) << "the extent still holds its 240 bytes";
  EXPECT_TRUE(ring.Release(**a, 240));
  auto e = ring.Place(100, false, kGoOn);  // the ring is empty: at its front
  auto f = ring.Place(150, false, kGoOn);  // then 100 .. 250
  ASSERT_TRUE(e.ok() && f.ok() && e->has_value() && f->has_value());
  ring.Sent(**e);
  EXPECT_FALSE(ring.Join(**e, **f)) << "e was sent";
  ASSERT_TRUE(ring.Release(**e, 100));
  auto g = ring.Place(60, false, kGoOn);  // 50 bytes left at the end: skips them
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ(**g, 0u);
  EXPECT_FALSE(ring.Join(**f, **g)) << "g skipped the tail: it does not continue f";
}

}  // namespace
}  // namespace primecache::ipc

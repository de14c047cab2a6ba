// The fetch pool's places: a job waiting for its client (ClientWait) gives
// its place to the next job, takes it back when one is free, and a pool
// whose parked jobs are at their bound keeps the place of a wait; its
// figures, as the server's counters hold them for the metrics.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/mutex.h"
#include "ipc/server_fetch_pool.h"

namespace primecache::ipc {
namespace {

// A gate a job waits at until the test opens it.
class Gate {
 public:
  void Open() {
    MutexLock l(&mu_);
    open_ = true;
    cv_.SignalAll();
  }
  void Wait() {
    MutexLock l(&mu_);
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return open_; });
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool open_ GUARDED_BY(mu_) = false;
};

// Polls `pred` for up to 10 s.
template <class Pred>
bool Eventually(Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(FetchPool, AJobWaitingForItsClientLetsTheNextOneRun) {
  FetchPool pool(1, 4);
  Gate client;
  std::atomic<bool> a_done{false}, b_done{false};
  pool.Post([&] {
    ClientWait waiting;
    client.Wait();
    (void)waiting;
    FetchPool::Settle();
    a_done = true;
  });
  ASSERT_TRUE(Eventually([&] { return pool.figures().parked == 1; }));
  pool.Post([&] { b_done = true; });
  EXPECT_TRUE(Eventually([&] { return b_done.load(); })) << "the second job waited for the parked one";
  EXPECT_FALSE(a_done.load());
  client.Open();
  EXPECT_TRUE(Eventually([&] { return a_done.load(); }));
  pool.Shutdown();
  const auto f = pool.figures();
  EXPECT_EQ(f.parks, 1u);
  EXPECT_EQ(f.threads, 0u);
  EXPECT_EQ(f.running + f.parked + f.queued, 0u);
}

// Jobs posted at once, as many as the places, all run at once: none waits
// for a thread another job took (a burst of fetches from many engines).
TEST(FetchPool, JobsPostedAtOnceRunAtOnceUpToThePlaces) {
  FetchPool pool(3, 4);
  Gate gate;
  std::atomic<int> started{0};
  for (int i = 0; i < 4; ++i) {
    pool.Post([&] {
      ++started;
      gate.Wait();
    });
  }
  EXPECT_TRUE(Eventually([&] { return started.load() == 3; })) << started.load() << " of 3 places in use";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(started.load(), 3) << "more jobs than places ran";
  EXPECT_EQ(pool.figures().queued, 1u);
  gate.Open();
  EXPECT_TRUE(Eventually([&] { return started.load() == 4; }));
  pool.Shutdown();
}

TEST(FetchPool, AJobBackFromItsClientWaitsForAFreePlace) {
  FetchPool pool(1, 4);
  Gate client, b_gate;
  std::atomic<bool> a_settled{false};
  pool.Post([&] {
    {
      ClientWait waiting;
      client.Wait();
    }
    FetchPool::Settle();
    a_settled = true;
  });
  ASSERT_TRUE(Eventually([&] { return pool.figures().parked == 1; }));
  pool.Post([&] { b_gate.Wait(); });
  ASSERT_TRUE(Eventually([&] { return pool.figures().running == 1; }));
  client.Open();  // its place is taken: it stays parked at Settle
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(a_settled.load());
  EXPECT_EQ(pool.figures().parked, 1u);
  b_gate.Open();
  EXPECT_TRUE(Eventually([&] { return a_settled.load(); }));
  pool.Shutdown();
}

TEST(FetchPool, PastItsParkedBoundAWaitKeepsItsPlace) {
  FetchPool pool(1, 0);
  Gate client;
  std::atomic<bool> b_done{false};
  pool.Post([&] {
    ClientWait waiting;
    client.Wait();
  });
  ASSERT_TRUE(Eventually([&] { return pool.figures().running == 1; }));
  pool.Post([&] { b_done = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(b_done.load());
  EXPECT_EQ(pool.figures().queued, 1u);
  EXPECT_EQ(pool.figures().threads, 1u);
  client.Open();
  EXPECT_TRUE(Eventually([&] { return b_done.load(); }));
  pool.Shutdown();
  EXPECT_EQ(pool.figures().parks, 0u);
  EXPECT_EQ(pool.figures().parks_refused, 1u);
}

// The pool stores its figures into the server's counters (the metrics read
// them there) at every change: each state of two jobs, one parked and one
// whose wait is refused a park, with a third queued behind them.
TEST(FetchPool, ItsFiguresAreTheServerCounters) {
  ServerCounters c;
  FetchPool pool(1, 1, &c);
  Gate a_client, b_client;
  std::atomic<bool> c_done{false};
  auto counted = [&] {
    const auto f = pool.figures();
    return f.running == c.fetch_pool_running.load() && f.parked == c.fetch_pool_parked.load() &&
           f.queued == c.fetch_pool_queued.load() && f.threads == c.fetch_pool_threads.load() &&
           f.parks == c.fetch_pool_parks.load() && f.parks_refused == c.fetch_pool_parks_refused.load();
  };
  auto waiting_job = [](Gate& g) {
    return [&g] {
      {
        ClientWait waiting;
        g.Wait();
      }
      FetchPool::Settle();
    };
  };
  pool.Post(waiting_job(a_client));
  ASSERT_TRUE(Eventually([&] { return c.fetch_pool_parked.load() == 1 && c.fetch_pool_running.load() == 0; }));
  EXPECT_EQ(c.fetch_pool_parks.load(), 1u);
  EXPECT_TRUE(counted());
  pool.Post(waiting_job(b_client));  // its wait finds one parked: it keeps its place
  ASSERT_TRUE(Eventually([&] { return c.fetch_pool_parks_refused.load() == 1; }));
  EXPECT_EQ(c.fetch_pool_running.load(), 1u);
  EXPECT_EQ(c.fetch_pool_parked.load(), 1u);
  pool.Post([&] { c_done = true; });
  ASSERT_TRUE(Eventually([&] { return c.fetch_pool_queued.load() == 1; }));
  EXPECT_EQ(c.fetch_pool_threads.load(), 2u);
  EXPECT_TRUE(counted());
  b_client.Open();
  a_client.Open();
  ASSERT_TRUE(Eventually([&] { return c_done.load(); }));
  ASSERT_TRUE(Eventually([&] { return c.fetch_pool_running.load() + c.fetch_pool_parked.load() == 0; }));
  EXPECT_EQ(c.fetch_pool_queued.load(), 0u);
  EXPECT_EQ(c.fetch_pool_parks.load(), 1u);
  EXPECT_EQ(c.fetch_pool_parks_refused.load(), 1u);
  pool.Shutdown();
  EXPECT_EQ(c.fetch_pool_threads.load(), 0u);
  EXPECT_TRUE(counted());
}

}  // namespace
}  // namespace primecache::ipc

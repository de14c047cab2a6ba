// Many restores at once: fetches whose clients stall (never release their
// window's chunks, or stop reading the socket) must not hold up the fetches
// of other clients, even when there are more of them than the daemon has
// fetch workers; and once the stalled ones are released or gone, the daemon
// serves as before (docs/protocol.md, "Fetch budget"); the daemon's metrics
// of its fetch pool (docs/metrics.md) count the fetches parked, holding a
// place and queued all along.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "ipc/shm.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/ipc/http_scrape.h"

namespace primecache::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kFetchWorkers = 2;
// Far below the daemon's 60 s stall timeout: a fetch that waited on a
// stalled one would be seen.
constexpr auto kDeadline = std::chrono::seconds(30);

// A raw connection that attaches a shared region and starts fetches whose
// windows it never releases (until Release), reading what arrives.
class WindowHog {
 public:
  explicit WindowHog(const std::string& socket) : conn_(socket) {}

  bool Attach(std::size_t bytes) {
    auto r = ipc::ShmRegion::Create(bytes, "fanin-test");
    if (!r.ok() || !conn_.Hello()) return false;
    region_ = std::move(r).value();
    auto m = ipc::BuildRequest(2, [&](wire::Request::Builder b) { b.initShmAttach().setSize(bytes); });
    auto flat = ipc::Flatten(*m);
    if (!ipc::SendWithFd(conn_.fd(), flat, region_->fd()).ok()) return false;
    auto reply = NextReply(conn_);
    return reply && reply->which == wire::Response::ACK;
  }
  // Fetch `id` of `entry` through `window` bytes at `offset` of the region.
  bool Fetch(std::uint64_t id, std::uint64_t entry, std::uint64_t offset, std::uint64_t window) {
    auto m = ipc::BuildRequest(id, [&](wire::Request::Builder b) {
      auto f = b.initFetch();
      f.setEntry(entry);
      f.initShmWindow().setOffset(offset);
      f.getShmWindow().setLength(window);
    });
    return conn_.Send(*m);
  }
  // Reads for `for_ms`, keeping every chunk sent in the window (held).
  void Drain(int for_ms) { Read(for_ms, false, 0); }
  // Releases what it holds and what arrives, until `fetches` fetchDone
  // answers came (true) or an error or a silence of 10 s.
  bool ReleaseUntilDone(int fetches) {
    for (auto [off, len] : held_) Release(off, len);
    held_.clear();
    return Read(10000, true, fetches);
  }
  int done() const { return done_; }

 private:
  void Release(std::uint64_t off, std::uint64_t len) {
    auto m = ipc::BuildRequest(0, [&](wire::Request::Builder b) {
      b.initShmRelease().setOffset(off);
      b.getShmRelease().setLength(len);
    });
    conn_.Send(*m);
  }
  // Until `until` fetches are done (0: a silence of `timeout_ms`).
  bool Read(int timeout_ms, bool release, int until) {
    while (until == 0 || done_ < until) {
      auto f = conn_.Next(timeout_ms);
      if (!f) return until == 0;
      auto rd = f->Reader({});
      auto r = rd->getRoot<wire::Response>();
      if (r.which() == wire::Response::ERROR) {
        ADD_FAILURE() << "fetch " << r.getId() << ": " << r.getError().getMessage().cStr();
        return false;
      }
      if (r.which() == wire::Response::FETCH_DONE) ++done_;
      if (r.which() == wire::Response::FETCH_CHUNK && r.getFetchChunk().getData().isShm()) {
        auto s = r.getFetchChunk().getData().getShm();
        if (release) {
          Release(s.getOffset(), s.getLength());
        } else {
          held_.emplace_back(s.getOffset(), s.getLength());
        }
      }
    }
    return true;
  }

  RawConn conn_;
  std::unique_ptr<ipc::ShmRegion> region_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> held_;
  int done_ = 0;
};

// The fetch pool's figures as the daemon's metrics show them.
struct PoolMetrics {
  double running = -1, parked = -1, queued = -1, parks = -1, parks_refused = -1;
  std::string text;  // the scrape, for a failure's message
};

class FaninTest : public ::testing::Test {
 protected:
  void SetUp() override { StartDaemon({}); }
  // A daemon of kFetchWorkers fetch workers serving metrics, with `extra` flags.
  void StartDaemon(std::vector<std::string> extra) {
    metrics_port_ = FreeLoopbackPort();
    ASSERT_NE(metrics_port_, 0);
    std::vector<std::string> flags = {"--fetch-workers", std::to_string(kFetchWorkers), "--metrics-listen",
                                      "127.0.0.1:" + std::to_string(metrics_port_)};
    flags.insert(flags.end(), extra.begin(), extra.end());
    publisher_.reset();
    d_ = std::make_unique<Daemon>(flags);
    ASSERT_TRUE(d_->Start());
    auto c = Client::Connect(d_->Options());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    publisher_ = std::move(c).value();
  }
  PoolMetrics Pool() const {
    PoolMetrics m;
    m.text = HttpRequest(metrics_port_, "GET /metrics HTTP/1.0\r\n\r\n");
    auto value = [&](const char* name) { return SampleValue(m.text, name).value_or(-1); };
    m.running = value("primecache_fetch_pool_running");
    m.parked = value("primecache_fetch_pool_parked");
    m.queued = value("primecache_fetch_pool_queued");
    m.parks = value("primecache_fetch_parks_total");
    m.parks_refused = value("primecache_fetch_parks_refused_total");
    return m;
  }
  // Scrapes until `pred` holds of the pool's metrics (true), or 10 s pass.
  template <class Pred>
  bool PoolBecomes(Pred pred, PoolMetrics* last) const {
    const auto end = Clock::now() + std::chrono::seconds(10);
    for (;;) {
      *last = Pool();
      if (pred(*last)) return true;
      if (Clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::uint64_t Publish(std::uint64_t len, std::uint32_t seed, std::vector<LayerData>* layers) {
    *layers = MakeLayers(len, 4, seed, 1024, 64);  // latent chunks of 256 KiB
    auto p = publisher_->Publish(TestModel(), Tokens(len, seed), *layers);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? p->id : 0;
  }

  std::unique_ptr<Daemon> d_;
  std::unique_ptr<Client> publisher_;
  std::uint16_t metrics_port_ = 0;
};

// A fetch of `entry` on a connection of its own, through shared memory:
// its status, and whether its bytes are `want`'s.
Status FetchAndCompare(const Daemon& d, std::uint64_t entry, const std::vector<LayerData>& want) {
  ClientOptions o = d.Options("", true);
  o.shared_memory_bytes = 8u << 20;
  PC_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
  PC_ASSIGN_OR_RETURN(auto got, c->FetchLayers(entry));
  if (got.size() != want.size()) return Status::Internal("wrong layer count");
  for (std::size_t l = 0; l < want.size(); ++l) {
    if (got[l].data.chunks != want[l].chunks) return Status::Internal("layer " + std::to_string(l) + " differs");
  }
  return Status::Ok();
}

TEST_F(FaninTest, StalledFetchersDoNotStallTheOthers) {
  std::vector<LayerData> big, small[4];
  const std::uint64_t big_id = Publish(3072, 1, &big);  // 24 MiB: more than a socket and write queue hold
  std::uint64_t small_id[4];
  for (std::uint32_t i = 0; i < 4; ++i) small_id[i] = Publish(512, 10 + i, &small[i]);
  ASSERT_FALSE(HasFailure());

  // Stalled: 3 fetches that get two chunks of window each and never release
  // them, and 3 on a connection that never reads: 6, three times the workers.
  WindowHog hog(d_->socket());
  ASSERT_TRUE(hog.Attach(8u << 20));
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(hog.Fetch(100 + i, big_id, i * (1u << 20), 512u << 10));
  RawConn deaf(d_->socket());
  ASSERT_TRUE(deaf.Hello());
  for (std::uint64_t i = 0; i < 3; ++i) {
    auto m = ipc::BuildRequest(200 + i, [&](wire::Request::Builder b) { b.initFetch().setEntry(big_id); });
    ASSERT_TRUE(deaf.Send(*m));
  }
  hog.Drain(500);  // every stalled fetch has begun and filled what it may
  // Each waits for its client parked, its place given back (none refused:
  // the daemon's default bound is far above 6).
  PoolMetrics m;
  EXPECT_TRUE(PoolBecomes([](const PoolMetrics& p) { return p.parked == 6 && p.running == 0; }, &m)) << m.text;
  EXPECT_GE(m.parks, 6) << m.text;
  EXPECT_EQ(m.queued, 0) << m.text;
  EXPECT_EQ(m.parks_refused, 0) << m.text;

  // The others, each on its own connection, at once.
  const auto t0 = Clock::now();
  Status results[4];
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] { results[i] = FetchAndCompare(*d_, small_id[i], small[i]); });
    }
    for (auto& t : threads) t.join();
  }
  const auto took = Clock::now() - t0;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(results[i].ok()) << "fetcher " << i << ": " << results[i].ToString();
  EXPECT_LT(took, kDeadline) << "the fetches waited on the stalled ones";

  hog.Drain(200);
  EXPECT_EQ(hog.done(), 0) << "the window's fetches were not stalled";

  // Released, the window's fetches finish; the deaf connection's go with it.
  EXPECT_TRUE(hog.ReleaseUntilDone(3)) << hog.done() << " of 3 stalled fetches finished once released";
  deaf.Close();
  EXPECT_TRUE(FetchAndCompare(*d_, big_id, big).ok());
  auto stat = publisher_->Stat();
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  // Every fetch is over: none holds a place or is parked.
  EXPECT_TRUE(PoolBecomes([](const PoolMetrics& p) { return p.parked == 0 && p.running == 0 && p.queued == 0; }, &m))
      << m.text;
  EXPECT_EQ(m.parks_refused, 0) << m.text;
}

// Past --max-parked-fetches a wait keeps its place: with one parked, the
// next two stalled fetches each hold one of the two places and a fourth
// waits unstarted; the metrics count each, and once released all are done.
TEST_F(FaninTest, PastTheParkedBoundStalledFetchesKeepTheirPlaces) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--max-parked-fetches", "1"}));
  std::vector<LayerData> big;
  const std::uint64_t big_id = Publish(3072, 2, &big);
  ASSERT_FALSE(HasFailure());
  WindowHog hog(d_->socket());
  ASSERT_TRUE(hog.Attach(8u << 20));
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(hog.Fetch(100 + i, big_id, i * (1u << 20), 512u << 10));
  hog.Drain(500);
  PoolMetrics m;
  EXPECT_TRUE(PoolBecomes([](const PoolMetrics& p) { return p.parked == 1 && p.running == 2; }, &m)) << m.text;
  EXPECT_GE(m.parks, 1) << m.text;
  EXPECT_GE(m.parks_refused, 2) << m.text;
  EXPECT_EQ(m.queued, 0) << m.text;
  ASSERT_TRUE(hog.Fetch(103, big_id, 3u << 20, 512u << 10));
  EXPECT_TRUE(PoolBecomes([](const PoolMetrics& p) { return p.queued == 1; }, &m)) << m.text;
  EXPECT_EQ(m.running, 2) << m.text;
  EXPECT_EQ(m.parked, 1) << m.text;
  EXPECT_TRUE(hog.ReleaseUntilDone(4)) << hog.done() << " of 4 stalled fetches finished once released";
  EXPECT_TRUE(PoolBecomes([](const PoolMetrics& p) { return p.parked == 0 && p.running == 0 && p.queued == 0; }, &m))
      << m.text;
}

}  // namespace
}  // namespace primecache::testing

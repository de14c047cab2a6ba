// The daemon's connection limits and deadlines, and its bounds on the bytes
// of publishes that never commit, against the real primecached with small
// configured limits.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Opens publish `pub` of one layer of `chunks` chunks and sends `sent` of
// them, `bytes` each; every request acked.
void OpenPublish(RawConn& c, std::uint64_t pub, std::uint32_t chunks, std::uint32_t sent, std::size_t bytes,
                 std::uint32_t seed) {
  ASSERT_TRUE(SendBegin(c, pub, 1, seed));
  ASSERT_TRUE(SendLayer(c, pub + 1, pub, 0, chunks));
  for (std::uint32_t i = 0; i < sent; ++i) ASSERT_TRUE(SendChunk(c, pub + 2 + i, pub, 0, i, bytes));
  for (std::uint32_t i = 0; i < sent + 2; ++i) {
    auto r = NextReply(c);
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->which, wire::Response::ACK) << r->message;
  }
}

// Sends chunks of distinct bytes (no two deduplicate) to open publish `pub`,
// each answered before the next, until one is refused; that refusal.
std::optional<Reply> ChunksUntilRefused(RawConn& c, std::uint64_t pub, std::uint32_t chunks, std::size_t bytes) {
  for (std::uint32_t i = 0; i < chunks; ++i) {
    const bool sent = c.Send(*ipc::BuildRequest(pub + 2 + i, [&](wire::Request::Builder q) {
      auto ch = q.initPublishChunk();
      ch.setPublish(pub);
      ch.setLayer(0);
      ch.setIndex(i);
      auto d = ch.initData().initInline(static_cast<unsigned>(bytes));
      std::memcpy(d.begin(), &i, sizeof i);
    }, bytes / 8 + 64));
    if (!sent) return std::nullopt;
    auto r = NextReply(c);
    if (!r.has_value() || r->which != wire::Response::ACK) return r;
  }
  return std::nullopt;
}

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ---- connections -----------------------------------------------------------------

TEST(ConnectionLimits, SilentConnectionsAtTheLimitLeaveTheAdminSocketServed) {
  Daemon d({"--max-connections", "8", "--hello-timeout", "0", "--max-admin-connections", "2"});
  ASSERT_TRUE(d.Start());
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int i = 0; i < 8; ++i) {
    silent.push_back(std::make_unique<RawConn>(d.socket()));
    ASSERT_TRUE(silent.back()->ok());
  }
  // One more data connection is told why and closed.
  RawConn extra(d.socket());
  ASSERT_TRUE(extra.ok());
  auto why = NextReply(extra);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->id, 0u);
  EXPECT_EQ(why->code, wire::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(why->message.find("--max-connections"), std::string::npos) << why->message;
  EXPECT_TRUE(extra.ClosedByPeer());
  auto refused = Client::Connect(d.Options());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--max-connections"), std::string::npos) << refused.status().ToString();

  // The operator still gets in, at once: admin connections are counted apart.
  const auto t0 = Clock::now();
  auto admin = Admin(d);
  ASSERT_NE(admin, nullptr);
  auto st = admin->Stat();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_LT(SecondsSince(t0), 3.0);
  EXPECT_EQ(st->connections, 9u);  // the 8 silent ones and the admin
}

TEST(ConnectionLimits, SilentConnectionsWithoutHelloAreClosedAtTheHelloDeadline) {
  Daemon d({"--max-connections", "8", "--hello-timeout", "1"});
  ASSERT_TRUE(d.Start());
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int i = 0; i < 8; ++i) {
    silent.push_back(std::make_unique<RawConn>(d.socket()));
    ASSERT_TRUE(silent.back()->ok());
  }
  // A data client keeps trying; it is served once the deadline frees slots.
  const auto t0 = Clock::now();
  ClientOptions o = d.Options();
  o.reconnect_attempts = 40;
  o.reconnect_backoff = std::chrono::milliseconds(100);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto hit = (*c)->Lookup(TestModel(), Tokens(10, 1));
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_LT(SecondsSince(t0), 4.0);
  for (auto& s : silent) {
    auto why = NextReply(*s, 5000);
    ASSERT_TRUE(why.has_value());
    EXPECT_EQ(why->code, wire::ErrorCode::DEADLINE_EXCEEDED);
    EXPECT_NE(why->message.find("--hello-timeout"), std::string::npos) << why->message;
    EXPECT_TRUE(s->ClosedByPeer(5000));
  }
}

// A child process of another uid connects and says hello: 0 when served.
// (The test process runs no other thread here, so the child may allocate.)
int HelloAsOtherUid(const std::string& socket, uid_t uid) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgid(uid) != 0 || setuid(uid) != 0) _exit(10);
    RawConn c(socket);
    _exit(c.ok() && c.Hello() ? 0 : 11);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(ConnectionLimits, OneUidAtItsLimitDoesNotLockOutAnother) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as a second uid";
  Daemon d({"--max-connections", "8", "--max-connections-per-uid", "4", "--hello-timeout", "0"});
  ASSERT_TRUE(d.Start());
  // Let uid 65534 reach the data socket (the test's directory is private).
  ASSERT_EQ(chmod(d.dir().c_str(), 0711), 0);
  ASSERT_EQ(chmod(d.socket().c_str(), 0666), 0);
  std::vector<std::unique_ptr<RawConn>> silent;
  for (int i = 0; i < 4; ++i) {
    silent.push_back(std::make_unique<RawConn>(d.socket()));
    ASSERT_TRUE(silent.back()->ok());
  }
  RawConn fifth(d.socket());
  auto why = NextReply(fifth);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->code, wire::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(why->message.find("--max-connections-per-uid"), std::string::npos) << why->message;
  EXPECT_EQ(HelloAsOtherUid(d.socket(), 65534), 0);
}

TEST(ConnectionLimits, IdleConnectionsCloseButNotWhileAPublishIsOpen) {
  Daemon d({"--idle-timeout", "1", "--publish-timeout", "0"});
  ASSERT_TRUE(d.Start());
  RawConn idle(d.socket());
  ASSERT_TRUE(idle.Hello());
  RawConn publishing(d.socket());
  ASSERT_TRUE(publishing.Hello());
  OpenPublish(publishing, 10, 4, 1, 1000, 1);
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok());

  auto why = NextReply(idle, 5000);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->code, wire::ErrorCode::DEADLINE_EXCEEDED);
  EXPECT_NE(why->message.find("--idle-timeout"), std::string::npos) << why->message;
  EXPECT_TRUE(idle.ClosedByPeer(5000));
  // Silent as long, but its publish is open: still served.
  EXPECT_FALSE(publishing.ClosedByPeer(500));
  ASSERT_TRUE(SendChunk(publishing, 20, 10, 0, 1, 1000));
  auto ack = NextReply(publishing);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->which, wire::Response::ACK) << ack->message;
  // The library's client was closed too, and reconnects on its next call.
  auto hit = (*c)->Lookup(TestModel(), Tokens(10, 1));
  EXPECT_TRUE(hit.ok()) << hit.status().ToString();
}

TEST(ConnectionLimits, TheConfigFileSetsThem) {
  const std::string dir = MakeTempDir();
  const std::string cfg = dir + "/cfg.json";
  {
    std::ofstream out(cfg);
    out << R"({"max_connections": 2, "hello_timeout": 0, "max_uncommitted_total": "1M"})";
  }
  Daemon d({"--config", cfg});
  ASSERT_TRUE(d.Start());
  RawConn a(d.socket()), b(d.socket()), c(d.socket());
  auto why = NextReply(c);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->message.find("connection limit (2, --max-connections)"), std::string::npos) << why->message;
  a.Close();
  b.Close();
  auto client = Client::Connect(d.Options());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto big = (*client)->Publish(TestModel(), Tokens(8192, 1), MakeLayers(8192, 1, 1));  // 2 MiB
  EXPECT_NE(big.status().message().find("limit of 1048576 bytes (--max-uncommitted-total)"), std::string::npos)
      << big.status().ToString();
  std::filesystem::remove_all(dir);
}

// ---- publishes that never commit --------------------------------------------------

TEST(UncommittedBytes, BoundedPerConnection) {
  Daemon d({"--max-uncommitted-per-connection", "64K"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok());
  // 256 tokens x 64 floats = 64 KiB of chunks, plus the header: over 64K.
  auto pub = (*c)->Publish(TestModel(), Tokens(256, 1), MakeLayers(256, 1, 1));
  ASSERT_FALSE(pub.ok());
  EXPECT_EQ(pub.status().code(), StatusCode::kResourceExhausted) << pub.status().ToString();
  EXPECT_NE(pub.status().message().find("--max-uncommitted-per-connection"), std::string::npos)
      << pub.status().ToString();
  auto admin = Admin(d);
  ASSERT_NE(admin, nullptr);
  EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 0 && s.publishes_in_flight == 0; }));
  // Smaller entries still go through on the same connection.
  auto small = (*c)->Publish(TestModel(), Tokens(64, 2), MakeLayers(64, 1, 2));
  EXPECT_TRUE(small.ok()) << small.status().ToString();
}

TEST(UncommittedBytes, BoundedInTotalAndReleasedWhenAConnectionCloses) {
  Daemon d({"--max-uncommitted-per-connection", "64K", "--max-uncommitted-total", "96K"});
  ASSERT_TRUE(d.Start());
  auto admin = Admin(d);
  ASSERT_NE(admin, nullptr);
  auto first = std::make_unique<RawConn>(d.socket());
  ASSERT_TRUE(first->Hello());
  OpenPublish(*first, 10, 8, 6, 10000, 1);  // 60,000 bytes held
  EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 60000; }));

  RawConn second(d.socket());
  ASSERT_TRUE(second.Hello());
  OpenPublish(second, 10, 8, 3, 10000, 2);  // 90,000 in all
  ASSERT_TRUE(SendChunk(second, 30, 10, 0, 3, 10000));
  auto refused = NextReply(second);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, wire::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused->message.find("--max-uncommitted-total"), std::string::npos) << refused->message;
  // The refused publish was aborted: its 30,000 bytes are back.
  EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 60000; }));

  // The first client goes away mid-publish: its bytes are released promptly.
  first.reset();
  EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 0; }));
  OpenPublish(second, 40, 8, 6, 10000, 3);
  EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 60000; }));
}

TEST(UncommittedBytes, APublishIdlePastItsDeadlineIsAbortedAndReleased) {
  Daemon d({"--publish-timeout", "1"});
  ASSERT_TRUE(d.Start());
  auto admin = Admin(d);
  ASSERT_NE(admin, nullptr);
  RawConn r(d.socket());
  ASSERT_TRUE(r.Hello());
  OpenPublish(r, 10, 4, 2, 5000, 1);
  auto st = admin->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->uncommitted_bytes, 10000u);
  EXPECT_EQ(st->publishes_in_flight, 1u);

  const auto t0 = Clock::now();
  auto notice = NextReply(r, 5000);
  ASSERT_TRUE(notice.has_value());
  EXPECT_LT(SecondsSince(t0), 3.0);
  EXPECT_EQ(notice->id, 0u);
  EXPECT_EQ(notice->code, wire::ErrorCode::DEADLINE_EXCEEDED);
  EXPECT_NE(notice->message.find("--publish-timeout"), std::string::npos) << notice->message;
  EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 0 && s.publishes_in_flight == 0; }));
  // A late chunk learns why the publish is gone; the connection stays.
  ASSERT_TRUE(SendChunk(r, 30, 10, 0, 2, 5000));
  auto late = NextReply(r);
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->code, wire::ErrorCode::DEADLINE_EXCEEDED);
  EXPECT_NE(late->message.find("was aborted"), std::string::npos) << late->message;
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->Publish(TestModel(), Tokens(64, 2), MakeLayers(64, 1, 2)).ok());
}

TEST(UncommittedBytes, APublishTheStoreRefusesIsReleasedAtOnce) {
  const std::string dir = MakeTempDir();
  const std::string data = dir + "/data";
  ASSERT_EQ(mkdir(data.c_str(), 0700), 0);
  {
    Tmpfs small(data, 16);
    PRIMECACHE_TMPFS_OR_SKIP(small);
    Daemon d({"--publish-timeout", "0"}, dir);
    ASSERT_TRUE(d.Start());
    auto c = Client::Connect(d.Options());
    ASSERT_TRUE(c.ok());
    ASSERT_FALSE(FillStore(**c).ok()) << "16 MiB never filled";
    // The refused publish gave its bytes back: the disk is filled to the
    // last byte from outside.
    testing::FillFileSystem(data + "/filler");
    auto admin = Admin(d);
    ASSERT_NE(admin, nullptr);
    // A publish into the full store: its chunks are refused (the steps
    // before may be staged in memory), and while the client keeps it open
    // nothing of it stays counted.
    RawConn r(d.socket());
    ASSERT_TRUE(r.Hello());
    ASSERT_TRUE(SendBegin(r, 10, 1, 99));
    ASSERT_TRUE(SendLayer(r, 11, 10, 0, 4));
    for (std::uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(SendChunk(r, 12 + i, 10, 0, i, 100000));
    for (int i = 0; i < 6; ++i) {
      auto e = NextReply(r);
      ASSERT_TRUE(e.has_value());
      if (e->id >= 12) {
        EXPECT_EQ(e->which, wire::Response::ERROR) << "chunk " << e->id - 12;
      }
    }
    EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 0; }));
    auto st = admin->Stat();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->publishes_in_flight, 1u);  // still open: the client has not given up on it
    d.Kill();
  }
  std::filesystem::remove_all(dir);
}

// The issue's wedge: one client fills a small disk with a publish that never
// commits and goes away; the daemon gives the bytes back at once (new
// publishes and a compaction go through, no restart), and a daemon stopped
// on a disk that is full starts again and serves what it stored.
TEST(FullDisk, AnAbortedPublishThatFilledTheDiskDoesNotWedgeTheDaemon) {
  const std::string dir = MakeTempDir();
  const std::string data = dir + "/data";
  ASSERT_EQ(mkdir(data.c_str(), 0700), 0);
  {
    Tmpfs small(data, 32);
    PRIMECACHE_TMPFS_OR_SKIP(small);
    Daemon d({"--publish-timeout", "0"}, dir);
    d.DisownDir();
    ASSERT_TRUE(d.Start());
    auto c = Client::Connect(d.Options());
    ASSERT_TRUE(c.ok());
    const auto kept = Tokens(256, 3);
    ASSERT_TRUE((*c)->Publish(TestModel(), kept, MakeLayers(256, 1, 3)).ok());
    {
      RawConn r(d.socket());
      ASSERT_TRUE(r.Hello());
      ASSERT_TRUE(SendBegin(r, 10, 1, 99));
      ASSERT_TRUE(SendLayer(r, 11, 10, 0, 400));
      for (int i = 0; i < 2; ++i) ASSERT_TRUE(NextReply(r).has_value());
      auto refused = ChunksUntilRefused(r, 10, 400, 100000);
      ASSERT_TRUE(refused.has_value()) << "40 MB never filled a 32 MiB disk";
      EXPECT_EQ(refused->code, wire::ErrorCode::RESOURCE_EXHAUSTED) << refused->message;
    }  // the connection goes: its publish is aborted
    auto admin = Admin(d);
    ASSERT_NE(admin, nullptr);
    ASSERT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.publishes_in_flight == 0; }));
    auto again = (*c)->Publish(TestModel(), Tokens(256, 4), MakeLayers(256, 1, 4));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    ASSERT_TRUE(admin->Compact().ok());
    EXPECT_EQ(d.Stop(), 0);

    testing::FillFileSystem(data + "/filler");  // left full by someone else: the daemon starts all the same
    Daemon restarted({"--publish-timeout", "0"}, dir);
    restarted.DisownDir();
    ASSERT_TRUE(restarted.Start()) << "the daemon did not start on a full disk";
    auto c2 = Client::Connect(restarted.Options());
    ASSERT_TRUE(c2.ok());
    auto hit = (*c2)->Lookup(TestModel(), kept);
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    ASSERT_TRUE(hit->has_value());
    auto layers = (*c2)->FetchLayers((*hit)->id);
    ASSERT_TRUE(layers.ok()) << layers.status().ToString();
    EXPECT_EQ(restarted.Stop(), 0);
  }
  std::filesystem::remove_all(dir);
}

// ---- smaller refusals ------------------------------------------------------------

TEST(Refusals, OneLayerTooManyIsNamed) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  RawConn r(d.socket());
  ASSERT_TRUE(r.Hello());
  OpenPublish(r, 10, 1, 1, 100, 1);
  ASSERT_TRUE(SendLayer(r, 20, 10, 1, 1));
  auto e = NextReply(r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(e->message.find("one too many"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("announced 1 layer"), std::string::npos) << e->message;
}

TEST(Refusals, CancellingAnUnknownFetchSaysSo) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  RawConn r(d.socket());
  ASSERT_TRUE(r.Hello());
  ASSERT_TRUE(r.Send(*ipc::BuildRequest(5, [](wire::Request::Builder q) { q.initCancel().setTarget(999); })));
  auto e = NextReply(r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->id, 5u);
  EXPECT_EQ(e->which, wire::Response::ERROR);
  EXPECT_EQ(e->code, wire::ErrorCode::NOT_FOUND);
  EXPECT_NE(e->message.find("999"), std::string::npos) << e->message;
}

TEST(Refusals, StatOnATenantConnectionIsRefused) {
  const std::string dir = MakeTempDir();
  const std::string cfg = dir + "/cfg.json";
  {
    std::ofstream out(cfg);
    out << R"({"tenants": {")" << getuid() << R"(": ["team-a"]}})";
  }
  Daemon d({"--config", cfg});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options("team-a"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*c)->Publish(TestModel(), Tokens(64, 2), MakeLayers(64, 1, 2)).ok());
  auto st = (*c)->Stat();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("permission denied"), std::string::npos) << st.status().ToString();
  auto admin = Admin(d);
  ASSERT_NE(admin, nullptr);
  auto all = admin->Stat();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->store.entries, 1u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace primecache::testing

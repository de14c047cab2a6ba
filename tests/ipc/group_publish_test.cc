// Group publishes through a real daemon: the ranks of a tensor-parallel
// engine each publish their part on a connection of their own; the entry is
// visible only once every part committed; a rank process killed mid-publish
// (SIGKILL) leaves no entry and no staged bytes; a group whose missing rank
// never comes is aborted at --group-timeout.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "tests/ipc/daemon_harness.h"
#include "tests/ipc/http_scrape.h"

namespace primecache::testing {
namespace {

constexpr std::uint32_t kRanks = 2;
constexpr char kChildEnv[] = "PRIMECACHE_GROUP_CHILD_SOCKET";

std::vector<std::vector<LayerData>> Parts(std::uint64_t len, std::uint32_t seed) {
  return MakeGroupParts(len, seed);
}

// Streams rank `rank`'s part on `c` (no commit).
std::unique_ptr<PublishStream> Stream(Client& c, const std::vector<std::uint32_t>& tokens,
                                      std::uint64_t token, std::uint32_t rank,
                                      const std::vector<LayerData>& part) {
  auto s = c.BeginPublish(TestModel(), tokens, static_cast<std::uint32_t>(part.size()),
                          PublishGroup{token, kRanks, rank});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  for (const LayerData& l : part) {
    EXPECT_TRUE((*s)->BeginLayer(l.header, static_cast<std::uint32_t>(l.chunks.size())).ok());
    for (const auto& chunk : l.chunks) EXPECT_TRUE((*s)->AddChunk(chunk).ok());
  }
  return std::move(s).value();
}

std::uint64_t StagedBytes(Client& admin) {
  auto st = admin.Stat();
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  return st.ok() ? st->store.staged_bytes : ~0ull;
}

// Waits until the store holds no staged bytes; false after 20 s.
bool StagedDrains(Client& admin) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    if (StagedBytes(admin) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(GroupPublishDaemon, TwoRanksOnTwoConnectionsPublishOneEntry) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto rank0 = Client::Connect(d.Options("tp")).value();
  auto rank1 = Client::Connect(d.Options("tp")).value();
  const auto tokens = Tokens(300, 3);
  const auto parts = Parts(tokens.size(), 5);
  auto s0 = Stream(*rank0, tokens, 77, 0, parts[0]);
  auto s1 = Stream(*rank1, tokens, 77, 1, parts[1]);
  auto pending = s1->Commit();
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  EXPECT_TRUE(pending->group_pending);
  EXPECT_FALSE(rank0->Lookup(TestModel(), tokens).value()) << "visible before rank 0 committed";
  auto admin = Admin(d);
  EXPECT_EQ(admin->Stat().value().store.group_publishes_open, 1u);
  auto done = s0->Commit();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_FALSE(done->group_pending);
  auto hit = rank1->Lookup(TestModel(), tokens).value();
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->id, done->id);
  EXPECT_EQ(hit->ranks, kRanks);
  EXPECT_EQ(hit->layers, 3u);
  EXPECT_EQ(rank0->Describe(done->id).value().info.ranks, kRanks);
  auto layers = rank1->FetchLayers(done->id).value();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[1].data.header, parts[0][1].header);  // rank 0's shard, then rank 1's
  EXPECT_EQ(layers[2].data.header, parts[1][0].header);
  EXPECT_EQ(layers[2].data.chunks, parts[1][0].chunks);
  EXPECT_EQ(StagedBytes(*admin), 0u);
  const auto after = admin->Stat().value().store;
  EXPECT_EQ(after.group_publishes_open, 0u);
  EXPECT_EQ(after.group_publishes_aborted, 0u);
}

std::uint64_t ChunkBytes(const std::vector<LayerData>& layers) {
  std::uint64_t n = 0;
  for (const LayerData& l : layers) {
    for (const auto& c : l.chunks) n += c.size();
  }
  return n;
}

// The metrics count bytes by rank: each part's committed chunk bytes by its
// group rank, and each fetch's bytes by the rank its connection said it is.
TEST(GroupPublishDaemon, TheMetricsCountEachRanksPublishedAndFetchedBytes) {
  const std::uint16_t port = FreeLoopbackPort();
  ASSERT_NE(port, 0);
  Daemon d({"--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(d.Start());
  std::vector<std::unique_ptr<Client>> ranks;
  for (std::uint32_t r = 0; r < kRanks; ++r) {
    ClientOptions o = d.Options("tp");
    o.tp_rank = r;
    ranks.push_back(Client::Connect(o).value());
  }
  const auto tokens = Tokens(300, 3);
  const auto parts = Parts(tokens.size(), 5);
  auto s0 = Stream(*ranks[0], tokens, 78, 0, parts[0]);
  auto s1 = Stream(*ranks[1], tokens, 78, 1, parts[1]);
  ASSERT_TRUE(s1->Commit().ok());
  auto done = s0->Commit();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  // Rank 0 reads its part (entry layers 0 and 1), rank 1 the replicated layer and its shard (0 and 2).
  const std::vector<std::uint32_t> mine0 = {0, 1}, mine1 = {0, 2};
  ASSERT_TRUE(ranks[0]->FetchLayers(done->id, mine0).ok());
  ASSERT_TRUE(ranks[1]->FetchLayers(done->id, mine1).ok());
  const std::string text = HttpRequest(port, "GET /metrics HTTP/1.0\r\n\r\n");
  auto sample = [&](const std::string& name, std::uint32_t r) {
    return SampleValue(text, name + "{rank=\"" + std::to_string(r) + "\"}").value_or(-1);
  };
  EXPECT_EQ(sample("primecache_rank_publish_bytes_total", 0), double(ChunkBytes(parts[0])));
  EXPECT_EQ(sample("primecache_rank_publish_bytes_total", 1), double(ChunkBytes(parts[1])));
  EXPECT_EQ(sample("primecache_rank_fetch_bytes_total", 0), double(ChunkBytes(parts[0])));
  EXPECT_EQ(sample("primecache_rank_fetch_bytes_total", 1),
            double(ChunkBytes({parts[0][0]}) + ChunkBytes(parts[1])));
  // A connection that is no rank counts under none; a rank beyond the limit is refused.
  EXPECT_FALSE(SampleValue(text, "primecache_rank_fetch_bytes_total{rank=\"2\"}"));
  ClientOptions bad = d.Options("tp");
  bad.tp_rank = 4096;
  auto refused = Client::Connect(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("TP rank 4096"), std::string::npos) << refused.status().ToString();
}

// A fetch by query that skips parted hits (as a TP engine's restore does)
// is told a group entry's hit and streams none of its layers: the daemon
// sends no chunk byte; each rank then fetches its own parts by entry. A
// plain fetch by query still streams the whole entry, and a single-rank
// entry streams whether skipped hits are asked for or not.
TEST(GroupPublishDaemon, AFetchByQuerySkippingPartedHitsStreamsNoneOfAGroupEntry) {
  const std::uint16_t port = FreeLoopbackPort();
  ASSERT_NE(port, 0);
  Daemon d({"--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(d.Start());
  auto rank0 = Client::Connect(d.Options("tp")).value();
  auto rank1 = Client::Connect(d.Options("tp")).value();
  ASSERT_TRUE(rank0->server_info().fetch_by_query);
  const auto tokens = Tokens(300, 9);
  const auto parts = Parts(tokens.size(), 11);
  auto s0 = Stream(*rank0, tokens, 79, 0, parts[0]);
  auto s1 = Stream(*rank1, tokens, 79, 1, parts[1]);
  ASSERT_TRUE(s1->Commit().ok());
  auto done = s0->Commit();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  auto fetch_bytes = [&] {
    return SampleValue(HttpRequest(port, "GET /metrics HTTP/1.0\r\n\r\n"), "primecache_fetch_bytes_total")
        .value_or(-1);
  };
  int layers_seen = 0;
  std::optional<LookupHit> told;
  FetchCallbacks cb;
  cb.on_hit = [&](const LookupHit& h) {
    told = h;
    return Status::Ok();
  };
  cb.on_layer = [&](std::uint32_t, std::span<const std::byte>, std::uint32_t) {
    ++layers_seen;
    return Status::Ok();
  };
  cb.skip_parted_hits = true;
  const double before = fetch_bytes();
  auto hit = rank1->LookupAndFetch(TestModel(), tokens, cb);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  ASSERT_TRUE(hit->has_value());
  EXPECT_EQ((*hit)->id, done->id);
  EXPECT_EQ((*hit)->ranks, kRanks);
  ASSERT_TRUE(told.has_value());
  EXPECT_EQ(told->ranks, kRanks);
  EXPECT_EQ(layers_seen, 0);
  EXPECT_EQ(fetch_bytes(), before) << "the daemon sent a skipped entry's bytes";
  // The connection goes on: the rank fetches its own parts by entry.
  const std::vector<std::uint32_t> mine1 = {0, 2};
  ASSERT_TRUE(rank1->FetchLayers(done->id, mine1).ok());
  EXPECT_EQ(fetch_bytes(), before + double(ChunkBytes({parts[0][0]}) + ChunkBytes(parts[1])));

  cb.skip_parted_hits = false;
  auto whole = rank1->LookupAndFetch(TestModel(), tokens, cb);
  ASSERT_TRUE(whole.ok() && whole->has_value()) << whole.status().ToString();
  EXPECT_EQ(layers_seen, 3);

  const auto single = Tokens(200, 13);
  ASSERT_TRUE(rank0->Publish(TestModel(), single, MakeLayers(200, 2, 13, 64, 32)).ok());
  layers_seen = 0;
  cb.skip_parted_hits = true;
  auto plain = rank0->LookupAndFetch(TestModel(), single, cb);
  ASSERT_TRUE(plain.ok() && plain->has_value()) << plain.status().ToString();
  EXPECT_EQ((*plain)->ranks, 1u);
  EXPECT_EQ(layers_seen, 2);
}

// Run as a child process (self-exec): rank 1 streams its part, says so, and
// waits to be killed.
TEST(GroupPublishDaemonChild, StreamsItsPartAndWaits) {
  const char* socket = std::getenv(kChildEnv);
  if (socket == nullptr) GTEST_SKIP() << "the child of GroupPublishDaemon.ARankProcessKilledMidPublish";
  ClientOptions o;
  o.endpoint = socket;
  o.ns = "tp";
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto tokens = Tokens(300, 4);
  auto s = Stream(**c, tokens, 78, 1, Parts(tokens.size(), 6)[1]);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE((*c)->Stat().ok());  // a round trip: every chunk before it reached the daemon
  std::printf("STREAMED\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(120));
}

TEST(GroupPublishDaemon, ARankProcessKilledMidPublishLeavesNoEntryAndNoStagedBytes) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(out[1], 1);
    close(out[0]);
    setenv(kChildEnv, d.socket().c_str(), 1);
    execl("/proc/self/exe", "group_child", "--gtest_filter=GroupPublishDaemonChild.*", nullptr);
    _exit(127);
  }
  close(out[1]);
  auto rank0 = Client::Connect(d.Options("tp")).value();
  const auto tokens = Tokens(300, 4);
  auto s0 = Stream(*rank0, tokens, 78, 0, Parts(tokens.size(), 6)[0]);
  std::string said;
  char buf[256];
  while (said.find("STREAMED") == std::string::npos) {
    const ssize_t n = read(out[0], buf, sizeof buf);
    ASSERT_GT(n, 0) << "the rank process ended before it streamed: " << said;
    said.append(buf, static_cast<std::size_t>(n));
  }
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  close(out[0]);
  // Rank 0 commits: refused if the daemon saw rank 1 go first, else parked
  // until its connection's end aborts the group. Either way, no entry.
  auto r = s0->Commit();
  if (r.ok()) {
    EXPECT_TRUE(r->group_pending);
  } else {
    EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  }
  auto admin = Admin(d);
  EXPECT_TRUE(StagedDrains(*admin)) << StagedBytes(*admin) << " bytes still staged";
  EXPECT_FALSE(rank0->Lookup(TestModel(), tokens).value());
  EXPECT_EQ(admin->Stat().value().store.group_publishes_aborted, 1u);
  // The same boundary from two live ranks, under a new token.
  auto rank1 = Client::Connect(d.Options("tp")).value();
  const auto parts = Parts(tokens.size(), 6);
  auto a = Stream(*rank0, tokens, 79, 0, parts[0]);
  auto b = Stream(*rank1, tokens, 79, 1, parts[1]);
  ASSERT_TRUE(b->Commit().ok());
  ASSERT_TRUE(a->Commit().ok());
  EXPECT_TRUE(rank1->Lookup(TestModel(), tokens).value());
}

TEST(GroupPublishDaemon, AGroupWhoseMissingRankNeverComesIsAbortedAtTheGroupTimeout) {
  Daemon d({"--group-timeout", "0.3"});
  ASSERT_TRUE(d.Start());
  auto rank1 = Client::Connect(d.Options("tp")).value();
  const auto tokens = Tokens(200, 7);
  auto s1 = Stream(*rank1, tokens, 80, 1, Parts(tokens.size(), 8)[1]);
  ASSERT_TRUE(s1->Commit().value().group_pending);
  auto admin = Admin(d);
  EXPECT_GT(StagedBytes(*admin), 0u);  // parked, waiting for rank 0
  EXPECT_TRUE(StagedDrains(*admin));
  EXPECT_EQ(admin->Stat().value().store.group_publishes_aborted, 1u);
  EXPECT_EQ(admin->Stat().value().store.group_publishes_open, 0u);
  // Rank 0 comes too late: its group is over.
  auto rank0 = Client::Connect(d.Options("tp")).value();
  auto late = rank0->BeginPublish(TestModel(), tokens, 2, PublishGroup{80, kRanks, 0});
  Status st = late.ok() ? (*late)->Commit().status() : late.status();
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(rank0->Lookup(TestModel(), tokens).value());
}

}  // namespace
}  // namespace primecache::testing

// End-to-end tests against the real primecached process.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <grp.h>
#include <sys/stat.h>

#include <atomic>
#include <thread>

#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {
namespace {

void ExpectSameLayers(const std::vector<LayerData>& want, const std::vector<FetchedLayer>& got,
                      const std::vector<std::uint32_t>& order = {}) {
  std::vector<std::uint32_t> idx = order;
  if (idx.empty()) {
    for (std::uint32_t i = 0; i < want.size(); ++i) idx.push_back(i);
  }
  ASSERT_EQ(got.size(), idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    EXPECT_EQ(got[i].layer, idx[i]);
    const LayerData& w = want[idx[i]];
    EXPECT_EQ(got[i].data.header, w.header) << "layer " << idx[i];
    ASSERT_EQ(got[i].data.chunks.size(), w.chunks.size()) << "layer " << idx[i];
    for (std::size_t c = 0; c < w.chunks.size(); ++c) {
      EXPECT_TRUE(got[i].data.chunks[c] == w.chunks[c]) << "layer " << idx[i] << " chunk " << c;
    }
  }
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()); }
  Daemon d_;
};

void RoundTrip(Daemon& d, bool shm) {
  auto c = Client::Connect(d.Options("", shm));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Client& cl = **c;
  EXPECT_EQ(cl.server_info().version, 1u);
  EXPECT_FALSE(cl.server_info().admin);
  if (shm) {
    ASSERT_NE(cl.region().base, nullptr);
    EXPECT_GE(cl.region().fd, 0);
  } else {
    EXPECT_EQ(cl.region().base, nullptr);
  }

  const auto tokens = Tokens(300, 1);
  const auto layers = MakeLayers(200, 3, 1, 64, 32);
  auto miss = cl.Lookup(TestModel(), tokens);
  ASSERT_TRUE(miss.ok()) << miss.status().ToString();
  EXPECT_FALSE(miss->has_value());

  auto pub = cl.Publish(TestModel(), std::span(tokens).first(200), layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();

  auto hit = cl.Lookup(TestModel(), tokens);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  ASSERT_TRUE(hit->has_value());
  EXPECT_EQ((*hit)->id, pub->id);
  EXPECT_EQ((*hit)->length, 200u);
  EXPECT_EQ((*hit)->layers, 3u);

  // Another model never matches.
  auto other = cl.Lookup(TestModel(2), tokens);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
  // A query shorter than the boundary does not match it.
  auto shorter = cl.Lookup(TestModel(), std::span(tokens).first(150));
  ASSERT_TRUE(shorter.ok());
  EXPECT_FALSE(shorter->has_value());

  auto all = cl.FetchLayers((*hit)->id);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ExpectSameLayers(layers, *all);

  const std::vector<std::uint32_t> some = {2, 0};
  auto part = cl.FetchLayers((*hit)->id, some);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  ExpectSameLayers(layers, *part, some);

  if (shm) {
    // Chunks really arrived through the region.
    const auto* base = static_cast<const std::byte*>(cl.region().base);
    std::size_t in_region = 0, total = 0;
    FetchCallbacks cb;
    cb.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> b) {
      ++total;
      if (b.data() >= base && b.data() + b.size() <= base + cl.region().size) ++in_region;
      return Status::Ok();
    };
    ASSERT_TRUE(cl.Fetch((*hit)->id, {}, cb).ok());
    EXPECT_EQ(total, ChunkCount(layers));
    EXPECT_EQ(in_region, total);
  }

  auto v = cl.CheckEntry((*hit)->id);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->ok) << v->message;
  EXPECT_EQ(v->layers, 3u);

  auto missing = cl.FetchLayers((*hit)->id + 1000000);
  EXPECT_TRUE(missing.status().IsNotFound()) << missing.status().ToString();

  auto st = cl.Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->store.entries, 1u);
  EXPECT_GE(st->connections, 1u);
  auto list = cl.List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->entries.size(), 1u);
  EXPECT_EQ(list->entries[0].id, pub->id);
  EXPECT_EQ(list->entries[0].tokens, std::vector<std::uint32_t>(tokens.begin(), tokens.begin() + 200));
  EXPECT_EQ(list->entries[0].model, TestModel().digest);
}

TEST_F(DaemonTest, RoundTripOverSocket) { RoundTrip(d_, false); }
TEST_F(DaemonTest, RoundTripOverSharedMemory) { RoundTrip(d_, true); }

TEST_F(DaemonTest, SharedMemoryPublishFetchedOverSocketAndBack) {
  // A small region: one publish slot and a fetch window the chunks wrap around.
  ClientOptions small = d_.Options("", true);
  small.shared_memory_bytes = 1u << 20;
  auto a = Client::Connect(small);
  auto b = Client::Connect(d_.Options("", false));
  ASSERT_TRUE(a.ok() && b.ok());
  const auto tokens = Tokens(64, 9);
  const auto layers = MakeLayers(64, 3, 9, 4096, 4);  // 64 KiB chunks, 34 in all
  auto pub = (*a)->Publish(TestModel(), tokens, layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  auto got = (*b)->FetchLayers(pub->id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameLayers(layers, *got);
}

// Large chunks read straight into the fetch window, of sizes that are no
// multiple of anything convenient (the ring's places are not aligned).
TEST_F(DaemonTest, LargeOddChunksOverSharedMemoryArriveIntact) {
  const auto tokens = Tokens(300, 23);
  // 64 rows of 1567 floats: 401152-byte chunks.
  const auto layers = MakeLayers(300, 3, 23, 1567, 64);
  auto c = Client::Connect(d_.Options("", true));
  ASSERT_TRUE(c.ok());
  auto pub = (*c)->Publish(TestModel(), tokens, layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  for (int rep = 0; rep < 3; ++rep) {
    auto got = (*c)->FetchLayers(pub->id);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectSameLayers(layers, *got);
  }
}

// Chunks handed over (on_chunk_held) and released later, from other threads
// and out of order: the bytes stay intact until released (a window reused too
// early would overwrite them), and a window smaller than the entry wraps as
// releases come back.
TEST_F(DaemonTest, HeldChunksAreReleasedFromOtherThreadsOutOfOrder) {
  const auto tokens = Tokens(64, 19);
  const auto layers = MakeLayers(64, 3, 19, 4096, 4);  // 64 KiB chunks, 34 in all
  {
    auto pc = Client::Connect(d_.Options());
    ASSERT_TRUE(pc.ok());
    ASSERT_TRUE((*pc)->Publish(TestModel(), tokens, layers).ok());
  }
  for (bool shm : {true, false}) {
    ClientOptions o = d_.Options("", shm);
    o.shared_memory_bytes = 1u << 20;  // a 512 KiB window: 8 chunks at a time
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok());
    auto hit = (*c)->Lookup(TestModel(), tokens);
    ASSERT_TRUE(hit.ok() && hit->has_value());
    struct Held {
      std::uint32_t layer, index;
      std::span<const std::byte> bytes;
      ChunkRelease release;
    };
    std::mutex mu;
    std::vector<FetchedLayer> got(layers.size());
    std::vector<Held> held;
    std::vector<std::thread> releasers;
    int in_region = 0;
    // Copies each chunk, newest first, then releases it (twice: the second does nothing).
    auto settle = [&](std::vector<Held> batch) {
      for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
        {
          std::lock_guard l(mu);
          got[it->layer].data.chunks[it->index].assign(it->bytes.begin(), it->bytes.end());
        }
        it->release();
        it->release();
      }
    };
    FetchCallbacks cb;
    cb.on_layer = [&](std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) {
      std::lock_guard l(mu);
      got[layer].layer = layer;
      got[layer].data.header.assign(header.begin(), header.end());
      got[layer].data.chunks.resize(chunks);
      return Status::Ok();
    };
    cb.on_chunk_held = [&](std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                           ChunkRelease release) {
      const auto region = (*c)->region();
      const auto* base = static_cast<const std::byte*>(region.base);
      if (base != nullptr && bytes.data() >= base && bytes.data() < base + region.size) ++in_region;
      held.push_back({layer, index, bytes, std::move(release)});
      if (held.size() == 3) {
        releasers.emplace_back(settle, std::move(held));
        held.clear();
      }
      return Status::Ok();
    };
    Status s = (*c)->Fetch((*hit)->id, {}, cb);
    settle(std::move(held));
    for (auto& t : releasers) t.join();
    ASSERT_TRUE(s.ok()) << s.ToString();
    if (shm) {
      EXPECT_EQ(in_region, static_cast<int>(ChunkCount(layers)));
    }
    ExpectSameLayers(layers, got);
  }
}

TEST_F(DaemonTest, RepublishingABoundaryAnswersTheStoredEntry) {
  auto c = Client::Connect(d_.Options());
  ASSERT_TRUE(c.ok());
  const auto tokens = Tokens(48, 31);
  const auto layers = MakeLayers(48, 2, 31);
  auto first = (*c)->Publish(TestModel(), tokens, layers);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->existed);
  auto again = (*c)->Publish(TestModel(), tokens, layers);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->existed);
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ((*c)->Stat()->store.entries, 1u);
  // A layer the store's validator refuses (its header says 40 tokens, the
  // boundary has 48) fails the commit and stores nothing.
  auto wrong = (*c)->Publish(TestModel(), Tokens(48, 32), MakeLayers(40, 1, 32));
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ((*c)->Stat()->store.entries, 1u);
  EXPECT_FALSE((*c)->Lookup(TestModel(), Tokens(48, 32))->has_value());
}

// The branch point over the wire: asked for, a lookup answers how far a
// stored entry shares the query (on a miss too, and in the namespace of the
// connection only); not asked for, the client leaves it alone.
TEST_F(DaemonTest, ALookupAnswersItsSharedLengthWhenAsked) {
  auto c = Client::Connect(d_.Options());
  ASSERT_TRUE(c.ok());
  const auto stored = Tokens(900, 41);
  ASSERT_TRUE((*c)->Publish(TestModel(), stored, MakeLayers(900, 2, 41)).ok());
  std::vector<std::uint32_t> query(stored.begin(), stored.begin() + 700);
  for (std::uint32_t t : Tokens(100, 42)) query.push_back(t | 0x80000000u);  // differs from token 700 on
  std::uint64_t shared = 12345;
  auto miss = (*c)->Lookup(TestModel(), query, &shared);
  ASSERT_TRUE(miss.ok()) << miss.status().ToString();
  EXPECT_FALSE(miss->has_value());
  EXPECT_EQ(shared, 700u);
  // A query that extends the entry: hit and branch point are the boundary.
  std::vector<std::uint32_t> longer = stored;
  longer.push_back(7);
  auto hit = (*c)->Lookup(TestModel(), longer, &shared);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->length, 900u);
  EXPECT_EQ(shared, 900u);
  // Another namespace's connection shares nothing with it.
  auto other = Client::Connect(d_.Options("elsewhere"));
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Lookup(TestModel(), query, &shared).ok());
  EXPECT_EQ(shared, 0u);
}

// LookupAndFetch: one round trip finds the longest stored prefix and
// streams it, the hit told first; the same bytes as Lookup then FetchLayers,
// over the socket and through shared memory; a miss streams nothing.
TEST_F(DaemonTest, LookupAndFetchStreamsTheLongestStoredPrefixAfterItsHit) {
  for (bool shm : {false, true}) {
    SCOPED_TRACE(shm ? "shared memory" : "socket");
    auto c = Client::Connect(d_.Options("", shm));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE((*c)->server_info().fetch_by_query);
    const auto tokens = Tokens(600, shm ? 52 : 51);
    const auto layers = MakeLayers(400, 3, shm ? 52 : 51, 64, 32);
    auto pub = (*c)->Publish(TestModel(), std::span(tokens).first(400), layers);
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();

    std::vector<FetchedLayer> got;
    std::optional<LookupHit> told;
    FetchCallbacks cb;
    cb.on_hit = [&](const LookupHit& h) {
      EXPECT_TRUE(got.empty()) << "the hit came after a layer";
      told = h;
      return Status::Ok();
    };
    cb.on_layer = [&](std::uint32_t l, std::span<const std::byte> header, std::uint32_t) {
      FetchedLayer f;
      f.layer = l;
      f.data.header.assign(header.begin(), header.end());
      got.push_back(std::move(f));
      return Status::Ok();
    };
    cb.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> b) {
      got.back().data.chunks.emplace_back(b.begin(), b.end());
      return Status::Ok();
    };
    std::uint64_t shared = 0;
    auto hit = (*c)->LookupAndFetch(TestModel(), tokens, cb, &shared);
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    ASSERT_TRUE(hit->has_value());
    EXPECT_EQ((*hit)->id, pub->id);
    EXPECT_EQ((*hit)->length, 400u);
    EXPECT_EQ((*hit)->layers, 3u);
    ASSERT_TRUE(told.has_value());
    EXPECT_EQ(told->id, pub->id);
    EXPECT_EQ(shared, 400u);
    ExpectSameLayers(layers, got);

    // A miss: nothing streamed, the branch point still said.
    got.clear();
    told.reset();
    std::vector<std::uint32_t> off(tokens.begin(), tokens.begin() + 300);
    off.push_back(0x7fffffffu);
    auto miss = (*c)->LookupAndFetch(TestModel(), off, cb, &shared);
    ASSERT_TRUE(miss.ok()) << miss.status().ToString();
    EXPECT_FALSE(miss->has_value());
    EXPECT_FALSE(told.has_value());
    EXPECT_TRUE(got.empty());
    EXPECT_EQ(shared, 300u);
    auto other_model = (*c)->LookupAndFetch(TestModel(2), tokens, cb);
    ASSERT_TRUE(other_model.ok());
    EXPECT_FALSE(other_model->has_value());
  }
}

// An on_hit that refuses the hit cancels its fetch: the call returns that
// error, and the connection fetches on.
TEST_F(DaemonTest, LookupAndFetchRefusedAtItsHitCancelsAndTheConnectionGoesOn) {
  auto c = Client::Connect(d_.Options("", true));
  ASSERT_TRUE(c.ok());
  const auto tokens = Tokens(500, 61);
  ASSERT_TRUE((*c)->Publish(TestModel(), tokens, MakeLayers(500, 4, 61, 64, 32)).ok());
  int layers_seen = 0;
  FetchCallbacks refuse;
  refuse.on_hit = [](const LookupHit&) { return Status::FailedPrecondition("too short for this engine"); };
  refuse.on_layer = [&](std::uint32_t, std::span<const std::byte>, std::uint32_t) {
    ++layers_seen;
    return Status::Ok();
  };
  auto r = (*c)->LookupAndFetch(TestModel(), tokens, refuse);
  EXPECT_TRUE(r.status().IsFailedPrecondition()) << r.status().ToString();
  EXPECT_EQ(layers_seen, 0);
  FetchCallbacks take;
  take.on_layer = refuse.on_layer;
  auto again = (*c)->LookupAndFetch(TestModel(), tokens, take);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(again->has_value());
  EXPECT_EQ(layers_seen, 4);
}

// A fetch by query keeps to its connection's tenant: another namespace's
// entry is a miss, and a query naming another namespace is refused.
TEST_F(DaemonTest, LookupAndFetchKeepsTenantsApart) {
  auto a = Client::Connect(d_.Options("tenant-a"));
  auto b = Client::Connect(d_.Options("tenant-b"));
  ASSERT_TRUE(a.ok() && b.ok());
  const auto tokens = Tokens(80, 71);
  ASSERT_TRUE((*a)->Publish(TestModel(), tokens, MakeLayers(80, 1, 71)).ok());
  int layers_seen = 0;
  FetchCallbacks cb;
  cb.on_layer = [&](std::uint32_t, std::span<const std::byte>, std::uint32_t) {
    ++layers_seen;
    return Status::Ok();
  };
  auto theirs = (*b)->LookupAndFetch(TestModel(), tokens, cb);
  ASSERT_TRUE(theirs.ok()) << theirs.status().ToString();
  EXPECT_FALSE(theirs->has_value());
  EXPECT_EQ(layers_seen, 0);
  auto ours = (*a)->LookupAndFetch(TestModel(), tokens, cb);
  ASSERT_TRUE(ours.ok() && ours->has_value());
  EXPECT_EQ(layers_seen, 1);
  RawConn r(d_.socket());
  ASSERT_TRUE(r.Hello("tenant-b"));
  auto m = ipc::BuildRequest(5, [&](wire::Request::Builder q) {
    auto l = q.initFetch().initQuery().initQuery();
    l.setNamespace("tenant-a");
    l.initTokens(1).set(0, 1);
  });
  ASSERT_TRUE(r.Send(*m));
  auto f = r.Next();
  ASSERT_TRUE(f.has_value());
  auto rd = f->Reader({});
  auto resp = rd->getRoot<wire::Response>();
  ASSERT_EQ(resp.which(), wire::Response::ERROR);
  EXPECT_EQ(resp.getError().getCode(), wire::ErrorCode::PERMISSION_DENIED);
}

// A publish carries its model's prefill cost: the entry's FLOPs are the
// estimate from it (what the utility and marginal policies weigh), its
// tokens when none is sent; a cost out of bounds is refused.
TEST_F(DaemonTest, APublishCarriesItsModelsPrefillCost) {
  auto c = Client::Connect(d_.Options());
  ASSERT_TRUE(c.ok());
  ModelId costly = TestModel(7);
  costly.cost = {1000000, 2, 512};
  auto with = (*c)->Publish(costly, Tokens(300, 51), MakeLayers(300, 2, 51));
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  auto without = (*c)->Publish(TestModel(8), Tokens(300, 52), MakeLayers(300, 2, 52));
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  auto a = (*c)->Describe(with->id), b = (*c)->Describe(without->id);
  ASSERT_TRUE(a.ok() && b.ok());
  // L * flops_per_token + attention_layers * flops_per_pair * L (L + 1) / 2
  EXPECT_DOUBLE_EQ(a->info.flops, 300.0 * 1000000 + 2.0 * 512 * 300 * 301 / 2);
  EXPECT_DOUBLE_EQ(b->info.flops, 300.0);
  ModelId absurd = TestModel(9);
  absurd.cost = {1ull << 51, 0, 0};
  auto refused = (*c)->Publish(absurd, Tokens(300, 53), MakeLayers(300, 2, 53));
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  absurd.cost = {1, 3, 1};  // more attention layers than the publish has layers
  refused = (*c)->Publish(absurd, Tokens(300, 53), MakeLayers(300, 2, 53));
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_EQ((*c)->Stat()->store.entries, 2u);
}

TEST_F(DaemonTest, SocketModeIs0600AndPathsExist) {
  struct stat st {};
  ASSERT_EQ(stat(d_.socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(d_.admin_socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(DaemonTest, ManyConcurrentClients) {
  constexpr int kClients = 16;
  std::atomic<int> good{0};
  std::vector<std::thread> ts;
  std::vector<std::string> errors(kClients);
  for (int i = 0; i < kClients; ++i) {
    ts.emplace_back([&, i] {
      auto c = Client::Connect(d_.Options("", i % 2 == 0));
      if (!c.ok()) {
        errors[i] = c.status().ToString();
        return;
      }
      const auto tokens = Tokens(100 + i, 100 + i);
      for (int round = 0; round < 3; ++round) {
        const auto layers = MakeLayers(50 + round, 2, 100 + i, 32 + i, 16);
        auto pub = (*c)->Publish(TestModel(), std::span(tokens).first(50 + round), layers);
        if (!pub.ok()) {
          errors[i] = pub.status().ToString();
          return;
        }
        auto hit = (*c)->Lookup(TestModel(), tokens);
        if (!hit.ok() || !hit->has_value() || (*hit)->length != 50u + round) {
          errors[i] = "lookup";
          return;
        }
        auto got = (*c)->FetchLayers((*hit)->id);
        if (!got.ok() || got->size() != 2 || got->at(0).data.chunks != layers[0].chunks ||
            got->at(1).data.header != layers[1].header) {
          errors[i] = "fetch " + got.status().ToString();
          return;
        }
      }
      ++good;
    });
  }
  for (auto& t : ts) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(errors[i], "") << "client " << i;
  EXPECT_EQ(good.load(), kClients);
  auto c = Client::Connect(d_.Options());
  auto st = (*c)->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->store.entries, kClients * 3u);
}

TEST_F(DaemonTest, AsyncCallsPipelineOnOneClient) {
  auto c = Client::Connect(d_.Options());
  ASSERT_TRUE(c.ok());
  std::vector<std::future<Result<PublishResult>>> pubs;
  std::vector<std::vector<LayerData>> contents;
  for (int i = 0; i < 4; ++i) {
    contents.push_back(MakeLayers(30, 2, 40 + i));
    pubs.push_back((*c)->PublishAsync(TestModel(), Tokens(30, 40 + i), contents.back()));
  }
  std::vector<std::uint64_t> entries;
  for (auto& f : pubs) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    entries.push_back(r->id);
  }
  std::vector<std::future<Result<std::optional<LookupHit>>>> looks;
  for (int i = 0; i < 4; ++i) looks.push_back((*c)->LookupAsync(TestModel(), Tokens(30, 40 + i)));
  std::vector<std::future<Result<std::vector<FetchedLayer>>>> fetches;
  for (int i = 0; i < 4; ++i) {
    auto r = looks[i].get();
    ASSERT_TRUE(r.ok() && r->has_value());
    EXPECT_EQ((*r)->id, entries[i]);
    fetches.push_back((*c)->FetchLayersAsync((*r)->id));
  }
  for (int i = 0; i < 4; ++i) {
    auto r = fetches[i].get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectSameLayers(contents[i], *r);
  }
  auto st = (*c)->StatAsync().get();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->store.entries, 4u);
}

TEST_F(DaemonTest, DisconnectMidPublishLeavesNothing) {
  // A client process dies in the middle of a publish (no commit, no abort).
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = Client::Connect(d_.Options());
    if (!c.ok()) _exit(2);
    auto s = (*c)->BeginPublish(TestModel(), Tokens(40, 5), 2);
    if (!s.ok()) _exit(3);
    const auto layers = MakeLayers(40, 2, 5, 64, 8);
    if (!(*s)->BeginLayer(layers[0].header, static_cast<std::uint32_t>(layers[0].chunks.size())).ok()) _exit(4);
    if (!(*s)->AddChunk(layers[0].chunks[0]).ok()) _exit(5);
    if (!(*s)->AddChunk(layers[0].chunks[1]).ok()) _exit(6);
    auto st = (*c)->Stat();  // a round trip: the chunks have reached the daemon
    if (!st.ok() || st->publishes_in_flight != 1) _exit(7);
    _exit(0);
  }
  int wst = 0;
  ASSERT_EQ(waitpid(child, &wst, 0), child);
  ASSERT_TRUE(WIFEXITED(wst));
  ASSERT_EQ(WEXITSTATUS(wst), 0);
  auto c = Client::Connect(d_.Options());
  ASSERT_TRUE(c.ok());
  DaemonStats st;
  for (int i = 0; i < 200; ++i) {
    auto r = (*c)->Stat();
    ASSERT_TRUE(r.ok());
    st = *r;
    if (st.publishes_in_flight == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(st.publishes_in_flight, 0u);
  EXPECT_EQ(st.store.entries, 0u);
  EXPECT_EQ(st.store.stored_bytes, 0u);
  auto hit = (*c)->Lookup(TestModel(), Tokens(40, 5));
  ASSERT_TRUE(hit.ok());
  EXPECT_FALSE(hit->has_value());
}

TEST_F(DaemonTest, RawDisconnectMidPublishLeavesNothing) {
  {
    RawConn r(d_.socket());
    ASSERT_TRUE(r.Hello());
    const auto tokens = Tokens(20, 3);
    auto begin = ipc::BuildRequest(7, [&](wire::Request::Builder q) {
      auto pb = q.initPublishBegin();
      pb.setLayerCount(1);
      auto b = pb.initBoundary();
      b.initFingerprint().setDigestLo(TestModel().digest.lo);
      b.getFingerprint().setDigestHi(TestModel().digest.hi);
      auto t = b.initTokens(20);
      for (unsigned i = 0; i < 20; ++i) t.set(i, tokens[i]);
      b.setLength(20);
    });
    ASSERT_TRUE(r.Send(*begin));
    auto layer = ipc::BuildRequest(8, [&](wire::Request::Builder q) {
      auto l = q.initPublishLayer();
      l.setPublish(7);
      l.setLayer(0);
      l.setChunkCount(2);
    });
    ASSERT_TRUE(r.Send(*layer));
    auto chunk = ipc::BuildRequest(9, [&](wire::Request::Builder q) {
      auto c = q.initPublishChunk();
      c.setPublish(7);
      c.initData().initInline(1000);
    });
    ASSERT_TRUE(r.Send(*chunk));
    for (int i = 0; i < 3; ++i) {
      auto f = r.Next();
      ASSERT_TRUE(f.has_value());
      auto rd = f->Reader({});
      EXPECT_EQ(rd->getRoot<wire::Response>().which(), wire::Response::ACK);
    }
  }  // closed here, mid-publish
  auto c = Client::Connect(d_.Options());
  for (int i = 0; i < 200; ++i) {
    auto st = (*c)->Stat();
    if (st.ok() && st->publishes_in_flight == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto st = (*c)->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->publishes_in_flight, 0u);
  EXPECT_EQ(st->store.entries, 0u);
  auto hit = (*c)->Lookup(TestModel(), Tokens(20, 3));
  ASSERT_TRUE(hit.ok());
  EXPECT_FALSE(hit->has_value());
}

TEST_F(DaemonTest, PublishesInFlightAreLimitedPerClient) {
  auto c = Client::Connect(d_.Options());
  ASSERT_TRUE(c.ok());
  const std::uint32_t limit = (*c)->server_info().max_publishes_in_flight;
  ASSERT_GT(limit, 0u);
  std::vector<std::unique_ptr<PublishStream>> open;
  for (std::uint32_t i = 0; i < limit; ++i) {
    auto s = (*c)->BeginPublish(TestModel(), Tokens(10, i), 1);
    ASSERT_TRUE(s.ok());
    open.push_back(std::move(*s));
  }
  auto extra = (*c)->BeginPublish(TestModel(), Tokens(10, 99), 1);
  ASSERT_TRUE(extra.ok());  // sent; the refusal arrives as the stream's error
  auto header = Bytes(10, 1);
  Status s = Status::Ok();
  auto done = (*extra)->Commit();
  EXPECT_TRUE(done.status().IsResourceExhausted()) << done.status().ToString();
  // Another connection has its own budget.
  auto other = Client::Connect(d_.Options());
  auto ok = (*other)->Publish(TestModel(), Tokens(10, 50), MakeLayers(10, 1, 50));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  for (auto& o : open) EXPECT_TRUE(o->Abort().ok());
}

TEST_F(DaemonTest, DestructiveOpsNeedTheAdminSocket) {
  auto c = Client::Connect(d_.Options());
  ASSERT_TRUE(c.ok());
  auto pub = (*c)->Publish(TestModel(), Tokens(10, 1), MakeLayers(10, 1, 1));
  ASSERT_TRUE(pub.ok());
  Status del = (*c)->Delete(pub->id);
  EXPECT_EQ(del.code(), StatusCode::kFailedPrecondition) << del.ToString();
  EXPECT_NE(del.message().find("permission denied"), std::string::npos);
  EXPECT_EQ((*c)->SetByteBudget(0).code(), StatusCode::kFailedPrecondition);
  ListOptions lo;
  lo.ns = "another-tenant";  // another namespace than the connection's: every namespace is asked for
  auto all = (*c)->List(lo);
  EXPECT_EQ(all.status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*c)->Lookup(TestModel(), Tokens(10, 1))->has_value());

  ClientOptions ao = d_.Options();
  ao.endpoint = d_.admin_socket();
  auto admin = Client::Connect(ao);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  EXPECT_TRUE((*admin)->server_info().admin);
  EXPECT_TRUE((*admin)->SetByteBudget(0).ok());
  EXPECT_TRUE((*admin)->Delete(pub->id).ok());
  EXPECT_TRUE((*admin)->Delete(pub->id).IsNotFound());
  EXPECT_FALSE((*c)->Lookup(TestModel(), Tokens(10, 1))->has_value());
}

TEST_F(DaemonTest, NamespacesKeepTenantsApart) {
  auto a = Client::Connect(d_.Options("tenant-a"));
  auto b = Client::Connect(d_.Options("tenant-b"));
  ASSERT_TRUE(a.ok() && b.ok());
  const auto tokens = Tokens(50, 77);
  auto pub = (*a)->Publish(TestModel(), tokens, MakeLayers(50, 1, 77));
  ASSERT_TRUE(pub.ok());
  EXPECT_TRUE((*a)->Lookup(TestModel(), tokens)->has_value());
  EXPECT_FALSE((*b)->Lookup(TestModel(), tokens)->has_value());
  EXPECT_TRUE((*b)->FetchLayers(pub->id).status().IsNotFound());
  EXPECT_TRUE((*b)->CheckEntry(pub->id).status().IsNotFound());
  EXPECT_EQ((*b)->List()->entries.size(), 0u);
  EXPECT_EQ((*a)->List()->entries.size(), 1u);
  // A raw request naming another namespace than the hello's is refused.
  RawConn r(d_.socket());
  ASSERT_TRUE(r.Hello("tenant-b"));
  auto m = ipc::BuildRequest(5, [&](wire::Request::Builder q) {
    auto l = q.initLookup().initQuery();
    l.setNamespace("tenant-a");
    l.initTokens(1).set(0, 1);
  });
  ASSERT_TRUE(r.Send(*m));
  auto f = r.Next();
  ASSERT_TRUE(f.has_value());
  auto rd = f->Reader({});
  auto resp = rd->getRoot<wire::Response>();
  ASSERT_EQ(resp.which(), wire::Response::ERROR);
  EXPECT_EQ(resp.getError().getCode(), wire::ErrorCode::PERMISSION_DENIED);
}

TEST_F(DaemonTest, VersionNegotiationAndHelloFirst) {
  RawConn r(d_.socket());
  ASSERT_TRUE(r.ok());
  auto stat = ipc::BuildRequest(3, [](wire::Request::Builder q) { q.setStat(); });
  ASSERT_TRUE(r.Send(*stat));
  auto f = r.Next();
  ASSERT_TRUE(f.has_value());
  {
    auto rd = f->Reader({});
    auto resp = rd->getRoot<wire::Response>();
    EXPECT_EQ(resp.getId(), 3u);
    ASSERT_EQ(resp.which(), wire::Response::ERROR);
    EXPECT_EQ(resp.getError().getCode(), wire::ErrorCode::PROTOCOL);
  }
  auto future = ipc::BuildRequest(4, [](wire::Request::Builder q) {
    q.initHello().setMinVersion(2);
    q.getHello().setMaxVersion(9);
  });
  ASSERT_TRUE(r.Send(*future));
  f = r.Next();
  ASSERT_TRUE(f.has_value());
  {
    auto rd = f->Reader({});
    auto resp = rd->getRoot<wire::Response>();
    ASSERT_EQ(resp.which(), wire::Response::ERROR);
    EXPECT_EQ(resp.getError().getCode(), wire::ErrorCode::NOT_SUPPORTED);
  }
  auto wide = ipc::BuildRequest(5, [](wire::Request::Builder q) {
    q.initHello().setMinVersion(0);
    q.getHello().setMaxVersion(7);
  });
  ASSERT_TRUE(r.Send(*wide));
  f = r.Next();
  ASSERT_TRUE(f.has_value());
  auto rd = f->Reader({});
  auto resp = rd->getRoot<wire::Response>();
  ASSERT_EQ(resp.which(), wire::Response::HELLO);
  EXPECT_EQ(resp.getHello().getVersion(), 1u);
}

TEST_F(DaemonTest, TimeoutWhenTheDaemonDoesNotAnswer) {
  ClientOptions o = d_.Options();
  o.timeout = std::chrono::milliseconds(300);
  o.reconnect_attempts = 0;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  kill(d_.pid(), SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = (*c)->Lookup(TestModel(), Tokens(5, 1));
  const auto took = std::chrono::steady_clock::now() - t0;
  kill(d_.pid(), SIGCONT);
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_LT(took, std::chrono::seconds(3));
  // The connection still works once the daemon runs again.
  auto again = (*c)->Lookup(TestModel(), Tokens(5, 1));
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST(DaemonNoServer, ConnectFailsUnavailable) {
  ClientOptions o;
  o.endpoint = MakeTempDir() + "/none.sock";
  o.reconnect_attempts = 1;
  o.reconnect_backoff = std::chrono::milliseconds(1);
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.status().IsUnavailable()) << c.status().ToString();
  std::filesystem::remove_all(std::filesystem::path(o.endpoint).parent_path());
}

TEST(DaemonLifecycle, RestartKeepsEntriesAndClientReconnects) {
  std::string dir;
  const auto tokens = Tokens(120, 11);
  const auto layers = MakeLayers(120, 2, 11);
  std::unique_ptr<Client> client;
  std::uint64_t entry = 0;
  {
    Daemon d;
    ASSERT_TRUE(d.Start());
    d.DisownDir();
    dir = d.dir();
    ClientOptions o = d.Options();
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok());
    client = std::move(*c);
    auto pub = client->Publish(TestModel(), tokens, layers);
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    entry = pub->id;
    EXPECT_EQ(d.Stop(), 0);
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/d.sock"));
  Daemon d2({}, dir);
  d2.OwnDir();
  ASSERT_TRUE(d2.Start());
  // The same client object: its connection died with the first daemon.
  auto hit = client->Lookup(TestModel(), tokens);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  ASSERT_TRUE(hit->has_value());
  EXPECT_EQ((*hit)->id, entry);
  auto got = client->FetchLayers(entry);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameLayers(layers, *got);
  EXPECT_TRUE(client->connected());
}

// The daemon dies while the client holds fetched chunks in its region: the
// fetch fails, the held bytes stay readable and intact until released,
// releasing them then is harmless, and the same client fetches whole from a
// restarted daemon.
TEST(DaemonLifecycle, KilledMidFetchWhileChunksAreHeld) {
  const auto tokens = Tokens(64, 29);
  const auto layers = MakeLayers(64, 3, 29, 4096, 4);  // 64 KiB chunks, 34 in all
  Daemon d;
  ASSERT_TRUE(d.Start());
  d.DisownDir();
  const std::string dir = d.dir();
  ClientOptions o = d.Options("", true);
  o.shared_memory_bytes = 1u << 20;  // a 512 KiB window: the fetch stalls after 8 held chunks
  o.reconnect_backoff = std::chrono::milliseconds(20);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  auto pub = (*c)->Publish(TestModel(), tokens, layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();

  struct Held {
    std::uint32_t layer, index;
    std::span<const std::byte> bytes;
    ChunkRelease release;
  };
  std::vector<Held> held;
  FetchCallbacks cb;
  cb.on_layer = [](std::uint32_t, std::span<const std::byte>, std::uint32_t) { return Status::Ok(); };
  cb.on_chunk_held = [&](std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                         ChunkRelease release) {
    held.push_back({layer, index, bytes, std::move(release)});
    if (held.size() == 8) d.Kill();  // the window is full: the daemon waits for releases that never come
    return Status::Ok();
  };
  Status s = (*c)->Fetch(pub->id, {}, cb);
  EXPECT_FALSE(s.ok());
  ASSERT_EQ(held.size(), 8u);
  for (const Held& h : held) {
    const auto& want = layers[h.layer].chunks[h.index];
    ASSERT_EQ(h.bytes.size(), want.size());
    EXPECT_EQ(std::memcmp(h.bytes.data(), want.data(), want.size()), 0) << h.layer << "/" << h.index;
  }
  for (Held& h : held) h.release();
  held.clear();

  Daemon again({}, dir);
  again.OwnDir();
  ASSERT_TRUE(again.Start());
  auto got = (*c)->FetchLayers(pub->id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameLayers(layers, *got);
}

TEST(DaemonLifecycle, SigtermDuringPublishAbortsItAndExitsCleanly) {
  std::string dir;
  const auto tokens = Tokens(60, 21);
  {
    Daemon d;
    ASSERT_TRUE(d.Start());
    d.DisownDir();
    dir = d.dir();
    auto c = Client::Connect(d.Options());
    ASSERT_TRUE(c.ok());
    // One committed entry, one publish left open.
    ASSERT_TRUE((*c)->Publish(TestModel(), Tokens(30, 20), MakeLayers(30, 1, 20)).ok());
    auto s = (*c)->BeginPublish(TestModel(), tokens, 2);
    ASSERT_TRUE(s.ok());
    const auto layers = MakeLayers(60, 2, 21, 64, 8);
    ASSERT_TRUE((*s)->BeginLayer(layers[0].header, static_cast<std::uint32_t>(layers[0].chunks.size())).ok());
    for (int i = 0; i < 4; ++i) ASSERT_TRUE((*s)->AddChunk(layers[0].chunks[i]).ok());
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(d.Stop(), 0);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    auto commit = (*s)->Commit();
    EXPECT_FALSE(commit.ok());
    EXPECT_FALSE(std::filesystem::exists(dir + "/d.sock"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/a.sock"));
  }
  Daemon d2({}, dir);
  d2.OwnDir();
  ASSERT_TRUE(d2.Start());
  auto c = Client::Connect(d2.Options());
  ASSERT_TRUE(c.ok());
  auto st = (*c)->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->store.entries, 1u);
  EXPECT_FALSE((*c)->Lookup(TestModel(), tokens)->has_value());
  EXPECT_TRUE((*c)->Lookup(TestModel(), Tokens(30, 20))->has_value());
}

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(DaemonLifecycle, TcpLoopbackAndConfigFile) {
  const std::string dir = MakeTempDir();
  const std::string cfg = dir + "/cfg.json";
  const int port = FreeLoopbackPort();
  {
    std::ofstream out(cfg);
    out << R"({"tcp_port": )" << port << R"(, "log_level": "warn", "max_publishes": 2, "capacity": "1G"})";
  }
  Daemon d({"--config", cfg});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->server_info().max_publishes_in_flight, 2u);

  ClientOptions t = d.Options();
  t.endpoint = "tcp:127.0.0.1:" + std::to_string(port);
  auto tc = Client::Connect(t);
  ASSERT_TRUE(tc.ok()) << tc.status().ToString();
  const auto layers = MakeLayers(33, 2, 61);
  auto pub = (*tc)->Publish(TestModel(), Tokens(33, 61), layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  auto got = (*tc)->FetchLayers(pub->id);
  ASSERT_TRUE(got.ok());
  ExpectSameLayers(layers, *got);
  // No shared memory over TCP.
  t.shared_memory = true;
  EXPECT_EQ(Client::Connect(t).status().code(), StatusCode::kNotSupported);
  std::filesystem::remove_all(dir);
}

TEST(DaemonLifecycle, SocketGroupReadyFileAndTenants) {
  const std::string dir = MakeTempDir();
  group* g = getgrgid(getgid());
  ASSERT_NE(g, nullptr);
  const std::string cfg = dir + "/cfg.json";
  {
    std::ofstream out(cfg);
    out << R"({"tenants": {")" << getuid() << R"(": ["team-a", ""]}})";
  }
  const std::string ready = dir + "/ready";
  Daemon d({"--config", cfg, "--socket-group", g->gr_name, "--ready-file", ready});
  ASSERT_TRUE(d.Start());
  struct stat st {};
  ASSERT_EQ(stat(d.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, getgid());
  ASSERT_EQ(stat(d.admin_socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // the admin socket never opens to a group
  {
    std::ifstream in(ready);
    std::string pid;
    in >> pid;
    EXPECT_EQ(pid, std::to_string(d.pid()));
  }
  EXPECT_TRUE(Client::Connect(d.Options("team-a")).ok());
  EXPECT_TRUE(Client::Connect(d.Options("")).ok());
  auto refused = Client::Connect(d.Options("team-b"));
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("permission denied"), std::string::npos);
  EXPECT_EQ(d.Stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(ready));
  std::filesystem::remove_all(dir);
}

TEST(DaemonLifecycle, RefusesASocketGroupOnASocketInsideThePrivateDataDir) {
  const std::string dir = MakeTempDir();
  const ProcessResult r = RunProcess({PRIMECACHED_PATH, "--data-dir", dir, "--socket-group", "root"});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--socket-group needs a --socket outside the data dir"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/primecached.sock"));
  std::filesystem::remove_all(dir);
}

TEST(DaemonLifecycle, RefusesSecondDaemonOnALiveSocket) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  Daemon twin({}, d.dir());
  twin.DisownDir();
  EXPECT_FALSE(twin.Start());
  EXPECT_TRUE(d.Alive());
  auto c = Client::Connect(d.Options());
  EXPECT_TRUE(c.ok());
}

}  // namespace
}  // namespace primecache::testing

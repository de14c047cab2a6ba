// The client's side of extents, against a daemon that lies: a crafted
// daemon (a socket that answers hello, attachDevice and each fetch with the
// stream its test scripts) sends fetchChunks whose extents are malformed, and
// the client refuses each before any callback sees it; a well-formed extent
// reaches on_device_extent whole.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>

#include "tests/ipc/crafted_server.h"
#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {
namespace {

constexpr std::uint64_t kWindow = 1u << 20;
constexpr std::uint32_t kChunks = 4;  // of the one layer every fetch announces

// One fetchChunk of layer `layer` in the device window.
struct Crafted {
  std::uint32_t layer = 0, index = 0, count = 0;
  std::vector<std::uint64_t> sizes;
  std::uint64_t offset = 0, length = 0;
  bool inline_bytes = false;
  bool shm = false;  // in the shared region instead of the device window
  // Where a fetchHit goes in the stream (of any fetch: the client must
  // refuse one to a fetch by entry).
  enum class Hit { kNone, kFirst, kTwice, kMiss, kAfterTheLayer, kTooLong } hit = Hit::kNone;
};

// A daemon that speaks just enough: hello (with device copies and fetches
// by query), attachDevice and shmAttach (ack; the region's descriptor is
// dropped unread), and a fetch of entry e (by query: e is the query's first
// token) answered with FetchLayer(0, kChunks), the fetchChunk script(e)
// gives, then fetchDone, with the script's fetchHit where it says. One
// connection at a time.
class CraftedDaemon {
 public:
  // `fetch_by_query` false: as an older daemon, which says nothing of it in
  // its hello and answers a lookup of query q with entry q[0], length 1.
  explicit CraftedDaemon(std::function<Crafted(std::uint64_t)> script, bool fetch_by_query = true)
      : script_(std::move(script)), fetch_by_query_(fetch_by_query), server_([this](int fd, ipc::Frame& f) {
          Answer(fd, f);
          return true;
        }) {}
  const std::string& path() const { return server_.path(); }
  // The length of the hit a lookup is answered (1 by default).
  void AnswerLookupsWithLength(std::uint32_t n) { lookup_length_ = n; }
  // Lookups, and fetches by query, it was sent.
  int lookups() const { return lookups_; }
  int queries() const { return queries_; }

 private:
  static void Put(int fd, const ipc::OutMessage& m) { CraftedServer::Put(fd, m); }
  void Answer(int fd, ipc::Frame& f) {
    auto rd = f.Reader({});
    auto q = rd->getRoot<wire::Request>();
    const std::uint64_t id = q.getId();
    if (q.which() == wire::Request::HELLO) {
      CraftedServer::PutHello(fd, id, 64u << 20, fetch_by_query_, /*device_copies=*/true);
    } else if (q.which() == wire::Request::LOOKUP) {
      auto tokens = q.getLookup().getQuery().getTokens();
      ++lookups_;
      Put(fd, *ipc::BuildResponse(id, [&](wire::Response::Builder r) {
        auto h = r.initLookup();
        h.setFound(tokens.size() != 0);
        h.setEntry(tokens.size() != 0 ? tokens[0] : 0);
        h.setLength(lookup_length_);
        h.setLayerCount(1);
        h.setSharedTokens(lookup_length_);
      }));
    } else if (q.which() == wire::Request::ATTACH_DEVICE || q.which() == wire::Request::SHM_ATTACH) {
      Put(fd, *ipc::BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
    } else if (q.which() == wire::Request::FETCH) {
      auto f = q.getFetch();
      if (f.hasQuery()) ++queries_;
      const bool by_query = f.hasQuery() && f.getQuery().getQuery().getTokens().size() != 0;
      const Crafted c = script_(by_query ? f.getQuery().getQuery().getTokens()[0] : f.getEntry());
      using Hit = Crafted::Hit;
      auto hit = [&](bool found, std::uint32_t length) {
        Put(fd, *ipc::BuildResponse(id, [&](wire::Response::Builder r) {
          auto h = r.initFetchHit();
          h.setFound(found);
          h.setEntry(found ? 9 : 0);
          h.setLength(found ? length : 0);
          h.setLayerCount(found ? 1 : 0);
        }));
      };
      if (c.hit == Hit::kFirst || c.hit == Hit::kTwice) hit(true, 1);
      if (c.hit == Hit::kTwice) hit(true, 1);
      if (c.hit == Hit::kMiss) hit(false, 0);
      if (c.hit == Hit::kTooLong) hit(true, 1000);
      Put(fd, *ipc::BuildResponse(id, [](wire::Response::Builder r) {
        auto l = r.initFetchLayer();
        l.setLayer(0);
        l.setChunkCount(kChunks);
      }));
      if (c.hit == Hit::kAfterTheLayer) hit(true, 1);
      Put(fd, *ipc::BuildResponse(id, [&](wire::Response::Builder r) {
        auto ch = r.initFetchChunk();
        ch.setLayer(c.layer);
        ch.setIndex(c.index);
        ch.setCount(c.count);
        auto s = ch.initSizes(static_cast<unsigned>(c.sizes.size()));
        for (unsigned i = 0; i < c.sizes.size(); ++i) s.set(i, c.sizes[i]);
        if (c.inline_bytes) {
          std::vector<kj::byte> bytes(c.length);
          ch.initData().setInline(kj::arrayPtr(bytes.data(), bytes.size()));
        } else if (c.shm) {
          auto d = ch.initData().initShm();
          d.setOffset(c.offset);
          d.setLength(c.length);
        } else {
          auto d = ch.initData().initDevice();
          d.setOffset(c.offset);
          d.setLength(c.length);
        }
      }));
      Put(fd, *ipc::BuildResponse(id, [](wire::Response::Builder r) { r.initFetchDone(); }));
    }
  }

  std::function<Crafted(std::uint64_t)> script_;
  const bool fetch_by_query_;
  std::atomic<int> lookups_{0}, queries_{0};
  std::atomic<std::uint32_t> lookup_length_{1};
  CraftedServer server_;  // last: its thread stops before the rest goes
};

// A client of `d` that tries once (a refused reply must not be retried
// away), with a shared region of `shm_bytes` when not 0.
Result<std::unique_ptr<Client>> ConnectTo(const CraftedDaemon& d, std::uint64_t shm_bytes = 0) {
  ClientOptions o;
  o.endpoint = d.path();
  o.timeout = std::chrono::milliseconds(5000);
  o.reconnect_attempts = 0;
  o.shared_memory = shm_bytes != 0;
  if (shm_bytes != 0) o.shared_memory_bytes = shm_bytes;
  return Client::Connect(o);
}

TEST(ClientExtentTest, MalformedExtentsAreRefusedAndAWellFormedOneArrivesWhole) {
  // Entry e of the crafted daemon answers with cases[e].
  const std::vector<std::pair<std::string, Crafted>> cases = {
      {"well formed", {0, 1, 2, {100, 200}, 4096, 300}},
      {"one chunk, an older daemon's way", {0, 3, 0, {}, 0, 77}},
      {"count 0 with sizes", {0, 0, 0, {100}, 0, 100}},
      {"count and sizes disagree", {0, 0, 3, {100, 100}, 0, 200}},
      {"several chunks without sizes", {0, 0, 2, {}, 0, 200}},
      {"past the layer's chunks", {0, 2, 3, {1, 1, 1}, 0, 3}},
      {"index past the layer", {0, 4, 1, {1}, 0, 1}},
      {"sizes short of the length", {0, 0, 2, {100, 100}, 0, 300}},
      {"sizes past the length", {0, 0, 2, {200, 200}, 0, 300}},
      {"outside the window", {0, 0, 2, {100, 100}, kWindow - 100, 200}},
      {"a layer not announced", {1, 0, 1, {10}, 0, 10}},
      {"several chunks inline", {0, 0, 2, {5, 5}, 0, 10, true}},
  };
  CraftedDaemon d([&](std::uint64_t e) { return e < cases.size() ? cases[e].second : Crafted{}; });
  auto c = ConnectTo(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  DeviceWindowSpec spec;
  spec.pci_bus_id = "0000:00:00.0";
  spec.handle.assign(kDeviceHandleBytes, '\x5a');
  spec.size = kWindow;
  ASSERT_TRUE((*c)->AttachDeviceWindow(spec).ok());
  for (std::uint64_t e = 0; e < cases.size(); ++e) {
    std::vector<DeviceExtent> got;
    std::vector<std::vector<std::uint64_t>> sizes;
    int chunks = 0;
    FetchCallbacks cb;
    cb.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte>) {
      ++chunks;
      return Status::Ok();
    };
    cb.on_device_extent = [&](const DeviceExtent& x, ChunkRelease release) {
      got.push_back(x);
      sizes.emplace_back(x.sizes.begin(), x.sizes.end());
      release();
      return Status::Ok();
    };
    const Status s = (*c)->Fetch(e, {}, cb);
    const std::string& name = cases[e].first;
    if (e == 0) {
      ASSERT_TRUE(s.ok()) << name << ": " << s.ToString();
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].layer, 0u);
      EXPECT_EQ(got[0].index, 1u);
      EXPECT_EQ(got[0].count, 2u);
      EXPECT_EQ(got[0].offset, 4096u);
      EXPECT_EQ(got[0].length, 300u);
      EXPECT_EQ(sizes[0], (std::vector<std::uint64_t>{100, 200}));
    } else if (e == 1) {
      ASSERT_TRUE(s.ok()) << name << ": " << s.ToString();
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].count, 1u);
      EXPECT_EQ(sizes[0], (std::vector<std::uint64_t>{77}));
    } else {
      EXPECT_TRUE(s.IsCorruption()) << name << ": " << s.ToString();
      EXPECT_TRUE(got.empty() && chunks == 0) << name << ": a callback saw what was refused";
    }
  }
}

// The shared region's runs: split into their chunks for on_chunk, and
// refused outside the fetch's window (the region's second half).
TEST(ClientExtentTest, SharedExtentsAreSplitAndRefusedOutsideTheFetchWindow) {
  constexpr std::uint64_t kRegion = 2u << 20;  // the fetch window is [1 MiB, 2 MiB)
  const std::vector<std::pair<std::string, Crafted>> cases = {
      {"a run of two in the window", {0, 1, 2, {100, 28}, kRegion / 2 + 4096, 128, false, true}},
      {"in the publish half", {0, 0, 1, {100}, 4096, 100, false, true}},
      {"past the region's end", {0, 0, 2, {50, 50}, kRegion - 50, 100, false, true}},
      {"sizes short of the length", {0, 0, 2, {50, 40}, kRegion / 2, 100, false, true}},
  };
  CraftedDaemon d([&](std::uint64_t e) { return e < cases.size() ? cases[e].second : Crafted{}; });
  auto c = ConnectTo(d, kRegion);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (std::uint64_t e = 0; e < cases.size(); ++e) {
    std::vector<std::pair<std::uint32_t, std::size_t>> chunks;  // index, bytes
    FetchCallbacks cb;
    cb.on_chunk = [&](std::uint32_t, std::uint32_t index, std::span<const std::byte> b) {
      chunks.emplace_back(index, b.size());
      return Status::Ok();
    };
    const Status s = (*c)->Fetch(e, {}, cb);
    const std::string& name = cases[e].first;
    if (e == 0) {
      ASSERT_TRUE(s.ok()) << name << ": " << s.ToString();
      EXPECT_EQ(chunks, (std::vector<std::pair<std::uint32_t, std::size_t>>{{1, 100}, {2, 28}})) << name;
    } else {
      EXPECT_TRUE(s.IsCorruption()) << name << ": " << s.ToString();
      EXPECT_TRUE(chunks.empty()) << name << ": a callback saw what was refused";
    }
  }
}

// A fetch by query's fetchHit, checked where it stands: once, first, never
// to a fetch by entry, never after a miss but fetchDone, and a prefix of the
// query; what is refused reaches no callback.
TEST(ClientExtentTest, AFetchByQuerysHitMustComeFirstAndOnce) {
  using Hit = Crafted::Hit;
  auto with = [](Hit h) {
    Crafted c{0, 0, 1, {10}, 0, 10, true};  // one chunk inline
    c.hit = h;
    return c;
  };
  const std::vector<std::pair<std::string, Crafted>> cases = {
      {"a hit, then its layer", with(Hit::kFirst)},
      {"no hit at all", with(Hit::kNone)},
      {"two hits", with(Hit::kTwice)},
      {"a miss, then a layer", with(Hit::kMiss)},
      {"the layer, then the hit", with(Hit::kAfterTheLayer)},
      {"a hit longer than the query", with(Hit::kTooLong)},
  };
  CraftedDaemon d([&](std::uint64_t e) { return e < cases.size() ? cases[e].second : Crafted{}; });
  auto c = ConnectTo(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*c)->server_info().fetch_by_query);
  for (std::uint32_t e = 0; e < cases.size(); ++e) {
    const std::string& name = cases[e].first;
    std::vector<std::string> seen;
    FetchCallbacks cb;
    cb.on_hit = [&](const LookupHit& h) {
      seen.push_back("hit " + std::to_string(h.id));
      return Status::Ok();
    };
    cb.on_layer = [&](std::uint32_t l, std::span<const std::byte>, std::uint32_t) {
      seen.push_back("layer " + std::to_string(l));
      return Status::Ok();
    };
    cb.on_chunk = [&](std::uint32_t, std::uint32_t i, std::span<const std::byte>) {
      seen.push_back("chunk " + std::to_string(i));
      return Status::Ok();
    };
    const std::vector<std::uint32_t> query = {e, 1, 2, 3};
    auto r = (*c)->LookupAndFetch(TestModel(), query, cb);
    if (e == 0) {
      ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
      ASSERT_TRUE(r->has_value()) << name;
      EXPECT_EQ((*r)->id, 9u);
      EXPECT_EQ(seen, (std::vector<std::string>{"hit 9", "layer 0", "chunk 0"})) << name;
    } else {
      EXPECT_TRUE(r.status().IsCorruption()) << name << ": " << r.status().ToString();
      EXPECT_TRUE(seen.empty() || (e == 2 && seen.size() == 1)) << name << ": a callback saw what was refused";
    }
  }
  // A fetch by entry is never sent a hit.
  std::vector<std::string> seen;
  FetchCallbacks cb;
  cb.on_layer = [&](std::uint32_t, std::span<const std::byte>, std::uint32_t) {
    seen.push_back("layer");
    return Status::Ok();
  };
  const Status s = (*c)->Fetch(0, {}, cb);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_TRUE(seen.empty());
}

// Against a daemon that does not fetch by query, LookupAndFetch makes a
// lookup and then a fetch of its hit, with the same callbacks in the same
// order; it never sends such a daemon a fetch by query.
TEST(ClientExtentTest, LookupAndFetchFromAnOlderDaemonIsALookupThenAFetch) {
  Crafted one{0, 0, 1, {10}, 0, 10, true};  // one chunk inline
  CraftedDaemon d([&](std::uint64_t e) { return e == 5 ? one : Crafted{}; }, /*fetch_by_query=*/false);
  auto c = ConnectTo(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE((*c)->server_info().fetch_by_query);
  std::vector<std::string> seen;
  FetchCallbacks cb;
  cb.on_hit = [&](const LookupHit& h) {
    seen.push_back("hit " + std::to_string(h.id));
    return Status::Ok();
  };
  cb.on_layer = [&](std::uint32_t l, std::span<const std::byte>, std::uint32_t) {
    seen.push_back("layer " + std::to_string(l));
    return Status::Ok();
  };
  cb.on_chunk = [&](std::uint32_t, std::uint32_t i, std::span<const std::byte>) {
    seen.push_back("chunk " + std::to_string(i));
    return Status::Ok();
  };
  const std::vector<std::uint32_t> query = {5, 6, 7};
  auto r = (*c)->LookupAndFetch(TestModel(), query, cb);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->id, 5u);
  EXPECT_EQ(seen, (std::vector<std::string>{"hit 5", "layer 0", "chunk 0"}));
  EXPECT_EQ(d.lookups(), 1);
  EXPECT_EQ(d.queries(), 0);
}

// A lookup's hit is a prefix of the query or nothing: a hit of no tokens or
// of more than the query has is refused, with the branch point asked for or
// not (the cases of ipc_lookup_reply_fuzzer's seeds hit-of-no-tokens, hit-past-query
// and hit-past-query-shared, tests/fuzz/corpus/ipc_lookup_reply/).
TEST(ClientExtentTest, ALookupHitMustBeAPrefixOfTheQuery) {
  CraftedDaemon d([](std::uint64_t) { return Crafted{}; }, /*fetch_by_query=*/false);
  auto c = ConnectTo(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::vector<std::uint32_t> query = {5, 6, 7};
  for (std::uint32_t length : {0u, 4u, 1000u, 0xffffffffu}) {
    d.AnswerLookupsWithLength(length);
    std::uint64_t shared = 0;
    auto plain = (*c)->Lookup(TestModel(), query);
    EXPECT_TRUE(plain.status().IsCorruption()) << length << ": " << plain.status().ToString();
    auto with_shared = (*c)->Lookup(TestModel(), query, &shared);
    EXPECT_TRUE(with_shared.status().IsCorruption()) << length << ": " << with_shared.status().ToString();
    auto fetched = (*c)->LookupAndFetch(TestModel(), query, FetchCallbacks{});
    EXPECT_TRUE(fetched.status().IsCorruption()) << length << ": " << fetched.status().ToString();
  }
  d.AnswerLookupsWithLength(3);
  std::uint64_t shared = 0;
  auto whole = (*c)->Lookup(TestModel(), query, &shared);
  ASSERT_TRUE(whole.ok() && whole->has_value()) << whole.status().ToString();
  EXPECT_EQ((*whole)->length, 3u);
  EXPECT_EQ(shared, 3u);
}

}  // namespace
}  // namespace primecache::testing

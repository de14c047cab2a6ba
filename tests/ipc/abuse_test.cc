// The daemon against bad peers: garbage, truncated, oversize and deeply nested
// messages, a reader that stops reading, and a request made by the stock
// `capnp` tool.
#include <capnp/any.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {
namespace {

class AbuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.Start());
    auto c = Client::Connect(d_.Options());
    ASSERT_TRUE(c.ok());
    good_ = std::move(*c);
    auto pub = good_->Publish(TestModel(), Tokens(40, 1), MakeLayers(40, 2, 1));
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    entry_ = pub->id;
  }

  // The daemon is alive and a well-behaved client notices nothing.
  void ExpectHealthy() {
    ASSERT_TRUE(d_.Alive());
    auto hit = good_->Lookup(TestModel(), Tokens(40, 1));
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    EXPECT_TRUE(hit->has_value());
    auto got = good_->FetchLayers(entry_);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->size(), 2u);
    auto fresh = Client::Connect(d_.Options());
    ASSERT_TRUE(fresh.ok());
    EXPECT_TRUE((*fresh)->Stat().ok());
  }

  static wire::ErrorCode ErrorOf(const ipc::Frame& f) {
    auto rd = f.Reader({});
    auto r = rd->getRoot<wire::Response>();
    EXPECT_EQ(r.which(), wire::Response::ERROR);
    return r.which() == wire::Response::ERROR ? r.getError().getCode() : wire::ErrorCode::INTERNAL;
  }

  Daemon d_;
  std::unique_ptr<Client> good_;
  std::uint64_t entry_ = 0;
};

TEST_F(AbuseTest, GarbageBytesCloseOnlyThatConnection) {
  RawConn bad(d_.socket());
  ASSERT_TRUE(bad.ok());
  auto junk = Bytes(1 << 16, 42);
  bad.SendBytes(junk.data(), junk.size());
  // An error reply (id 0, code protocol), then the daemon hangs up.
  auto f = bad.Next();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(ErrorOf(*f), wire::ErrorCode::PROTOCOL);
  EXPECT_TRUE(bad.ClosedByPeer());
  ExpectHealthy();
}

TEST_F(AbuseTest, WellFramedGarbageGetsErrorsOrAClose) {
  std::mt19937 g(7);
  for (int round = 0; round < 30; ++round) {
    RawConn bad(d_.socket());
    ASSERT_TRUE(bad.ok());
    bool hello = round % 2 == 0;
    if (hello) {
      ASSERT_TRUE(bad.Hello());
    }
    // Frames whose table is right but whose words are random.
    for (int k = 0; k < 20; ++k) {
      const std::uint32_t words = 1 + g() % 64;
      std::vector<std::uint32_t> buf(2 + words * 2);
      buf[0] = 0;
      buf[1] = words;
      for (std::size_t i = 2; i < buf.size(); ++i) buf[i] = g();
      if (!bad.SendBytes(buf.data(), buf.size() * 4)) break;
    }
    // Whatever came back is an error reply, or the connection was closed.
    for (;;) {
      auto f = bad.Next(100);
      if (!f) break;
      auto rd = f->Reader({});
      auto r = rd->getRoot<wire::Response>();
      EXPECT_EQ(r.which(), wire::Response::ERROR);
    }
  }
  ExpectHealthy();
}

TEST_F(AbuseTest, TruncatedFramesAreHarmless) {
  {
    RawConn cut(d_.socket());
    ASSERT_TRUE(cut.Hello());
    std::uint32_t table[2] = {0, 100};  // promises 800 bytes
    ASSERT_TRUE(cut.SendBytes(table, sizeof(table)));
    auto junk = Bytes(40, 3);
    ASSERT_TRUE(cut.SendBytes(junk.data(), junk.size()));
    // Held open half-sent while others work.
    ExpectHealthy();
  }  // and dropped mid-frame
  {
    RawConn cut(d_.socket());
    std::uint32_t half = 0;
    ASSERT_TRUE(cut.SendBytes(&half, 2));  // not even a whole segment count
  }
  ExpectHealthy();
}

TEST_F(AbuseTest, OversizeMessagesAreRefusedBeforeAllocation) {
  {
    RawConn big(d_.socket());
    ASSERT_TRUE(big.Hello());
    std::uint32_t table[2] = {0, 0x10000000};  // a 2 GiB segment
    ASSERT_TRUE(big.SendBytes(table, sizeof(table)));
    auto f = big.Next();
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(ErrorOf(*f), wire::ErrorCode::PROTOCOL);
    EXPECT_TRUE(big.ClosedByPeer());
  }
  {
    RawConn many(d_.socket());
    std::vector<std::uint32_t> table(1 + 1000, 1);
    table[0] = 999;  // 1000 segments
    ASSERT_TRUE(many.SendBytes(table.data(), table.size() * 4));
    auto f = many.Next();
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(ErrorOf(*f), wire::ErrorCode::PROTOCOL);
    EXPECT_TRUE(many.ClosedByPeer());
  }
  {
    // Within the frame limit but a chunk over the chunk limit.
    RawConn r(d_.socket());
    ASSERT_TRUE(r.Hello());
    const std::size_t chunk_limit = good_->server_info().max_chunk_bytes;
    auto begin = ipc::BuildRequest(2, [&](wire::Request::Builder q) {
      auto pb = q.initPublishBegin();
      pb.setLayerCount(1);
      auto b = pb.initBoundary();
      b.initTokens(1).set(0, 5);
      b.setLength(1);
    });
    ASSERT_TRUE(r.Send(*begin));
    auto layer = ipc::BuildRequest(3, [&](wire::Request::Builder q) {
      auto l = q.initPublishLayer();
      l.setPublish(2);
      l.setChunkCount(1);
    });
    ASSERT_TRUE(r.Send(*layer));
    auto chunk = ipc::BuildRequest(4, [&](wire::Request::Builder q) {
      auto c = q.initPublishChunk();
      c.setPublish(2);
      c.initData().initInline(static_cast<unsigned>(chunk_limit + 1));
    }, chunk_limit / 8 + 64);
    ASSERT_TRUE(r.Send(*chunk));
    bool refused = false;
    for (int i = 0; i < 3; ++i) {
      auto f = r.Next();
      ASSERT_TRUE(f.has_value());
      auto rd = f->Reader({});
      auto resp = rd->getRoot<wire::Response>();
      if (resp.getId() == 4) {
        ASSERT_EQ(resp.which(), wire::Response::ERROR);
        EXPECT_EQ(resp.getError().getCode(), wire::ErrorCode::INVALID_ARGUMENT);
        refused = true;
      }
    }
    EXPECT_TRUE(refused);
  }
  ExpectHealthy();
}

TEST_F(AbuseTest, DeeplyNestedMessageIsRefusedAndTheConnectionLives) {
  RawConn r(d_.socket());
  ASSERT_TRUE(r.ok());
  {
    // A Request-shaped root (id 77, union = hello) whose hello pointer opens
    // a chain of 200 nested structs.
    auto b = std::make_unique<capnp::MallocMessageBuilder>();
    auto root = b->initRoot<capnp::AnyPointer>().initAsAnyStruct(2, 1);
    auto data = root.getDataSection();
    const std::uint64_t id = 77;
    std::memcpy(data.begin(), &id, 8);
    auto p = root.getPointerSection()[0];
    for (int depth = 0; depth < 200; ++depth) {
      auto s = p.initAsAnyStruct(1, 1);
      p = s.getPointerSection()[0];
    }
    ipc::OutMessage m(std::move(b));
    ASSERT_TRUE(r.Send(m));
  }
  auto f = r.Next();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(ErrorOf(*f), wire::ErrorCode::PROTOCOL);
  // Same connection, a proper hello now works.
  ASSERT_TRUE(r.Hello());
  ExpectHealthy();
}

TEST_F(AbuseTest, PointerAmplificationHitsTheTraversalLimit) {
  RawConn r(d_.socket());
  ASSERT_TRUE(r.Hello());
  // A lookup whose token list is 512 K entries; the frame limit lets it in,
  // but each is read exactly once: fine. Then a message whose pointers all
  // alias one large list: refused by the traversal budget.
  auto b = std::make_unique<capnp::MallocMessageBuilder>();
  auto root = b->initRoot<capnp::AnyPointer>().initAsAnyStruct(2, 64);
  auto ptrs = root.getPointerSection();
  auto big = ptrs[0].initAs<capnp::List<std::uint64_t>>(100000);
  (void)big;
  ipc::OutMessage shell(std::move(b));
  auto flat = ipc::Flatten(shell);
  // Rewrite pointers 1..63 to alias pointer 0's target (same offset rebased).
  auto* words = reinterpret_cast<std::uint64_t*>(flat.data() + 8);  // after the table
  // words[0] root ptr, words[1..2] data, words[3..66] pointers.
  const std::uint64_t p0 = words[3];
  const std::int32_t off0 = static_cast<std::int32_t>(static_cast<std::uint32_t>(p0) >> 2);
  for (int i = 1; i < 64; ++i) {
    const std::int32_t off = off0 - i;
    words[3 + i] = (p0 & 0xFFFFFFFF00000003ull) | (static_cast<std::uint64_t>(static_cast<std::uint32_t>(off) << 2));
  }
  ASSERT_TRUE(r.SendBytes(flat.data(), flat.size()));
  auto f = r.Next();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(ErrorOf(*f), wire::ErrorCode::PROTOCOL);
  ExpectHealthy();
}

// Whether the peer of `fd` stopped sending: bytes wait unread in its receive
// queue and their count has not changed over five looks 100 ms apart. False
// when that does not happen within 20 s.
bool SenderStalled(int fd) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int last = -1, same = 0;
  while (std::chrono::steady_clock::now() < end) {
    int queued = 0;
    if (ioctl(fd, FIONREAD, &queued) != 0) return false;
    same = queued > 0 && queued == last ? same + 1 : 0;
    if (same >= 5) return true;
    last = queued;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(Backpressure, SlowReaderDoesNotMakeTheDaemonBuffer) {
  Daemon d({"--write-queue", "4M"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok());
  // One latent layer of 81920 tokens x 576 floats: 80 chunks of 2.25 MiB.
  const auto tokens = Tokens(81920, 1);
  const auto layers = MakeLayers(81920, 1, 1, 576, 1024);
  const std::size_t kChunks = layers[0].chunks.size();
  ASSERT_EQ(kChunks, 80u);
  std::uint64_t total = 0;
  for (const auto& ch : layers[0].chunks) total += ch.size();
  auto pub = (*c)->Publish(TestModel(), tokens, layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();

  RawConn slow(d.socket());
  ASSERT_TRUE(slow.Hello());
  // Keep the kernel's buffers small so what piles up is the daemon's own.
  int small = 64 << 10;
  setsockopt(slow.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long before = d.RssKiB();
  auto fetch = ipc::BuildRequest(9, [&](wire::Request::Builder q) { q.initFetch().setEntry(pub->id); });
  ASSERT_TRUE(slow.Send(*fetch));
  // What the daemon buffers is measured once it has stalled on this reader:
  // bytes wait in the socket and none arrive any more.
  ASSERT_TRUE(SenderStalled(slow.fd())) << "the fetch never stalled on the slow reader";
  const long during = d.RssKiB();
  // Others are served meanwhile.
  auto hit = (*c)->Lookup(TestModel(), tokens);
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->has_value());
  // Unbounded buffering would hold the whole 180 MiB entry. What a stalled
  // fetch may hold: the write queue (4 MiB), the chunks read ahead (8 MiB),
  // and what the read threads' allocator arenas keep of freed chunk buffers.
  EXPECT_LT(during - before, 64 * 1024) << "daemon RSS grew from " << before << " KiB to " << during << " KiB";

  // Now read it all: every byte arrives, in order.
  std::uint64_t bytes = 0;
  std::uint32_t chunks = 0;
  for (;;) {
    auto f = slow.Next(20000);
    ASSERT_TRUE(f.has_value());
    auto rd = f->Reader([] {
      ipc::FrameLimits l;
      l.traversal_factor = 4;
      return l;
    }());
    auto r = rd->getRoot<wire::Response>();
    if (r.which() == wire::Response::FETCH_CHUNK) {
      auto ch = r.getFetchChunk();
      EXPECT_EQ(ch.getIndex(), chunks);
      auto data = ch.getData().getInline();
      const auto& want = layers[0].chunks[chunks];
      ASSERT_EQ(data.size(), want.size());
      EXPECT_EQ(std::memcmp(data.begin(), want.data(), want.size()), 0);
      bytes += data.size();
      ++chunks;
    } else if (r.which() == wire::Response::FETCH_DONE) {
      break;
    } else {
      ASSERT_EQ(r.which(), wire::Response::FETCH_LAYER);
    }
  }
  EXPECT_EQ(chunks, kChunks);
  EXPECT_EQ(bytes, total);
}

// ---- the stock capnp tool ------------------------------------------------------

std::string Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) out += "\n[exit " + std::to_string(rc) + "]";
  return out;
}

TEST_F(AbuseTest, RequestEncodedByTheCapnpToolIsAnswered) {
  // An entry with known tokens and model.
  const std::vector<std::uint32_t> tokens = {10, 20, 30, 40, 50};
  const ModelId model{Hash128{4242, 99}, "tool-model", "", {}};
  auto pub = good_->Publish(model, tokens, MakeLayers(5, 1, 5));
  ASSERT_TRUE(pub.ok());

  const std::string dir = d_.dir();
  {
    std::ofstream(dir + "/hello.txt") << "(id = 1, hello = (minVersion = 1, maxVersion = 1, client = \"capnp-tool\"))\n";
    std::ofstream(dir + "/lookup.txt")
        << "(id = 2, lookup = (query = (fingerprint = (digestLo = 4242, digestHi = 99), "
           "tokens = [10, 20, 30, 40, 50, 60, 70])))\n";
  }
  const std::string enc = std::string(CAPNP_TOOL) + " encode " + SCHEMA_FILE + " Request";
  ASSERT_EQ(Shell(enc + " < " + dir + "/hello.txt > " + dir + "/req.bin"), "");
  ASSERT_EQ(Shell(enc + " < " + dir + "/lookup.txt >> " + dir + "/req.bin"), "");

  std::ifstream in(dir + "/req.bin", std::ios::binary);
  std::string req((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(req.size(), 16u);
  RawConn r(d_.socket());
  ASSERT_TRUE(r.SendBytes(req.data(), req.size()));
  // Keep the raw reply bytes for the tool.
  std::string raw;
  ipc::FrameDecoder dec({});
  std::vector<ipc::Frame> frames;
  while (frames.size() < 2) {
    pollfd pf{r.fd(), POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, 10000), 1);
    auto buf = dec.ReadBuffer();
    ssize_t n = recv(r.fd(), buf.data(), buf.size(), 0);
    ASSERT_GT(n, 0);
    raw.append(reinterpret_cast<const char*>(buf.data()), static_cast<std::size_t>(n));
    ASSERT_TRUE(dec.Consume(static_cast<std::size_t>(n), &frames).ok());
  }
  std::ofstream(dir + "/resp.bin", std::ios::binary) << raw;
  const std::string text =
      Shell(std::string(CAPNP_TOOL) + " decode --short " + SCHEMA_FILE + " Response < " + dir + "/resp.bin");
  EXPECT_NE(text.find("id = 1, hello = (version = 1"), std::string::npos) << text;
  EXPECT_NE(text.find("id = 2, lookup = (found = true, length = 5, entry = " + std::to_string(pub->id)),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace primecache::testing

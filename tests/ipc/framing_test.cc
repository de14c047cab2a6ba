// The framing decoder and the session's dispatch, in process.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <atomic>
#include <random>
#include <thread>

#include "ipc/framing.h"
#include "ipc/session.h"
#include "ipc/shm.h"
#include "ipc/wire.h"
#include "session_harness.h"

namespace primecache::ipc {
namespace {

std::vector<std::byte> Encode(std::uint64_t id, std::size_t blob) {
  auto m = BuildRequest(id, [&](wire::Request::Builder r) {
    auto c = r.initPublishChunk();
    c.setPublish(id * 3);
    auto d = c.initData().initInline(static_cast<unsigned>(blob));
    for (std::size_t i = 0; i < blob; ++i) d[i] = static_cast<kj::byte>(i * 7 + id);
  });
  return Flatten(*m);
}

void Check(const Frame& f, std::uint64_t id, std::size_t blob) {
  auto rd = f.Reader({});
  auto r = rd->getRoot<wire::Request>();
  ASSERT_EQ(r.getId(), id);
  auto d = r.getPublishChunk().getData().getInline();
  ASSERT_EQ(d.size(), blob);
  for (std::size_t i = 0; i < blob; ++i) ASSERT_EQ(d[i], static_cast<kj::byte>(i * 7 + id));
}

TEST(Framing, DecodesAcrossEveryReadSize) {
  // Small and stage-overflowing frames, back to back, fed in random pieces.
  const std::vector<std::size_t> sizes = {0, 1, 100, 70000, 5, 300000, 8};
  std::vector<std::byte> stream;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto e = Encode(i + 1, sizes[i]);
    stream.insert(stream.end(), e.begin(), e.end());
  }
  std::mt19937 g(1);
  for (int trial = 0; trial < 20; ++trial) {
    FrameDecoder dec({}, 4096);
    std::vector<Frame> frames;
    std::size_t pos = 0;
    while (pos < stream.size()) {
      auto buf = dec.ReadBuffer();
      ASSERT_FALSE(buf.empty());
      std::size_t n = std::min<std::size_t>({buf.size(), stream.size() - pos, 1 + g() % (trial < 10 ? 7 : 100000)});
      std::memcpy(buf.data(), stream.data() + pos, n);
      pos += n;
      ASSERT_TRUE(dec.Consume(n, &frames).ok());
    }
    ASSERT_EQ(frames.size(), sizes.size());
    EXPECT_EQ(dec.Pending(), 0u);
    for (std::size_t i = 0; i < sizes.size(); ++i) Check(frames[i], i + 1, sizes[i]);
  }
}

TEST(Framing, RefusesOversizeAndTooManySegments) {
  FrameLimits lim;
  lim.max_message_bytes = 1 << 20;
  lim.max_segments = 8;
  {
    FrameDecoder dec(lim);
    std::uint32_t t[2] = {0, (2u << 20) / 8};
    auto buf = dec.ReadBuffer();
    std::memcpy(buf.data(), t, 8);
    std::vector<Frame> out;
    Status s = dec.Consume(8, &out);
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  }
  {
    FrameDecoder dec(lim);
    std::uint32_t t[1] = {8};  // nine segments
    auto buf = dec.ReadBuffer();
    std::memcpy(buf.data(), t, 4);
    std::vector<Frame> out;
    EXPECT_TRUE(dec.Consume(4, &out).IsInvalidArgument());
  }
  {
    FrameDecoder dec(lim);
    std::uint32_t t[1] = {0xFFFFFFFFu};  // 2^32 segments: the +1 must not wrap
    auto buf = dec.ReadBuffer();
    std::memcpy(buf.data(), t, 4);
    std::vector<Frame> out;
    EXPECT_TRUE(dec.Consume(4, &out).IsInvalidArgument());
  }
  {
    // Sizes that sum past 2^32 words.
    FrameDecoder dec(lim);
    std::uint32_t t[4] = {2, 0xFFFFFFFFu, 0xFFFFFFFFu, 2};
    auto buf = dec.ReadBuffer();
    std::memcpy(buf.data(), t, 16);
    std::vector<Frame> out;
    EXPECT_TRUE(dec.Consume(16, &out).IsInvalidArgument());
  }
}

TEST(Framing, ASegmentTableLargerThanTheStageIsHeldWhileTheStageGrows) {
  // A frame of 2,000 one-word segments: its table (8,008 bytes with its
  // padding) outgrows a 4,096-byte stage, which must grow and keep what it
  // holds, however the bytes arrive. Each word carries its segment's index.
  constexpr std::uint32_t kSegments = 2000;
  std::vector<std::byte> frame((4 + 4 * kSegments + 4) / 8 * 8 + 8 * kSegments);
  auto put32 = [&](std::size_t at, std::uint32_t v) { std::memcpy(frame.data() + at, &v, 4); };
  put32(0, kSegments - 1);
  for (std::uint32_t i = 0; i < kSegments; ++i) put32(4 + 4 * i, 1);
  const std::size_t body = frame.size() - 8 * kSegments;
  for (std::uint32_t i = 0; i < kSegments; ++i) put32(body + 8 * i, i);
  std::vector<std::byte> stream = Encode(1, 100);
  stream.insert(stream.end(), frame.begin(), frame.end());
  FrameLimits lim;
  lim.max_segments = 4096;
  std::mt19937 g(2);
  for (int trial = 0; trial < 10; ++trial) {
    FrameDecoder dec(lim, 4096);
    std::vector<Frame> frames;
    for (std::size_t pos = 0; pos < stream.size();) {
      auto buf = dec.ReadBuffer();
      const std::size_t n =
          std::min<std::size_t>({buf.size(), stream.size() - pos, 1 + g() % (trial < 5 ? 7 : 5000)});
      std::memcpy(buf.data(), stream.data() + pos, n);
      pos += n;
      ASSERT_TRUE(dec.Consume(n, &frames).ok());
    }
    ASSERT_EQ(frames.size(), 2u);
    Check(frames[0], 1, 100);
    EXPECT_EQ(frames[1].total_bytes(), frame.size());
    EXPECT_EQ(dec.Pending(), 0u);
    auto rd = frames[1].Reader({});
    auto& segments = static_cast<capnp::SegmentArrayMessageReader&>(*rd);
    for (std::uint32_t i = 0; i < kSegments; ++i) {
      auto seg = segments.getSegment(i);
      ASSERT_EQ(seg.size(), 1u);
      std::uint32_t v = 0;
      std::memcpy(&v, seg.begin(), 4);
      ASSERT_EQ(v, i) << "segment " << i << " of trial " << trial;
    }
  }
}

TEST(Framing, MultiSegmentMessagesRoundTrip) {
  auto b = std::make_unique<capnp::MallocMessageBuilder>(16, capnp::AllocationStrategy::FIXED_SIZE);
  auto r = b->initRoot<wire::Request>();
  r.setId(5);
  auto t = r.initLookup().initQuery().initTokens(1000);
  for (unsigned i = 0; i < 1000; ++i) t.set(i, i * 3);
  OutMessage m(std::move(b));
  ASSERT_GT(m.iov().size(), 2u);  // table + several segments
  auto flat = Flatten(m);
  FrameDecoder dec({});
  auto buf = dec.ReadBuffer();
  ASSERT_GE(buf.size(), flat.size());
  std::memcpy(buf.data(), flat.data(), flat.size());
  std::vector<Frame> out;
  ASSERT_TRUE(dec.Consume(flat.size(), &out).ok());
  ASSERT_EQ(out.size(), 1u);
  auto rd = out[0].Reader({});
  auto q = rd->getRoot<wire::Request>().getLookup().getQuery().getTokens();
  ASSERT_EQ(q.size(), 1000u);
  EXPECT_EQ(q[999], 2997u);
}

// ---- the session, driven in process ------------------------------------------

TEST(Session, PublishOutOfOrderIsRefusedAndAborted) {
  session_testing::SessionRig rig;
  auto& store = rig.store;
  auto& sink = rig.sink;
  auto& counters = rig.counters;
  auto send = [&](std::uint64_t id, auto fill) { return rig.Send(id, fill) == Session::Connection::kKeep; };
  ASSERT_TRUE(send(1, [](wire::Request::Builder r) { r.initHello().setMaxVersion(1); }));
  ASSERT_TRUE(send(2, [](wire::Request::Builder r) {
    auto pb = r.initPublishBegin();
    pb.setLayerCount(2);
    pb.initBoundary().initTokens(3);
    pb.getBoundary().setLength(3);
  }));
  EXPECT_EQ(counters.publishes_in_flight.load(), 1u);
  // Layer 1 before layer 0.
  ASSERT_TRUE(send(3, [](wire::Request::Builder r) {
    auto l = r.initPublishLayer();
    l.setPublish(2);
    l.setLayer(1);
  }));
  ASSERT_EQ(sink->frames.size(), 3u);
  auto rd = sink->frames[2].Reader({});
  auto resp = rd->getRoot<wire::Response>();
  EXPECT_EQ(resp.getId(), 3u);
  ASSERT_EQ(resp.which(), wire::Response::ERROR);
  EXPECT_EQ(resp.getError().getCode(), wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(counters.publishes_in_flight.load(), 0u);  // aborted
  // The publish is gone.
  ASSERT_TRUE(send(4, [](wire::Request::Builder r) { r.initPublishCommit().setPublish(2); }));
  auto rd2 = sink->frames.back().Reader({});
  EXPECT_EQ(rd2->getRoot<wire::Response>().getError().getCode(), wire::ErrorCode::NOT_FOUND);
  EXPECT_EQ(store->Stat()->entries, 0u);
}

}  // namespace
}  // namespace primecache::ipc

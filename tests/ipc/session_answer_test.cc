// Every request a session is handed gets exactly one answer, its reply or an
// error, whatever refuses it: the property the handlers' Answer (ipc/
// session_answer.h) is there to keep. The table walks each request kind
// through its refusals and its success; the fuzzer's seed streams are
// replayed frame by frame. shmRelease and deviceRelease, which the protocol
// does not answer, get no answer unless refused.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "primecache/internal/codec.h"
#include "primecache/internal/snapshot.h"
#include "session_harness.h"

namespace primecache::ipc {
namespace {

using session_testing::SessionRig;
using Fill = std::function<void(wire::Request::Builder)>;

struct Step {
  const char* what;
  std::uint64_t id;
  Fill fill;
  std::size_t answers = 1;  // final answers expected (0: a release)
};

struct Seen {
  std::uint64_t id;
  wire::Response::Which which;
};

// The final answers sent since frame `from`: every response but a fetch's
// streamed layers and chunks.
std::vector<Seen> AnswersSince(const session_testing::CollectSink& sink, std::size_t from) {
  std::vector<Seen> out;
  for (std::size_t i = from; i < sink.frames.size(); ++i) {
    auto rd = sink.frames[i].Reader({});
    auto r = rd->getRoot<wire::Response>();
    if (r.which() == wire::Response::FETCH_LAYER || r.which() == wire::Response::FETCH_CHUNK) continue;
    out.push_back({r.getId(), r.which()});
  }
  return out;
}

void ExpectAnswers(SessionRig& rig, const std::vector<Step>& steps) {
  for (const Step& st : steps) {
    const std::size_t before = rig.sink->frames.size();
    EXPECT_EQ(rig.Send(st.id, st.fill), Session::Connection::kKeep) << st.what;
    auto answers = AnswersSince(*rig.sink, before);
    EXPECT_EQ(answers.size(), st.answers) << st.what;
    for (const Seen& a : answers) EXPECT_EQ(a.id, st.id) << st.what;
  }
}

Fill Hello(std::uint32_t lo, std::uint32_t hi, std::string ns = "") {
  return [=](wire::Request::Builder r) {
    auto h = r.initHello();
    h.setMinVersion(lo);
    h.setMaxVersion(hi);
    h.setNamespace(ns);
  };
}

struct BeginArgs {
  std::uint32_t layers = 1;
  std::uint32_t tokens = 3;
  std::uint32_t length = 3;
  std::string name = "m";
  std::string ns = "";
  std::size_t descriptor = 0;
  std::uint32_t attention_layers = 0;
};

Fill Begin(BeginArgs a) {
  return [=](wire::Request::Builder r) {
    auto pb = r.initPublishBegin();
    pb.setLayerCount(a.layers);
    auto b = pb.initBoundary();
    auto t = b.initTokens(a.tokens);
    for (unsigned i = 0; i < a.tokens; ++i) t.set(i, i + 1);
    b.setLength(a.length);
    b.setNamespace(a.ns);
    auto fp = b.initFingerprint();
    fp.setDigestLo(7);
    fp.setName(a.name);
    fp.initDescriptor(static_cast<unsigned>(a.descriptor));
    if (a.attention_layers != 0) pb.initCost().setAttentionLayers(a.attention_layers);
  };
}

// A real layer for a 3-token boundary (a commit checks what it stores):
// its header and its chunks.
struct Encoded {
  std::string header;
  std::vector<std::string> chunks;
};

const Encoded& ThreeTokenLayer() {
  static const Encoded e = [] {
    Encoded out;
    auto snap = MakeSnapshot(LatentShape{3, 4, 0, 0, 0, false, 0});
    EXPECT_TRUE(snap.ok());
    EncodeOptions eo;
    eo.all_planes = TransformSpec{std::string(kRawTransform), 0};
    auto enc = EncodeLayer(*snap, eo);
    EXPECT_TRUE(enc.ok()) << enc.status().ToString();
    out.header = SerializeLayerHeader(enc->header);
    for (const auto& c : enc->chunks) out.chunks.emplace_back(reinterpret_cast<const char*>(c.data()), c.size());
    return out;
  }();
  return e;
}

Fill Layer(std::uint64_t pub, std::uint32_t layer, std::uint32_t chunks, std::size_t header = 0) {
  return [=](wire::Request::Builder r) {
    auto l = r.initPublishLayer();
    l.setPublish(pub);
    l.setLayer(layer);
    l.setChunkCount(chunks);
    if (header != 0) {
      l.initHeader(static_cast<unsigned>(header));
    } else {
      const std::string& h = ThreeTokenLayer().header;
      l.setHeader(kj::arrayPtr(reinterpret_cast<const kj::byte*>(h.data()), h.size()));
    }
  };
}

Fill Chunk(std::uint64_t pub, std::uint32_t layer, std::uint32_t index) {
  return [=](wire::Request::Builder r) {
    auto c = r.initPublishChunk();
    c.setPublish(pub);
    c.setLayer(layer);
    c.setIndex(index);
    const auto& chunks = ThreeTokenLayer().chunks;
    const std::string& bytes = chunks[index % chunks.size()];
    c.initData().setInline(kj::arrayPtr(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()));
  };
}

Fill Commit(std::uint64_t pub) {
  return [=](wire::Request::Builder r) { r.initPublishCommit().setPublish(pub); };
}
Fill Abort(std::uint64_t pub) {
  return [=](wire::Request::Builder r) { r.initPublishAbort().setPublish(pub); };
}

Fill Fetch(const std::uint64_t* entry, std::uint32_t layers = 0, bool shm = false, bool device = false) {
  return [=](wire::Request::Builder r) {
    auto f = r.initFetch();
    f.setEntry(*entry);
    f.initLayers(layers);
    if (shm) f.initShmWindow().setLength(4096);
    if (device) f.initDeviceWindow().setLength(4096);
  };
}

SessionLimits SmallLimits() {
  SessionLimits l;
  l.max_descriptor_bytes = 16;
  l.max_layers = 4;
  l.max_publishes_in_flight = 2;
  return l;
}

std::uint64_t PublishedEntry(const session_testing::CollectSink& sink) {
  auto rd = sink.frames.back().Reader({});
  auto r = rd->getRoot<wire::Response>();
  EXPECT_EQ(r.which(), wire::Response::PUBLISHED)
      << (r.which() == wire::Response::ERROR ? r.getError().getMessage().cStr() : "");
  return r.which() == wire::Response::PUBLISHED ? r.getPublished().getEntry() : 0;
}

TEST(SessionAnswers, HelloAndPublishAnswerEveryRequestOnce) {
  ASSERT_EQ(ThreeTokenLayer().chunks.size(), 1u);  // the steps send one chunk a layer
  SessionRig rig(SmallLimits());
  ExpectAnswers(rig, {
      {"lookup before hello", 1, [](wire::Request::Builder r) { r.initLookup(); }},
      {"hello, no common version", 2, Hello(9, 9)},
      {"hello, namespace too long", 3, Hello(1, 1, std::string(300, 'n'))},
      {"hello", 4, Hello(1, 1)},
      {"hello twice", 5, Hello(1, 1)},
      {"publishBegin, model name too long", 10, Begin({.name = std::string(300, 'm')})},
      {"publishBegin, another namespace", 11, Begin({.ns = "other"})},
      {"publishBegin, descriptor too long", 12, Begin({.descriptor = 17})},
      {"publishBegin, no tokens", 13, Begin({.tokens = 0, .length = 0})},
      {"publishBegin, length differs", 14, Begin({.length = 2})},
      {"publishBegin, no layers", 15, Begin({.layers = 0})},
      {"publishBegin, too many layers", 16, Begin({.layers = 5})},
      {"publishBegin, cost out of bounds", 17, Begin({.attention_layers = 9})},
      {"publishBegin", 20, Begin({})},
      {"publishBegin, id in use", 20, Begin({})},
      {"publishBegin, a second", 21, Begin({.layers = 2})},
      {"publishBegin, past the in-flight limit", 22, Begin({})},
      {"publishLayer, no such publish", 30, Layer(99, 0, 1)},
      {"publishChunk before any layer", 31, Chunk(21, 0, 0)},
      {"publishCommit of the aborted publish", 32, Commit(21)},
      {"publishBegin, a third", 23, Begin({.layers = 2})},
      {"publishLayer, out of order", 33, Layer(23, 1, 1)},
      {"publishBegin, a fourth", 24, Begin({.layers = 2})},
      {"publishLayer, too many chunks", 34, Layer(24, 0, 1u << 30)},
      {"publishBegin, a fifth", 25, Begin({.layers = 2})},
      {"publishLayer, header too long", 35, Layer(25, 0, 1, 2u << 20)},
      {"publishBegin, a sixth", 26, Begin({.layers = 2})},
      {"publishLayer 0 of 2", 36, Layer(26, 0, 1)},
      {"publishCommit too early", 37, Commit(26)},
      {"publishBegin, a seventh", 27, Begin({.layers = 2})},
      {"publishAbort", 38, Abort(27)},
      {"publishAbort again", 39, Abort(27)},
      {"publishLayer 0", 40, Layer(20, 0, 1)},
      {"publishChunk, past the layer's count", 41, Chunk(20, 0, 1)},
  });
  // The refused chunk aborted publish 20; a whole one commits.
  ExpectAnswers(rig, {
      {"publishBegin, whole", 50, Begin({})},
      {"publishLayer, whole", 51, Layer(50, 0, 1)},
      {"publishChunk, whole", 52, Chunk(50, 0, 0)},
      {"publishLayer, one too many", 53, Layer(50, 1, 1)},
      {"publishBegin, whole again", 54, Begin({})},
      {"publishLayer, whole again", 55, Layer(54, 0, 1)},
      {"publishChunk, whole again", 56, Chunk(54, 0, 0)},
      {"publishCommit", 57, Commit(54)},
  });
  EXPECT_NE(PublishedEntry(*rig.sink), 0u);
  EXPECT_EQ(rig.counters.publishes_in_flight.load(), 0u);
}

TEST(SessionAnswers, FetchLookupAndWindowsAnswerEveryRequestOnce) {
  SessionRig rig(SmallLimits());
  std::uint64_t entry = 0;
  const std::uint64_t missing = 1ull << 40;
  ExpectAnswers(rig, {
      {"hello", 1, Hello(1, 1)},
      {"publishBegin", 2, Begin({})},
      {"publishLayer", 3, Layer(2, 0, 1)},
      {"publishChunk", 4, Chunk(2, 0, 0)},
      {"publishCommit", 5, Commit(2)},
  });
  entry = PublishedEntry(*rig.sink);
  ExpectAnswers(rig, {
      {"lookup, another namespace", 10,
       [](wire::Request::Builder r) { r.initLookup().initQuery().setNamespace("other"); }},
      {"lookup, too many tokens", 11,
       [](wire::Request::Builder r) { r.initLookup().initQuery().initTokens((1u << 20) + 1); }},
      {"lookup", 12,
       [](wire::Request::Builder r) {
         auto q = r.initLookup().initQuery();
         q.initFingerprint().setDigestLo(7);
         auto t = q.initTokens(3);
         for (unsigned i = 0; i < 3; ++i) t.set(i, i + 1);
       }},
      {"fetch, too many layers", 20, Fetch(&entry, 5)},
      {"fetch, shared window without a region", 21, Fetch(&entry, 0, true)},
      {"fetch, device window without one attached", 22, Fetch(&entry, 0, false, true)},
      {"fetch, no such entry", 23, Fetch(&missing)},
      {"fetch", 24, Fetch(&entry)},
      {"cancel, no such fetch", 25, [](wire::Request::Builder r) { r.initCancel().setTarget(24); }},
      {"checkEntry, no such entry", 26, [=](wire::Request::Builder r) { r.initCheckEntry().setEntry(missing); }},
      {"checkEntry", 27, [&](wire::Request::Builder r) { r.initCheckEntry().setEntry(entry); }},
      {"shmAttach without a descriptor", 30, [](wire::Request::Builder r) { r.initShmAttach().setSize(4096); }},
      {"shmRelease, nothing fetched", 0,
       [](wire::Request::Builder r) { r.initShmRelease().setLength(8); }, 0},
      {"deviceRelease, nothing fetched", 0,
       [](wire::Request::Builder r) { r.initDeviceRelease().setLength(8); }, 0},
      {"attachDevice, bus id too long", 31,
       [](wire::Request::Builder r) { r.initAttachDevice().setPciBusId(std::string(65, 'b')); }},
      {"attachDevice, short handle", 32, [](wire::Request::Builder r) { r.initAttachDevice().initHandle(3); }},
      {"attachDevice, no device copies", 33,
       [](wire::Request::Builder r) {
         auto a = r.initAttachDevice();
         a.initHandle(kDeviceHandleBytes);
         a.setSize(4096);
       }},
  });
}

TEST(SessionAnswers, AdminRequestsAnswerEveryRequestOnce) {
  for (bool admin : {false, true}) {
    SCOPED_TRACE(admin ? "admin socket" : "client socket");
    PeerInfo peer;
    peer.admin = admin;
    SessionRig rig(SmallLimits(), peer);
    ExpectAnswers(rig, {
        {"hello", 1, Hello(1, 1)},
        {"delete", 2, [](wire::Request::Builder r) { r.initDelete().setEntry(12345); }},
        {"setByteBudget", 3, [](wire::Request::Builder r) { r.initSetByteBudget().setBytes(0); }},
        {"compact", 4, [](wire::Request::Builder r) { r.setCompact(); }},
        {"checkStore", 5, [](wire::Request::Builder r) { r.initCheckStore().setReadChunks(true); }},
        {"list", 6, [](wire::Request::Builder r) { r.initList(); }},
        {"list, every namespace", 7, [](wire::Request::Builder r) { r.initList().setAllNamespaces(true); }},
        {"list, quarantined", 8, [](wire::Request::Builder r) { r.initList().setQuarantined(true); }},
        {"list, page token too long", 9, [](wire::Request::Builder r) { r.initList().initPageToken(4097); }},
        {"stat", 10, [](wire::Request::Builder r) { r.setStat(); }},
        {"describe, no such entry", 11, [](wire::Request::Builder r) { r.initDescribe().setEntry(12345); }},
    });
  }
}

TEST(SessionAnswers, RefusalsOfThePeerAnswerEveryRequestOnce) {
  {
    PeerInfo tenant;
    tenant.allowed_namespaces = std::vector<std::string>{"a"};
    SessionRig rig(SmallLimits(), tenant);
    ExpectAnswers(rig, {
        {"hello, a namespace not allowed", 1, Hello(1, 1, "b")},
        {"hello", 2, Hello(1, 1, "a")},
        {"stat, limited to tenants", 3, [](wire::Request::Builder r) { r.setStat(); }},
    });
  }
  {
    PeerInfo remote;
    remote.local = false;
    SessionRig rig(SmallLimits(), remote);
    ExpectAnswers(rig, {{"hello", 1, Hello(1, 1)}});
    rig.fds.push_back(open("/dev/null", O_RDONLY));
    ExpectAnswers(rig, {{"shmAttach over TCP", 2, [](wire::Request::Builder r) { r.initShmAttach().setSize(4096); }}});
    EXPECT_TRUE(rig.fds.empty());  // taken, and closed
  }
  {
    PeerInfo refused;
    refused.refused = "not on this socket";
    SessionRig rig(SmallLimits(), refused);
    const std::size_t before = rig.sink->frames.size();
    EXPECT_EQ(rig.Send(1, Hello(1, 1)), Session::Connection::kClose);
    EXPECT_EQ(AnswersSince(*rig.sink, before).size(), 1u);
  }
}

// The fuzzer's seed streams, frame by frame: each frame is answered once
// (a frame that cannot be read, once with id 0), a release at most once.
TEST(SessionAnswers, FuzzSeedStreamsAnswerEveryFrameOnce) {
  std::size_t frames_seen = 0;
  for (const auto& file : std::filesystem::directory_iterator(IPC_SEED_CORPUS)) {
    std::ifstream in(file.path(), std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (bool admin : {false, true}) {
      SCOPED_TRACE(file.path().filename().string() + (admin ? " (admin)" : ""));
      PeerInfo peer;
      peer.admin = admin;
      SessionRig rig({}, peer);
      std::vector<Frame> frames = session_testing::ToFrames(std::as_bytes(std::span(raw)), /*may_break=*/true);
      for (auto& f : frames) {
        bool release = false;
        try {
          auto rd = f.Reader({});
          const auto which = rd->getRoot<wire::Request>().which();
          release = which == wire::Request::SHM_RELEASE || which == wire::Request::DEVICE_RELEASE;
        } catch (const kj::Exception&) {
        }
        const std::size_t before = rig.sink->frames.size();
        ++frames_seen;
        if (rig.session->OnFrame(std::move(f), &rig.fds) == Session::Connection::kClose) break;
        const std::size_t answers = AnswersSince(*rig.sink, before).size();
        if (release) {
          EXPECT_LE(answers, 1u);
        } else {
          EXPECT_EQ(answers, 1u) << "frame " << frames_seen;
        }
      }
    }
  }
  EXPECT_GT(frames_seen, 10u);
}

}  // namespace
}  // namespace primecache::ipc

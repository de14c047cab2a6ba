// Extents through a real daemon, read off the wire: a fetch through the
// shared window whose client takes extents gets runs of adjacent chunks of
// one layer per fetchChunk (in order, inside the window, never wrapping it,
// at most a quarter of it, bytes exact), one release each; an older client
// gets one chunk per message; a damaged chunk inside what would be an
// extent fails the fetch and quarantines exactly that entry; a fetch
// stopped mid-extent leaves the window whole. The device's extents:
// tests/gpu/device_window_gpu_test.cc.
#include <gtest/gtest.h>

#include <cstring>

#include "ipc/shm.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/ipc/damaged_entry.h"

namespace primecache::testing {
namespace {

// One fetchChunk as it came.
struct Message {
  std::uint32_t layer = 0, index = 0, count = 0;
  std::vector<std::uint64_t> sizes;
  std::uint64_t offset = 0, length = 0;
  bool in_window = false;
};

// A raw connection with a shared region attached, fetching through a window
// of it with or without extents; every chunk's bytes copied out as it came.
class RawFetcher {
 public:
  RawFetcher(const Daemon& d, std::size_t region) : c_(d.socket()) {
    if (!c_.ok() || !c_.Hello()) return;
    auto r = ipc::ShmRegion::Create(region, "fetch-extent-test");
    if (!r.ok()) return;
    shm_ = std::move(r).value();
    auto attach = ipc::BuildRequest(2, [&](wire::Request::Builder q) { q.initShmAttach().setSize(region); });
    if (!ipc::SendWithFd(c_.fd(), ipc::Flatten(*attach), shm_->fd()).ok()) return;
    auto reply = NextReply(c_);
    ok_ = reply && reply->which == wire::Response::ACK;
  }
  bool ok() const { return ok_; }

  struct Result {
    std::vector<Message> messages;
    std::vector<std::vector<std::vector<std::byte>>> chunks;  // [layer][index]
    std::optional<Reply> last;                                 // fetchDone or the error
  };
  // Fetches `entry` through [window_offset, +window_length) of the region;
  // `cancel_after`: sends cancel once that many messages came.
  Result Fetch(std::uint64_t entry, std::uint64_t window_offset, std::uint64_t window_length, bool extents,
               std::size_t cancel_after = SIZE_MAX) {
    Result out;
    const std::uint64_t id = next_id_++;
    c_.Send(*ipc::BuildRequest(id, [&](wire::Request::Builder q) {
      auto f = q.initFetch();
      f.setEntry(entry);
      f.initShmWindow().setOffset(window_offset);
      f.getShmWindow().setLength(window_length);
      f.setExtents(extents);
    }));
    for (;;) {
      auto frame = c_.Next();
      if (!frame) return out;
      auto rd = frame->Reader({});
      auto r = rd->getRoot<wire::Response>();
      if (r.getId() != id) continue;  // the cancel's answer, say
      if (r.which() == wire::Response::FETCH_LAYER) {
        out.chunks.resize(std::max<std::size_t>(out.chunks.size(), r.getFetchLayer().getLayer() + 1));
        out.chunks[r.getFetchLayer().getLayer()].resize(r.getFetchLayer().getChunkCount());
        continue;
      }
      if (r.which() != wire::Response::FETCH_CHUNK) {
        out.last = Reply{r.getId(), r.which(), r.which() == wire::Response::ERROR ? r.getError().getCode()
                                                                                   : wire::ErrorCode::INTERNAL,
                         r.which() == wire::Response::ERROR ? r.getError().getMessage().cStr() : ""};
        return out;
      }
      Take(r.getFetchChunk(), window_offset, window_length, &out);
      if (out.messages.size() == cancel_after) {
        c_.Send(*ipc::BuildRequest(0, [&](wire::Request::Builder q) { q.initCancel().setTarget(id); }));
      }
    }
  }

 private:
  void Take(wire::FetchChunk::Reader ch, std::uint64_t woff, std::uint64_t wlen, Result* out) {
    Message m;
    m.layer = ch.getLayer();
    m.index = ch.getIndex();
    m.count = ch.getCount();
    for (std::uint64_t s : ch.getSizes()) m.sizes.push_back(s);
    if (ch.getData().which() == wire::Payload::SHM) {
      m.offset = ch.getData().getShm().getOffset();
      m.length = ch.getData().getShm().getLength();
      m.in_window = m.offset >= woff && m.length <= wlen && m.offset - woff <= wlen - m.length;
      std::vector<std::uint64_t> sizes = m.sizes.empty() ? std::vector<std::uint64_t>{m.length} : m.sizes;
      std::uint64_t at = m.offset;
      for (std::size_t i = 0; i < sizes.size() && m.in_window; ++i) {
        if (m.layer < out->chunks.size() && m.index + i < out->chunks[m.layer].size()) {
          const std::byte* b = shm_->data() + at;
          out->chunks[m.layer][m.index + i].assign(b, b + sizes[i]);
        }
        at += sizes[i];
      }
      c_.Send(*ipc::BuildRequest(0, [&](wire::Request::Builder q) {
        auto x = q.initShmRelease();
        x.setOffset(m.offset);
        x.setLength(m.length);
      }));
    } else if (ch.getData().which() == wire::Payload::INLINE) {
      m.length = ch.getData().getInline().size();
      const auto* b = reinterpret_cast<const std::byte*>(ch.getData().getInline().begin());
      if (m.layer < out->chunks.size() && m.index < out->chunks[m.layer].size()) {
        out->chunks[m.layer][m.index].assign(b, b + m.length);
      }
    }
    out->messages.push_back(std::move(m));
  }

  RawConn c_;
  std::unique_ptr<ipc::ShmRegion> shm_;
  bool ok_ = false;
  std::uint64_t next_id_ = 10;
};

std::vector<std::vector<std::vector<std::byte>>> AsChunks(const std::vector<LayerData>& layers) {
  std::vector<std::vector<std::vector<std::byte>>> out;
  for (const auto& l : layers) out.push_back(l.chunks);
  return out;
}

// Every message in order (layer by layer, each chunk once), each extent of
// one layer inside the window, its sizes adding up, at most `bound` bytes.
void ExpectOrderedExtents(const std::vector<Message>& ms, const std::vector<LayerData>& want, std::uint64_t bound,
                          const std::string& what) {
  std::uint32_t layer = 0, next = 0;
  for (const Message& m : ms) {
    if (next == want[layer].chunks.size()) {
      ++layer;
      next = 0;
    }
    ASSERT_EQ(m.layer, layer) << what;
    ASSERT_EQ(m.index, next) << what << ": chunks out of order";
    ASSERT_TRUE(m.in_window) << what;
    ASSERT_EQ(m.count, m.sizes.size()) << what;
    std::uint64_t sum = 0;
    for (std::uint64_t s : m.sizes) sum += s;
    EXPECT_EQ(sum, m.length) << what;
    if (m.count > 1) {
      EXPECT_LE(m.length, bound) << what;
    }
    next += m.count;
  }
  EXPECT_EQ(layer + 1, want.size()) << what;
}

class FetchExtentTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()); }
  Daemon d_;
};

// Windows that force splits (a quarter of each is the bound), chunks whose
// size leaves a tail at the ring's end (the ring wraps inside what would be
// an extent): every byte arrives right, in order, in fewer messages than
// chunks; and a client that asks for no extents gets one chunk a message.
TEST_F(FetchExtentTest, ExtentsCarryAdjacentChunksInOrderAndBitExact) {
  auto p = Client::Connect(d_.Options());
  ASSERT_TRUE(p.ok());
  const auto small = MakeLayers(128, 5, 151, 4096, 4);  // 64 KiB chunks
  const auto odd = MakeLayers(300, 3, 152, 1567, 8);    // odd-sized chunks
  auto a = (*p)->Publish(TestModel(), Tokens(128, 151), small);
  auto b = (*p)->Publish(TestModel(), Tokens(300, 152), odd);
  ASSERT_TRUE(a.ok() && b.ok());
  RawFetcher f(d_, 8u << 20);
  ASSERT_TRUE(f.ok());
  // 656360 bytes: a tail to skip at the ring's end, extents of 2 chunks of 64 KiB.
  for (std::uint64_t window : {std::uint64_t{656360}, std::uint64_t{1} << 20, std::uint64_t{4} << 20}) {
    for (const auto& [entry, layers] : {std::pair{a->id, &small}, std::pair{b->id, &odd}}) {
      const std::string what = "entry " + std::to_string(entry) + ", window " + std::to_string(window);
      auto r = f.Fetch(entry, 4096, window, true);
      ASSERT_TRUE(r.last && r.last->which == wire::Response::FETCH_DONE) << what << ": " << (r.last ? r.last->message : "");
      EXPECT_TRUE(r.chunks == AsChunks(*layers)) << what;
      ExpectOrderedExtents(r.messages, *layers, window / 4, what);
      EXPECT_LT(r.messages.size(), ChunkCount(*layers)) << what << ": no chunks travelled together";
      auto old = f.Fetch(entry, 4096, window, false);
      ASSERT_TRUE(old.last && old.last->which == wire::Response::FETCH_DONE) << what;
      EXPECT_TRUE(old.chunks == AsChunks(*layers)) << what;
      EXPECT_EQ(old.messages.size(), ChunkCount(*layers)) << what << ": an older client got extents";
      for (const Message& m : old.messages) EXPECT_TRUE(m.count == 0 && m.sizes.empty()) << what;
    }
  }
}

// A chunk damaged in the middle of a layer (inside what would be an
// extent): the fetch fails without sending it, and exactly that entry is
// quarantined; an entry beside it still fetches, and the window serves on.
TEST_F(FetchExtentTest, ADamagedChunkInsideAnExtentFailsTheFetchAndQuarantinesItsEntry) {
  const EntryToPublish bad_entry{Tokens(256, 161), MakeLayers(256, 3, 161, 4096, 4)};
  const EntryToPublish good_entry{Tokens(256, 162), MakeLayers(256, 3, 162, 4096, 4)};
  const auto& bad_layers = bad_entry.layers;
  const auto& good_layers = good_entry.layers;
  // Chunk 5 of a latent layer (64 KiB chunks), a third of the way in.
  const ChunkDamage damage{2, 5, bad_layers[2].chunks[5].size() / 3, 0x20};
  DamagedPair ids;
  ASSERT_NO_FATAL_FAILURE(PublishAndDamage(d_, bad_entry, good_entry, damage, &ids));
  const std::uint64_t bad = ids.bad, good = ids.good;
  RawFetcher f(d_, 8u << 20);
  ASSERT_TRUE(f.ok());
  auto r = f.Fetch(bad, 0, 4u << 20, true);
  ASSERT_TRUE(r.last && r.last->which == wire::Response::ERROR);
  EXPECT_EQ(r.last->code, wire::ErrorCode::CORRUPTION) << r.last->message;
  for (const Message& m : r.messages) {
    EXPECT_FALSE(m.layer == 2 && m.index <= 5 && m.index + std::max<std::uint32_t>(m.count, 1) > 5)
        << "the damaged chunk was sent";
  }
  ASSERT_EQ(r.chunks.size(), 3u);
  EXPECT_TRUE(r.chunks[0] == bad_layers[0].chunks && r.chunks[1] == bad_layers[1].chunks)
      << "the layers before it came whole";
  auto admin = Admin(d_);
  ASSERT_TRUE(admin);
  ListOptions lo;
  lo.state = EntryState::kQuarantined;
  auto q = admin->List(lo);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->entries.size(), 1u);
  EXPECT_EQ(q->entries[0].id, bad);
  auto g = f.Fetch(good, 0, 4u << 20, true);
  ASSERT_TRUE(g.last && g.last->which == wire::Response::FETCH_DONE) << (g.last ? g.last->message : "");
  EXPECT_TRUE(g.chunks == AsChunks(good_layers));
}

// A client that stops a fetch mid-extent (its chunks held, some released,
// an error returned in the middle of an extent) gets the window back whole
// once it released what it held: the next fetch lands in it, bit-exact.
TEST_F(FetchExtentTest, AFetchStoppedMidExtentLeavesTheWindowWhole) {
  const auto layers = MakeLayers(256, 3, 171, 4096, 4);  // 64 KiB chunks
  auto p = Client::Connect(d_.Options());
  ASSERT_TRUE(p.ok());
  auto pub = (*p)->Publish(TestModel(), Tokens(256, 171), layers);
  ASSERT_TRUE(pub.ok());
  ClientOptions o = d_.Options("", true);
  o.shared_memory_bytes = 4u << 20;  // a 2 MiB window: extents of up to 8 chunks
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  std::vector<ChunkRelease> held;
  FetchCallbacks cb;
  cb.on_chunk_held = [&](std::uint32_t layer, std::uint32_t index, std::span<const std::byte>, ChunkRelease r) {
    if (layer == 0 && index == 3) {
      r();
      return Status::Aborted("stopped in the middle of an extent");
    }
    held.push_back(std::move(r));
    return Status::Ok();
  };
  const Status s = (*c)->Fetch(pub->id, {}, cb);
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_EQ(held.size(), 3u);
  // While chunks are held the window stays taken: this fetch streams inline.
  std::size_t in_region = 0;
  auto count = [&](std::span<const std::byte> b) {
    const auto r = (*c)->region();
    const auto* base = static_cast<const std::byte*>(r.base);
    if (b.data() >= base && b.data() + b.size() <= base + r.size) ++in_region;
  };
  std::vector<std::vector<std::byte>> got;
  FetchCallbacks all;
  all.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> b) {
    got.emplace_back(b.begin(), b.end());
    count(b);
    return Status::Ok();
  };
  ASSERT_TRUE((*c)->Fetch(pub->id, {}, all).ok());
  EXPECT_EQ(in_region, 0u);
  for (auto& r : held) r();
  got.clear();
  ASSERT_TRUE((*c)->Fetch(pub->id, {}, all).ok());
  std::vector<std::vector<std::byte>> want;
  for (const auto& l : layers) want.insert(want.end(), l.chunks.begin(), l.chunks.end());
  EXPECT_TRUE(got == want);
  EXPECT_EQ(in_region, want.size()) << "the window did not come back whole";
}

// Cancelled by the client after two messages, the fetch ends (aborted)
// with its open extent unsent, and the connection fetches on.
TEST_F(FetchExtentTest, CancelledMidStreamTheConnectionFetchesOn) {
  const auto layers = MakeLayers(256, 3, 181, 4096, 4);
  auto p = Client::Connect(d_.Options());
  ASSERT_TRUE(p.ok());
  auto pub = (*p)->Publish(TestModel(), Tokens(256, 181), layers);
  ASSERT_TRUE(pub.ok());
  RawFetcher f(d_, 4u << 20);
  ASSERT_TRUE(f.ok());
  auto r = f.Fetch(pub->id, 0, 1u << 20, true, 2);
  ASSERT_TRUE(r.last);
  if (r.last->which == wire::Response::ERROR) {
    EXPECT_EQ(r.last->code, wire::ErrorCode::ABORTED) << r.last->message;
  } else {
    EXPECT_EQ(r.last->which, wire::Response::FETCH_DONE) << "the fetch ended before the cancel came";
  }
  auto g = f.Fetch(pub->id, 0, 1u << 20, true);
  ASSERT_TRUE(g.last && g.last->which == wire::Response::FETCH_DONE) << (g.last ? g.last->message : "");
  EXPECT_TRUE(g.chunks == AsChunks(layers));
}

}  // namespace
}  // namespace primecache::testing

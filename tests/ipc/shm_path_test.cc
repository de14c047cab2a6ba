// The one-copy data paths through the shared region: chunks an encoder
// writes in place for a publish (PublishStream::ReserveChunk), and fetches
// that land in the fetch window straight from the store.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/ipc/daemon_harness.h"
#include "tests/ipc/damaged_entry.h"

namespace primecache::testing {
namespace {

bool InRegion(const Client& c, std::span<const std::byte> b) {
  const auto r = c.region();
  const auto* base = static_cast<const std::byte*>(r.base);
  return base != nullptr && b.data() >= base && b.data() + b.size() <= base + r.size;
}

// Publishes `layers` writing every chunk into a reservation, as an encoder
// would: reserved `slack` bytes larger than the chunk, only the chunk added.
Result<PublishResult> PublishReserved(Client& c, std::span<const std::uint32_t> tokens,
                                      const std::vector<LayerData>& layers, std::size_t slack,
                                      bool expect_shm) {
  PC_ASSIGN_OR_RETURN(auto stream,
                      c.BeginPublish(TestModel(), tokens, static_cast<std::uint32_t>(layers.size())));
  for (const auto& layer : layers) {
    PC_RETURN_IF_ERROR(stream->BeginLayer(layer.header, static_cast<std::uint32_t>(layer.chunks.size())));
    for (const auto& ch : layer.chunks) {
      PC_ASSIGN_OR_RETURN(ReservedChunk r, stream->ReserveChunk(ch.size() + slack));
      if (r.in_shared_memory() != expect_shm || InRegion(c, r.bytes()) != expect_shm) {
        return Status::Internal("reservation not where expected");
      }
      std::memcpy(r.bytes().data(), ch.data(), ch.size());
      PC_RETURN_IF_ERROR(stream->AddReservedChunk(std::move(r), ch.size()));
      // The moved-from reservation must be left owning nothing.
      if (r.size() != 0) return Status::Internal("an added reservation still owns bytes");  // NOLINT(bugprone-use-after-move)
    }
  }
  return stream->Commit();
}

void ExpectSame(const std::vector<LayerData>& want, const std::vector<FetchedLayer>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t l = 0; l < want.size(); ++l) {
    EXPECT_EQ(got[l].data.header, want[l].header);
    ASSERT_EQ(got[l].data.chunks.size(), want[l].chunks.size());
    for (std::size_t c = 0; c < want[l].chunks.size(); ++c) {
      EXPECT_TRUE(got[l].data.chunks[c] == want[l].chunks[c]) << "layer " << l << " chunk " << c;
    }
  }
}

class ShmPathTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()); }
  Daemon d_;
};

// Chunks written in place (over shared memory) or into private buffers
// (without it) come back bit-exact, whichever way they are fetched.
TEST_F(ShmPathTest, ReservedChunksRoundTripBitExact) {
  for (bool shm : {true, false}) {
    ClientOptions o = d_.Options("", shm);
    o.shared_memory_bytes = 2u << 20;  // a 1 MiB publish half: 64 KiB chunks wrap around it
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const auto tokens = Tokens(128, shm ? 31 : 32);
    const auto layers = MakeLayers(128, 5, shm ? 31 : 32, 4096, 4);  // 64 KiB chunks
    auto pub = PublishReserved(**c, tokens, layers, 1000, shm);
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    EXPECT_FALSE(pub->existed);
    for (bool fetch_shm : {true, false}) {
      auto f = Client::Connect(d_.Options("", fetch_shm));
      ASSERT_TRUE(f.ok());
      auto got = (*f)->FetchLayers(pub->id);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSame(layers, *got);
    }
  }
}

// A dropped reservation gives its space back at once; a full publish half
// makes ReserveChunk wait (and fail clearly when nothing comes back), and
// never hands out bytes another reservation holds.
TEST_F(ShmPathTest, ReserveDropReserveAgainAndExhaustion) {
  ClientOptions o = d_.Options("", true);
  o.shared_memory_bytes = 1u << 20;  // a 512 KiB publish half
  o.timeout = std::chrono::milliseconds(300);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  const auto tokens = Tokens(64, 41);
  auto stream = (*c)->BeginPublish(TestModel(), tokens, 1);
  ASSERT_TRUE(stream.ok());
  const std::size_t half = 512u << 10;
  {
    auto whole = (*stream)->ReserveChunk(half);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_TRUE(InRegion(**c, whole->bytes()));
  }  // dropped
  auto a = (*stream)->ReserveChunk(half / 2);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::memset(a->bytes().data(), 0xA5, a->size());
  auto b = (*stream)->ReserveChunk(half / 2);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::memset(b->bytes().data(), 0x5A, b->size());
  // Full: a third waits for the timeout and says why.
  auto full = (*stream)->ReserveChunk(4096);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kDeadlineExceeded) << full.status().ToString();
  EXPECT_NE(full.status().message().find("publish half"), std::string::npos) << full.status().ToString();
  // A waiter gets the space as soon as a reservation is dropped. The half
  // is full until the drop, so a reservation that succeeds having lasted
  // until the drop is one that waited for it.
  std::atomic<bool> got{false}, calling{false};
  std::atomic<std::int64_t> waited_ms{-1};
  const std::span<std::byte> a_bytes = a->bytes();
  std::thread waiter([&] {
    calling = true;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*stream)->ReserveChunk(half / 4);
    waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    got = r.ok() && r->bytes().data() >= a_bytes.data() &&
          r->bytes().data() + r->size() <= a_bytes.data() + a_bytes.size();
  });
  while (!calling) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const bool done_before_the_drop = waited_ms.load() >= 0;
  *a = ReservedChunk();
  waiter.join();
  EXPECT_FALSE(done_before_the_drop) << "a reservation in a full half came back before any space was given back";
  EXPECT_TRUE(got.load());
  EXPECT_GE(waited_ms.load(), 100) << "the reservation did not wait for the drop";
  // What b holds was never handed out twice.
  for (std::byte x : b->bytes()) ASSERT_EQ(x, std::byte{0x5A});
  // Too large for the half, or for the daemon: refused at once.
  EXPECT_EQ((*stream)->ReserveChunk(half + 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*stream)->ReserveChunk(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*stream)->ReserveChunk((*c)->server_info().max_chunk_bytes + 1).status().code(),
            StatusCode::kInvalidArgument);
}

// Space comes back as the daemon stores chunks: a publish far larger than the
// publish half, every chunk reserved and written in place, round-trips; and
// after an aborted stream (its reservations dropped half-way) the next
// publish still has the whole half.
TEST_F(ShmPathTest, SpaceComesBackAfterStoresAndAborts) {
  ClientOptions o = d_.Options("", true);
  o.shared_memory_bytes = 1u << 20;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  const auto layers = MakeLayers(256, 3, 43, 4096, 16);  // 256 KiB chunks, 4 MiB in all
  {
    auto stream = (*c)->BeginPublish(TestModel(), Tokens(256, 43), 3);
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(
        (*stream)->BeginLayer(layers[0].header, static_cast<std::uint32_t>(layers[0].chunks.size())).ok());
    auto r = (*stream)->ReserveChunk(layers[0].chunks[0].size());
    ASSERT_TRUE(r.ok());
    std::memcpy(r->bytes().data(), layers[0].chunks[0].data(), r->size());
    ASSERT_TRUE((*stream)->AddReservedChunk(std::move(*r)).ok());
    auto held = (*stream)->ReserveChunk(200u << 10);
    ASSERT_TRUE(held.ok());
    ASSERT_TRUE((*stream)->Abort().ok());
  }  // `held` dropped with the scope
  auto pub = PublishReserved(**c, Tokens(256, 43), layers, 0, true);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  auto got = (*c)->FetchLayers(pub->id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(layers, *got);
  EXPECT_EQ((*c)->List()->entries.size(), 1u);  // the aborted publish left nothing
}

// Fetches `entry` chunk by chunk (on_chunk): every chunk's bytes, and how
// many arrived inside the region.
struct Fetched {
  Status status;
  std::vector<std::vector<std::byte>> chunks;
  std::size_t in_region = 0;
};
// Fetches an entry, keeping its chunks; `pause` per chunk makes a slow
// reader (the store then fills the window and must wait for releases).
Fetched FetchCounting(Client& c, std::uint64_t entry, std::size_t fail_after = SIZE_MAX,
                      std::chrono::microseconds pause = {}) {
  Fetched f;
  FetchCallbacks cb;
  cb.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> b) {
    if (f.chunks.size() == fail_after) return Status::Aborted("enough");
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    f.chunks.emplace_back(b.begin(), b.end());
    if (InRegion(c, b)) ++f.in_region;
    return Status::Ok();
  };
  f.status = c.Fetch(entry, {}, cb);
  return f;
}

std::vector<std::vector<std::byte>> AllChunks(const std::vector<LayerData>& layers) {
  std::vector<std::vector<std::byte>> out;
  for (const auto& l : layers) out.insert(out.end(), l.chunks.begin(), l.chunks.end());
  return out;
}

// Windows far smaller than the entry, chunks that leave a tail to skip, and
// chunks larger than the window: the store reads each chunk into window
// space as it frees up (the ring wraps many times, so reading ahead finds no
// room and waits), chunks too large for the window travel inline, and every
// byte arrives intact.
TEST_F(ShmPathTest, FetchesThroughSmallWindowsAreBitExact) {
  auto p = Client::Connect(d_.Options());
  ASSERT_TRUE(p.ok());
  const auto small = MakeLayers(128, 5, 51, 4096, 4);  // 64 KiB chunks
  const auto odd = MakeLayers(300, 3, 52, 1567, 64);   // 401152-byte chunks
  auto a = (*p)->Publish(TestModel(), Tokens(128, 51), small);
  auto b = (*p)->Publish(TestModel(), Tokens(300, 52), odd);
  ASSERT_TRUE(a.ok() && b.ok());
  auto waits = [&] {
    auto st = (*p)->Stat();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return st.ok() ? st->fetch_window_waits : 0;
  };
  for (std::size_t region : {512u << 10, 1u << 20, 3u << 20}) {
    const std::uint64_t waits_before = waits();
    ClientOptions o = d_.Options("", true);
    o.shared_memory_bytes = region;  // windows of 256 KiB, 512 KiB, 1.5 MiB
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok());
    for (int rep = 0; rep < 2; ++rep) {
      // The first time round, a slow reader.
      const auto pause = std::chrono::microseconds(rep == 0 ? 1000 : 0);
      Fetched fa = FetchCounting(**c, a->id, SIZE_MAX, pause);
      ASSERT_TRUE(fa.status.ok()) << fa.status.ToString();
      EXPECT_TRUE(fa.chunks == AllChunks(small)) << "region " << region;
      EXPECT_EQ(fa.in_region, fa.chunks.size()) << "region " << region;
      Fetched fb = FetchCounting(**c, b->id, SIZE_MAX, pause);
      ASSERT_TRUE(fb.status.ok()) << fb.status.ToString();
      EXPECT_TRUE(fb.chunks == AllChunks(odd)) << "region " << region;
      // 401152-byte latent chunks fit a window of 512 KiB or more; below it
      // they come inline (the recurrent layers' small chunks still fit).
      const std::size_t latent = odd[0].chunks.size() + odd[2].chunks.size();
      if (region / 2 < 401152) {
        EXPECT_EQ(fb.in_region, fb.chunks.size() - latent);
      } else {
        EXPECT_EQ(fb.in_region, fb.chunks.size());
      }
    }
    // Each entry is several windows long: the store's read-ahead filled the
    // window and waited for releases (the path this test is about).
    EXPECT_GT(waits(), waits_before) << "region " << region << ": no fetch waited for room";
  }
}

// A fetch that fails half-way on a corrupt chunk, and one the client stops
// half-way (cancel), leave the connection's window whole: the next fetch on
// the same connection lands in it, bit-exact.
TEST_F(ShmPathTest, FailedAndCancelledFetchesLeaveTheWindowUsable) {
  const EntryToPublish bad_entry{Tokens(256, 61), MakeLayers(256, 3, 61, 4096, 4)};
  const EntryToPublish good_entry{Tokens(256, 62), MakeLayers(256, 3, 62, 4096, 4)};
  const auto& good_layers = good_entry.layers;
  // The last latent chunk of `bad` is damaged behind the store's back.
  const auto& latent = bad_entry.layers[2].chunks;
  const ChunkDamage damage{2, latent.size() - 1, latent.back().size() / 2, 0x10};
  DamagedPair ids;
  ASSERT_NO_FATAL_FAILURE(PublishAndDamage(d_, bad_entry, good_entry, damage, &ids));
  const std::uint64_t bad = ids.bad, good = ids.good;
  ClientOptions o = d_.Options("", true);
  o.shared_memory_bytes = 1u << 20;  // a 512 KiB window: 8 chunks at a time
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  Fetched f = FetchCounting(**c, bad);
  EXPECT_TRUE(f.status.IsCorruption()) << f.status.ToString();
  EXPECT_GT(f.chunks.size(), 8u) << "it failed late, after the window had wrapped";
  const auto want = AllChunks(good_layers);
  Fetched g = FetchCounting(**c, good);
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_TRUE(g.chunks == want);
  EXPECT_EQ(g.in_region, want.size());
  // Stopped by the client after 5 chunks, then fetched whole.
  Fetched stopped = FetchCounting(**c, good, 5);
  EXPECT_EQ(stopped.status.code(), StatusCode::kAborted) << stopped.status.ToString();
  g = FetchCounting(**c, good);
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_TRUE(g.chunks == want);
  EXPECT_EQ(g.in_region, want.size());
}

// Chunks handed over (on_chunk_held) keep the window taken after their fetch
// ends, even one stopped half-way: a fetch meanwhile streams inline rather
// than over bytes still held; once they are released the window serves again.
TEST_F(ShmPathTest, HeldChunksKeepTheWindowUntilReleased) {
  const auto layers = MakeLayers(256, 3, 71, 4096, 4);
  auto p = Client::Connect(d_.Options());
  ASSERT_TRUE(p.ok());
  auto pub = (*p)->Publish(TestModel(), Tokens(256, 71), layers);
  ASSERT_TRUE(pub.ok());
  ClientOptions o = d_.Options("", true);
  o.shared_memory_bytes = 4u << 20;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  std::vector<ChunkRelease> releases;
  std::vector<std::vector<std::byte>> held_copy;
  std::vector<std::span<const std::byte>> held;
  FetchCallbacks cb;
  cb.on_chunk_held = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> b, ChunkRelease r) {
    if (held.size() == 6) {
      r();
      return Status::Aborted("enough");
    }
    held.push_back(b);
    held_copy.emplace_back(b.begin(), b.end());
    releases.push_back(std::move(r));
    return Status::Ok();
  };
  EXPECT_EQ((*c)->Fetch(pub->id, {}, cb).code(), StatusCode::kAborted);
  ASSERT_EQ(held.size(), 6u);
  for (auto b : held) EXPECT_TRUE(InRegion(**c, b));
  const auto want = AllChunks(layers);
  Fetched meanwhile = FetchCounting(**c, pub->id);
  ASSERT_TRUE(meanwhile.status.ok()) << meanwhile.status.ToString();
  EXPECT_TRUE(meanwhile.chunks == want);
  EXPECT_EQ(meanwhile.in_region, 0u) << "the window was still taken by held chunks";
  for (std::size_t i = 0; i < held.size(); ++i) {
    EXPECT_TRUE(std::equal(held[i].begin(), held[i].end(), held_copy[i].begin()))
        << "held chunk " << i << " overwritten";
  }
  for (auto& r : releases) r();
  Fetched after = FetchCounting(**c, pub->id);
  ASSERT_TRUE(after.status.ok()) << after.status.ToString();
  EXPECT_TRUE(after.chunks == want);
  EXPECT_EQ(after.in_region, want.size());
}

}  // namespace
}  // namespace primecache::testing

// The one-copy data paths through the shared region: chunks an encoder
// writes in place for a publish (PublishStream::ReserveChunk), and fetches
// that land in the fetch window straight from the store.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "tests/ipc/daemon_harness.h"

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
                                      const std::vector<LayerData>& layers, std::size_t slack, bool expect_shm) {
  PC_ASSIGN_OR_RETURN(auto stream, c.BeginPublish(TestModel(), tokens, static_cast<std::uint32_t>(layers.size())));
  for (const auto& layer : layers) {
    PC_RETURN_IF_ERROR(stream->BeginLayer(layer.header, static_cast<std::uint32_t>(layer.chunks.size())));
    for (const auto& ch : layer.chunks) {
      PC_ASSIGN_OR_RETURN(ReservedChunk r, stream->ReserveChunk(ch.size() + slack));
      if (r.in_shared_memory() != expect_shm || InRegion(c, r.bytes()) != expect_shm) {
        return Status::Internal("reservation not where expected");
      }
      std::memcpy(r.bytes().data(), ch.data(), ch.size());
      PC_RETURN_IF_ERROR(stream->AddReservedChunk(std::move(r), ch.size()));
      if (r.size() != 0) return Status::Internal("an added reservation still owns bytes");
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
      auto got = (*f)->FetchLayers(pub->entry);
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
  // A waiter gets the space as soon as a reservation is dropped.
  std::atomic<bool> got{false};
  const std::span<std::byte> a_bytes = a->bytes();
  std::thread waiter([&] {
    auto r = (*stream)->ReserveChunk(half / 4);
    got = r.ok() && r->bytes().data() >= a_bytes.data() && r->bytes().data() + r->size() <= a_bytes.data() + a_bytes.size();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  *a = ReservedChunk();
  waiter.join();
  EXPECT_TRUE(got.load());
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
    ASSERT_TRUE((*stream)->BeginLayer(layers[0].header, static_cast<std::uint32_t>(layers[0].chunks.size())).ok());
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
  auto got = (*c)->FetchLayers(pub->entry);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSame(layers, *got);
  EXPECT_EQ((*c)->List()->entries.size(), 1u);  // the aborted publish left nothing
}

}  // namespace
}  // namespace primecache::testing

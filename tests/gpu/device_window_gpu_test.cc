// The daemon's device copies end to end: a real primecached with device
// copies, and an engine process (device_dma_peer) exporting device memory
// that the client attaches as its device window. A fetch delivers every raw
// chunk resident in the page cache as a device chunk, copied by the GPU into
// the peer's memory bit for bit (checked by the peer's checksum of its
// device bytes), and every other chunk through the host, bit for bit; the
// window is attached again after the daemon restarts. Adjacent chunks come
// as extents (one copy, message and release each), split where the ring
// wraps; a damaged chunk inside one fails the fetch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include "tests/gpu/gpu_daemon_path.h"  // before the daemon harness
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/dma_peer.h"
#include "tests/ipc/daemon_harness.h"
#include "tests/ipc/damaged_entry.h"

namespace primecache::testing {
namespace {

using gpu_test::Peer;

std::string SumLine(std::span<const std::byte> b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "SUM %016llx", static_cast<unsigned long long>(Checksum64(b)));
  return buf;
}

// Raw layers (MakeLayers stores every plane raw/v1) and one latent layer
// stored shuffle-zstd, which must not come as device chunks.
std::vector<LayerData> MixedLayers() {
  auto layers = MakeLayers(4096, 3, 91, 256, 64);  // 64 KiB latent chunks, 4 MiB a latent layer
  const LayerShape shape = LatentShape{4096, 256, 0, 0, 0, false, 0};  // the boundary's length
  auto snap = MakeSnapshot(shape);
  EXPECT_TRUE(snap.ok());
  std::mt19937 g(92);
  for (auto plane : CodecRegistry::Default().KindFor(shape).value()->MutablePlaneData(*snap)) {
    for (float& x : plane) x = static_cast<float>(g() % 1000) * 0.5f;
  }
  EncodeOptions eo;
  eo.all_planes = TransformSpec{std::string(kShuffleZstdTransform), 1};
  eo.target_chunk_bytes = 64u << 10;
  auto enc = EncodeLayer(*snap, eo);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  layers.push_back(ToLayerData(*enc));
  return layers;
}

struct Tally {
  std::size_t device = 0, host = 0;
  std::size_t extents = 0;    // device extents (each one or more adjacent chunks)
  std::uint64_t largest = 0;  // bytes of the largest
};

// Fetches `entry` through the device window, checking every chunk against
// `want` where it landed: device chunks by the peer's checksum (before they
// are released, so the daemon cannot have reused the space), host chunks by
// their bytes. A device chunk of a non-raw plane is a failure.
Tally FetchChecked(Client& c, Peer& peer, std::uint64_t entry, const std::vector<LayerData>& want) {
  Tally t;
  std::vector<bool> raw;
  FetchCallbacks cb;
  cb.on_layer = [&](std::uint32_t, std::span<const std::byte> header, std::uint32_t) {
    auto h = ParseLayerHeader(header);
    if (!h.ok()) return h.status();
    raw.clear();
    for (const auto& p : h->planes) raw.insert(raw.end(), p.chunks.size(), p.transform == kRawTransform);
    return Status::Ok();
  };
  cb.on_chunk = [&](std::uint32_t layer, std::uint32_t index, std::span<const std::byte> b) {
    EXPECT_TRUE(std::equal(b.begin(), b.end(), want[layer].chunks[index].begin(), want[layer].chunks[index].end()))
        << "host chunk " << layer << "/" << index;
    ++t.host;
    return Status::Ok();
  };
  cb.on_device_extent = [&](const DeviceExtent& x, ChunkRelease release) {
    std::uint64_t off = x.offset;
    for (std::uint32_t i = 0; i < x.count; ++i) {
      const std::uint32_t index = x.index + i;
      EXPECT_TRUE(index < raw.size() && raw[index]) << "a device chunk of a plane not stored raw";
      EXPECT_EQ(x.sizes[i], want[x.layer].chunks[index].size());
      EXPECT_EQ(peer.Sum(off, x.sizes[i]), SumLine(want[x.layer].chunks[index]))
          << "device chunk " << x.layer << "/" << index << " (" << i << " of an extent of " << x.count << ")";
      off += x.sizes[i];
    }
    EXPECT_EQ(off, x.offset + x.length);
    t.device += x.count;
    ++t.extents;
    t.largest = std::max<std::uint64_t>(t.largest, x.length);
    release();
    return Status::Ok();
  };
  Status s = c.Fetch(entry, {}, cb);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return t;
}

// A client of the started daemon `d` with `peer`'s memory (`window` bytes)
// attached as its device window; null after a failure it reported.
std::unique_ptr<Client> AttachedClient(const Daemon& d, Peer& peer, std::size_t window) {
  DeviceWindowSpec spec;
  if (!peer.ReadSpec(&spec, window)) {
    ADD_FAILURE() << "the peer exported no window";
    return nullptr;
  }
  auto c = Client::Connect(d.Options("", true));
  if (!c.ok()) {
    ADD_FAILURE() << c.status().ToString();
    return nullptr;
  }
  if (!(*c)->server_info().device_copies) {
    ADD_FAILURE() << "a daemon on a GPU host makes device copies by default";
    return nullptr;
  }
  const Status attached = (*c)->AttachDeviceWindow(spec);
  if (!attached.ok()) {
    ADD_FAILURE() << attached.ToString();
    return nullptr;
  }
  return std::move(c).value();
}

TEST(DeviceWindowGpu, RawChunksComeAsDeviceChunksBitExact) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kWindow = 2u << 20;  // far below an entry: the device ring wraps
  Peer peer(kWindow);
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto c = AttachedClient(d, peer, kWindow);
  ASSERT_TRUE(c);

  const auto layers = MixedLayers();
  auto pub = c->Publish(TestModel(), Tokens(4096, 91), layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  const std::size_t encoded = layers.back().chunks.size();
  const std::size_t raw = ChunkCount(layers) - encoded;
  for (int rep = 0; rep < 2; ++rep) {  // the second reuses the window
    const Tally t = FetchChecked(*c, peer, pub->id, layers);
    EXPECT_EQ(t.device, raw) << "just published, so every chunk is in the page cache";
    EXPECT_EQ(t.host, encoded);
    EXPECT_LT(t.extents, t.device) << "adjacent chunks did not travel as extents";
    EXPECT_LE(t.largest, kWindow / 4) << "an extent over a quarter of the window";
  }

  // A restarted daemon gets the window again with the client's next call.
  ASSERT_EQ(d.Stop(), 0);
  ASSERT_TRUE(d.Start());
  const Tally t = FetchChecked(*c, peer, pub->id, layers);
  EXPECT_EQ(t.device + t.host, raw + encoded);
  EXPECT_GT(t.device, 0u) << "the window was not attached again after the reconnect";
}

// A window whose size is no multiple of the chunks: the ring's end falls
// inside what would be an extent, which is split there (the rest at the
// front); every chunk still arrives bit for bit, over many wraps.
TEST(DeviceWindowGpu, AnExtentSplitByTheRingsWrapArrivesBitExact) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kWindow = (3u << 19) + 40000;  // 1.5 MiB + 40000 bytes; 64 KiB chunks
  Peer peer(kWindow);
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto c = AttachedClient(d, peer, kWindow);
  ASSERT_TRUE(c);
  const auto layers = MakeLayers(4096, 3, 93, 256, 64);  // every plane raw
  auto pub = c->Publish(TestModel(), Tokens(4096, 93), layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  for (int rep = 0; rep < 3; ++rep) {
    const Tally t = FetchChecked(*c, peer, pub->id, layers);
    EXPECT_EQ(t.device, ChunkCount(layers));
    EXPECT_LT(t.extents, t.device);
    EXPECT_LE(t.largest, kWindow / 4);
  }
}

// A chunk damaged in the middle of a raw layer (inside what would be a
// device extent), resident in the page cache: the fetch fails without
// announcing it, exactly that entry is quarantined, and an entry beside it
// still arrives bit for bit through the same window.
TEST(DeviceWindowGpu, ADamagedChunkInsideADeviceExtentFailsTheFetchAndQuarantinesItsEntry) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kWindow = 4u << 20;
  Peer peer(kWindow);
  Daemon d;
  ASSERT_TRUE(d.Start());
  const EntryToPublish bad_entry{Tokens(4096, 94), MakeLayers(4096, 3, 94, 256, 64)};
  const EntryToPublish good_entry{Tokens(4096, 95), MakeLayers(4096, 3, 95, 256, 64)};
  const auto& good_layers = good_entry.layers;
  // Rewritten through the page cache: resident, so it goes the mapped path.
  const ChunkDamage damage{0, 5, bad_entry.layers[0].chunks[5].size() / 2, 0x10};
  DamagedPair ids;
  ASSERT_NO_FATAL_FAILURE(PublishAndDamage(d, bad_entry, good_entry, damage, &ids));
  const std::uint64_t bad = ids.bad, good = ids.good;
  auto c = AttachedClient(d, peer, kWindow);
  ASSERT_TRUE(c);
  bool damaged_announced = false;
  FetchCallbacks cb;
  cb.on_chunk = [&](std::uint32_t layer, std::uint32_t index, std::span<const std::byte>) {
    damaged_announced |= layer == 0 && index == 5;
    return Status::Ok();
  };
  cb.on_device_extent = [&](const DeviceExtent& x, ChunkRelease release) {
    damaged_announced |= x.layer == 0 && x.index <= 5 && x.index + x.count > 5;
    release();
    return Status::Ok();
  };
  Status s = c->Fetch(bad, {}, cb);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_FALSE(damaged_announced) << "the damaged chunk reached the client";
  ListOptions lo;
  lo.state = EntryState::kQuarantined;
  auto admin = Admin(d);
  ASSERT_TRUE(admin);
  auto q = admin->List(lo);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->entries.size(), 1u);
  EXPECT_EQ(q->entries[0].id, bad);
  const Tally t = FetchChecked(*c, peer, good, good_layers);
  EXPECT_EQ(t.device + t.host, ChunkCount(good_layers));
}

TEST(DeviceWindowGpu, DaemonRefusesAWindowLargerThanTheExportedAllocation) {
  PC_SKIP_WITHOUT_CUDA();
  Peer peer(1u << 20);
  DeviceWindowSpec spec;
  ASSERT_TRUE(peer.ReadSpec(&spec, 64u << 20));
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Status s = (*c)->AttachDeviceWindow(spec);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace primecache::testing

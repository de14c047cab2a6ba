// The daemon's device copies end to end: a real primecached with device
// copies, and an engine process (device_dma_peer) exporting device memory
// that the client attaches as its device window. A fetch delivers every raw
// chunk resident in the page cache as a device chunk, copied by the GPU into
// the peer's memory bit for bit (checked by the peer's checksum of its
// device bytes), and every other chunk through the host, bit for bit; the
// window is attached again after the daemon restarts.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "tests/gpu/gpu_daemon_path.h"  // before the daemon harness
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/dma_peer.h"
#include "tests/ipc/daemon_harness.h"

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
  cb.on_device_chunk = [&](std::uint32_t layer, std::uint32_t index, std::uint64_t off, std::uint64_t len,
                           ChunkRelease release) {
    EXPECT_TRUE(index < raw.size() && raw[index]) << "a device chunk of a plane not stored raw";
    EXPECT_EQ(len, want[layer].chunks[index].size());
    EXPECT_EQ(peer.Sum(off, len), SumLine(want[layer].chunks[index])) << "device chunk " << layer << "/" << index;
    ++t.device;
    release();
    return Status::Ok();
  };
  Status s = c.Fetch(entry, {}, cb);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return t;
}

TEST(DeviceWindowGpu, RawChunksComeAsDeviceChunksBitExact) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kWindow = 2u << 20;  // far below an entry: the device ring wraps
  Peer peer(kWindow);
  DeviceWindowSpec spec;
  ASSERT_TRUE(peer.ReadSpec(&spec, kWindow));
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options("", true));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*c)->server_info().device_copies) << "a daemon on a GPU host makes device copies by default";
  Status attached = (*c)->AttachDeviceWindow(spec);
  ASSERT_TRUE(attached.ok()) << attached.ToString();

  const auto layers = MixedLayers();
  auto pub = (*c)->Publish(TestModel(), Tokens(4096, 91), layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  const std::size_t encoded = layers.back().chunks.size();
  const std::size_t raw = ChunkCount(layers) - encoded;
  for (int rep = 0; rep < 2; ++rep) {  // the second reuses the window
    const Tally t = FetchChecked(**c, peer, pub->id, layers);
    EXPECT_EQ(t.device, raw) << "just published, so every chunk is in the page cache";
    EXPECT_EQ(t.host, encoded);
  }

  // A restarted daemon gets the window again with the client's next call.
  ASSERT_EQ(d.Stop(), 0);
  ASSERT_TRUE(d.Start());
  const Tally t = FetchChecked(**c, peer, pub->id, layers);
  EXPECT_EQ(t.device + t.host, raw + encoded);
  EXPECT_GT(t.device, 0u) << "the window was not attached again after the reconnect";
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

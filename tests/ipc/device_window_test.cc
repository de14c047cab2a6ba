// Device windows without a GPU: what a daemon that makes no device copies,
// or any daemon, answers to attachDevice and to fetches naming a device
// window; that fetches go on unaffected; and the daemon's device flags. The
// copies themselves: tests/gpu/device_dma_gpu_test.cc.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {
namespace {

DeviceWindowSpec WellFormedSpec() {
  DeviceWindowSpec spec;
  spec.pci_bus_id = "0000:00:00.0";
  spec.handle.assign(client::kDeviceHandleBytes, '\x5a');
  spec.size = 1u << 20;
  return spec;
}

// Fetches `entry` with on_device_extent set: every chunk must still come
// through on_chunk; returns them, or the first failure.
Result<std::vector<std::vector<std::byte>>> FetchWithDeviceCallback(Client& c, std::uint64_t entry,
                                                                    int* device_chunks) {
  std::vector<std::vector<std::byte>> chunks;
  FetchCallbacks cb;
  cb.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> b) {
    chunks.emplace_back(b.begin(), b.end());
    return Status::Ok();
  };
  cb.on_device_extent = [&](const DeviceExtent& x, ChunkRelease release) {
    *device_chunks += static_cast<int>(x.count);
    release();
    return Status::Ok();
  };
  PC_RETURN_IF_ERROR(c.Fetch(entry, {}, cb));
  return chunks;
}

std::vector<std::vector<std::byte>> Flatten(const std::vector<LayerData>& layers) {
  std::vector<std::vector<std::byte>> out;
  for (const auto& l : layers) out.insert(out.end(), l.chunks.begin(), l.chunks.end());
  return out;
}

TEST(DeviceWindowTest, DaemonWithoutDeviceCopiesRefusesAttachAndFetchesGoOn) {
  Daemon d({"--device-copies", "off"});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options("", true));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE((*c)->server_info().device_copies);
  Status s = (*c)->AttachDeviceWindow(WellFormedSpec());
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.ToString();
  EXPECT_NE(s.message().find("--device-copies"), std::string::npos) << s.ToString();

  const auto layers = MakeLayers(256, 3, 81, 4096, 4);
  auto pub = (*c)->Publish(TestModel(), Tokens(256, 81), layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  int device_chunks = 0;
  auto got = FetchWithDeviceCallback(**c, pub->id, &device_chunks);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == Flatten(layers));
  EXPECT_EQ(device_chunks, 0);
}

// Checked before anything else, so every daemon (with or without a GPU)
// answers these the same.
TEST(DeviceWindowTest, MalformedAttachIsRefused) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  DeviceWindowSpec short_handle = WellFormedSpec();
  short_handle.handle.resize(10);
  Status s = (*c)->AttachDeviceWindow(short_handle);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("10 bytes, not 64"), std::string::npos) << s.ToString();
  DeviceWindowSpec empty = WellFormedSpec();
  empty.size = 0;
  EXPECT_EQ((*c)->AttachDeviceWindow(empty).code(), StatusCode::kInvalidArgument);
  DeviceWindowSpec long_bus = WellFormedSpec();
  long_bus.pci_bus_id.assign(300, '0');
  EXPECT_EQ((*c)->AttachDeviceWindow(long_bus).code(), StatusCode::kInvalidArgument);

  // Nothing was attached: fetches are untouched.
  const auto layers = MakeLayers(128, 2, 82, 4096, 4);
  auto pub = (*c)->Publish(TestModel(), Tokens(128, 82), layers);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  int device_chunks = 0;
  auto got = FetchWithDeviceCallback(**c, pub->id, &device_chunks);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == Flatten(layers));
  EXPECT_EQ(device_chunks, 0);
}

wire::ErrorCode ErrorOf(const ipc::Frame& f) {
  auto rd = f.Reader({});
  auto r = rd->getRoot<wire::Response>();
  return r.which() == wire::Response::ERROR ? r.getError().getCode() : wire::ErrorCode::INTERNAL;
}

// On the wire: a fetch naming a device window with none attached is refused;
// a deviceRelease naming nothing streaming is ignored.
TEST(DeviceWindowTest, DeviceWindowOnTheWireNeedsAnAttach) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  RawConn r(d.socket());
  ASSERT_TRUE(r.ok() && r.Hello());
  auto rel = ipc::BuildRequest(0, [](wire::Request::Builder q) {
    auto x = q.initDeviceRelease();
    x.setOffset(0);
    x.setLength(4096);
  });
  ASSERT_TRUE(r.Send(*rel));
  auto fetch = ipc::BuildRequest(5, [](wire::Request::Builder q) {
    auto f = q.initFetch();
    f.setEntry(1);
    auto w = f.initDeviceWindow();
    w.setOffset(0);
    w.setLength(1u << 20);
  });
  ASSERT_TRUE(r.Send(*fetch));
  auto f = r.Next();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->Reader({})->getRoot<wire::Response>().getId(), 5u) << "the release got no answer";
  EXPECT_EQ(ErrorOf(*f), wire::ErrorCode::FAILED_PRECONDITION);
}

TEST(DeviceWindowTest, DeviceFlagsAreCheckedAndReadFromTheConfig) {
  {
    Daemon bad({"--device-copies", "sometimes"});
    EXPECT_FALSE(bad.Start());
  }
  {
    Daemon bad({"--device-register-budget", "lots"});
    EXPECT_FALSE(bad.Start());
  }
  Daemon probe;  // only for a temporary directory
  const std::string config = probe.dir() + "/device.json";
  std::ofstream(config) << R"({"device_copies": "off", "device_register_budget": "1G"})";
  Daemon d({"--config", config});
  ASSERT_TRUE(d.Start());
  auto c = Client::Connect(d.Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE((*c)->server_info().device_copies);
  EXPECT_EQ((*c)->AttachDeviceWindow(WellFormedSpec()).code(), StatusCode::kNotSupported);
  std::ofstream(config) << R"({"device_copies": "always"})";
  Daemon refused({"--config", config});
  EXPECT_FALSE(refused.Start());
}

}  // namespace
}  // namespace primecache::testing

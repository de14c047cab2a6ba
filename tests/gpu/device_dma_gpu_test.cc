// DeviceDma on a real device: a peer process exports a device buffer, this
// one opens it and queues copies of mapped file bytes into it by DMA; the
// peer's checksum of its device bytes must match the file's, and copies
// outside the window or the mapping are refused. Pins: a registration's
// serial (PinnedAs) lasts exactly as long as the registration, a file is
// counted once in the budget however many mappings of it are registered,
// and a store's fetch skips the check of a chunk only under the pin it was
// checked under.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ipc/device_dma.h"
#include "primecache/checksum.h"
#include "tests/statestore/store_test_util.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/dma_peer.h"

namespace primecache::ipc {
namespace {

using gpu_test::Peer;

// A file of random bytes, mapped read-only.
struct MappedFile {
  std::string path;
  std::vector<std::byte> bytes;
  MappedRegion mapping;
  MappedFile(std::size_t size, std::uint64_t id, unsigned seed) {
    path = ::testing::TempDir() + "device_dma_" + std::to_string(id) + "_" + std::to_string(getpid());
    std::mt19937_64 rng(seed);
    bytes.resize(size);
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
    EXPECT_EQ(write(fd, bytes.data(), size), static_cast<ssize_t>(size));
    void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(p, MAP_FAILED);
    mapping.data = static_cast<const std::byte*>(p);
    mapping.size = size;
    mapping.id = id;
    mapping.owner = std::shared_ptr<const void>(p, [size](const void* q) { munmap(const_cast<void*>(q), size); });
  }
  ~MappedFile() { std::filesystem::remove(path); }
};

// Another read-only mapping of the file at `path`, of its first `size` bytes.
MappedRegion MapAgain(const std::string& path, std::size_t size, std::uint64_t id) {
  MappedRegion m;
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return m;
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return m;
  m.data = static_cast<const std::byte*>(p);
  m.size = size;
  m.id = id;
  m.owner = std::shared_ptr<const void>(p, [size](const void* q) { munmap(const_cast<void*>(q), size); });
  return m;
}

std::string SumLine(std::span<const std::byte> b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "SUM %016llx", static_cast<unsigned long long>(Checksum64(b)));
  return buf;
}

// A peer process exporting `size` device bytes, and this process's
// DeviceDma (a budget of `budget` registered bytes) with the peer's window
// open on it, unless `open` is false.
struct PeerWindow {
  explicit PeerWindow(std::size_t size) : peer(size) {}
  Peer peer;
  DeviceWindowSpec spec;
  std::unique_ptr<DeviceDma> dma;
  std::shared_ptr<DeviceWindow> window;
};

void Start(PeerWindow* p, std::size_t size, std::uint64_t budget, bool open = true,
           std::size_t max_streams = DeviceDma::kDefaultMaxStreams) {
  ASSERT_TRUE(p->peer.ReadSpec(&p->spec, size));
  auto dma = DeviceDma::Create(budget, max_streams);
  ASSERT_TRUE(dma.ok()) << dma.status().ToString();
  p->dma = std::move(dma).value();
  if (!open) return;
  auto window = p->dma->Open(p->spec);
  ASSERT_TRUE(window.ok()) << window.status().ToString();
  p->window = std::move(window).value();
}

// `file`'s bytes copied to the window's start in 4 MiB pieces, shuffled,
// by four threads, each with a queue of its own enqueueing without waiting.
std::vector<Status> CopyOnFourQueues(PeerWindow& p, const MappedFile& file) {
  constexpr std::size_t kPiece = 4u << 20;
  std::vector<std::size_t> offsets;
  for (std::size_t o = 0; o < file.bytes.size(); o += kPiece) offsets.push_back(o);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937(3));
  // Four threads, each with a queue of its own, enqueue without waiting.
  std::vector<std::thread> threads;
  std::vector<Status> results(4);
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto q = p.dma->NewQueue(p.window);
      if (!q.ok()) {
        results[t] = q.status();
        return;
      }
      for (std::size_t i = t; i < offsets.size() && results[t].ok(); i += 4) {
        const std::size_t o = offsets[i], n = std::min(kPiece, file.bytes.size() - o);
        results[t] = (*q)->Enqueue(o, std::span(file.mapping.data + o, n), file.mapping);
      }
      auto done = (*q)->Completed((*q)->enqueued());
      if (results[t].ok() && (!done.ok() || *done != (*q)->enqueued())) results[t] = Status::Internal("not all done");
    });
  }
  for (auto& th : threads) th.join();
  return results;
}

TEST(DeviceDmaGpu, CopiesMappedBytesIntoAnotherProcesssDeviceBuffer) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kSize = 48u << 20;
  PeerWindow p(kSize);
  ASSERT_NO_FATAL_FAILURE(Start(&p, kSize, 32u << 20));

  MappedFile file(kSize - 12345, 1, 7);  // not a whole number of pieces
  for (const Status& s : CopyOnFourQueues(p, file)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(p.peer.Sum(0, file.bytes.size()), SumLine(file.bytes));
  EXPECT_EQ(p.peer.Sum(file.bytes.size(), 12345), SumLine(std::vector<std::byte>(12345)));

  // A second mapping pushes the first out of the 32 MiB budget once no copy
  // of the first is in flight.
  MappedFile second(24u << 20, 2, 9);
  {
    auto q = p.dma->NewQueue(p.window);
    ASSERT_TRUE(q.ok());
    ASSERT_TRUE((*q)->Enqueue(0, std::span(second.mapping.data, 1u << 20), second.mapping).ok());
    auto done = (*q)->Completed(1);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    ASSERT_EQ(*done, 1u);
  }
  EXPECT_EQ(p.dma->registered_bytes(), second.mapping.size);
  EXPECT_EQ(p.peer.Sum(0, 1u << 20), SumLine(std::span(second.bytes).first(1u << 20)));
}

// Many small copies in flight at once, polled and then left to the queue's
// destructor: every byte lands, in a window the copies fill back to back.
// Past --copy-streams, queues share a stream: four queues on one stream
// each complete their own copies, and the bytes all land.
TEST(DeviceDmaGpu, QueuesSharingOneStreamEachCompleteTheirCopies) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kSize = 48u << 20;
  PeerWindow p(kSize);
  ASSERT_NO_FATAL_FAILURE(Start(&p, kSize, 64u << 20, true, 1));
  MappedFile file(kSize - 4321, 3, 11);
  for (const Status& s : CopyOnFourQueues(p, file)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(p.peer.Sum(0, file.bytes.size()), SumLine(file.bytes));
}

// By default the queues of a device share one stream, so their copies run
// in the order they were enqueued, whoever queued them: a fetch's copy
// enqueued after another fetch's runs after it (the turns concurrent
// restores take), and each queue knows how many share the device.
TEST(DeviceDmaGpu, QueuesOfADeviceTakeTurnsInTheOrderTheyEnqueued) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kSize = 64u << 20, kPiece = 16u << 20;
  PeerWindow p(kSize);
  ASSERT_NO_FATAL_FAILURE(Start(&p, kSize, 256u << 20));
  MappedFile file(kSize, 4, 7);
  auto a = p.dma->NewQueue(p.window);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->sharers(), 1u);
  {
    auto b = p.dma->NewQueue(p.window);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ((*a)->sharers(), 2u);
    EXPECT_EQ((*b)->sharers(), 2u);
    // a, b, a, b: once b's second copy completed, both of a's had.
    for (std::size_t i = 0; i < 4; ++i) {
      DeviceCopyQueue& q = i % 2 == 0 ? **a : **b;
      const std::size_t o = i * kPiece;
      ASSERT_TRUE(q.Enqueue(o, std::span(file.mapping.data + o, kPiece), file.mapping).ok());
    }
    auto b_done = (*b)->Completed(2);
    ASSERT_TRUE(b_done.ok()) << b_done.status().ToString();
    auto a_done = (*a)->Completed(0);  // no wait: what has completed already
    ASSERT_TRUE(a_done.ok()) << a_done.status().ToString();
    EXPECT_EQ(*a_done, 2u);
  }
  EXPECT_EQ((*a)->sharers(), 1u);
  EXPECT_EQ(p.peer.Sum(0, kSize), SumLine(file.bytes));
}

TEST(DeviceDmaGpu, AQueueDestroyedWithCopiesInFlightWaitsForThem) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kSize = 32u << 20, kPiece = 256u << 10;
  PeerWindow p(kSize);
  ASSERT_NO_FATAL_FAILURE(Start(&p, kSize, 256u << 20));
  MappedFile file(kSize, 4, 5);
  {
    auto q = p.dma->NewQueue(p.window);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    for (std::size_t o = 0; o < kSize; o += kPiece) {
      ASSERT_TRUE((*q)->Enqueue(o, std::span(file.mapping.data + o, kPiece), file.mapping).ok());
      auto done = (*q)->Completed(0);
      ASSERT_TRUE(done.ok());
      EXPECT_LE(*done, (*q)->enqueued());
    }
    EXPECT_EQ((*q)->enqueued(), kSize / kPiece);
    EXPECT_TRUE((*q)->Completed((*q)->enqueued() + 1).status().IsInvalidArgument());
  }
  EXPECT_EQ(p.peer.Sum(0, kSize), SumLine(file.bytes));
}

TEST(DeviceDmaGpu, RefusesCopiesOutsideTheWindowOrTheMapping) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kSize = 1u << 20;
  PeerWindow p(kSize);
  ASSERT_NO_FATAL_FAILURE(Start(&p, kSize, 64u << 20));
  MappedFile file(2u << 20, 3, 1);
  const auto& m = file.mapping;
  auto q = p.dma->NewQueue(p.window);
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE((*q)->Enqueue(kSize - 10, std::span(m.data, 11), m).IsInvalidArgument());
  EXPECT_TRUE((*q)->Enqueue(kSize + 1, std::span(m.data, 0), m).IsInvalidArgument());
  EXPECT_TRUE((*q)->Enqueue(0, std::span(m.data + m.size - 10, 11), m).IsInvalidArgument());
  EXPECT_EQ((*q)->enqueued(), 0u);
  EXPECT_TRUE(p.dma->NewQueue(nullptr).status().IsInvalidArgument());
  DeviceWindowSpec bad = p.spec;
  bad.handle.pop_back();
  EXPECT_TRUE(p.dma->Open(bad).status().IsInvalidArgument());
  bad = p.spec;
  bad.pci_bus_id = "not-a-bus";
  EXPECT_FALSE(p.dma->Open(bad).ok());
  EXPECT_EQ(p.peer.Sum(0, kSize), SumLine(std::vector<std::byte>(kSize)));  // nothing was written
}

// The size is the client's word: a window larger than the exported
// allocation is refused, so no copy can land past it.
TEST(DeviceDmaGpu, RefusesAWindowLargerThanItsAllocation) {
  PC_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kSize = 1u << 20;
  PeerWindow p(kSize);
  ASSERT_NO_FATAL_FAILURE(Start(&p, kSize, 64u << 20, /*open=*/false));
  DeviceWindowSpec larger = p.spec;
  larger.size = 64u << 20;
  auto refused = p.dma->Open(larger);
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  auto window = p.dma->Open(p.spec);
  EXPECT_TRUE(window.ok()) << window.status().ToString();
}

// PinnedAs is 0 before a registration, the same nonzero serial while it
// lasts (across pins and copies), 0 once it was evicted, and another serial
// once the mapping is registered again.
TEST(DeviceDmaGpu, APinsSerialLastsExactlyAsLongAsItsRegistration) {
  PC_SKIP_WITHOUT_CUDA();
  auto dma = DeviceDma::Create(6u << 20);
  ASSERT_TRUE(dma.ok()) << dma.status().ToString();
  MappedFile a(4u << 20, 21, 1), b(4u << 20, 22, 2);
  EXPECT_EQ((*dma)->PinnedAs(a.mapping), 0u) << "not registered yet";
  std::uint64_t first = 0;
  {
    auto pin = (*dma)->Pin(a.mapping);
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
    first = pin->serial;
    EXPECT_NE(first, 0u);
    EXPECT_EQ((*dma)->PinnedAs(a.mapping), first);
    auto again = (*dma)->Pin(a.mapping);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->serial, first) << "a second pin of a registered mapping is the same registration";
  }
  EXPECT_EQ((*dma)->PinnedAs(a.mapping), first) << "kept registered after its pins went, within the budget";
  {
    auto pin = (*dma)->Pin(b.mapping);  // over the 6 MiB budget: `a`, unused, goes
    ASSERT_TRUE(pin.ok());
    EXPECT_NE(pin->serial, first);
    EXPECT_EQ((*dma)->PinnedAs(a.mapping), 0u) << "evicted";
  }
  auto redone = (*dma)->Pin(a.mapping);
  ASSERT_TRUE(redone.ok());
  EXPECT_NE(redone->serial, 0u);
  EXPECT_NE(redone->serial, first) << "a registration redone must not match the old one's records";
  EXPECT_EQ((*dma)->PinnedAs(a.mapping), redone->serial);
}

// A file mapped twice (a segment that grew: a shorter and a longer mapping)
// is counted once against the budget; the shorter one's registration goes
// once nothing holds it.
TEST(DeviceDmaGpu, AFileMappedTwiceIsCountedOnce) {
  PC_SKIP_WITHOUT_CUDA();
  auto dma = DeviceDma::Create(64u << 20);
  ASSERT_TRUE(dma.ok()) << dma.status().ToString();
  MappedFile file(8u << 20, 31, 3);
  // The file as the store maps it: first its first 4 MiB, then all of it,
  // at another address under another id.
  MappedRegion longer = file.mapping;
  MappedRegion shorter = MapAgain(file.path, 4u << 20, 32);
  ASSERT_NE(shorter.data, nullptr);
  shorter.file = longer.file = 1234;
  auto held = (*dma)->Pin(shorter);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ((*dma)->registered_bytes(), shorter.size);
  {
    auto pin = (*dma)->Pin(longer);
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
    EXPECT_EQ((*dma)->registered_bytes(), longer.size) << "one file counted twice";
    EXPECT_NE((*dma)->PinnedAs(shorter), 0u) << "still held: still registered";
  }
  held->hold.reset();
  EXPECT_EQ((*dma)->PinnedAs(shorter), 0u) << "replaced, and no longer held: let go";
  EXPECT_NE((*dma)->PinnedAs(longer), 0u);
  EXPECT_EQ((*dma)->registered_bytes(), longer.size);
}

// A store's fetch through a sink that pins with DeviceDma, as the daemon's
// does: the first fetch checks every mapped chunk, a second under the same
// registration checks none, and once the registration was evicted and
// redone every chunk is checked again (TestHooks::mapped_checks).
struct DmaPinSink final : FetchSink {
  DeviceDma* dma = nullptr;
  std::size_t mapped = 0;
  Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte>) override { return Status::Ok(); }
  bool TakesMappedChunks() const override { return true; }
  Status OnMappedChunk(std::uint32_t, std::uint32_t, std::span<const std::byte>, const MappedRegion&) override {
    ++mapped;
    return Status::Ok();
  }
  Result<MappingPin> Pin(const MappedRegion& m) override { return dma->Pin(m); }
};

TEST(DeviceDmaGpu, AFetchSkipsTheCheckOnlyUnderTheRegistrationItWasCheckedUnder) {
  PC_SKIP_WITHOUT_CUDA();
  using namespace store_test;  // NOLINT(google-build-using-namespace)
  TempDir dir;
  auto hooks = std::make_shared<statestore_internal::TestHooks>();
  hooks->mapped_checks = std::make_shared<statestore_internal::MappedCheckCounts>();
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  auto store = statestore_internal::OpenWithHooks(o, hooks);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  TestModel model;
  model.chunk_bytes = 64u << 10;
  const EntryId id = MustPublish(**store, Conversation(2000, 41), 1, "", model);
  // A budget below one more mapping: pinning `other` evicts the segment's.
  auto dma = DeviceDma::Create(1u << 20);
  ASSERT_TRUE(dma.ok()) << dma.status().ToString();
  DmaPinSink sink;
  sink.dma = dma->get();
  auto& counts = *hooks->mapped_checks;
  // (A chunk met twice in one fetch may be skipped the second time.)
  ASSERT_TRUE((*store)->Fetch(id, {}, sink).ok());
  const std::uint64_t chunks = sink.mapped;
  ASSERT_GT(chunks, 0u) << "just published, the segment is in the page cache";
  const std::uint64_t checked = counts.checked.load(), skipped = counts.skipped.load();
  EXPECT_GT(checked, 0u);
  EXPECT_EQ(checked + skipped, chunks);
  ASSERT_TRUE((*store)->Fetch(id, {}, sink).ok());
  EXPECT_EQ(sink.mapped, 2 * chunks);
  EXPECT_EQ(counts.checked.load(), checked) << "checked again under the same registration";
  EXPECT_EQ(counts.skipped.load(), skipped + chunks);
  MappedFile other(2u << 20, 1ull << 40, 5);
  ASSERT_TRUE((*dma)->Pin(other.mapping).ok());  // evicts the segment's registration
  ASSERT_TRUE((*store)->Fetch(id, {}, sink).ok());
  EXPECT_EQ(sink.mapped, 3 * chunks);
  EXPECT_GT(counts.checked.load(), checked) << "not checked again after the registration was redone";
  EXPECT_EQ(counts.checked.load() + counts.skipped.load(), 3 * chunks);
}

}  // namespace
}  // namespace primecache::ipc

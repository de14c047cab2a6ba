// Fetches that hand chunks out where they lie (FetchSink::TakesMappedChunks):
// every chunk bit-exact, in place when its pages are resident and read
// otherwise; a damaged chunk is still caught before any sink sees it; a
// mapping held across a compaction keeps its bytes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include "segment_util.h"
#include "store_test_util.h"
#include "tests/support/fault_env.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

const TestModel kModel = [] {
  TestModel m;
  m.chunk_bytes = 2048;
  return m;
}();

// Collects what it is handed, remembering which chunks came mapped and
// keeping their mappings.
struct MappedSink final : FetchSink {
  std::vector<std::string> chunks;
  std::size_t mapped = 0, read = 0;
  std::vector<MappedRegion> held;
  Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
    ++read;
    chunks.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    return Status::Ok();
  }
  bool TakesMappedChunks() const override { return true; }
  Status OnMappedChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b,
                       const MappedRegion& m) override {
    if (b.data() < m.data || b.data() + b.size() > m.data + m.size) return Status::Internal("outside its mapping");
    ++mapped;
    held.push_back(m);
    chunks.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    return Status::Ok();
  }
};

// A sink that says its mappings are pinned as `pin` (0: not pinned).
struct PinningSink final : FetchSink {
  std::uint64_t pin = 0;
  std::vector<std::string> chunks;
  Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
    chunks.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    return Status::Ok();
  }
  bool TakesMappedChunks() const override { return true; }
  Result<MappingPin> Pin(const MappedRegion&) override { return MappingPin{pin, nullptr}; }
};

// A sink that pins (registers) each mapping the first time it meets it, as
// the daemon's device copies do, with a pin number that changes with every
// registration. `on_register` runs as a registration reads the pages, before
// they are pinned. Records the order of its calls.
struct RegisteringSink final : FetchSink {
  std::function<void()> on_register;
  std::map<std::uint64_t, std::uint64_t> pins;  // mapping id -> pin
  std::uint64_t serials = 100;
  std::vector<std::string> calls, chunks;
  std::uint64_t Register(const MappedRegion& m) {
    auto [it, fresh] = pins.try_emplace(m.id, 0);
    if (fresh) {
      calls.push_back("register");
      if (on_register) on_register();
      it->second = ++serials;
    }
    return it->second;
  }
  Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
    calls.push_back("read");
    chunks.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    return Status::Ok();
  }
  bool TakesMappedChunks() const override { return true; }
  Result<MappingPin> Pin(const MappedRegion& m) override {
    calls.push_back("pin");
    return MappingPin{Register(m), nullptr};
  }
  Status OnMappedChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b, const MappedRegion& m) override {
    Register(m);  // the copy registers what is not registered yet
    calls.push_back("copy");
    chunks.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    return Status::Ok();
  }
};

std::vector<std::string> AllChunks(const std::vector<LayerBytes>& layers) {
  std::vector<std::string> out;
  for (const auto& l : layers) out.insert(out.end(), l.chunks.begin(), l.chunks.end());
  return out;
}

TEST(MappedFetch, ResidentChunksComeMappedAndBitExact) {
  MemStore m;  // a memory Env: every mapping is resident
  const auto t = Conversation(400, 11);
  const EntryId id = MustPublish(*m.store, t, 1, "", kModel);
  MappedSink sink;
  ASSERT_TRUE(m.store->Fetch(id, {}, sink).ok());
  EXPECT_EQ(sink.chunks, AllChunks(MakeLayers(t, kModel)));
  EXPECT_EQ(sink.read, 0u);
  EXPECT_EQ(sink.mapped, sink.chunks.size());
}

TEST(MappedFetch, ADamagedChunkIsCaughtAndQuarantined) {
  MemStore m;
  const auto t = Conversation(400, 12);
  const auto layers = MakeLayers(t, kModel);
  const EntryId id = MustPublish(*m.store, t, 1, "", kModel);
  m.store.reset();
  std::string bad = layers[1].chunks[0];
  bad[bad.size() / 2] ^= 0x10;
  OverwriteChunk(m.env.get(), m.options.path, Checksum128(std::as_bytes(std::span(layers[1].chunks[0]))), bad);
  m.Reopen();
  MappedSink sink;
  Status s = m.store->Fetch(id, {}, sink);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  for (const auto& c : sink.chunks) EXPECT_NE(c, bad) << "a damaged chunk reached the sink";
  auto info = m.store->Describe(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info.state, EntryState::kQuarantined);
}

TEST(MappedFetch, AMappingHeldAcrossACompactionKeepsItsBytes) {
  MemStore m;
  const auto keep = Conversation(400, 13), drop = Conversation(400, 14);
  const EntryId gone = MustPublish(*m.store, drop, 1, "", kModel);
  const EntryId id = MustPublish(*m.store, keep, 1, "", kModel);
  MappedSink sink;
  ASSERT_TRUE(m.store->Fetch(id, {}, sink).ok());
  ASSERT_FALSE(sink.held.empty());
  ASSERT_TRUE(m.store->Delete(gone).ok());
  ASSERT_TRUE(m.store->Compact().ok());  // rewrites the segment and unlinks it
  // Every chunk handed out is still where it was, unchanged.
  const auto want = AllChunks(MakeLayers(keep, kModel));
  MappedSink again;
  ASSERT_TRUE(m.store->Fetch(id, {}, again).ok());
  EXPECT_EQ(again.chunks, want);
  EXPECT_EQ(sink.chunks, want);
}

// On a real file system (mmap and mincore): a segment just written is in the
// page cache and comes mapped; after its pages were dropped, whichever way
// each chunk comes (mapped pages of a live mapping may stay resident), every
// byte is right.
TEST(MappedFetch, OnDiskChunksComeMappedWhenResidentAndStayExact) {
  const std::string dir = ::testing::TempDir() + "mapped_fetch_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  StoreOptions o = CodecStoreOptions();
  o.path = dir;
  auto store = LocalStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const auto t = Conversation(400, 15);
  const EntryId id = MustPublish(**store, t, 1, "", kModel);
  const auto want = AllChunks(MakeLayers(t, kModel));
  MappedSink warm;
  ASSERT_TRUE((*store)->Fetch(id, {}, warm).ok());
  EXPECT_EQ(warm.chunks, want);
  EXPECT_EQ(warm.mapped, want.size()) << "just written, the segment is in the page cache";
  for (const auto& e : std::filesystem::directory_iterator(dir + "/segments")) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  warm.held.clear();
  MappedSink cold;
  ASSERT_TRUE((*store)->Fetch(id, {}, cold).ok());
  EXPECT_EQ(cold.chunks, want);
  EXPECT_EQ(cold.mapped + cold.read, want.size());
  store->reset();
  std::filesystem::remove_all(dir);
}

// A chunk checked while the sink held its mapping pinned is not checked
// again while the pin lasts (its pages cannot have been read back from the
// disk); under another pin, or none, it is. The bytes are changed behind
// the store's back here only to see which fetches check them.
TEST(MappedFetch, AChunkCheckedWhilePinnedIsCheckedAgainOnlyUnderAnotherPin) {
  const std::string dir = ::testing::TempDir() + "pinned_fetch_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  StoreOptions o = CodecStoreOptions();
  o.path = dir;
  const auto t = Conversation(400, 16);
  const auto layers = MakeLayers(t, kModel);
  EntryId id = 0;
  {
    auto store = LocalStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    id = MustPublish(**store, t, 1, "", kModel);
  }
  const std::string good = layers[1].chunks[0];
  const ChunkPlace place = PlaceOfChunk(Env::Default(), dir, Checksum128(std::as_bytes(std::span(good))));
  auto store = LocalStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  PinningSink first;
  first.pin = 7;
  ASSERT_TRUE((*store)->Fetch(id, {}, first).ok());
  EXPECT_EQ(first.chunks, AllChunks(layers));

  std::string bad = good;
  bad[bad.size() / 2] ^= 0x10;
  const int fd = ::open(place.file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bad.data(), bad.size(), static_cast<off_t>(place.offset)), static_cast<ssize_t>(bad.size()));
  ::close(fd);

  PinningSink same;
  same.pin = 7;
  ASSERT_TRUE((*store)->Fetch(id, {}, same).ok()) << "checked under pin 7 already";
  EXPECT_NE(std::find(same.chunks.begin(), same.chunks.end(), bad), same.chunks.end());
  PinningSink other;
  other.pin = 8;
  Status s = (*store)->Fetch(id, {}, other);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_EQ(std::find(other.chunks.begin(), other.chunks.end(), bad), other.chunks.end());
  EXPECT_EQ((*store)->Describe(id)->info.state, EntryState::kQuarantined);
  store->reset();
  std::filesystem::remove_all(dir);
}

// The pages of a mapping can be dropped and read back from the disk at any
// time until they are pinned: here, as the first chunk's mapping is
// registered, its bytes on the disk are other bytes (FaultInjectionEnv's
// page cache). The address must be checked over the bytes that are pinned,
// so the fetch refuses, quarantines the entry and hands out nothing damaged.
TEST(MappedFetch, BytesReadBackFromTheDiskBeforeTheyArePinnedAreChecked) {
  auto base = NewMemEnv();
  FaultInjectionEnv fenv(base.get());
  fenv.MapAsPageCache("/segments/");
  StoreOptions o = CodecStoreOptions();
  o.env = &fenv;
  o.path = "/store";
  const auto t = Conversation(400, 17);
  const auto layers = MakeLayers(t, kModel);
  EntryId id = 0;
  {
    auto store = LocalStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    id = MustPublish(**store, t, 1, "", kModel);
  }
  // The first chunk fetched is the one read back damaged: its check is the
  // only one done before the first registration, whatever the read-ahead.
  const std::string good = layers[0].chunks[0];
  const ChunkPlace place = PlaceOfChunk(base.get(), o.path, Checksum128(std::as_bytes(std::span(good))));
  std::string bad = good;
  bad[bad.size() / 2] ^= 0x10;
  auto store = LocalStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  RegisteringSink sink;
  sink.on_register = [&] {
    OverwriteAt(base.get(), place.file, place.offset, bad);
    ASSERT_TRUE(fenv.ReadBackMappedPages("/segments/").ok());
  };
  Status s = (*store)->Fetch(id, {}, sink);
  ASSERT_FALSE(sink.calls.empty());
  EXPECT_EQ(sink.calls.front(), "pin") << "the mapping is pinned before anything is handed out";
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  for (const auto& c : sink.chunks) EXPECT_NE(c, bad) << "a chunk damaged before it was pinned reached the sink";
  EXPECT_EQ((*store)->Describe(id)->info.state, EntryState::kQuarantined);
}

}  // namespace
}  // namespace primecache

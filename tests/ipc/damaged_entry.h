// A damaged entry beside a whole one in a real daemon's store, for the
// fetch tests of a chunk that fails its check (tests/ipc/fetch_extent_test.cc,
// tests/ipc/shm_path_test.cc, tests/gpu/device_window_gpu_test.cc). Include
// after tests/ipc/daemon_harness.h (and, for the GPU tests, their daemon
// path before it); needs tests/statestore on the include path.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "primecache/internal/env.h"
#include "segment_util.h"
#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {

// An entry to publish: its tokens and layers.
struct EntryToPublish {
  std::vector<std::uint32_t> tokens;
  std::vector<LayerData> layers;
};

// Which stored chunk of the bad entry is damaged, and how: byte `at` of
// chunk `index` of layer `layer`, xor `mask`.
struct ChunkDamage {
  std::uint32_t layer = 0;
  std::size_t index = 0;
  std::size_t at = 0;
  std::uint8_t mask = 0x10;
};

// The ids of the two entries.
struct DamagedPair {
  std::uint64_t bad = 0, good = 0;
};

// Publishes `bad` then `good` into the running daemon `d`, stops it (it must
// exit cleanly), rewrites `damage`'s chunk of `bad` in its segment file
// (through the page cache: its pages stay resident) with one byte changed,
// and starts `d` again on the same store. A failed step is a fatal gtest
// failure: call it in ASSERT_NO_FATAL_FAILURE.
inline void PublishAndDamage(Daemon& d, const EntryToPublish& bad, const EntryToPublish& good,
                             const ChunkDamage& damage, DamagedPair* ids) {
  {
    auto p = Client::Connect(d.Options());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto rb = (*p)->Publish(TestModel(), bad.tokens, bad.layers);
    auto rg = (*p)->Publish(TestModel(), good.tokens, good.layers);
    ASSERT_TRUE(rb.ok() && rg.ok()) << rb.status().ToString() << " / " << rg.status().ToString();
    ids->bad = rb->id;
    ids->good = rg->id;
  }
  ASSERT_EQ(d.Stop(), 0);
  ASSERT_LT(damage.layer, bad.layers.size());
  ASSERT_LT(damage.index, bad.layers[damage.layer].chunks.size());
  const auto& chunk = bad.layers[damage.layer].chunks[damage.index];
  ASSERT_LT(damage.at, chunk.size());
  std::string changed(reinterpret_cast<const char*>(chunk.data()), chunk.size());
  changed[damage.at] = static_cast<char>(changed[damage.at] ^ damage.mask);
  ASSERT_NO_FATAL_FAILURE(store_test::OverwriteChunk(
      Env::Default(), d.data_dir() + "/store", Checksum128(std::span<const std::byte>(chunk)), changed));
  ASSERT_TRUE(d.Start());
}

}  // namespace primecache::testing

// StagedFetch: one fetch of a stored boundary into PrefixCache's staging
// (serving/prefix_cache_restore.cc). Private to primecache_serving.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "core/worker_pool.h"
#include "engine/model/hybrid_model.h"
#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/engine.h"

namespace primecache::model {

// One fetch into staging. Layer headers are checked against the cache as
// they arrive and give each layer its block (planes back to back, in view
// order) at the same offset in host and device staging. Each chunk is handed
// to the pool: a raw one whose bytes lie in registered memory is checked and
// copied to device staging from where it lies, its loan returned by a
// releaser thread once an event recorded after the copy has passed; one the
// daemon copied into the device window (an extent of them) is copied on from
// there the same way;
// any other is decoded into host staging, its loan returned, and (with device
// staging) copied up from there.
// Callbacks run on the client's reader thread; chunk work on the pool.
class StagedFetch {
 public:
  // `window`: the device window attached to the daemon (empty: none; only
  // with device staging).
  StagedFetch(engine::Device& dev, WorkerPool& pool, std::vector<LayerGeometry> geometry, float* host,
              float* device, std::uint64_t capacity, std::span<const std::byte> window);
  ~StagedFetch() { CloseLoans(); }
  StagedFetch(const StagedFetch&) = delete;
  StagedFetch& operator=(const StagedFetch&) = delete;

  client::FetchCallbacks Callbacks();

  // After Fetch returned `fetched`: waits for every chunk's work and the
  // transfer lane (whatever happened: no copy may outlive the staging), then
  // checks that every layer and chunk arrived.
  Status Finish(Status fetched);

  // After Finish: lays the head-group parts of each layer side by side in
  // the rank's layout (serving/head_groups.h). parts[m] are the fetched
  // layers model layer m is made of, in part order, each of one shape; one
  // fetched layer is the layer as it is, n of them are gathered into n
  // times their heads (KDA) or row widths (KV) beyond the fetched layers in
  // staging (on the device with device staging, where the fetched bytes
  // are). Views() then gives one view per model layer. Each fetched layer
  // belongs to one model layer.
  Status GatherParts(std::span<const std::vector<std::uint32_t>> parts);

  // The staged layers as views (of device staging when there is one): one
  // per fetched layer, or per model layer after GatherParts.
  std::vector<engine::LayerSnapshotView> Views() const;
  std::uint64_t floats() const { return used_; }
  std::uint64_t direct_chunks() const { return direct_.load(); }
  std::uint64_t device_chunks() const { return device_chunks_.load(); }
  std::uint64_t device_chunk_bytes() const { return device_bytes_.load(); }
  std::uint64_t device_extents() const { return device_extents_.load(); }

 private:
  struct Layer {
    std::optional<LayerDecoder> decoder;
    std::uint64_t offset = 0;            // of its block in staging, in floats
    std::vector<std::uint64_t> planes;  // each plane's offset within the block
    std::vector<bool> seen;
  };

  Status OnLayer(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks);
  // Marks chunk `index` of `layer` as arrived: refused (and released) when
  // it is not one this fetch expects, is there already, or the fetch failed.
  Status Claim(std::uint32_t layer, std::uint32_t index, const client::ChunkRelease& release);
  Status OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                 client::ChunkRelease release);
  Status RunChunk(const Layer& l, std::size_t index, std::span<const std::byte> bytes, client::ChunkRelease release);
  // Raw chunks the daemon copied into the device window as one extent: each
  // checked as if the daemon were hostile (a chunk this fetch expects,
  // stored raw, exactly its size, the extent inside the window; the daemon
  // checked each address over the bytes it copied), then copied on to their
  // places in device staging on the transfer lane, chunks whose places
  // follow each other in one copy, here on the reader thread (enqueues, no
  // host work); the extent's window space is lent back once the copies
  // have run (the releaser: one event, one release).
  Status OnDeviceExtent(const client::DeviceExtent& extent, client::ChunkRelease release);
  // After a copy out of lent memory was enqueued (`copied` its status):
  // queues the loan for the releaser behind an event recorded after the copy
  // (a host callback on the stream would stall the copies behind it for a
  // round trip to the host each). On failure the loan ends now.
  Status Lend(const Status& copied, client::ChunkRelease release);
  // The releaser: returns each direct chunk's loan once its copy has run,
  // until Finish closes the queue.
  void ReleaseLoop();
  void CloseLoans();
  void Done(const Status& s, std::uint32_t layer, bool counted = true);

  engine::Device& dev_;
  WorkerPool& pool_;
  const std::vector<LayerGeometry> geometry_;
  float* const host_;
  float* const device_;  // null: host staging only
  const std::uint64_t capacity_;
  const std::span<const std::byte> window_;  // device; empty: no device chunks
  std::vector<Layer> layers_;
  // After GatherParts: each model layer's shape and offset in staging.
  std::vector<std::pair<LayerShape, std::uint64_t>> gathered_;
  std::uint64_t used_ = 0;
  std::atomic<std::uint64_t> direct_{0};
  std::atomic<std::uint64_t> device_chunks_{0}, device_bytes_{0}, device_extents_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t pending_ = 0;
  Status status_;

  struct Loan {
    engine::Event copied;  // recorded on the transfer lane after the chunk's copy
    client::ChunkRelease release;
  };
  std::mutex loan_mu_;
  std::condition_variable loan_cv_;
  std::deque<Loan> loans_;
  bool closing_ = false;
  std::thread releaser_;  // with device staging
};

// The most floats a restored layer of this plan can hold at `len` tokens:
// what sizes the pinned staging before any header has arrived. With
// `sharded_only`, of its sharded layers only (what GatherParts adds).
std::uint64_t StagingFloats(const engine::StatePlan& plan, std::uint64_t len, bool sharded_only = false);

// The geometry of one of `parts` head-group parts of a layer of geometry
// `layer`: a KDA layer's heads or a KV layer's row widths divided by
// `parts`; InvalidArgument when they do not divide, or for a layer that
// does not split.
Result<LayerGeometry> PartGeometry(const LayerGeometry& layer, std::uint32_t parts);

}  // namespace primecache::model

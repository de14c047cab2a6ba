// The daemon's side of one fetch: the windows it streams chunks through and
// the FetchSink that sends the store's chunks to the client (docs/protocol.md,
// "Shared memory" and "Device copies").
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "core/mutex.h"
#include "ipc/device_dma.h"
#include "ipc/session.h"
#include "ipc/shm.h"
#include "primecache/internal/store.h"
#include "primecache/status.h"

namespace primecache::ipc {

// One window of a fetch (in the shared region or in device memory) used as a
// ring. Chunks are placed at the head, in the order the sender places them;
// a chunk's span returns once it and every chunk placed before it were
// released. Chunks are sent in chunk order, which can differ from placing
// order (the store reads later chunks ahead into the shared ring while an
// earlier, mapped chunk is placed only when it is handed out), so a release
// names its chunk rather than being the oldest. A wait for room happens only
// when every placed chunk was sent: otherwise the room waited for could be
// held by a chunk sent only after this one. Thread-safe.
class WindowRing {
 public:
  WindowRing() = default;
  ~WindowRing();
  WindowRing(const WindowRing&) = delete;
  WindowRing& operator=(const WindowRing&) = delete;

  // The window: `length` bytes at `offset` of its region (0: none). With
  // `in_use`, the bytes the ring holds placed are added to it while they
  // are (ServerCounters::shm_bytes_in_use); with `waits`, every wait for
  // room is counted there too (ServerCounters::fetch_window_waits).
  void Open(std::uint64_t offset, std::uint64_t length, std::atomic<std::uint64_t>* in_use = nullptr,
            std::atomic<std::uint64_t>* waits = nullptr);
  bool open() const { return length_ != 0; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t length() const { return length_; }
  bool Overlaps(const WindowRing& other) const;

  // A place for `len` bytes (from the window's start). nullopt: no room now
  // (and no wait: `may_wait` false, or a placed chunk not sent yet). Aborted
  // once `stop` answers true; DeadlineExceeded after 60 s without room.
  Result<std::optional<std::uint64_t>> Place(std::uint64_t len, bool may_wait, const std::function<bool()>& stop);
  // Joins the unsent placement at `next` to the unsent one at `pos` when
  // `next` was placed right after it and continues its bytes (no skip
  // between them): the two are then one placement at `pos`, sent, dropped
  // and released as one (an extent). False: they stay apart.
  bool Join(std::uint64_t pos, std::uint64_t next);
  // The chunk placed at `pos` was sent to the client.
  void Sent(std::uint64_t pos);
  // The chunk placed at `pos` will never be sent: its space goes back.
  void Drop(std::uint64_t pos);
  // The client released the sent chunk at `pos` of `len` bytes. False: no
  // such chunk is out (a release the protocol does not allow).
  bool Release(std::uint64_t pos, std::uint64_t len);
  // Wakes a waiting Place (to see `stop`).
  void Wake();
  // Times a Place began waiting for room: tests observe the wait path.
  std::uint64_t waits() const { return waits_.load(); }

 private:
  struct Placed {
    std::uint64_t pos, len, span;  // span includes the skipped tail before pos
    bool sent = false, released = false;
  };
  void PopReleasedLocked() REQUIRES(mu_);

  std::uint64_t offset_ = 0, length_ = 0;
  std::atomic<std::uint64_t>* in_use_ = nullptr;
  std::atomic<std::uint64_t>* waits_total_ = nullptr;
  Mutex mu_;
  CondVar cv_;
  std::uint64_t head_ GUARDED_BY(mu_) = 0, used_ GUARDED_BY(mu_) = 0;
  std::uint32_t unsent_ GUARDED_BY(mu_) = 0;
  std::deque<Placed> placed_ GUARDED_BY(mu_);
  std::atomic<std::uint64_t> waits_{0};
};

// One fetch in flight on a connection.
struct FetchState {
  std::uint64_t id = 0;
  std::atomic<bool> cancelled{false};
  std::shared_ptr<ShmRegion> shm;  // null: no shared window
  WindowRing shm_ring;
  std::shared_ptr<DeviceWindow> device;  // null: no device window
  WindowRing device_ring;
  bool extents = false;  // the client takes runs of chunks in one fetchChunk (Fetch.extents)

  void Cancel() {
    cancelled = true;
    shm_ring.Wake();
    device_ring.Wake();
  }
};

// Streams a fetch's answers. With a shared window, each chunk is read by the
// store straight into space of the window ring (ChunkBuffer) and only its
// place is sent; a chunk larger than the window, or any chunk without a
// window, travels inline. With a device window too, the store hands out
// chunks resident in the page cache where they lie (OnMappedChunk): one of a
// plane stored raw is copied by the GPU into the device ring and announced
// as `device` once its copy completed; any other goes to the shared ring
// (one CPU copy) or inline.
//
// Extents (to a client that takes them, FetchState::extents): adjacent
// chunks of one layer travel as one fetchChunk, one window placement and
// one release. A chunk joins the open extent when it is the layer's next
// chunk, its ring placement continues the extent's (WindowRing::Join) and,
// for the device, its bytes continue the extent's in the same mapping,
// whose registration the extent pins until its one copy is enqueued. The
// extent goes out at its bound (kShmExtentBytes / kDeviceExtentBytes, at
// most a quarter of the window), before any other answer, before a wait
// for window room and at Finish; each of its chunks was checked by the
// store before it was handed out, as ever.
//
// Device copies are queued, not waited for one by one: every answer waits in
// `out_`, in the order the store produced it, until the device copies before
// it completed, so the copy engines stay busy while the store hands out the
// next chunks and the client sees answers in order. Each ring belongs to
// this one fetch: space placed for a chunk never sent (the fetch failed or
// was cancelled) goes with it. Used by the fetching thread only; Finish is
// called once, after the store's Fetch returned.
class FetchSender : public FetchSink {
 public:
  FetchSender(std::uint64_t id, FetchState* st, ResponseSink* sink, DeviceDma* dma)
      : id_(id), st_(st), sink_(sink), dma_(dma) {}

  Status OnLayer(std::uint32_t layer, std::string_view header, std::uint32_t chunk_count) override;
  Result<std::optional<std::span<std::byte>>> ChunkBuffer(std::uint32_t layer, std::uint32_t chunk,
                                                          std::uint64_t size, bool may_wait) override;
  Status OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes) override;
  bool TakesMappedChunks() const override { return st_->device != nullptr && dma_ != nullptr; }
  Status OnMappedChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                       const MappedRegion& mapping) override;
  // The device registration of `mapping`, held by the store until it
  // handed the chunk out (OnMappedChunk's copy then holds it itself).
  Result<MappingPin> Pin(const MappedRegion& mapping) override {
    return dma_ != nullptr ? dma_->Pin(mapping) : Result<MappingPin>(MappingPin{});
  }

  // After the store's Fetch returned `fetched`: waits for every device copy
  // (none may land in the window after the fetch has ended), then sends what
  // is queued when `fetched` is ok. Returns the first error of the two.
  Status Finish(Status fetched);

  std::uint32_t layers() const { return layers_; }
  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t device_chunks() const { return device_chunks_; }
  std::uint64_t device_extents() const { return device_extents_; }
  std::uint64_t shm_chunks() const { return shm_chunks_; }
  std::uint64_t shm_extents() const { return shm_extents_; }
  // Adds the chunks sent through each window, and the fetchChunks (extents)
  // that carried them, to the daemon's counters.
  void AddTo(ServerCounters& c) const;
  // Where the fetch's time went, for the daemon's debug log: one line.
  std::string Timings() const;

 private:
  enum class Where { kInline, kShm, kDevice };
  using Clock = std::chrono::steady_clock;
  // Counts the time since the last callback returned as waiting for the
  // store, and marks when this one returns.
  class InCallback {
   public:
    explicit InCallback(FetchSender& s) : s_(s) {
      const Clock::time_point now = Clock::now();
      s_.store_wait_ += now - s_.last_return_;
      if (s_.first_callback_ == Clock::time_point()) s_.first_callback_ = now;
    }
    ~InCallback() { s_.last_return_ = Clock::now(); }
    InCallback(const InCallback&) = delete;
    InCallback& operator=(const InCallback&) = delete;

   private:
    FetchSender& s_;
  };
  // An answer waiting for the device copies before it.
  struct Outgoing {
    std::unique_ptr<OutMessage> msg;
    std::uint64_t after_copies = 0;  // sent once this many device copies completed
    WindowRing* ring = nullptr;      // the ring its chunk was placed in (marked sent)
    std::uint64_t pos = 0;
  };

  // Chunks handed out and not sent yet: adjacent chunks of one layer in one
  // placement of one ring, sent as one fetchChunk.
  struct Extent {
    Where where = Where::kShm;
    std::uint32_t layer = 0, index = 0;
    std::uint64_t pos = 0, len = 0;  // its placement in the ring
    std::vector<std::uint64_t> sizes;
    // The device's: each chunk's bytes to copy (a segment frame's header
    // lies between two chunks, so they are pieces, not one span), in
    // `mapping`, registered while `pin` is held (the store checked them
    // under that registration).
    std::vector<const std::byte*> srcs;
    MappedRegion mapping;
    MappingPin pin;
  };

  Status Gate();
  bool Stopped() const;
  // Copies a mapped raw chunk into the device ring; false: it did not go.
  Result<bool> SendToDevice(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                            const MappedRegion& mapping);
  // Joins the chunk to the open device extent: true when it did.
  Result<bool> JoinDevice(std::span<const std::byte> bytes, const MappedRegion& mapping);
  // A mapped chunk not for the device: into the shared ring (one copy), else inline.
  Status SendThroughHost(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes);
  // A place in the device ring, waiting for queued copies and the client's
  // releases as needed; nullopt: no room (the chunk goes through the host).
  Result<std::optional<std::uint64_t>> PlaceOnDevice(std::uint64_t len);
  Result<DeviceCopyQueue*> Copies();
  // Whether a chunk of `size` bytes may join the open extent `where`.
  bool Joinable(Where where, std::uint32_t layer, std::uint32_t index, std::uint64_t size) const;
  // Sends the open extent (the device's: its copy enqueued first, or its
  // chunks through the host when the copy cannot go); none: nothing.
  Status Flush();
  Status FlushDevice(Extent e);
  void SendInline(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes);
  // Sends `e`, placed in `ring`, as one fetchChunk of its chunks.
  void SendExtent(const Extent& e, WindowRing* ring);
  // Queues an answer behind every device copy enqueued before it.
  void Queue(Outgoing o);
  // Sends the queued answers whose copies completed, after waiting until at
  // least `wait_for` copies have (0: none).
  Status Pump(std::uint64_t wait_for);

  std::uint64_t id_;
  FetchState* st_;
  ResponseSink* sink_;
  DeviceDma* dma_;
  std::unique_ptr<DeviceCopyQueue> copies_;  // made on the first device copy
  std::deque<Outgoing> out_;
  std::vector<bool> raw_;  // of the current layer's chunks: stored raw/v1
  std::uint32_t layers_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t device_chunks_ = 0, device_extents_ = 0;
  std::uint64_t shm_chunks_ = 0, shm_extents_ = 0;
  std::optional<Extent> open_;  // the extent being gathered
  bool warned_ = false;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_return_ = start_;
  Clock::duration store_wait_{}, room_wait_{}, copy_wait_{};
  // When the store's first callback came, the first device copy was
  // enqueued and the store's Fetch returned (zero: not yet).
  Clock::time_point first_callback_, copy_start_, store_done_;
};

}  // namespace primecache::ipc

#include "ipc/fetch_sender.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "ipc/server_fetch_pool.h"
#include "ipc/wire.h"
#include "primecache/internal/codec.h"

namespace primecache::ipc {

// ---- WindowRing --------------------------------------------------------------

WindowRing::~WindowRing() {
  if (in_use_ != nullptr && used_ != 0) in_use_->fetch_sub(used_, std::memory_order_relaxed);
}

void WindowRing::Open(std::uint64_t offset, std::uint64_t length, std::atomic<std::uint64_t>* in_use,
                      std::atomic<std::uint64_t>* waits) {
  offset_ = offset;
  length_ = length;
  in_use_ = in_use;
  waits_total_ = waits;
}

bool WindowRing::Overlaps(const WindowRing& other) const {
  return open() && other.open() && offset_ < other.offset_ + other.length_ && other.offset_ < offset_ + length_;
}

Result<std::optional<std::uint64_t>> WindowRing::Place(std::uint64_t len, bool may_wait,
                                                       const std::function<bool()>& stop) {
  using Answer = std::optional<std::uint64_t>;
  MutexLock l(&mu_);
  for (;;) {
    if (stop()) return Status::Aborted("fetch cancelled");
    // An empty ring starts over at the front: a chunk that does not fit the
    // tail past the head (skipping the tail costs space until it is
    // released) would otherwise never fit, even with every byte free.
    if (used_ == 0) head_ = 0;
    std::uint64_t at = head_;
    std::uint64_t skip = 0;
    if (at + len > length_) {
      skip = length_ - at;
      at = 0;
    }
    if (used_ + skip + len <= length_) {
      used_ += skip + len;
      if (in_use_ != nullptr) in_use_->fetch_add(skip + len, std::memory_order_relaxed);
      head_ = at + len == length_ ? 0 : at + len;
      placed_.push_back({at, len, skip + len});
      ++unsent_;
      return Answer(at);
    }
    if (!may_wait || unsent_ != 0) return Answer();
    ++waits_;
    if (waits_total_ != nullptr) waits_total_->fetch_add(1, std::memory_order_relaxed);
    ClientWait waiting;  // the fetch's place in the fetch pool serves others meanwhile
    if (!cv_.WaitFor(&mu_, std::chrono::seconds(60))) {
      return Status::DeadlineExceeded("client released no window bytes for 60 s");
    }
  }
}

bool WindowRing::Join(std::uint64_t pos, std::uint64_t next) {
  MutexLock l(&mu_);
  for (std::size_t i = 0; i + 1 < placed_.size(); ++i) {
    Placed& a = placed_[i];
    if (a.pos != pos || a.sent) continue;
    Placed& b = placed_[i + 1];
    if (b.pos != next || b.sent || b.span != b.len || a.pos + a.len != b.pos) return false;
    a.len += b.len;
    a.span += b.span;
    placed_.erase(placed_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    --unsent_;
    return true;
  }
  return false;
}

void WindowRing::Sent(std::uint64_t pos) {
  MutexLock l(&mu_);
  for (Placed& p : placed_) {
    if (p.pos == pos && !p.sent) {
      p.sent = true;
      --unsent_;
      return;
    }
  }
}

void WindowRing::Drop(std::uint64_t pos) {
  {
    MutexLock l(&mu_);
    for (Placed& p : placed_) {
      if (p.pos == pos && !p.sent) {
        p.sent = p.released = true;
        --unsent_;
        break;
      }
    }
    PopReleasedLocked();
  }
  cv_.SignalAll();
}

bool WindowRing::Release(std::uint64_t pos, std::uint64_t len) {
  {
    MutexLock l(&mu_);
    Placed* found = nullptr;
    for (Placed& p : placed_) {
      if (p.pos == pos && p.len == len && p.sent && !p.released) found = &p;
    }
    if (found == nullptr) return false;
    found->released = true;
    PopReleasedLocked();
  }
  cv_.SignalAll();
  return true;
}

void WindowRing::PopReleasedLocked() {
  while (!placed_.empty() && placed_.front().released) {
    used_ -= placed_.front().span;
    if (in_use_ != nullptr) in_use_->fetch_sub(placed_.front().span, std::memory_order_relaxed);
    placed_.pop_front();
  }
}

void WindowRing::Wake() {
  MutexLock l(&mu_);
  cv_.SignalAll();
}

// ---- FetchSender ---------------------------------------------------------------

namespace {

// Device copies (one per extent) a fetch keeps enqueued and not yet known
// complete: kCopyDepth alone (a 256 MiB window's worth of 16 MiB extents, about
// 4.7 ms of copying at 55 GB/s), that split among the fetches copying into
// the same device at once, kMinCopyDepth at least. On a stream they share
// the copies run in the order they were enqueued, and each fetch enqueues
// its next copy as one of its own completes, so the fetches' copies take
// turns; a shallow depth makes the turns short from the start.
constexpr std::uint64_t kCopyDepth = 16;
constexpr std::uint64_t kMinCopyDepth = 4;

std::uint64_t CopyDepth(std::size_t sharers) {
  return std::max<std::uint64_t>(kMinCopyDepth, kCopyDepth / std::max<std::size_t>(sharers, 1));
}

// An extent's bytes, at most, and at most a quarter of its window, so that
// copies stay in flight while the client releases earlier extents. On the
// device, 16 MiB spreads a message each way, an event and a release over 26
// chunks of 0.6 MiB (the per-chunk overhead was about half of a hot
// restore's time; the queue copies the chunks as one 2D copy) while a 256 MiB
// window keeps 16 extents in flight, and the extent is gathered in well under
// a millisecond. On the H200, 8 MiB restored as fast (0.70-0.71x of the
// pinned copy against 0.71x); the shared ring's go to the client's decode
// threads sooner.
constexpr std::uint64_t kDeviceExtentBytes = 16u << 20;
constexpr std::uint64_t kShmExtentBytes = 4u << 20;

// Which chunks of a layer are stored raw/v1 (their bytes are the values, so a
// device copy of them is the restored plane's bytes).
Result<std::vector<bool>> RawChunks(std::string_view header) {
  auto parsed = ParseLayerHeader(std::as_bytes(std::span(header.data(), header.size())));
  if (!parsed.ok()) return parsed.status().WithContext("fetch through a device window: layer header");
  std::vector<bool> raw;
  raw.reserve(parsed->chunk_count());
  for (const PlaneRecord& plane : parsed->planes) raw.insert(raw.end(), plane.chunks.size(), plane.transform == kRawTransform);
  return raw;
}

}  // namespace

bool FetchSender::Stopped() const { return st_->cancelled.load() || sink_->Closed(); }

Status FetchSender::Gate() {
  if (st_->cancelled.load()) return Status::Aborted("fetch cancelled");
  // Backpressure: produce nothing more while the connection's queue is full.
  if (!sink_->WaitForRoom() || st_->cancelled.load()) return Status::Aborted("connection closed");
  return Status::Ok();
}

Status FetchSender::OnLayer(std::uint32_t layer, std::string_view header, std::uint32_t chunk_count) {
  InCallback in(*this);
  PC_RETURN_IF_ERROR(Gate());
  if (TakesMappedChunks()) {
    PC_ASSIGN_OR_RETURN(raw_, RawChunks(header));
  }
  PC_RETURN_IF_ERROR(Flush());  // an extent never crosses layers
  Queue({BuildResponse(
      id_,
      [&](wire::Response::Builder r) {
        auto l = r.initFetchLayer();
        l.setLayer(layer);
        l.setChunkCount(chunk_count);
        l.setHeader(kj::arrayPtr(reinterpret_cast<const kj::byte*>(header.data()), header.size()));
      },
      WordsFor(header.size()))});
  ++layers_;
  return Pump(0);
}

Result<std::optional<std::span<std::byte>>> FetchSender::ChunkBuffer(std::uint32_t, std::uint32_t, std::uint64_t size,
                                                                     bool may_wait) {
  InCallback in(*this);
  using Answer = std::optional<std::span<std::byte>>;
  WindowRing& ring = st_->shm_ring;
  if (st_->shm == nullptr || size == 0 || size > ring.length()) return Answer(std::span<std::byte>());
  const Clock::time_point t0 = Clock::now();
  auto pos = ring.Place(size, false, [this] { return Stopped(); });
  if (pos.ok() && !*pos && may_wait) {
    // The ring waits for room only once every chunk placed in it was sent:
    // the open extent goes, and every answer waiting for its copies.
    PC_RETURN_IF_ERROR(Flush());
    PC_RETURN_IF_ERROR(Pump(copies_ ? copies_->enqueued() : 0));
    pos = ring.Place(size, true, [this] { return Stopped(); });
  }
  room_wait_ += Clock::now() - t0;
  PC_RETURN_IF_ERROR(pos.status());
  if (!*pos) return Answer();  // no room until the client releases some
  return Answer(std::span<std::byte>(st_->shm->data() + ring.offset() + **pos, size));
}

bool FetchSender::Joinable(Where where, std::uint32_t layer, std::uint32_t index, std::uint64_t size) const {
  if (!open_ || open_->where != where || open_->layer != layer || open_->index + open_->sizes.size() != index) {
    return false;
  }
  const WindowRing& ring = where == Where::kDevice ? st_->device_ring : st_->shm_ring;
  const std::uint64_t bound = std::min(where == Where::kDevice ? kDeviceExtentBytes : kShmExtentBytes, ring.length() / 4);
  return open_->len + size <= bound;
}

Status FetchSender::OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes) {
  InCallback in(*this);
  PC_RETURN_IF_ERROR(Gate());
  WindowRing& ring = st_->shm_ring;
  const std::byte* window = st_->shm != nullptr ? st_->shm->data() + ring.offset() : nullptr;
  const bool in_window = window != nullptr && !bytes.empty() && bytes.data() >= window &&
                         bytes.data() + bytes.size() <= window + ring.length();
  if (!in_window) {
    PC_RETURN_IF_ERROR(Flush());
    SendInline(layer, index, bytes);
    return Pump(0);
  }
  const auto pos = static_cast<std::uint64_t>(bytes.data() - window);
  if (Joinable(Where::kShm, layer, index, bytes.size()) && ring.Join(open_->pos, pos)) {
    open_->len += bytes.size();
    open_->sizes.push_back(bytes.size());
    return Pump(0);
  }
  PC_RETURN_IF_ERROR(Flush());
  Extent e;
  e.layer = layer;
  e.index = index;
  e.pos = pos;
  e.len = bytes.size();
  e.sizes = {bytes.size()};
  open_ = std::move(e);
  if (!st_->extents) PC_RETURN_IF_ERROR(Flush());
  return Pump(0);
}

Status FetchSender::OnMappedChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                                  const MappedRegion& mapping) {
  InCallback in(*this);
  PC_RETURN_IF_ERROR(Gate());
  PC_ASSIGN_OR_RETURN(bool sent, SendToDevice(layer, index, bytes, mapping));
  if (sent) return Status::Ok();
  return SendThroughHost(layer, index, bytes);
}

Status FetchSender::SendThroughHost(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes) {
  PC_ASSIGN_OR_RETURN(std::optional<std::span<std::byte>> buf, ChunkBuffer(layer, index, bytes.size(), true));
  if (!buf || buf->empty()) {
    PC_RETURN_IF_ERROR(Flush());
    SendInline(layer, index, bytes);
    return Pump(0);
  }
  std::memcpy(buf->data(), bytes.data(), bytes.size());
  return OnChunk(layer, index, *buf);
}

Result<DeviceCopyQueue*> FetchSender::Copies() {
  if (copies_ == nullptr) {
    PC_ASSIGN_OR_RETURN(copies_, dma_->NewQueue(st_->device));
  }
  return copies_.get();
}

Result<std::optional<std::uint64_t>> FetchSender::PlaceOnDevice(std::uint64_t len) {
  WindowRing& ring = st_->device_ring;
  for (;;) {
    const Clock::time_point t0 = Clock::now();
    auto pos = ring.Place(len, true, [this] { return Stopped(); });
    room_wait_ += Clock::now() - t0;
    PC_RETURN_IF_ERROR(pos.status());
    if (*pos || out_.empty()) return *pos;
    // No room while answers wait for their copies: the ring may wait for the
    // client's releases only once they are sent. The oldest answer goes as
    // soon as its copy completed (its release frees the ring's front), not
    // after every queued copy: the copy engines stay busy with the others
    // while the client takes it and releases it.
    PC_RETURN_IF_ERROR(Pump(out_.front().after_copies));
  }
}

Result<bool> FetchSender::SendToDevice(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                                       const MappedRegion& mapping) {
  WindowRing& ring = st_->device_ring;
  if (!ring.open() || index >= raw_.size() || !raw_[index] || bytes.empty() || bytes.size() > ring.length()) {
    return false;
  }
  if (Joinable(Where::kDevice, layer, index, bytes.size())) {
    PC_ASSIGN_OR_RETURN(bool joined, JoinDevice(bytes, mapping));
    if (joined) return true;
  }
  PC_RETURN_IF_ERROR(Flush());
  if (Result<DeviceCopyQueue*> q = Copies(); !q.ok()) {
    // The chunk still goes, through the host; a device that copies nothing
    // is worth one line in the log per fetch, not a failed restore.
    if (!std::exchange(warned_, true)) spdlog::warn("primecached: device copy failed, chunks go through the host: {}", q.status().ToString());
    return false;
  }
  PC_ASSIGN_OR_RETURN(std::optional<std::uint64_t> pos, PlaceOnDevice(bytes.size()));
  if (!pos) return false;
  Extent e;
  e.where = Where::kDevice;
  e.layer = layer;
  e.index = index;
  e.pos = *pos;
  e.len = bytes.size();
  e.sizes = {bytes.size()};
  e.srcs = {bytes.data()};
  e.mapping = mapping;
  // The store checked the bytes under its pin, held until this returns: the
  // extent holds the same registration until its copy is enqueued.
  if (st_->extents) {
    if (auto pin = dma_->Pin(mapping); pin.ok()) e.pin = std::move(pin).value();
  }
  const bool keep_open = e.pin.serial != 0;
  open_ = std::move(e);
  if (!keep_open) PC_RETURN_IF_ERROR(Flush());
  return true;
}

Result<bool> FetchSender::JoinDevice(std::span<const std::byte> bytes, const MappedRegion& mapping) {
  if (mapping.id != open_->mapping.id) return false;
  WindowRing& ring = st_->device_ring;
  PC_ASSIGN_OR_RETURN(std::optional<std::uint64_t> pos, ring.Place(bytes.size(), false, [this] { return Stopped(); }));
  if (!pos) return false;  // no room now: the extent goes before a wait
  if (ring.Join(open_->pos, *pos)) {
    open_->len += bytes.size();
    open_->sizes.push_back(bytes.size());
    open_->srcs.push_back(bytes.data());
    return true;
  }
  // Placed at the ring's front (its end was too near): the extent goes and
  // this chunk begins the next one, under the same registration.
  Extent next;
  next.where = Where::kDevice;
  next.layer = open_->layer;
  next.index = open_->index + static_cast<std::uint32_t>(open_->sizes.size());
  next.pos = *pos;
  next.len = bytes.size();
  next.sizes = {bytes.size()};
  next.srcs = {bytes.data()};
  next.mapping = mapping;
  next.pin = open_->pin;
  PC_RETURN_IF_ERROR(Flush());
  open_ = std::move(next);
  return true;
}

Status FetchSender::Flush() {
  if (!open_) return Status::Ok();
  Extent e = std::move(*open_);
  open_.reset();
  if (e.where == Where::kDevice) return FlushDevice(std::move(e));
  SendExtent(e, &st_->shm_ring);
  shm_chunks_ += e.sizes.size();
  ++shm_extents_;
  return Status::Ok();
}

Status FetchSender::FlushDevice(Extent e) {
  WindowRing& ring = st_->device_ring;
  DeviceCopyQueue* q = copies_.get();  // made before the extent's first chunk was placed
  // One copy of the extent's chunks (the queue turns their pieces, apart by
  // their segment frames' headers, into as few copies as it can).
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(e.sizes.size());
  for (std::size_t i = 0; i < e.sizes.size(); ++i) pieces.emplace_back(e.srcs[i], e.sizes[i]);
  if (copy_start_ == Clock::time_point()) copy_start_ = Clock::now();
  const Status copied = q->Enqueue(ring.offset() + e.pos, pieces, e.mapping);
  if (!copied.ok()) {
    // Its chunks still go, through the host, from where they lie (still
    // pinned by e.pin); no part of its copy is left in flight, so its space
    // goes back to the ring. A device that copies nothing is worth one line.
    ring.Drop(e.pos);
    if (!std::exchange(warned_, true)) spdlog::warn("primecached: device copy failed, chunks go through the host: {}", copied.ToString());
    for (std::size_t i = 0; i < e.sizes.size(); ++i) {
      PC_RETURN_IF_ERROR(SendThroughHost(e.layer, e.index + static_cast<std::uint32_t>(i), std::span(e.srcs[i], e.sizes[i])));
    }
    return Status::Ok();
  }
  SendExtent(e, &ring);
  device_chunks_ += e.sizes.size();
  ++device_extents_;
  // A bound on the copies in flight, so that answers do not wait long and
  // concurrent fetches take turns.
  const std::uint64_t n = q->enqueued(), depth = CopyDepth(q->sharers());
  return Pump(n > depth ? n - depth : 0);
}

void FetchSender::SendInline(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes) {
  bytes_ += bytes.size();
  Outgoing o;
  o.msg = BuildResponse(
      id_,
      [&](wire::Response::Builder r) {
        auto c = r.initFetchChunk();
        c.setLayer(layer);
        c.setIndex(index);
        c.initData().setInline(kj::arrayPtr(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()));
      },
      WordsFor(bytes.size()));
  Queue(std::move(o));
}

void FetchSender::SendExtent(const Extent& e, WindowRing* ring) {
  bytes_ += e.len;
  Outgoing o;
  o.ring = ring;
  o.pos = e.pos;
  const auto n = static_cast<unsigned>(e.sizes.size());
  o.msg = BuildResponse(
      id_,
      [&](wire::Response::Builder r) {
        auto c = r.initFetchChunk();
        c.setLayer(e.layer);
        c.setIndex(e.index);
        if (st_->extents) {
          // What an older client would not know is never sent to it.
          c.setCount(n);
          auto sizes = c.initSizes(n);
          for (unsigned i = 0; i < n; ++i) sizes.set(i, e.sizes[i]);
        }
        if (e.where == Where::kShm) {
          auto s = c.initData().initShm();
          s.setOffset(ring->offset() + e.pos);
          s.setLength(e.len);
        } else {
          auto d = c.initData().initDevice();
          d.setOffset(ring->offset() + e.pos);
          d.setLength(e.len);
        }
      },
      WordsFor(8 * e.sizes.size()));
  Queue(std::move(o));
}

// An answer goes after every device copy enqueued before it.
void FetchSender::Queue(Outgoing o) {
  o.after_copies = copies_ ? copies_->enqueued() : 0;
  out_.push_back(std::move(o));
}

Status FetchSender::Pump(std::uint64_t wait_for) {
  std::uint64_t done = 0;
  if (copies_) {
    const Clock::time_point t0 = Clock::now();
    PC_ASSIGN_OR_RETURN(done, copies_->Completed(wait_for));
    if (wait_for != 0) copy_wait_ += Clock::now() - t0;
  }
  while (!out_.empty() && out_.front().after_copies <= done) {
    Outgoing& o = out_.front();
    if (o.ring != nullptr) o.ring->Sent(o.pos);
    sink_->Send(std::move(o.msg));
    out_.pop_front();
  }
  return Status::Ok();
}

std::string FetchSender::Timings() const {
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  auto u = [](std::uint64_t n) { return static_cast<unsigned long long>(n); };
  auto since = [&](Clock::time_point t) { return t == Clock::time_point() ? 0.0 : ms(t - start_); };
  char buf[480];
  std::snprintf(buf, sizeof buf,
                "%u layers, %llu bytes (%llu chunks in %llu extents by device copy, %llu in %llu through the "
                "shared window) in %.1f ms: waited %.1f ms for the store, %.1f ms for window room, %.1f ms for "
                "device copies; first answer at %.1f ms, first device copy at %.1f ms, the store done at %.1f ms",
                layers_, u(bytes_), u(device_chunks_), u(device_extents_), u(shm_chunks_), u(shm_extents_),
                ms(Clock::now() - start_), ms(store_wait_), ms(room_wait_), ms(copy_wait_), since(first_callback_),
                since(copy_start_), since(store_done_));
  return buf;
}

void FetchSender::AddTo(ServerCounters& c) const {
  c.fetch_window_chunks_shm.fetch_add(shm_chunks_, std::memory_order_relaxed);
  c.fetch_window_messages_shm.fetch_add(shm_extents_, std::memory_order_relaxed);
  c.fetch_window_chunks_device.fetch_add(device_chunks_, std::memory_order_relaxed);
  c.fetch_window_messages_device.fetch_add(device_extents_, std::memory_order_relaxed);
}

Status FetchSender::Finish(Status fetched) {
  Status sent = fetched.ok() ? Flush() : Status::Ok();
  store_done_ = Clock::now();
  // Each answer goes as soon as its copy completed, so the client's work on
  // it overlaps the copies still running.
  while (fetched.ok() && sent.ok() && !out_.empty()) sent = Pump(out_.front().after_copies);
  // Whatever happened, no copy may land in the window once the fetch ended
  // (an extent never sent goes with its pin).
  open_.reset();
  copies_.reset();
  out_.clear();
  return fetched.ok() ? sent : fetched;
}

}  // namespace primecache::ipc

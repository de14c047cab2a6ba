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

// Device copies enqueued and not yet known complete, at most: enough to keep
// the copy engines busy (about 40 MiB of 0.6 MiB chunks).
constexpr std::uint64_t kMaxCopiesInFlight = 64;

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
  // The ring waits for room only once every chunk placed in it was sent.
  if (may_wait && copies_) PC_RETURN_IF_ERROR(Pump(copies_->enqueued()));
  const Clock::time_point t0 = Clock::now();
  auto pos = ring.Place(size, may_wait, [this] { return Stopped(); });
  room_wait_ += Clock::now() - t0;
  PC_RETURN_IF_ERROR(pos.status());
  if (!*pos) return Answer();  // no room until the client releases some
  return Answer(std::span<std::byte>(st_->shm->data() + ring.offset() + **pos, size));
}

Status FetchSender::OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes) {
  InCallback in(*this);
  PC_RETURN_IF_ERROR(Gate());
  WindowRing& ring = st_->shm_ring;
  const std::byte* window = st_->shm != nullptr ? st_->shm->data() + ring.offset() : nullptr;
  const bool in_window = window != nullptr && !bytes.empty() && bytes.data() >= window &&
                         bytes.data() + bytes.size() <= window + ring.length();
  if (!in_window) {
    Send(layer, index, Where::kInline, 0, bytes);
  } else {
    const auto pos = static_cast<std::uint64_t>(bytes.data() - window);
    Send(layer, index, Where::kShm, ring.offset() + pos, bytes, &ring, pos);
  }
  return Pump(0);
}

Status FetchSender::OnMappedChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                                  const MappedRegion& mapping) {
  InCallback in(*this);
  PC_RETURN_IF_ERROR(Gate());
  PC_ASSIGN_OR_RETURN(bool sent, SendToDevice(layer, index, bytes, mapping));
  if (sent) return Status::Ok();
  // Not for the device: into the shared ring (one copy), else inline.
  PC_ASSIGN_OR_RETURN(std::optional<std::span<std::byte>> buf, ChunkBuffer(layer, index, bytes.size(), true));
  if (!buf || buf->empty()) {
    Send(layer, index, Where::kInline, 0, bytes);
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
    // client's releases only once they are sent.
    PC_RETURN_IF_ERROR(Pump(copies_->enqueued()));
  }
}

Result<bool> FetchSender::SendToDevice(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                                       const MappedRegion& mapping) {
  WindowRing& ring = st_->device_ring;
  if (!ring.open() || index >= raw_.size() || !raw_[index] || bytes.empty() || bytes.size() > ring.length()) {
    return false;
  }
  Result<DeviceCopyQueue*> q = Copies();
  Status copied = q.status();
  std::optional<std::uint64_t> pos;
  if (copied.ok()) {
    PC_ASSIGN_OR_RETURN(pos, PlaceOnDevice(bytes.size()));
    if (!pos) return false;
    copied = (*q)->Enqueue(ring.offset() + *pos, bytes, mapping);
  }
  if (!copied.ok()) {
    // The chunk still goes, through the host; a device that copies nothing
    // is worth one line in the log per fetch, not a failed restore.
    if (pos) ring.Drop(*pos);
    if (!std::exchange(warned_, true)) spdlog::warn("primecached: device copy failed, chunks go through the host: {}", copied.ToString());
    return false;
  }
  Send(layer, index, Where::kDevice, ring.offset() + *pos, bytes, &ring, *pos);
  ++device_chunks_;
  // A bound on the copies in flight, so that answers do not wait long.
  const std::uint64_t n = (*q)->enqueued();
  PC_RETURN_IF_ERROR(Pump(n > kMaxCopiesInFlight ? n - kMaxCopiesInFlight : 0));
  return true;
}

void FetchSender::Send(std::uint32_t layer, std::uint32_t index, Where where, std::uint64_t offset,
                       std::span<const std::byte> bytes, WindowRing* ring, std::uint64_t pos) {
  bytes_ += bytes.size();
  Outgoing o;
  o.ring = ring;
  o.pos = pos;
  o.msg = BuildResponse(
      id_,
      [&](wire::Response::Builder r) {
        auto c = r.initFetchChunk();
        c.setLayer(layer);
        c.setIndex(index);
        if (where == Where::kInline) {
          c.initData().setInline(kj::arrayPtr(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()));
        } else if (where == Where::kShm) {
          auto s = c.initData().initShm();
          s.setOffset(offset);
          s.setLength(bytes.size());
        } else {
          auto d = c.initData().initDevice();
          d.setOffset(offset);
          d.setLength(bytes.size());
        }
      },
      where == Where::kInline ? WordsFor(bytes.size()) : 0);
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
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%u layers, %llu bytes (%llu chunks by device copy) in %.1f ms: waited %.1f ms for the store, "
                "%.1f ms for window room, %.1f ms for device copies",
                layers_, static_cast<unsigned long long>(bytes_), static_cast<unsigned long long>(device_chunks_),
                ms(Clock::now() - start_), ms(store_wait_), ms(room_wait_), ms(copy_wait_));
  return buf;
}

Status FetchSender::Finish(Status fetched) {
  Status sent = fetched.ok() ? Pump(copies_ ? copies_->enqueued() : 0) : Status::Ok();
  // Whatever happened, no copy may land in the window once the fetch ended.
  copies_.reset();
  out_.clear();
  return fetched.ok() ? sent : fetched;
}

}  // namespace primecache::ipc

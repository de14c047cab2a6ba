// Fetch: an entry's layers streamed to a sink, chunks read from their
// segment extents ahead of the sink on the read pool, each with positional
// reads straight into the sink's buffer when it gave one (else into the
// store's own), and checked against its address there.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "statestore/store_impl.h"
#include "statestore/test_hooks.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

// A chunk larger than this is read in parts on several pool threads.
constexpr std::uint64_t kPartBytes = 1u << 20;
// Chunks located at once (one MultiGet). Only the first batch is located
// before the first chunk goes; the others while the chunks before them are
// read, checked and copied (a whole entry's 900 chunks took 1.2-1.4 ms,
// which the first answer waited for).
constexpr std::size_t kLocateBatch = 64;
// Bytes of chunks read ahead into the store's own buffers (the sink gave
// none), at most, past the first: unlike the sink's buffers, these are the
// store's memory, once per fetch in flight.
constexpr std::uint64_t kOwnReadAheadBytes = 8u << 20;

// One fetch in progress. Chunks are read ahead up to a window of chunks and
// bytes (StoreOptions::fetch_read_ahead*), handed to the sink in order on
// the caller's thread. No read outlives the object (the destructor waits).
class FetchRun {
 public:
  FetchRun(LocalStore::Impl& s, FetchSink& sink, Manifest m, std::vector<std::uint32_t> order)
      : s_(s), sink_(sink), m_(std::move(m)), order_(std::move(order)) {}
  ~FetchRun() { WaitAll(); }
  FetchRun(const FetchRun&) = delete;
  FetchRun& operator=(const FetchRun&) = delete;

  // kCorruption: a chunk failed (the entry is to be quarantined; *bad names it).
  Status Run(std::optional<Hash128>* bad, std::string* where);

 private:
  struct Slot {
    std::uint32_t layer = 0, chunk = 0;
    std::size_t plan = 0;              // its index in plan_
    std::span<std::byte> bytes;        // the sink's buffer, or own
    std::unique_ptr<std::byte[]> own;  // when the sink gave none
    MappedRegion mapping;              // set: the chunk is handed out where it lies
    std::span<const std::byte> mapped;  // its bytes inside `mapping`
    std::uint64_t offset = 0;          // of the chunk in its segment (mapped)
    MappingPin pin;                    // the sink's pin of `mapping`, held until handed out
    bool checked = false;              // its address was checked in this fetch
    Status status;                     // guarded by mu_
    std::size_t parts_left = 0;        // guarded by mu_
    bool done = false;                 // guarded by mu_
  };

  // The chunks in order (plan_).
  void Plan();
  // Locates chunks in batches until plan index `i` is located.
  Status LocateThrough(std::size_t i);
  Status StartReads();
  // The chunk's bytes in place when the sink takes mapped chunks and they are
  // in the page cache: pinned by the sink first, then checked on the pool
  // over the pinned bytes (unless they were checked under this same pin);
  // else false (it is read).
  bool TryMapped(Slot& slot, const ChunkRef& ref, const LocalStore::Impl::Located& at);
  void PostCheck(Slot& slot, const Hash128& h, const Extent& at);
  // After a read chunk failed its address: whether a second read, into
  // memory of the store's own, matches (then the store is intact).
  bool ReadsBackIntact(const Slot& slot, const ChunkRef& ref);
  void Post(Slot& slot, const Hash128& h, const LocalStore::Impl::Located& at);
  void WaitAll();

  LocalStore::Impl& s_;
  FetchSink& sink_;
  Manifest m_;
  std::vector<std::uint32_t> order_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> plan_;  // the chunks, in order: (layer, chunk)
  std::vector<LocalStore::Impl::Located> located_;             // by plan index: [0, located_.size())
  std::deque<Slot> slots_;  // stable addresses: added at the back, removed at the front
  std::size_t next_read_ = 0;
  std::uint64_t bytes_ahead_ = 0;
  std::uint64_t own_ahead_ = 0;  // of bytes_ahead_, in the store's own buffers
  Mutex mu_;
  CondVar cv_;
  std::size_t outstanding_ GUARDED_BY(mu_) = 0;  // jobs on the pool
};

void FetchRun::WaitAll() {
  MutexLock g(&mu_);
  cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return outstanding_ == 0; });
}

void FetchRun::Plan() {
  for (std::uint32_t l : order_) {
    for (std::uint32_t c = 0; c < m_.layers[l].chunks.size(); ++c) plan_.emplace_back(l, c);
  }
  located_.reserve(plan_.size());
}

// The next batch's extents and open files in one MultiGet (a chunk stored
// twice in the batch is asked for once).
Status FetchRun::LocateThrough(std::size_t i) {
  while (located_.size() <= i && located_.size() < plan_.size()) {
    const std::size_t from = located_.size(), to = std::min(plan_.size(), from + kLocateBatch);
    std::vector<Hash128> hashes;
    std::vector<std::size_t> where;
    std::unordered_map<Hash128, std::size_t, Hash128Hasher> index;
    for (std::size_t k = from; k < to; ++k) {
      const Hash128& h = m_.layers[plan_[k].first].chunks[plan_[k].second].address;
      auto [it, added] = index.emplace(h, hashes.size());
      if (added) hashes.push_back(h);
      where.push_back(it->second);
    }
    std::vector<LocalStore::Impl::Located> got;
    PC_RETURN_IF_ERROR(s_.LocateChunks(hashes, &got));
    for (std::size_t w : where) located_.push_back(got[w]);
  }
  return Status::Ok();
}

void FetchRun::Post(Slot& slot, const Hash128& h, const LocalStore::Impl::Located& at) {
  const std::uint64_t size = slot.bytes.size();
  if (!at.status.ok()) {
    slot.status = at.status;
    slot.done = true;
    return;
  }
  auto read_all = [this, &slot, h, at] {
    Status st = s_.ReadExtent(at.file, at.extent, h, slot.bytes);
    MutexLock g(&mu_);
    slot.status = std::move(st);
    slot.done = true;
    --outstanding_;
    cv_.SignalAll();
  };
  if (!s_.read_pool) {
    slot.status = s_.ReadExtent(at.file, at.extent, h, slot.bytes);
    slot.done = true;
    return;
  }
  const std::size_t parts =
      std::min<std::uint64_t>(s_.read_pool->size(), (size + kPartBytes - 1) / kPartBytes);
  if (parts <= 1) {
    {
      MutexLock g(&mu_);
      ++outstanding_;
    }
    s_.read_pool->Post(read_all);
    return;
  }
  // Parts on several threads; the last one to land checks the address.
  const std::uint64_t part = (size + parts - 1) / parts;
  {
    MutexLock g(&mu_);
    outstanding_ += parts;
    slot.parts_left = parts;
  }
  for (std::size_t i = 0; i < parts; ++i) {
    const std::uint64_t from = i * part, to = std::min(size, from + part);
    s_.read_pool->Post([this, &slot, h, at, from, to] {
      std::size_t n = 0;
      Status st = ReadAt(*at.file, at.extent.offset + from, slot.bytes.subspan(from, to - from), &n);
      if (st.ok() && n != to - from) {
        st = Status::Corruption("chunk " + HashHex(h) + " in segment " + SegmentHex(at.extent.segment) +
                                ": the file ends early (truncated behind the store's back?)");
      }
      MutexLock g(&mu_);
      if (!st.ok() && slot.status.ok()) slot.status = st;
      if (--slot.parts_left == 0) {
        if (slot.status.ok()) slot.status = LocalStore::Impl::CheckAddress(slot.bytes, h, at.extent);
        slot.done = true;
      }
      --outstanding_;
      cv_.SignalAll();
    });
  }
}

bool FetchRun::TryMapped(Slot& slot, const ChunkRef& ref, const LocalStore::Impl::Located& at) {
  if (!sink_.TakesMappedChunks() || !at.status.ok() || ref.size == 0) return false;
  auto m = s_.SegmentMapping(at.extent.segment, *at.file, at.extent.offset + ref.size);
  if (!m.ok() || !s_.env->IsResident(*m, at.extent.offset, ref.size)) return false;
  slot.mapping = std::move(m).value();
  slot.mapped = std::span(slot.mapping.data + at.extent.offset, ref.size);
  slot.offset = at.extent.offset;
  // Pinned before the check, so that what is checked is what stays pinned
  // for the copy: pages read back from the disk between a check and a pin
  // would go out unchecked. A pin that failed is no pin: checked as any.
  if (auto pin = sink_.Pin(slot.mapping); pin.ok()) slot.pin = std::move(pin).value();
  if (s_.CheckedWhilePinned(slot.mapping.id, slot.offset, slot.pin.serial)) {
    if (s_.hooks != nullptr && s_.hooks->mapped_checks) ++s_.hooks->mapped_checks->skipped;
    MutexLock g(&mu_);
    slot.done = true;
    return true;
  }
  if (s_.hooks != nullptr && s_.hooks->mapped_checks) ++s_.hooks->mapped_checks->checked;
  slot.checked = true;
  PostCheck(slot, ref.address, at.extent);
  return true;
}

// The address checked over the bytes where they lie (on the pool).
void FetchRun::PostCheck(Slot& slot, const Hash128& h, const Extent& at) {
  auto check = [this, &slot, h, at] {
    Status st = LocalStore::Impl::CheckAddress(slot.mapped, h, at);
    MutexLock g(&mu_);
    slot.status = std::move(st);
    slot.done = true;
    --outstanding_;
    cv_.SignalAll();
  };
  {
    MutexLock g(&mu_);
    ++outstanding_;
  }
  if (s_.read_pool) {
    s_.read_pool->Post(check);
  } else {
    check();
  }
}

Status FetchRun::StartReads() {
  const std::size_t window = s_.read_pool ? s_.opts.fetch_read_ahead : 1;
  while (next_read_ < plan_.size() && slots_.size() < window &&
         (slots_.empty() || bytes_ahead_ < s_.opts.fetch_read_ahead_bytes)) {
    const auto [l, c] = plan_[next_read_];
    const ChunkRef& ref = m_.layers[l].chunks[c];
    PC_RETURN_IF_ERROR(LocateThrough(next_read_));
    const LocalStore::Impl::Located& at = located_[next_read_];
    if (sink_.TakesMappedChunks()) {
      Slot& slot = slots_.emplace_back();
      slot.layer = l;
      slot.chunk = c;
      slot.plan = next_read_;
      if (TryMapped(slot, ref, at)) {
        bytes_ahead_ += ref.size;
        ++next_read_;
        continue;
      }
      slots_.pop_back();  // not in place: read as any other chunk
    }
    const bool may_wait = slots_.empty();
    PC_ASSIGN_OR_RETURN(auto target, sink_.ChunkBuffer(l, c, ref.size, may_wait));
    if (!target) {
      if (may_wait) return Status::Internal("fetch sink gave no buffer for a chunk it had to take");
      break;  // no room yet: asked again after the next chunk is handed out
    }
    if (!target->empty() && target->size() != ref.size) {
      return Status::Internal("fetch sink gave a buffer of the wrong size");
    }
    if (target->empty() && !slots_.empty() && own_ahead_ + ref.size > kOwnReadAheadBytes) break;
    Slot& slot = slots_.emplace_back();
    slot.layer = l;
    slot.chunk = c;
    slot.plan = next_read_;
    if (target->empty()) {
      slot.own.reset(new std::byte[ref.size]);
      slot.bytes = std::span<std::byte>(slot.own.get(), ref.size);
      own_ahead_ += ref.size;
    } else {
      slot.bytes = *target;
    }
    bytes_ahead_ += ref.size;
    Post(slot, ref.address, at);
    ++next_read_;
  }
  return Status::Ok();
}

// A chunk read into a sink's buffer may live in memory another process can
// write (a client's shared region), and a read can be hit by a transient
// fault: neither may quarantine an entry whose stored bytes are intact.
bool FetchRun::ReadsBackIntact(const Slot& slot, const ChunkRef& ref) {
  const LocalStore::Impl::Located& at = located_[slot.plan];
  if (!at.status.ok() || at.file == nullptr) return false;
  std::vector<std::byte> own(ref.size);
  return s_.ReadExtent(at.file, at.extent, ref.address, own).ok();
}

Status FetchRun::Run(std::optional<Hash128>* bad, std::string* where) {
  Plan();
  for (std::uint32_t l : order_) {
    PC_RETURN_IF_ERROR(StartReads());
    const auto& ml = m_.layers[l];
    PC_RETURN_IF_ERROR(sink_.OnLayer(l, ml.header, static_cast<std::uint32_t>(ml.chunks.size())));
    for (std::uint32_t c = 0; c < ml.chunks.size(); ++c) {
      PC_RETURN_IF_ERROR(StartReads());
      Slot& slot = slots_.front();
      Status rs;
      {
        MutexLock g(&mu_);
        cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return slot.done; });
        rs = std::move(slot.status);
      }
      if (rs.IsCorruption()) {
        WaitAll();  // reads in flight finish before the quarantine batch
        if (!slot.mapping.owner && ReadsBackIntact(slot, ml.chunks[c])) {
          return Status::Aborted(rs.message() +
                                 "; read again, it matches: the first read's bytes were changed after the read "
                                 "(a transient fault, or the fetch's buffer was written meanwhile); nothing "
                                 "quarantined");
        }
        *bad = ml.chunks[c].address;
        *where = "layer " + std::to_string(l) + " chunk " + std::to_string(c);
        return rs;
      }
      PC_RETURN_IF_ERROR(rs);
      if (slot.mapping.owner) {
        // Checked over the bytes pinned as slot.pin, still held: not checked
        // again while that pin lasts.
        if (slot.checked) s_.NoteCheckedWhilePinned(slot.mapping.id, slot.offset, slot.pin.serial);
        PC_RETURN_IF_ERROR(sink_.OnMappedChunk(l, c, slot.mapped, slot.mapping));
      } else {
        PC_RETURN_IF_ERROR(sink_.OnChunk(l, c, slot.bytes));
      }
      bytes_ahead_ -= ml.chunks[c].size;
      if (slot.own) own_ahead_ -= ml.chunks[c].size;
      slots_.pop_front();
    }
  }
  return Status::Ok();
}

}  // namespace

Status LocalStore::Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
                    const FetchOptions& options) {
  Impl& s = *impl_;
  // What becomes of a damaged entry (a read-only store leaves it as it is).
  const std::string fate = s.opts.read_only ? "" : " quarantined";
  std::string record;
  PC_ASSIGN_OR_RETURN(Lease lease, LeaseLive(id, &record));
  if (options.ns) PC_RETURN_IF_ERROR(s.CheckNamespace(id, record, *options.ns));
  std::string mv;
  bool found = false;
  Status ms = s.GetValue(s.cf_manifests, IdKey(id), &mv, &found);
  if (ms.ok() && !found) ms = Status::Corruption("manifest missing");
  if (ms.IsCorruption()) {
    lease.Release();
    s.Quarantine(id, "manifest unreadable: " + ms.message(), std::nullopt);
    return ms.WithContext("entry " + std::to_string(id) + fate);
  }
  PC_RETURN_IF_ERROR(ms);
  auto manifest = DecodeManifest(mv, StoreLimits::kMaxChunkBytes);
  if (!manifest.ok()) {
    lease.Release();
    s.Quarantine(id, manifest.status().message(), std::nullopt);
    return manifest.status().WithContext("entry " + std::to_string(id) + fate);
  }
  std::vector<std::uint32_t> order;
  if (layers.empty()) {
    order.resize(manifest->layers.size());
    for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  } else {
    for (std::uint32_t l : layers) {
      if (l >= manifest->layers.size()) {
        return Status::InvalidArgument("entry " + std::to_string(id) + " has " +
                                       std::to_string(manifest->layers.size()) + " layers; asked for layer " +
                                       std::to_string(l));
      }
    }
    order.assign(layers.begin(), layers.end());
  }
  std::optional<Hash128> bad;
  std::string where;
  Status rs;
  {
    FetchRun run(s, sink, std::move(manifest).value(), std::move(order));
    rs = run.Run(&bad, &where);
  }
  if (rs.IsCorruption() && bad) {
    lease.Release();
    s.Quarantine(id, where + ": " + rs.message(), bad);
    return rs.WithContext("entry " + std::to_string(id) + fate);
  }
  PC_RETURN_IF_ERROR(rs);
  s.Touch(id, false);
  return Status::Ok();
}

}  // namespace primecache

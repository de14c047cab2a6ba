// The fetch family: fetch, cancel and checkEntry, and the windows a fetch
// fills: shmAttach, attachDevice, shmRelease and deviceRelease.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <utility>

#include "ipc/fetch_sender.h"
#include "ipc/session.h"
#include "ipc/session_internal.h"
#include "ipc/wire.h"

namespace primecache::ipc {

using session_internal::ReadText;

Status Session::OpenWindows(wire::Fetch::Reader f, FetchState& st) {
  if (f.hasShmWindow() && f.getShmWindow().getLength() != 0) {
    auto w = f.getShmWindow();
    if (!shm_) return Status::FailedPrecondition("no shared region attached");
    if (!shm_->Contains(w.getOffset(), w.getLength())) {
      return Status::InvalidArgument("fetch window outside the shared region");
    }
    st.shm = shm_;
    st.shm_ring.Open(w.getOffset(), w.getLength(), &counters_->shm_bytes_in_use, &counters_->fetch_window_waits);
  }
  if (f.hasDeviceWindow() && f.getDeviceWindow().getLength() != 0) {
    auto w = f.getDeviceWindow();
    std::shared_ptr<DeviceWindow> device;
    {
      MutexLock l(&mu_);
      device = device_;
    }
    if (!device) return Status::FailedPrecondition("no device window attached (attachDevice)");
    if (w.getOffset() > device->size() || w.getLength() > device->size() - w.getOffset()) {
      return Status::InvalidArgument("fetch device window outside the attached window of " +
                                     std::to_string(device->size()) + " bytes");
    }
    st.device = std::move(device);
    st.device_ring.Open(w.getOffset(), w.getLength(), nullptr, &counters_->fetch_window_waits);
  }
  return Status::Ok();
}

Answer Session::OnAttachDevice(const Incoming& in) {
  const std::uint64_t id = in.id;
  auto a = in.req.getAttachDevice();
  // The request is checked first, so a malformed one is told so by any daemon.
  auto bus = ReadText(a.getPciBusId(), 64, "PCI bus id");
  if (!bus.ok()) return bus.status();
  if (a.getHandle().size() != kDeviceHandleBytes) {
    return Status::InvalidArgument("device handle of " + std::to_string(a.getHandle().size()) + " bytes, not " +
                                   std::to_string(kDeviceHandleBytes));
  }
  if (a.getSize() == 0) return Status::InvalidArgument("device window of 0 bytes");
  if (device_dma_ == nullptr) {
    return Status::NotSupported("this daemon makes no device copies (--device-copies off, no CUDA "
                                "device, or built without CUDA); fetch through shared memory");
  }
  if (!peer_.local) return Status::NotSupported("device windows need a Unix socket");
  DeviceWindowSpec spec{std::move(*bus), std::string(reinterpret_cast<const char*>(a.getHandle().begin()),
                                                     a.getHandle().size()),
                        a.getSize()};
  return Serve(executor_, id, [this, id, spec = std::move(spec)]() -> Answer {
    auto w = device_dma_->Open(spec);
    if (!w.ok()) {
      // Whatever the driver says, the handle named nothing this daemon can use.
      return Status::InvalidArgument("attachDevice: " + w.status().ToString());
    }
    {
      MutexLock l(&mu_);
      device_ = std::move(w).value();  // fetches streaming keep the window they began with
    }
    return Answer::Ack(id);
  });
}

std::optional<Answer> Session::OnWindowRelease(const Incoming& in) {
  const bool device = in.req.which() == wire::Request::DEVICE_RELEASE;
  const std::uint64_t offset = device ? in.req.getDeviceRelease().getOffset() : in.req.getShmRelease().getOffset();
  const std::uint64_t length = device ? in.req.getDeviceRelease().getLength() : in.req.getShmRelease().getLength();
  std::vector<std::shared_ptr<FetchState>> candidates;
  {
    MutexLock l(&mu_);
    for (auto& [fid, f] : fetches_) {
      const WindowRing& ring = device ? f->device_ring : f->shm_ring;
      if (ring.open() && offset >= ring.offset() && offset - ring.offset() < ring.length()) candidates.push_back(f);
    }
  }
  if (candidates.empty()) return std::nullopt;  // the fetch has ended; nothing to free
  // Device windows of fetches begun before and after a second attach may
  // share offsets: the release is the one fetch's whose chunk it names.
  for (auto& f : candidates) {
    WindowRing& ring = device ? f->device_ring : f->shm_ring;
    if (ring.Release(offset - ring.offset(), length)) return std::nullopt;
  }
  return Answer::Protocol(std::string(device ? "deviceRelease" : "shmRelease") +
                          " names no chunk sent and not yet released: release each chunk once, as it arrived");
}

Status Session::AddFetchInFlight(const std::shared_ptr<FetchState>& st) {
  MutexLock l(&mu_);
  if (fetches_.count(st->id) != 0) return Status::AlreadyExists("a fetch with this id is running");
  if (fetches_.size() >= limits_.max_fetches_in_flight) {
    return Status::ResourceExhausted("too many fetches in flight on this connection");
  }
  for (auto& [oid, other] : fetches_) {
    const bool same_device = st->device != nullptr && st->device == other->device;
    if ((st->shm && other->shm && st->shm_ring.Overlaps(other->shm_ring)) ||
        (same_device && st->device_ring.Overlaps(other->device_ring))) {
      return Status::InvalidArgument("fetch window overlaps the window of fetch " + std::to_string(oid));
    }
  }
  fetches_[st->id] = st;
  return Status::Ok();
}

Answer Session::OnFetch(const Incoming& in) {
  const std::uint64_t id = in.id;
  auto f = in.req.getFetch();
  auto layers_r = f.getLayers();
  if (layers_r.size() > limits_.max_layers) {
    return Status::InvalidArgument("fetch names over " + std::to_string(limits_.max_layers) + " layers");
  }
  std::optional<Query> query;  // a fetch by query: its hit's entry, not `entry`
  if (f.hasQuery()) {
    query.emplace();
    if (auto refused = ReadQuery(f.getQuery(), &*query)) return std::move(*refused);
  }
  auto st = std::make_shared<FetchState>();
  st->id = id;
  st->extents = f.getExtents();  // [extents] batched restore: runs of chunks per fetchChunk
  if (Status s = OpenWindows(f, *st); !s.ok()) return s;
  if (Status s = AddFetchInFlight(st); !s.ok()) return s;
  std::vector<std::uint32_t> layers = ToVector(layers_r);
  const std::uint64_t entry = f.getEntry();
  const bool skip_parted_hits = f.getSkipPartedHits();
  const auto arrived = std::chrono::steady_clock::now();
  return Serve(fetch_executor_, id,
               [this, id, st, entry, arrived, skip_parted_hits, query = std::move(query),
                layers = std::move(layers)]() -> Answer {
                 auto forget = [&] {
                   MutexLock l(&mu_);
                   fetches_.erase(id);
                 };
                 // A fetch by query: the hit stays leased until its fetch has ended.
                 Lease lease;
                 std::uint64_t target = entry;
                 if (query) {
                   Result<Found> found = RunLookup(*query, &lease);
                   if (!found.ok()) {
                     forget();
                     return found.status();
                   }
                   sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) {
                     WriteLookupHit(found->hit, found->shared, r.initFetchHit());
                   }));
                   // A miss, or a tensor-parallel hit whose ranks fetch their own parts.
                   if (!found->hit || (skip_parted_hits && found->hit->ranks > 1)) {
                     forget();
                     return BuildResponse(id, [&](wire::Response::Builder r) { r.initFetchDone(); });
                   }
                   target = found->hit->id;
                 }
                 FetchSender sender(id, st.get(), sink_.get(), device_dma_);
                 FetchOptions options;
                 options.ns = TenantScope();
                 Status s = sender.Finish(store_->Fetch(target, layers, sender, options));
                 spdlog::debug("primecached: fetch of entry {}: {}", target, sender.Timings());
                 forget();
                 counters_->fetch_bytes.fetch_add(sender.bytes(), std::memory_order_relaxed);
                 if (tp_rank_) counters_->rank_fetch_bytes.Add(*tp_rank_, sender.bytes());
                 sender.AddTo(*counters_);  // [extents] chunks and extents per window
                 if (!s.ok()) {
                   counters_->fetch_errors.fetch_add(1, std::memory_order_relaxed);
                   return s;
                 }
                 counters_->fetch_seconds.Observe(std::chrono::steady_clock::now() - arrived);
                 return BuildResponse(id, [&](wire::Response::Builder r) {
                   auto d = r.initFetchDone();
                   d.setLayers(sender.layers());
                   d.setBytes(sender.bytes());
                 });
               });
}

Answer Session::OnCancel(const Incoming& in) {
  const std::uint64_t target = in.req.getCancel().getTarget();
  std::shared_ptr<FetchState> st;
  {
    MutexLock l(&mu_);
    auto it = fetches_.find(target);
    if (it != fetches_.end()) st = it->second;
  }
  if (!st) return Status::NotFound("no fetch " + std::to_string(target) + " is running on this connection");
  st->Cancel();
  return Answer::Ack(in.id);
}

Answer Session::OnCheckEntry(const Incoming& in) {
  const std::uint64_t id = in.id;
  const std::uint64_t entry = in.req.getCheckEntry().getEntry();
  return Serve(fetch_executor_, id, [this, id, entry]() -> Answer {
    FetchOptions options;
    options.ns = TenantScope();
    auto report = store_->CheckEntry(entry, options);  // a failed check is the report's, not an error
    if (!report.ok()) return report.status();
    return BuildResponse(id, [&](wire::Response::Builder r) {
      auto out = r.initCheckEntry();
      out.setOk(report->ok);
      out.setMessage(report->message);
      out.setLayers(report->layers);
      out.setBytes(report->bytes);
    });
  });
}

Answer Session::OnShmAttach(const Incoming& in) {
  const std::uint64_t size = in.req.getShmAttach().getSize();
  if (in.fds->empty()) {
    return Status::InvalidArgument("shmAttach arrived without a descriptor (send it with SCM_RIGHTS)");
  }
  int fd = in.fds->front();
  in.fds->erase(in.fds->begin());
  Status refused;
  if (!peer_.local) {
    refused = Status::NotSupported("shared memory needs a Unix socket");
  } else if (shm_) {
    refused = Status::AlreadyExists("a shared region is already attached");
  } else if (size > limits_.max_shm_bytes) {
    refused = Status::InvalidArgument("shared region over " + std::to_string(limits_.max_shm_bytes) + " bytes");
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  auto region = ShmRegion::Adopt(fd, static_cast<std::size_t>(size));
  if (!region.ok()) return region.status();
  shm_ = std::shared_ptr<ShmRegion>(std::move(region).value());
  counters_->shm_regions.fetch_add(1, std::memory_order_relaxed);
  counters_->shm_bytes.fetch_add(shm_->size(), std::memory_order_relaxed);
  return Answer::Ack(in.id);
}

}  // namespace primecache::ipc

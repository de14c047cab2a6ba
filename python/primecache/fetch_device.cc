// fetch_into's device path (FetchIntoDevice, binding.h): destinations given
// as device pointers, raw chunks copied on by the device out of the device
// window (their space lent back once the copy ran: LoanReleaser), any other
// chunk decoded on the host into a staging copy of its plane and copied up.
#include "python/primecache/fetch_into.h"

#include <string>
#include <utility>
#include <vector>

namespace primecache::python {

std::vector<MutableElementSpan> CheckDeviceDestinations(const LayerDecoder& dec, const py::handle& given,
                                                        const std::string& where) {
  return GivenPlanes(dec, given, where, [&](const py::object& obj, const auto& layout, const std::string& name) {
    const auto pair = obj.cast<std::pair<std::uintptr_t, std::uint64_t>>();
    if (pair.second != layout.raw_bytes() || (pair.first == 0 && pair.second != 0)) {
      throw py::value_error(where + " plane '" + name + "': " + std::to_string(pair.second) +
                            " device bytes, the plane has " + std::to_string(layout.raw_bytes()));
    }
    return MutableElementSpan(std::span(reinterpret_cast<std::byte*>(pair.first), pair.second), layout.dtype);
  });
}

Status LoanReleaser::Lend(CudaRuntime::Stream stream, client::ChunkRelease release) {
  CudaRuntime::Event e = nullptr;
  Status s = cuda_->CreateEvent(&e);
  if (s.ok()) s = cuda_->Record(e, stream);
  if (!s.ok()) {
    if (e != nullptr) (void)cuda_->DestroyEvent(e);
    release();  // nothing reads the space once the fetch fails
    return s;
  }
  std::lock_guard<std::mutex> l(mu_);
  loans_.push_back({e, std::move(release)});
  cv_.notify_one();
  return Status::Ok();
}

Status LoanReleaser::Close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> l(mu_);
  return first_;
}

void LoanReleaser::Run() {
  (void)cuda_->SetDevice(device_);
  for (;;) {
    Loan loan;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return closed_ || !loans_.empty(); });
      if (loans_.empty()) return;
      loan = std::move(loans_.front());
      loans_.pop_front();
    }
    Status s = cuda_->Wait(loan.event);
    (void)cuda_->DestroyEvent(loan.event);
    loan.release();
    if (!s.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      if (first_.ok()) first_ = std::move(s);
    }
  }
}

Status PlaneStream::OnDeviceExtent(const client::DeviceExtent& x, client::ChunkRelease release,
                                   LoanReleaser& loans) {
  const std::string where = "layer " + std::to_string(x.layer) + ": device chunks " + std::to_string(x.index) +
                            " + " + std::to_string(x.count);
  if (x.offset > device_->window_bytes || x.length > device_->window_bytes - x.offset) {
    release();
    return Status::Corruption(where + ": " + std::to_string(x.length) + " bytes at " + std::to_string(x.offset) +
                              " do not fit the window");
  }
  // Every chunk checked first; chunks whose destinations follow each other
  // go in one copy.
  struct Run {
    std::byte* to = nullptr;
    std::uint64_t from = 0, bytes = 0;
  };
  std::vector<Run> runs;
  std::uint64_t from = x.offset;
  for (std::uint32_t i = 0; i < x.count; ++i) {
    const std::uint32_t index = x.index + i;
    PC_RETURN_IF_ERROR(Claim(x.layer, index, release));
    const LayerDecoder& dec = decoders_[at_];
    const ChunkLocation& loc = dec.chunk(index);
    const MutableElementSpan plane = dests_[at_].planes[loc.plane];
    const std::uint64_t value = ElementBytes(plane.type);
    if (!dec.ChunkIsRaw(index)) {
      release();
      return Status::Corruption(where + ": chunk " + std::to_string(index) + " is not stored raw");
    }
    if (x.sizes[i] != loc.value_count * value) {
      release();
      return Status::Corruption(where + ": chunk " + std::to_string(index) + " of " + std::to_string(x.sizes[i]) +
                                " bytes is not the stored chunk's size");
    }
    std::byte* to = plane.bytes.data() + loc.value_offset * value;
    if (!runs.empty() && runs.back().to + runs.back().bytes == to) {
      runs.back().bytes += x.sizes[i];
    } else {
      runs.push_back({to, from, x.sizes[i]});
    }
    from += x.sizes[i];
  }
  Status s;
  for (const Run& r : runs) {
    if (s.ok()) s = device_->cuda->CopyDeviceToDeviceAsync(r.to, device_->window + r.from, r.bytes, device_->stream);
  }
  if (!s.ok()) {
    (void)device_->cuda->Synchronize(device_->stream);  // the runs copied before are done with the space
    release();
    return s;
  }
  device_chunks_ += x.count;
  return loans.Lend(device_->stream, std::move(release));
}

MutableElementSpan PlaneStream::StagingFor(std::size_t layer, std::size_t plane) {
  auto& planes = staging_[layer];
  if (planes.empty()) planes.resize(dests_[layer].planes.size());
  std::vector<std::byte>& bytes = planes[plane];
  const MutableElementSpan dest = dests_[layer].planes[plane];
  if (bytes.size() != dest.bytes.size()) bytes.resize(dest.bytes.size());
  return {std::span(bytes), dest.type};
}

Status PlaneStream::CopyUp(const ChunkLocation& loc, MutableElementSpan host, MutableElementSpan device) const {
  const std::uint64_t value = ElementBytes(host.type);
  PC_RETURN_IF_ERROR(device_->cuda->SetDevice(device_->device));
  return device_->cuda->CopyHostToDevice(device.bytes.data() + loc.value_offset * value,
                                         host.bytes.data() + loc.value_offset * value, loc.value_count * value);
}

py::tuple FetchIntoDevice(client::Client& c, const DeviceTarget& device, std::uint64_t entry,
                          const py::dict& planes) {
  FetchCounts counts;
  py::dict headers = FetchDescribed(c, entry, planes, &device, &counts);
  py::dict stats;
  stats["device_chunks"] = counts.device_chunks;
  stats["host_chunks"] = counts.host_chunks;
  return py::make_tuple(headers, stats);
}

}  // namespace primecache::python

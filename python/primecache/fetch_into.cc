// fetch_into (FetchInto, binding.h): the destinations checked against the
// layers' headers before the fetch starts, then every chunk decoded on
// DecodePool straight into its rows (the device path: fetch_device.cc).
#include "python/primecache/fetch_into.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

namespace primecache::python {

std::vector<MutableElementSpan> CheckDestinations(const LayerDecoder& dec, const py::handle& given,
                                                  const std::string& where, std::vector<py::array>& keep) {
  return GivenPlanes(dec, given, where, [&](const py::object& obj, const auto& layout, const std::string& name) {
    const std::string at = where + " plane '" + name + "'";
    if (!py::isinstance<py::array>(obj)) throw py::value_error(at + ": not a NumPy array");
    auto a = py::reinterpret_borrow<py::array>(obj);
    CheckPlaneArray(a, layout, at);
    if (!a.writeable()) throw py::value_error(at + ": not writable");
    keep.push_back(a);
    return MutableElementSpan(std::span(static_cast<std::byte*>(a.mutable_data()), layout.raw_bytes()), layout.dtype);
  });
}

WorkerPool& DecodePool() {
  static WorkerPool* pool = new WorkerPool(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
  return *pool;
}

Status PlaneStream::Run(client::Client& c, std::uint64_t entry, const std::vector<std::uint32_t>& which,
                        FetchCounts* counts) {
  client::FetchCallbacks cb;
  cb.on_layer = [this](std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunk_count) {
    return OnLayer(layer, header, chunk_count);
  };
  cb.on_chunk_held = [this](std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                            client::ChunkRelease release) { return OnChunk(layer, index, bytes, std::move(release)); };
  std::optional<LoanReleaser> loans;
  if (device_ != nullptr) {
    PC_RETURN_IF_ERROR(device_->cuda->SetDevice(device_->device));
    loans.emplace(device_->cuda, device_->device);
    cb.on_device_extent = [this, &loans](const client::DeviceExtent& extent, client::ChunkRelease release) {
      return OnDeviceExtent(extent, std::move(release), *loans);
    };
  }
  const Status fetched = c.Fetch(entry, which, cb);
  // Always: the jobs and the copies use the destinations and decoders.
  const Status decoded = jobs_.Wait();
  Status copied = loans ? loans->Close() : Status::Ok();
  if (copied.ok() && device_ != nullptr) copied = device_->cuda->Synchronize(device_->stream);
  counts->device_chunks = device_chunks_;
  counts->host_chunks = host_chunks_;
  PC_RETURN_IF_ERROR(fetched);
  PC_RETURN_IF_ERROR(decoded);
  PC_RETURN_IF_ERROR(copied);
  for (std::size_t l = 0; l < dests_.size(); ++l) {
    if (l > at_ || (l == at_ && seen_ != decoders_[l].chunk_count())) {
      return Status::Corruption("layer " + std::to_string(dests_[l].layer) + ": the fetch ended early");
    }
  }
  return Status::Ok();
}

Status PlaneStream::OnLayer(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunk_count) {
  at_ = at_ == dests_.size() ? 0 : at_ + 1;
  seen_ = 0;
  if (at_ >= dests_.size() || layer != dests_[at_].layer) return Status::Corruption("the daemon sent another layer");
  const std::string_view want = headers_[at_];
  if (header.size() != want.size() || std::memcmp(header.data(), want.data(), want.size()) != 0 ||
      chunk_count != decoders_[at_].chunk_count()) {
    return Status::Corruption("layer " + std::to_string(layer) + ": the fetched header is not the described one");
  }
  return Status::Ok();
}

Status PlaneStream::Claim(std::uint32_t layer, std::uint32_t index, const client::ChunkRelease& release) {
  if (at_ >= dests_.size() || layer != dests_[at_].layer || index != seen_++ ||
      index >= decoders_[at_].chunk_count()) {
    release();
    return Status::Corruption("layer " + std::to_string(layer) + ": chunk " + std::to_string(index) +
                              " out of order");
  }
  if (Status s = jobs_.Error(); !s.ok()) {
    release();
    return s;
  }
  return Status::Ok();
}

Status PlaneStream::OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                            client::ChunkRelease release) {
  PC_RETURN_IF_ERROR(Claim(layer, index, release));
  const LayerDecoder& dec = decoders_[at_];
  const std::size_t plane_index = dec.chunk(index).plane;
  MutableElementSpan plane = dests_[at_].planes[plane_index];
  const MutableElementSpan device_plane = plane;
  if (device_ != nullptr) plane = StagingFor(at_, plane_index);
  ++host_chunks_;
  jobs_.Start();
  DecodePool().Post([this, &dec, plane, device_plane, index, bytes, layer, release = std::move(release)] {
    Status s = dec.DecodeChunk(index, bytes, plane);
    release();
    if (s.ok() && device_ != nullptr) s = CopyUp(dec.chunk(index), plane, device_plane);
    jobs_.Done(s.WithContext("layer " + std::to_string(layer)));
  });
  return Status::Ok();
}

py::dict FetchDescribed(client::Client& c, std::uint64_t entry, const py::dict& planes, const DeviceTarget* device,
                        FetchCounts* counts) {
  std::vector<Destination> dests;
  for (auto [key, value] : planes) dests.push_back({key.cast<std::uint32_t>(), {}, {}});
  std::sort(dests.begin(), dests.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  if (dests.empty()) throw py::value_error("fetch_into: no layers given");
  const EntryDetail detail = ValueOrRaise(WithoutGil([&] { return c.Describe(entry, client::DescribeOptions{std::nullopt, true}); }));
  std::vector<std::uint32_t> which;
  std::vector<std::string> headers;
  std::vector<LayerDecoder> decoders;
  py::dict out;
  for (Destination& d : dests) {
    const std::string where = "layer " + std::to_string(d.layer);
    if (d.layer >= detail.layer_headers.size()) {
      throw py::value_error(where + ": the entry has " + std::to_string(detail.layer_headers.size()) + " layers");
    }
    if (!which.empty() && which.back() == d.layer) throw py::value_error(where + ": given twice");
    const std::string& bytes = detail.layer_headers[d.layer];
    LayerHeader h = ValueOrRaise(ParseLayerHeader(AsBytes(bytes)));
    LayerDecoder dec = ValueOrRaise(LayerDecoder::Create(h));
    const py::handle given = planes[py::int_(d.layer)];
    d.planes = device != nullptr ? CheckDeviceDestinations(dec, given, where)
                                 : CheckDestinations(dec, given, where, d.arrays);
    out[py::int_(d.layer)] = py::cast(std::move(h));
    which.push_back(d.layer);
    headers.push_back(bytes);
    decoders.push_back(std::move(dec));
  }
  ThrowIfError(WithoutGil([&] { return PlaneStream(headers, decoders, dests, device).Run(c, entry, which, counts); }));
  return out;
}

py::dict FetchInto(client::Client& c, std::uint64_t entry, const py::dict& planes) {
  FetchCounts counts;
  return FetchDescribed(c, entry, planes, nullptr, &counts);
}

}  // namespace primecache::python

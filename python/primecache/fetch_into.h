// fetch_into's insides (python/primecache/fetch_into.cc, the host path, and
// fetch_device.cc, the device path): the checked destinations, the decode
// jobs, the device loans and the stream of one fetch. Internal to the module.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/worker_pool.h"
#include "python/primecache/binding.h"
#include "python/primecache/cuda_runtime.h"

namespace primecache::python {

// One layer's destinations for fetch_into: its decoder and one writable
// span per plane, each checked against the plane before anything is written.
struct Destination {
  std::uint32_t layer = 0;
  std::vector<py::array> arrays;
  std::vector<MutableElementSpan> planes;
};

// The destinations `given` for the planes `dec` describes, by plane name (a
// dict) or in stored order: checks there is one per plane (ValueError naming
// `where`), then makes each plane's span with `to_span(object, layout, name)`
// in plane order, so both paths refuse a bad argument with the same message.
template <typename ToSpan>
std::vector<MutableElementSpan> GivenPlanes(const LayerDecoder& dec, const py::handle& given,
                                            const std::string& where, ToSpan&& to_span) {
  const auto& layouts = dec.planes();
  const bool by_name = py::isinstance<py::dict>(given);
  if (py::len(given) != layouts.size()) {
    throw py::value_error(where + ": " + std::to_string(py::len(given)) + " destination planes; its kind " +
                          dec.header().kind + " has " + std::to_string(layouts.size()));
  }
  std::vector<MutableElementSpan> planes;
  for (std::size_t p = 0; p < layouts.size(); ++p) {
    const std::string name(PlaneName(layouts[p].id));
    if (by_name && !given.contains(name)) throw py::value_error(where + ": no destination for plane '" + name + "'");
    py::object obj = by_name ? given[py::str(name)] : given[py::int_(p)];
    planes.push_back(to_span(obj, layouts[p], name));
  }
  return planes;
}

// Checks `given` (arrays by plane name or in stored order) as the
// destinations of the planes `dec` describes; ValueError naming `where`.
// Keeps the arrays referenced in `keep`.
std::vector<MutableElementSpan> CheckDestinations(const LayerDecoder& dec, const py::handle& given,
                                                  const std::string& where, std::vector<py::array>& keep);
// A device destination plane: (pointer, bytes) with bytes the plane's.
// The pointer is the caller's (primecache.torch passes a CUDA tensor's
// data_ptr): the binding cannot check device memory, only the size claimed.
std::vector<MutableElementSpan> CheckDeviceDestinations(const LayerDecoder& dec, const py::handle& given,
                                                        const std::string& where);

// The threads fetch_into decodes on: chunks decode while the next ones
// arrive. Never destroyed (threads that outlive the interpreter's teardown
// touch no Python object).
WorkerPool& DecodePool();

// Chunks handed to DecodePool: how many are still decoding, and the first
// error. Thread-safety: all members under mu.
class DecodeJobs {
 public:
  void Start() {
    std::lock_guard<std::mutex> l(mu_);
    ++pending_;
  }
  void Done(Status s) {
    std::lock_guard<std::mutex> l(mu_);
    if (!s.ok() && first_.ok()) first_ = std::move(s);
    if (--pending_ == 0) cv_.notify_all();
  }
  Status Error() {
    std::lock_guard<std::mutex> l(mu_);
    return first_;
  }
  // Waits for every chunk started; returns the first error.
  Status Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return pending_ == 0; });
    return first_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t pending_ = 0;
  Status first_;
};

// Returns each device extent's window space once its copies out of the window
// ran: every copy is followed by an event, and one thread waits for them in
// arrival order, the order in which the daemon reuses the window. (A host
// callback on the stream would stall the copies queued behind it.)
// Thread-safety: Lend from one thread at a time; Close once, from any.
class LoanReleaser {
 public:
  LoanReleaser(const CudaRuntime* cuda, int device) : cuda_(cuda), device_(device), thread_([this] { Run(); }) {}
  ~LoanReleaser() { (void)Close(); }
  LoanReleaser(const LoanReleaser&) = delete;
  LoanReleaser& operator=(const LoanReleaser&) = delete;

  // After a copy out of lent window space was queued on `stream`.
  Status Lend(CudaRuntime::Stream stream, client::ChunkRelease release);
  // Waits until every loan's copy ran and its space was returned; the first
  // error waiting for one.
  Status Close();

 private:
  struct Loan {
    CudaRuntime::Event event = nullptr;
    client::ChunkRelease release;
  };
  void Run();

  const CudaRuntime* cuda_;
  const int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Loan> loans_;
  bool closed_ = false;
  Status first_;
  std::thread thread_;  // last: it starts once the members above exist
};

// One fetch of described layers into their destinations: the daemon must
// send exactly the layers and headers Describe gave, each chunk in order.
// Host destinations: each chunk decodes from where it arrived (the shared
// fetch window, or the socket's buffer) straight into its rows, on
// DecodePool, once its size and checksums passed. Device destinations
// (`device` set): a raw chunk the daemon copied into the device window is
// copied on from there by the device (the daemon checked it over the bytes
// it read); any other chunk decodes on the host into a staging copy of its
// plane and is copied to the device from there.
class PlaneStream {
 public:
  PlaneStream(const std::vector<std::string>& headers, const std::vector<LayerDecoder>& decoders,
              const std::vector<Destination>& dests, const DeviceTarget* device)
      : headers_(headers), decoders_(decoders), dests_(dests), device_(device), at_(dests.size()) {
    if (device_ != nullptr) staging_.resize(dests.size());
  }

  Status Run(client::Client& c, std::uint64_t entry, const std::vector<std::uint32_t>& which, FetchCounts* counts);

 private:
  // fetch_into.cc: the layers in order, and the chunks decoded on the host.
  Status OnLayer(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunk_count);
  // The next chunk in order, or the error that ends the fetch (the loan
  // returned then).
  Status Claim(std::uint32_t layer, std::uint32_t index, const client::ChunkRelease& release);
  Status OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                 client::ChunkRelease release);
  // fetch_device.cc: the extents the daemon copied into the device window
  // (each chunk checked, chunks whose destinations follow each other copied
  // on in one copy, one loan per extent), and the host's copied up.
  Status OnDeviceExtent(const client::DeviceExtent& extent, client::ChunkRelease release, LoanReleaser& loans);
  // A host copy of a device plane that chunks decode into first (made once,
  // on the fetch's thread).
  MutableElementSpan StagingFor(std::size_t layer, std::size_t plane);
  Status CopyUp(const ChunkLocation& loc, MutableElementSpan host, MutableElementSpan device) const;

  const std::vector<std::string>& headers_;
  const std::vector<LayerDecoder>& decoders_;
  const std::vector<Destination>& dests_;
  const DeviceTarget* device_;
  std::size_t at_;          // the layer streaming now
  std::uint32_t seen_ = 0;  // its chunks so far
  std::vector<std::vector<std::vector<std::byte>>> staging_;  // [layer][plane], device fetches only
  std::uint64_t device_chunks_ = 0;
  std::uint64_t host_chunks_ = 0;
  DecodeJobs jobs_;
};

// FetchInto and FetchIntoDevice: the layers' headers (Describe) and every
// destination are checked before the fetch starts, then it streams.
py::dict FetchDescribed(client::Client& c, std::uint64_t entry, const py::dict& planes, const DeviceTarget* device,
                        FetchCounts* counts);

}  // namespace primecache::python

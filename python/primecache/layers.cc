// NumPy planes to and from the daemon: publish encodes arrays with the
// codecs (LayerEncoder) and streams them; fetch decodes what comes back
// (LayerDecoder) into arrays whose base object keeps the fetched bytes alive,
// fetch_into into arrays the caller owns.
//
// A plane's element type maps to one NumPy dtype (PlaneDtype): f32 float32,
// f16 float16, and the types NumPy lacks as their bits, bf16 uint16 and
// f8e4m3 uint8 (primecache.torch views them as torch.bfloat16 and
// torch.float8_e4m3fn). An array of another dtype is refused by name.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <string>

#include "core/worker_pool.h"
#include "python/primecache/binding.h"
#include "python/primecache/cuda_runtime.h"

namespace primecache::python {

py::dtype PlaneDtype(ElementType t) {
  switch (t) {
    case ElementType::kF32:
      return py::dtype("float32");
    case ElementType::kF16:
      return py::dtype("float16");
    case ElementType::kBf16:
      return py::dtype("uint16");
    case ElementType::kF8E4M3:
      return py::dtype("uint8");
  }
  throw py::value_error("not an element type");
}

namespace {

// Whether an array's dtype carries values of type t: its PlaneDtype, or,
// for the types NumPy lacks, a dtype of their name (ml_dtypes') or any
// integer of their width holding the bits.
bool CarriesType(const py::dtype& d, ElementType t) {
  if (d.itemsize() != static_cast<py::ssize_t>(ElementBytes(t))) return false;
  const char kind = d.kind();
  const std::string name = py::str(d.attr("name"));
  switch (t) {
    case ElementType::kF32:
    case ElementType::kF16:
      return kind == 'f';
    case ElementType::kBf16:
      return kind == 'u' || kind == 'i' || name == "bfloat16";
    case ElementType::kF8E4M3:
      return kind == 'u' || kind == 'i' || name == "float8_e4m3fn";
  }
  return false;
}

// Checks an array as plane `lay` (its dtype, C order, its rows and row
// width or its flat size); ValueError naming `where` and what differs.
void CheckPlaneArray(const py::array& a, const PlaneLayout& lay, const std::string& where) {
  if (!CarriesType(a.dtype(), lay.dtype)) {
    throw py::value_error(where + ": dtype " + std::string(py::str(a.dtype())) + ", the plane is " +
                          ElementTypeName(lay.dtype) + " (want " + std::string(py::str(PlaneDtype(lay.dtype))) +
                          ")");
  }
  if ((a.flags() & py::array::c_style) == 0) throw py::value_error(where + ": not C-contiguous");
  const bool fits = a.ndim() == 2 ? static_cast<std::uint64_t>(a.shape(0)) == lay.rows &&
                                        static_cast<std::uint64_t>(a.shape(1)) == lay.row_width
                                  : a.ndim() == 1 && static_cast<std::uint64_t>(a.size()) == lay.values();
  if (!fits) {
    throw py::value_error(where + ": shape " + std::string(py::str(a.attr("shape"))) + ", want (" +
                          std::to_string(lay.rows) + ", " + std::to_string(lay.row_width) + ") or (" +
                          std::to_string(lay.values()) + ",)");
  }
}

// The bytes one fetch brought and the planes decoded from them: the base
// object of every array a fetch returns, so that they live as long as any of
// those arrays. Written only while the fetch runs, read-only after.
struct FetchBuffer {
  std::vector<client::FetchedLayer> layers;
  // Planes that are not one raw chunk. Views point into the inner vectors,
  // whose buffers stay put when the outer one grows.
  std::vector<std::vector<std::byte>> decoded;
  std::uint64_t fetched_bytes = 0;  // chunk bytes received
  std::uint64_t copied_bytes = 0;   // plane bytes decoded into memory of their own
};

// One fetched layer as Python sees it (client::FetchedLayer plus its parsed
// header and its planes as arrays).
struct PyFetchedLayer {
  std::uint32_t layer = 0;
  py::bytes header_bytes;
  std::optional<LayerHeader> header;  // parsed when decoded
  py::dict planes;                    // plane name -> [rows, row_width] of PlaneDtype
  py::list chunks;                    // uint8 views of the chunks, when not decoded
};

// Where one decoded plane's floats lie (inside a FetchBuffer).
struct PlaneView {
  std::string name;
  std::uint64_t rows = 0;
  std::uint32_t width = 0;
  ElementType dtype = ElementType::kF32;
  const std::byte* data = nullptr;  // null for a plane without values
};

struct DecodedLayer {
  LayerHeader header;
  std::vector<PlaneView> planes;
};

std::span<const std::byte> Bytes(const std::vector<std::byte>& v) {
  return {v.data(), v.size()};
}

// Plane p of a decoded layer: a view of its chunk when it is one raw/v1
// chunk of aligned floats (checked against its checksum), else decoded into
// a buffer of its own.
Result<PlaneView> DecodePlane(const LayerDecoder& dec, std::size_t p, client::LayerData& data,
                              FetchBuffer& buf) {
  const PlaneLayout& lay = dec.planes()[p];
  PlaneView view{std::string(PlaneName(lay.id)), lay.rows, lay.row_width, lay.dtype, nullptr};
  if (lay.values() == 0) return view;
  std::vector<std::size_t> chunks;
  for (std::size_t i = 0; i < dec.chunk_count(); ++i) {
    if (dec.chunk(i).plane == p) chunks.push_back(i);
  }
  if (chunks.size() == 1 && dec.ChunkIsRaw(chunks[0]) &&
      reinterpret_cast<std::uintptr_t>(data.chunks[chunks[0]].data()) % ElementBytes(lay.dtype) == 0) {
    PC_RETURN_IF_ERROR(dec.CheckEncoded(chunks[0], Bytes(data.chunks[chunks[0]])));
    view.data = data.chunks[chunks[0]].data();
    return view;
  }
  std::vector<std::byte>& out = buf.decoded.emplace_back(lay.raw_bytes());
  for (std::size_t i : chunks) {
    PC_RETURN_IF_ERROR(dec.DecodeChunk(i, Bytes(data.chunks[i]), MutableElementSpan(out, lay.dtype)));
    data.chunks[i] = {};  // decoded: its encoded bytes are not needed any more
  }
  buf.copied_bytes += lay.raw_bytes();
  view.data = out.data();
  return view;
}

Result<DecodedLayer> DecodeLayer(client::LayerData& data, FetchBuffer& buf) {
  PC_ASSIGN_OR_RETURN(LayerHeader header, ParseLayerHeader(Bytes(data.header)));
  PC_ASSIGN_OR_RETURN(LayerDecoder dec, LayerDecoder::Create(header));
  if (data.chunks.size() != dec.chunk_count()) {
    return Status::Corruption("layer has " + std::to_string(data.chunks.size()) +
                              " chunks, its header says " + std::to_string(dec.chunk_count()));
  }
  DecodedLayer out{std::move(header), {}};
  for (std::size_t p = 0; p < dec.planes().size(); ++p) {
    PC_ASSIGN_OR_RETURN(PlaneView view, DecodePlane(dec, p, data, buf));
    out.planes.push_back(std::move(view));
  }
  return out;
}

// Runs without the GIL: the fetch, and with `decode` every layer's decoding.
Status FetchAndDecode(client::Client& c, std::uint64_t entry, const std::vector<std::uint32_t>& which,
                      bool decode, FetchBuffer& buf, std::vector<DecodedLayer>& decoded) {
  PC_ASSIGN_OR_RETURN(buf.layers, c.FetchLayers(entry, which));
  for (const client::FetchedLayer& l : buf.layers) {
    for (const auto& chunk : l.data.chunks) buf.fetched_bytes += chunk.size();
  }
  if (!decode) return Status::Ok();
  for (client::FetchedLayer& l : buf.layers) {
    auto d = DecodeLayer(l.data, buf);
    if (!d.ok()) return d.status().WithContext("layer " + std::to_string(l.layer));
    decoded.push_back(std::move(d).value());
  }
  return Status::Ok();
}

// What a fetch returns is read-only: the arrays are views of the fetch's
// buffer (shared by every array of the fetch), not the caller's to write.
py::array ReadOnly(py::array a) {
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

py::array PlaneArray(const PlaneView& v, const py::object& base) {
  const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(v.rows), static_cast<py::ssize_t>(v.width)};
  if (v.data == nullptr) return ReadOnly(py::array(PlaneDtype(v.dtype), shape));
  return ReadOnly(py::array(PlaneDtype(v.dtype), shape, {}, v.data, base));
}

}  // namespace

py::list FetchArrays(client::Client& c, std::uint64_t entry, std::vector<std::uint32_t> layers, bool decode) {
  auto buf = std::make_shared<FetchBuffer>();
  std::vector<DecodedLayer> decoded;
  ThrowIfError(WithoutGil([&] { return FetchAndDecode(c, entry, layers, decode, *buf, decoded); }));
  const py::object base = py::cast(buf);
  py::list out;
  for (std::size_t i = 0; i < buf->layers.size(); ++i) {
    client::FetchedLayer& l = buf->layers[i];
    PyFetchedLayer f;
    f.layer = l.layer;
    f.header_bytes = py::bytes(reinterpret_cast<const char*>(l.data.header.data()), l.data.header.size());
    if (decode) {
      f.header = std::move(decoded[i].header);
      for (const PlaneView& v : decoded[i].planes) f.planes[py::str(v.name)] = PlaneArray(v, base);
    } else {
      for (const auto& chunk : l.data.chunks) {
        f.chunks.append(ReadOnly(py::array(py::dtype::of<std::uint8_t>(),
                                           {static_cast<py::ssize_t>(chunk.size())}, {}, chunk.data(), base)));
      }
    }
    out.append(py::cast(std::move(f)));
  }
  return out;
}

namespace {

// One layer's destinations for fetch_into: its decoder and one writable
// span per plane, each checked against the plane before anything is written.
struct Destination {
  std::uint32_t layer = 0;
  std::vector<py::array> arrays;
  std::vector<MutableElementSpan> planes;
};

std::vector<MutableElementSpan> CheckDestinations(const LayerDecoder& dec, const py::handle& given,
                                                  const std::string& where, std::vector<py::array>& keep) {
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
    const std::string at = where + " plane '" + name + "'";
    if (!py::isinstance<py::array>(obj)) throw py::value_error(at + ": not a NumPy array");
    auto a = py::reinterpret_borrow<py::array>(obj);
    CheckPlaneArray(a, layouts[p], at);
    if (!a.writeable()) throw py::value_error(at + ": not writable");
    keep.push_back(a);
    planes.emplace_back(std::span(static_cast<std::byte*>(a.mutable_data()), layouts[p].raw_bytes()),
                        layouts[p].dtype);
  }
  return planes;
}

// A device destination plane: (pointer, bytes) with bytes the plane's.
// The pointer is the caller's (primecache.torch passes a CUDA tensor's
// data_ptr): the binding cannot check device memory, only the size claimed.
std::vector<MutableElementSpan> CheckDeviceDestinations(const LayerDecoder& dec, const py::handle& given,
                                                        const std::string& where) {
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
    const auto pair = (by_name ? given[py::str(name)] : given[py::int_(p)]).cast<std::pair<std::uintptr_t, std::uint64_t>>();
    if (pair.second != layouts[p].raw_bytes() || (pair.first == 0 && pair.second != 0)) {
      throw py::value_error(where + " plane '" + name + "': " + std::to_string(pair.second) +
                            " device bytes, the plane has " + std::to_string(layouts[p].raw_bytes()));
    }
    planes.emplace_back(std::span(reinterpret_cast<std::byte*>(pair.first), pair.second), layouts[p].dtype);
  }
  return planes;
}

// The threads fetch_into decodes on: chunks decode while the next ones
// arrive. Never destroyed (threads that outlive the interpreter's teardown
// touch no Python object).
WorkerPool& DecodePool() {
  static WorkerPool* pool = new WorkerPool(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
  return *pool;
}

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

// Returns each device chunk's window space once its copy out of the window
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
  Status Lend(CudaRuntime::Stream stream, client::ChunkRelease release) {
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
  // Waits until every loan's copy ran and its space was returned; the first
  // error waiting for one.
  Status Close() {
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> l(mu_);
    return first_;
  }

 private:
  struct Loan {
    CudaRuntime::Event event = nullptr;
    client::ChunkRelease release;
  };
  void Run() {
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

  Status Run(client::Client& c, std::uint64_t entry, const std::vector<std::uint32_t>& which, FetchCounts* counts) {
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
      cb.on_device_chunk = [this, &loans](std::uint32_t layer, std::uint32_t index, std::uint64_t offset,
                                          std::uint64_t length, client::ChunkRelease release) {
        return OnDeviceChunk(layer, index, offset, length, std::move(release), *loans);
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

 private:
  Status OnLayer(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunk_count) {
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

  // The next chunk in order, or the error that ends the fetch (the loan
  // returned then).
  Status Claim(std::uint32_t layer, std::uint32_t index, const client::ChunkRelease& release) {
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

  Status OnChunk(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
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

  Status OnDeviceChunk(std::uint32_t layer, std::uint32_t index, std::uint64_t offset, std::uint64_t length,
                       client::ChunkRelease release, LoanReleaser& loans) {
    PC_RETURN_IF_ERROR(Claim(layer, index, release));
    const LayerDecoder& dec = decoders_[at_];
    const ChunkLocation& loc = dec.chunk(index);
    const MutableElementSpan plane = dests_[at_].planes[loc.plane];
    const std::uint64_t value = ElementBytes(plane.type);
    const std::string where = "layer " + std::to_string(layer) + ": device chunk " + std::to_string(index);
    if (!dec.ChunkIsRaw(index)) {
      release();
      return Status::Corruption(where + " is not stored raw");
    }
    if (length != loc.value_count * value || offset > device_->window_bytes ||
        length > device_->window_bytes - offset) {
      release();
      return Status::Corruption(where + ": " + std::to_string(length) + " bytes at " + std::to_string(offset) +
                                " do not fit the chunk or the window");
    }
    Status s = device_->cuda->CopyDeviceToDeviceAsync(plane.bytes.data() + loc.value_offset * value,
                                                     device_->window + offset, length, device_->stream);
    if (!s.ok()) {
      release();
      return s;
    }
    ++device_chunks_;
    return loans.Lend(device_->stream, std::move(release));
  }

  // A host copy of a device plane that chunks decode into first (made once,
  // on the fetch's thread).
  MutableElementSpan StagingFor(std::size_t layer, std::size_t plane) {
    auto& planes = staging_[layer];
    if (planes.empty()) planes.resize(dests_[layer].planes.size());
    std::vector<std::byte>& bytes = planes[plane];
    const MutableElementSpan dest = dests_[layer].planes[plane];
    if (bytes.size() != dest.bytes.size()) bytes.resize(dest.bytes.size());
    return {std::span(bytes), dest.type};
  }

  Status CopyUp(const ChunkLocation& loc, MutableElementSpan host, MutableElementSpan device) const {
    const std::uint64_t value = ElementBytes(host.type);
    PC_RETURN_IF_ERROR(device_->cuda->SetDevice(device_->device));
    return device_->cuda->CopyHostToDevice(device.bytes.data() + loc.value_offset * value,
                                           host.bytes.data() + loc.value_offset * value, loc.value_count * value);
  }

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

}  // namespace

namespace {

// FetchInto and FetchIntoDevice: the layers' headers (Describe) and every
// destination are checked before the fetch starts, then it streams.
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

}  // namespace

py::dict FetchInto(client::Client& c, std::uint64_t entry, const py::dict& planes) {
  FetchCounts counts;
  return FetchDescribed(c, entry, planes, nullptr, &counts);
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

namespace {

// A layer to publish: its shape and its planes in stored order, as views of
// the arrays it keeps referenced.
struct LayerInput {
  LayerShape shape;
  std::vector<py::array> arrays;
  std::vector<ElementSpan> planes;
};

// Checks one plane array against its layout; ValueError saying what differs.
ElementSpan PlaneSpan(const py::handle& obj, const PlaneLayout& lay, const std::string& where,
                      std::vector<py::array>& keep) {
  if (!py::isinstance<py::array>(obj)) throw py::value_error(where + ": not a NumPy array");
  auto a = py::reinterpret_borrow<py::array>(obj);
  CheckPlaneArray(a, lay, where);
  keep.push_back(a);
  return {{static_cast<const std::byte*>(a.data()), lay.raw_bytes()}, lay.dtype};
}

LayerInput ReadLayer(const py::handle& item, std::size_t index) {
  const std::string where = "layer " + std::to_string(index);
  py::object shape_obj, planes_obj;
  if (py::isinstance<py::tuple>(item) && py::len(item) == 2) {
    shape_obj = item[py::int_(0)];
    planes_obj = item[py::int_(1)];
  } else if (py::hasattr(item, "shape") && py::hasattr(item, "planes")) {
    shape_obj = item.attr("shape");
    planes_obj = item.attr("planes");
  } else {
    throw py::value_error(where + ": want a (shape, planes) pair or an object with .shape and .planes");
  }
  LayerInput in;
  try {
    in.shape = shape_obj.cast<LayerShape>();
  } catch (const py::cast_error&) {
    throw py::value_error(where + ": shape is not a LatentShape, RecurrentShape, KvShape or LinearStateShape");
  }
  if (Status s = CheckShape(in.shape); !s.ok()) throw py::value_error(where + ": " + s.message());
  auto codec = CodecRegistry::Default().KindFor(in.shape);
  if (!codec.ok()) throw py::value_error(where + ": " + codec.status().message());
  auto layouts = (*codec)->Planes(in.shape, CodecLimits{});
  if (!layouts.ok()) throw py::value_error(where + ": " + layouts.status().message());
  const bool by_name = py::isinstance<py::dict>(planes_obj);
  if (!by_name && py::len(planes_obj) != layouts->size()) {
    throw py::value_error(where + ": " + std::to_string(py::len(planes_obj)) + " planes, its kind " +
                          std::string((*codec)->kind()) + " has " + std::to_string(layouts->size()));
  }
  for (std::size_t p = 0; p < layouts->size(); ++p) {
    const PlaneLayout& lay = (*layouts)[p];
    const std::string name(PlaneName(lay.id));
    if (by_name && !planes_obj.contains(name)) throw py::value_error(where + ": no plane '" + name + "'");
    py::object plane = by_name ? planes_obj[py::str(name)] : planes_obj[py::int_(p)];
    in.planes.push_back(PlaneSpan(plane, lay, where + " plane '" + name + "'", in.arrays));
  }
  if (by_name && py::len(planes_obj) != layouts->size()) {
    throw py::value_error(where + ": planes other than its kind's (" + std::string((*codec)->kind()) + ")");
  }
  return in;
}

// Encodes one layer chunk by chunk and streams it.
Status StreamLayer(client::PublishStream& stream, const LayerInput& in, const EncodeOptions& options) {
  PC_ASSIGN_OR_RETURN(LayerEncoder enc, LayerEncoder::Create(in.shape, in.planes, options));
  std::vector<std::vector<std::byte>> chunks(enc.chunk_count());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].resize(enc.MaxChunkBytes(i));
    PC_ASSIGN_OR_RETURN(std::size_t n, enc.EncodeChunk(i, chunks[i]));
    chunks[i].resize(n);
  }
  PC_ASSIGN_OR_RETURN(LayerHeader header, enc.Finish());
  const std::string h = SerializeLayerHeader(header);
  PC_RETURN_IF_ERROR(stream.BeginLayer(AsBytes(h), static_cast<std::uint32_t>(chunks.size())));
  for (const auto& chunk : chunks) PC_RETURN_IF_ERROR(stream.AddChunk(chunk));
  return Status::Ok();
}

}  // namespace

PublishResult PublishArrays(client::Client& c, const client::ModelId& model,
                            std::vector<std::uint32_t> tokens, py::sequence layers,
                            const EncodeOptions& options) {
  std::vector<LayerInput> inputs;
  inputs.reserve(py::len(layers));
  for (std::size_t i = 0; i < py::len(layers); ++i) inputs.push_back(ReadLayer(layers[i], i));
  return ValueOrRaise(WithoutGil([&]() -> Result<PublishResult> {
    PC_ASSIGN_OR_RETURN(auto stream,
                        c.BeginPublish(model, tokens, static_cast<std::uint32_t>(inputs.size())));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (Status s = StreamLayer(*stream, inputs[i], options); !s.ok()) {
        return s.WithContext("layer " + std::to_string(i));
      }
    }
    return stream->Commit();
  }));
}

void BindLayers(py::module_& m) {
  py::class_<FetchBuffer, std::shared_ptr<FetchBuffer>>(
      m, "FetchBuffer", "The bytes of one fetch: the base object of every array it returned.")
      .def_readonly("fetched_bytes", &FetchBuffer::fetched_bytes, "chunk bytes received")
      .def_readonly("copied_bytes", &FetchBuffer::copied_bytes,
                    "plane bytes decoded into memory of their own (0: every plane views the fetched bytes)");
  py::class_<PlaneLayout>(m, "PlaneLayout", "One plane of a layer of a given shape (codec.h).")
      .def_property_readonly("name", [](const PlaneLayout& p) { return std::string(PlaneName(p.id)); })
      .def_readonly("rows", &PlaneLayout::rows)
      .def_readonly("row_width", &PlaneLayout::row_width)
      .def_readonly("dtype", &PlaneLayout::dtype)
      .def_readonly("append_only", &PlaneLayout::append_only)
      .def_property_readonly("raw_bytes", &PlaneLayout::raw_bytes);
  m.def(
      "plane_layouts",
      [](const LayerShape& shape) {
        const LayerCodec* codec = ValueOrRaise(CodecRegistry::Default().KindFor(shape));
        return ValueOrRaise(codec->Planes(shape, CodecLimits{}));
      },
      py::arg("shape"), "The planes of a layer of this shape, in stored order (ValueError for a bad shape).");
  py::class_<ChunkRecord>(m, "ChunkRecord")
      .def_readonly("raw_bytes", &ChunkRecord::raw_bytes)
      .def_readonly("encoded_bytes", &ChunkRecord::encoded_bytes)
      .def_readonly("raw_checksum", &ChunkRecord::raw_checksum)
      .def_readonly("encoded_checksum", &ChunkRecord::encoded_checksum);
  py::class_<PlaneRecord>(m, "PlaneRecord")
      .def_property_readonly("name", [](const PlaneRecord& p) { return std::string(PlaneName(p.id)); })
      .def_readonly("transform", &PlaneRecord::transform)
      .def_readonly("level", &PlaneRecord::level)
      .def_readonly("rows", &PlaneRecord::rows)
      .def_readonly("row_width", &PlaneRecord::row_width)
      .def_readonly("chunk_rows", &PlaneRecord::chunk_rows)
      .def_readonly("chunks", &PlaneRecord::chunks);
  py::class_<LayerHeader>(m, "LayerHeader")
      .def_readonly("kind", &LayerHeader::kind)
      .def_readonly("shape", &LayerHeader::shape)
      .def_readonly("planes", &LayerHeader::planes)
      .def_property_readonly("chunk_count", &LayerHeader::chunk_count);
  m.def(
      "parse_layer_header",
      [](const py::bytes& b) {
        const std::string s = b;
        return ValueOrRaise(ParseLayerHeader(AsBytes(s)));
      },
      py::arg("header"),
      "Parses a serialized layer header (EntryDetail.layer_headers, FetchedLayer.header_bytes).");
  py::class_<PyFetchedLayer>(m, "FetchedLayer")
      .def_readonly("layer", &PyFetchedLayer::layer)
      .def_readonly("header_bytes", &PyFetchedLayer::header_bytes)
      .def_readonly("header", &PyFetchedLayer::header)
      .def_property_readonly("shape",
                             [](const PyFetchedLayer& f) -> py::object {
                               return f.header ? py::cast(f.header->shape) : py::none();
                             })
      .def_readonly("planes", &PyFetchedLayer::planes)
      .def_readonly("chunks", &PyFetchedLayer::chunks);
}

}  // namespace primecache::python

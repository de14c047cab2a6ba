// Shared pieces of the Python binding (python/primecache/*.cc): how a
// Status becomes a Python exception, and how a client call runs without the
// GIL. Internal to the module; not a public header.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "primecache/status.h"

namespace primecache::python {

namespace py = pybind11;

// Creates the exception classes (primecache.Error and its subclasses by
// status code) in `m`. Called once, from the module's init.
void BindErrors(py::module_& m);

// Raises the exception class of s.code() carrying s.message() (and the code's
// name as its `code` attribute). Requires the GIL and a non-OK status.
[[noreturn]] void Raise(const Status& s);

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T ValueOrRaise(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

// Runs f() with the GIL released: every call into the client (socket I/O,
// encoding, decoding) goes through here, so other Python threads run
// meanwhile. f must not touch Python objects.
template <typename F>
auto WithoutGil(F&& f) -> decltype(f()) {
  py::gil_scoped_release release;
  return f();
}

// Token ids from any 1-D sequence or array of integers in [0, 2^32);
// ValueError otherwise.
std::vector<std::uint32_t> TokensFrom(py::handle tokens);

// Keyword construction for any bound value: T() with each keyword set as its
// attribute (TypeError for a name T has not).
template <typename T>
void KeywordInit(py::class_<T>& cls) {
  cls.def(py::init([](const py::kwargs& kw) {
    T value{};
    py::object view = py::cast(&value, py::return_value_policy::reference);
    for (auto [key, item] : kw) {
      if (!py::hasattr(view, key)) {
        throw py::type_error(std::string(py::str(py::type::of(view).attr("__name__"))) + " has no field '" +
                             std::string(py::str(key)) + "'");
      }
      view.attr(key) = item;
    }
    return value;
  }));
}

// A repr listing the given fields: "LookupHit(id=3, length=12, ...)".
template <typename T>
void FieldRepr(py::class_<T>& cls, std::vector<std::string> fields) {
  cls.def("__repr__", [fields](const py::object& self) {
    std::string s = std::string(py::str(py::type::of(self).attr("__name__"))) + "(";
    for (std::size_t i = 0; i < fields.size(); ++i) {
      s += (i ? ", " : "") + fields[i] + "=" + std::string(py::repr(self.attr(fields[i].c_str())));
    }
    return s + ")";
  });
}

// client.cc: the entry and stats values (entry.h) and the Client class.
void BindEntries(py::module_& m);
void BindStats(py::module_& m);
void BindClient(py::module_& m);

// layers.cc: NumPy planes to and from the daemon (fetch in fetch.cc,
// fetch_into in fetch_into.cc and fetch_device.cc).
// Binds FetchBuffer, FetchedLayer, LayerHeader and its records.
void BindLayers(py::module_& m);
// fetch.cc: the bindings of FetchBuffer and of FetchedLayer (BindLayers
// calls them, the first before its own values, the second after).
void BindFetchBuffer(py::module_& m);
void BindFetchedLayer(py::module_& m);
// A layer given as a (shape, planes) pair or an object with .shape and
// .planes (planes by name or in stored order) as a snapshot: f32 planes of
// the kinds a TP engine splits (latent, recurrent, KV); ValueError naming
// `index` otherwise (layers.cc).
LayerSnapshot SnapshotFromPlanes(const py::handle& layer, std::size_t index);
// A snapshot as a (shape, {plane name: float32 array [rows, row_width]}) pair.
py::tuple PlanesFromSnapshot(const LayerSnapshot& layer);
// tp.cc: the TP helpers (RankPartsPlan, rank_parts, assemble_rank_parts).
void BindTp(py::module_& m);
// Encodes each layer of `layers` ((shape, planes) pairs or objects with
// .shape and .planes, planes by name or in stored order) and publishes them;
// ValueError for arrays that do not fit their shape. With `group`, one
// rank's part of a tensor-parallel entry (PublishGroup, primecache/entry.h).
PublishResult PublishArrays(client::Client& c, const client::ModelId& model,
                            std::vector<std::uint32_t> tokens, py::sequence layers,
                            const EncodeOptions& options, const std::optional<PublishGroup>& group = std::nullopt);
// Fetches an entry's layers (empty: all) as a list of FetchedLayer: decoded
// float32 planes (views of the fetched bytes where a plane is one raw chunk)
// or, without decode, the chunks' bytes as uint8 views.
py::list FetchArrays(client::Client& c, std::uint64_t entry, std::vector<std::uint32_t> layers, bool decode);
// Fetches the layers keyed in `planes` ({layer: destination arrays, in stored
// order or by plane name}) and decodes them into those arrays, which must be
// writable, C-contiguous and each exactly its plane (dtype, rows, width).
// The layers' headers (Describe) and every destination are checked before
// the fetch starts, so such a refusal writes nothing; then each chunk is
// decoded from where it arrived straight into its rows, once its size and
// checksums passed. A damaged chunk raises, its rows unwritten, but earlier
// chunks' rows were written: the caller discards the destinations. Returns
// {layer: LayerHeader}.
py::dict FetchInto(client::Client& c, std::uint64_t entry, const py::dict& planes);
// Where a device fetch copies to (FetchIntoDevice): the device, the caller's
// stream (the copies are queued on it), and the device window attached to
// the client's daemon.
class CudaRuntime;
struct DeviceTarget {
  const CudaRuntime* cuda = nullptr;
  int device = 0;
  void* stream = nullptr;  // a cudaStream_t
  std::byte* window = nullptr;
  std::uint64_t window_bytes = 0;
};
struct FetchCounts {
  std::uint64_t device_chunks = 0;  // copied by the device out of the device window
  std::uint64_t host_chunks = 0;    // decoded on the host
};
// FetchInto into device memory: `planes` maps each layer to its planes'
// (device pointer, bytes), in stored order or by name, each exactly its
// plane's bytes. Raw chunks the daemon copied into the device window are
// copied on by the device; any other chunk is decoded on the host and
// copied up. Returns once every copy ran: ({layer: LayerHeader},
// {"device_chunks": n, "host_chunks": m}).
py::tuple FetchIntoDevice(client::Client& c, const DeviceTarget& device, std::uint64_t entry,
                          const py::dict& planes);
// The NumPy dtype of a plane of element type t (layers.cc, top).
py::dtype PlaneDtype(ElementType t);
// Checks an array as plane `lay` (its dtype, C order, its rows and row
// width or its flat size); ValueError naming `where` and what differs
// (layers.cc).
void CheckPlaneArray(const py::array& a, const PlaneLayout& lay, const std::string& where);

}  // namespace primecache::python

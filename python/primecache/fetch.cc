// fetch (FetchArrays, binding.h): an entry's layers fetched whole, decoded
// into arrays whose base object (FetchBuffer) keeps the fetched bytes alive,
// views of those bytes where a plane is one raw chunk.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "python/primecache/binding.h"

namespace primecache::python {

namespace {

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

void BindFetchBuffer(py::module_& m) {
  py::class_<FetchBuffer, std::shared_ptr<FetchBuffer>>(
      m, "FetchBuffer", "The bytes of one fetch: the base object of every array it returned.")
      .def_readonly("fetched_bytes", &FetchBuffer::fetched_bytes, "chunk bytes received")
      .def_readonly("copied_bytes", &FetchBuffer::copied_bytes,
                    "plane bytes decoded into memory of their own (0: every plane views the fetched bytes)");
}

void BindFetchedLayer(py::module_& m) {
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

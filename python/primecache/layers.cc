// NumPy planes to and from the daemon: publish encodes arrays with the
// codecs (LayerEncoder) and streams them; fetch decodes what comes back
// (LayerDecoder) into arrays whose base object keeps the fetched bytes alive,
// fetch_into into arrays the caller owns.
//
// A plane's element type maps to one NumPy dtype (PlaneDtype): f32 float32,
// f16 float16, and the types NumPy lacks as their bits, bf16 uint16 and
// f8e4m3 uint8 (primecache.torch views them as torch.bfloat16 and
// torch.float8_e4m3fn). An array of another dtype is refused by name.
//
// This file: the dtypes, the arrays checked as planes, publish and the
// bindings of the layers' values; fetch.cc: fetch; fetch_into.cc and
// fetch_device.cc: fetch_into to host arrays and to device memory.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <variant>

#include "python/primecache/binding.h"

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

}  // namespace

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

LayerSnapshot SnapshotFromPlanes(const py::handle& layer, std::size_t index) {
  const std::string where = "layer " + std::to_string(index);
  LayerInput in = ReadLayer(layer, index);
  if (std::holds_alternative<LinearStateShape>(in.shape)) {
    throw py::value_error(where + ": a linear-state layer does not split among TP ranks");
  }
  LayerSnapshot snap = ValueOrRaise(MakeSnapshot(in.shape));
  const LayerCodec* codec = ValueOrRaise(CodecRegistry::Default().KindFor(in.shape));
  const std::vector<std::span<float>> dst = codec->MutablePlaneData(snap);
  if (dst.size() != in.planes.size()) throw py::value_error(where + ": planes other than a snapshot's");
  for (std::size_t p = 0; p < dst.size(); ++p) {
    if (in.planes[p].type != ElementType::kF32 || in.planes[p].bytes.size() != dst[p].size_bytes()) {
      throw py::value_error(where + ": plane " + std::to_string(p) + " is not float32 values of its layer");
    }
    std::memcpy(dst[p].data(), in.planes[p].bytes.data(), dst[p].size_bytes());
  }
  return snap;
}

py::tuple PlanesFromSnapshot(const LayerSnapshot& layer) {
  const LayerShape shape = ShapeOf(layer);
  const LayerCodec* codec = ValueOrRaise(CodecRegistry::Default().KindFor(shape));
  const auto layouts = ValueOrRaise(codec->Planes(shape, CodecLimits{}));
  const std::vector<std::span<const float>> data = codec->PlaneData(layer);
  py::dict planes;
  for (std::size_t p = 0; p < layouts.size(); ++p) {
    py::array_t<float> a({static_cast<py::ssize_t>(layouts[p].rows), static_cast<py::ssize_t>(layouts[p].row_width)});
    std::memcpy(a.mutable_data(), data[p].data(), data[p].size_bytes());
    planes[py::str(std::string(PlaneName(layouts[p].id)))] = a;
  }
  return py::make_tuple(py::cast(shape), planes);
}

PublishResult PublishArrays(client::Client& c, const client::ModelId& model,
                            std::vector<std::uint32_t> tokens, py::sequence layers,
                            const EncodeOptions& options, const std::optional<PublishGroup>& group) {
  std::vector<LayerInput> inputs;
  inputs.reserve(py::len(layers));
  for (std::size_t i = 0; i < py::len(layers); ++i) inputs.push_back(ReadLayer(layers[i], i));
  return ValueOrRaise(WithoutGil([&]() -> Result<PublishResult> {
    PC_ASSIGN_OR_RETURN(auto stream,
                        c.BeginPublish(model, tokens, static_cast<std::uint32_t>(inputs.size()), group));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (Status s = StreamLayer(*stream, inputs[i], options); !s.ok()) {
        return s.WithContext("layer " + std::to_string(i));
      }
    }
    return stream->Commit();
  }));
}

void BindLayers(py::module_& m) {
  BindFetchBuffer(m);
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
  BindFetchedLayer(m);
}

}  // namespace primecache::python

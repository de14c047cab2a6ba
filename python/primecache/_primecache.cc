// primecache._primecache: the Python binding of the client library
// (include/primecache/client.h) and of the values it passes (entry.h,
// layer_shape.h, snapshot.h's ModelFingerprint). Each C++ value type is one
// Python class with the same fields; calls that talk to the daemon release
// the GIL; a non-OK Status becomes a primecache.Error (docs/python.md).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <string>

#include "primecache/internal/snapshot.h"
#include "python/primecache/binding.h"

namespace primecache::python {
namespace {

// The exception classes, created once at import and kept for the process
// (never released: they outlive any interpreter teardown ordering).
struct ErrorClasses {
  py::handle base, not_found, invalid_argument, unavailable, deadline_exceeded;
};
ErrorClasses& Errors() {
  static ErrorClasses classes;
  return classes;
}

py::handle NewError(py::module_& m, const char* name, py::handle bases, const char* doc,
                    const py::dict& attrs) {
  const std::string qualified = "primecache." + std::string(name);
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), attrs.ptr());
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(cls));
  return cls;
}

}  // namespace

void BindErrors(py::module_& m) {
  ErrorClasses& e = Errors();
  py::dict attrs;
  // str(e) is the message even where a builtin base (KeyError) would quote it.
  attrs["__str__"] = py::module_::import("builtins").attr("BaseException").attr("__str__");
  e.base = NewError(m, "Error", PyExc_Exception,
                    "A primecache call failed: .code names the status code, .message says why.", attrs);
  auto sub = [&](const char* name, PyObject* builtin, const char* doc) {
    const py::tuple bases = py::make_tuple(e.base, py::handle(builtin));
    return NewError(m, name, bases, doc, py::dict());
  };
  e.not_found = sub("NotFoundError", PyExc_KeyError, "No such entry (status 'not found').");
  e.invalid_argument = sub("InvalidArgumentError", PyExc_ValueError, "A request refused as invalid.");
  e.unavailable = sub("UnavailableError", PyExc_ConnectionError, "No daemon, or the connection dropped.");
  e.deadline_exceeded =
      sub("DeadlineExceededError", PyExc_TimeoutError, "No reply within the client's timeout.");
}

void Raise(const Status& s) {
  const ErrorClasses& e = Errors();
  py::handle cls = e.base;
  switch (s.code()) {
    case StatusCode::kNotFound:
      cls = e.not_found;
      break;
    case StatusCode::kInvalidArgument:
      cls = e.invalid_argument;
      break;
    case StatusCode::kUnavailable:
      cls = e.unavailable;
      break;
    case StatusCode::kDeadlineExceeded:
      cls = e.deadline_exceeded;
      break;
    default:
      break;
  }
  py::object exc = cls(s.message());
  exc.attr("code") = std::string(StatusCodeName(s.code()));
  exc.attr("message") = s.message();
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

std::vector<std::uint32_t> TokensFrom(py::handle tokens) {
  auto arr = py::reinterpret_borrow<py::array>(py::module_::import("numpy").attr("asarray")(tokens));
  if (arr.ndim() != 1) throw py::value_error("tokens: want a 1-D sequence of integers");
  if (arr.size() == 0) return {};
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw py::value_error("tokens: dtype " + std::string(py::str(arr.dtype())) + ", want integers");
  }
  if ((kind == 'i' && arr.attr("min")().cast<std::int64_t>() < 0) ||
      arr.attr("max")().cast<std::uint64_t>() > std::numeric_limits<std::uint32_t>::max()) {
    throw py::value_error("tokens: ids must lie in [0, 2**32)");
  }
  auto ids = py::array_t<std::uint32_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  return {ids.data(), ids.data() + ids.size()};
}

namespace {

// Value equality (the C++ operator==) as __eq__.
template <typename T>
bool Equal(const T& a, const T& b) {
  return a == b;
}

std::chrono::milliseconds Millis(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e9) {
    throw py::value_error("a duration in seconds in [0, 1e9]");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}
double Seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

void BindShapes(py::module_& m) {
  py::enum_<ElementType>(m, "ElementType", "The type of one value of a plane (layer_shape.h).")
      .value("f32", ElementType::kF32)
      .value("bf16", ElementType::kBf16)
      .value("f16", ElementType::kF16)
      .value("f8e4m3", ElementType::kF8E4M3);
  m.def("element_bytes", &ElementBytes, py::arg("type"), "Bytes of one value of this type.");
  m.def("plane_dtype", &PlaneDtype, py::arg("type"),
        "The NumPy dtype planes of this type are given and returned as (bf16 as uint16, f8e4m3 as uint8).");
  py::class_<LatentShape> latent(m, "LatentShape",
                                 "An MLA layer's latent rows and DSA index state (layer_shape.h).");
  latent.def_readwrite("len", &LatentShape::len)
      .def_readwrite("width", &LatentShape::width)
      .def_readwrite("index_width", &LatentShape::index_width)
      .def_readwrite("pool", &LatentShape::pool)
      .def_readwrite("pools_ready", &LatentShape::pools_ready)
      .def_readwrite("index_is_ring", &LatentShape::index_is_ring)
      .def_readwrite("index_ring_rows", &LatentShape::index_ring_rows)
      .def_readwrite("dtype", &LatentShape::dtype)
      .def_readwrite("index_dtype", &LatentShape::index_dtype)
      .def("tail_rows", &LatentShape::tail_rows)
      .def("__eq__", Equal<LatentShape>, py::is_operator());
  KeywordInit(latent);
  FieldRepr(latent,
            {"len", "width", "index_width", "pool", "pools_ready", "index_is_ring", "index_ring_rows", "dtype",
             "index_dtype"});
  py::class_<RecurrentShape> recurrent(m, "RecurrentShape", "A KDA layer's conv ring and recurrent state.");
  recurrent.def_readwrite("heads", &RecurrentShape::heads)
      .def_readwrite("head_dim", &RecurrentShape::head_dim)
      .def_readwrite("kernel", &RecurrentShape::kernel)
      .def_readwrite("conv_dtype", &RecurrentShape::conv_dtype)
      .def_readwrite("state_dtype", &RecurrentShape::state_dtype)
      .def("__eq__", Equal<RecurrentShape>, py::is_operator());
  KeywordInit(recurrent);
  FieldRepr(recurrent, {"heads", "head_dim", "kernel", "conv_dtype", "state_dtype"});
  py::class_<KvFormat> format(m, "KvFormat", "How an attention layer stores its K and V rows.");
  format.def_readwrite("window", &KvFormat::window)
      .def_readwrite("quant_bits", &KvFormat::quant_bits)
      .def_readwrite("head_dim", &KvFormat::head_dim)
      .def_readwrite("signs_digest", &KvFormat::signs_digest)
      .def_readwrite("index_width", &KvFormat::index_width)
      .def("__eq__", Equal<KvFormat>, py::is_operator());
  KeywordInit(format);
  FieldRepr(format, {"window", "quant_bits", "head_dim", "signs_digest", "index_width"});
  py::class_<KvShape> kv(m, "KvShape", "An attention layer's K and V rows.");
  kv.def_readwrite("len", &KvShape::len)
      .def_readwrite("k_width", &KvShape::k_width)
      .def_readwrite("v_width", &KvShape::v_width)
      .def_readwrite("format", &KvShape::format)
      .def_readwrite("rows", &KvShape::rows)
      .def_readwrite("dtype", &KvShape::dtype)
      .def_readwrite("index_dtype", &KvShape::index_dtype)
      .def("held_rows", &KvShape::held_rows)
      .def("__eq__", Equal<KvShape>, py::is_operator());
  KeywordInit(kv);
  FieldRepr(kv, {"len", "k_width", "v_width", "format", "rows", "dtype", "index_dtype"});
  py::class_<LinearStateShape> linear(m, "LinearStateShape",
                                      "A linear-attention layer's conv and recurrent state as PyTorch engines keep "
                                      "it (layer_shape.h; kind linear-state/v1).");
  linear.def_readwrite("conv_channels", &LinearStateShape::conv_channels)
      .def_readwrite("conv_width", &LinearStateShape::conv_width)
      .def_readwrite("state_heads", &LinearStateShape::state_heads)
      .def_readwrite("state_k_dim", &LinearStateShape::state_k_dim)
      .def_readwrite("state_v_dim", &LinearStateShape::state_v_dim)
      .def_readwrite("conv_dtype", &LinearStateShape::conv_dtype)
      .def_readwrite("state_dtype", &LinearStateShape::state_dtype)
      .def("__eq__", Equal<LinearStateShape>, py::is_operator());
  KeywordInit(linear);
  FieldRepr(linear, {"conv_channels", "conv_width", "state_heads", "state_k_dim", "state_v_dim", "conv_dtype",
                     "state_dtype"});
}

py::bytes Bytes(const std::string& s) {
  return {s.data(), s.size()};
}

void BindModel(py::module_& m) {
  py::class_<Hash128> hash(m, "Hash128", "A 128-bit digest (checksum.h).");
  hash.def_readwrite("lo", &Hash128::lo)
      .def_readwrite("hi", &Hash128::hi)
      .def("__eq__", Equal<Hash128>, py::is_operator());
  KeywordInit(hash);
  FieldRepr(hash, {"lo", "hi"});
  py::class_<ModelFingerprint> fp(m, "ModelFingerprint", "Which model produced a snapshot (snapshot.h).");
  fp.def_readwrite("architecture", &ModelFingerprint::architecture)
      .def_readwrite("plan_digest", &ModelFingerprint::plan_digest)
      .def_readwrite("weights_digest", &ModelFingerprint::weights_digest)
      .def_readwrite("codec_versions", &ModelFingerprint::codec_versions)
      .def("digest", &ModelFingerprint::Digest)
      .def("encode", [](const ModelFingerprint& f) { return Bytes(EncodeFingerprint(f)); });
  KeywordInit(fp);
  FieldRepr(fp, {"architecture", "plan_digest", "weights_digest", "codec_versions"});
  py::class_<ModelCost> cost(m, "ModelCost",
                             "What a prefill of the model costs, for the daemon's eviction policies (entry.h).");
  cost.def_readwrite("flops_per_token", &ModelCost::flops_per_token)
      .def_readwrite("attention_layers", &ModelCost::attention_layers)
      .def_readwrite("attention_flops_per_pair", &ModelCost::attention_flops_per_pair)
      .def("__eq__", Equal<ModelCost>, py::is_operator());
  KeywordInit(cost);
  FieldRepr(cost, {"flops_per_token", "attention_layers", "attention_flops_per_pair"});
  py::class_<client::ModelId> id(m, "ModelId", "The model a lookup or publish is for (client.h).");
  id.def_readwrite("digest", &client::ModelId::digest)
      .def_readwrite("name", &client::ModelId::name)
      .def_readwrite("cost", &client::ModelId::cost)
      .def_property(
          "descriptor", [](const client::ModelId& x) { return Bytes(x.descriptor); },
          [](client::ModelId& x, const py::bytes& b) { x.descriptor = b; })
      .def_static(
          "from_fingerprint",
          [](const ModelFingerprint& f, const std::string& name) {
            return client::ModelId{f.Digest(), name.empty() ? f.architecture : name, EncodeFingerprint(f), {}};
          },
          py::arg("fingerprint"), py::arg("name") = "");
  KeywordInit(id);
  FieldRepr(id, {"name", "digest"});
  m.def(
      "codec_identities", [] { return CodecRegistry::Default().Identities(); },
      "Every built-in kind and transform identity.");
  m.def(
      "codec_versions",
      [](const std::vector<LayerShape>& shapes) {
        std::vector<LayerGeometry> plan;
        for (const LayerShape& s : shapes) plan.push_back(PlanGeometryOf(s));
        return CodecVersionsOf(plan);
      },
      py::arg("shapes"),
      "The storage kinds a model whose layers have these shapes is stored as, sorted: a fingerprint's "
      "codec_versions.");
  m.def(
      "plan_digest", [](const std::vector<LayerShape>& shapes) { return PlanDigest(shapes); }, py::arg("shapes"),
      "The plan digest of a model whose layers have these shapes, in layer order: a fingerprint's plan_digest "
      "(the daemon refuses a publish whose layers are not its fingerprint's plan).");
}

void BindOptions(py::module_& m) {
  using client::ClientOptions;
  py::class_<ClientOptions> o(m, "ClientOptions",
                              "How to reach the daemon (client.h); durations in seconds.");
  o.def_readwrite("endpoint", &ClientOptions::endpoint)
      .def_readwrite("client_name", &ClientOptions::client_name)
      .def_readwrite("ns", &ClientOptions::ns)
      .def_property(
          "timeout", [](const ClientOptions& x) { return Seconds(x.timeout); },
          [](ClientOptions& x, double s) { x.timeout = Millis(s); })
      .def_property(
          "connect_timeout", [](const ClientOptions& x) { return Seconds(x.connect_timeout); },
          [](ClientOptions& x, double s) { x.connect_timeout = Millis(s); })
      .def_readwrite("reconnect_attempts", &ClientOptions::reconnect_attempts)
      .def_property(
          "reconnect_backoff", [](const ClientOptions& x) { return Seconds(x.reconnect_backoff); },
          [](ClientOptions& x, double s) { x.reconnect_backoff = Millis(s); })
      .def_readwrite("shared_memory", &ClientOptions::shared_memory)
      .def_readwrite("shared_memory_bytes", &ClientOptions::shared_memory_bytes)
      .def_readwrite("tp_rank", &ClientOptions::tp_rank);
  KeywordInit(o);
  FieldRepr(o, {"endpoint", "client_name", "ns", "timeout", "shared_memory"});
  py::class_<client::ServerInfo> info(m, "ServerInfo");
  info.def_readonly("version", &client::ServerInfo::version)
      .def_readonly("server", &client::ServerInfo::server)
      .def_readonly("max_message_bytes", &client::ServerInfo::max_message_bytes)
      .def_readonly("max_chunk_bytes", &client::ServerInfo::max_chunk_bytes)
      .def_readonly("max_publishes_in_flight", &client::ServerInfo::max_publishes_in_flight)
      .def_readonly("admin", &client::ServerInfo::admin)
      .def_readonly("device_copies", &client::ServerInfo::device_copies);
  FieldRepr(info, {"version", "server", "admin"});
}

}  // namespace
}  // namespace primecache::python

PYBIND11_MODULE(_primecache, m) {
  namespace pp = primecache::python;
  m.doc() = "The primecache client: lookups, publishes and fetches of cache-state snapshots as NumPy arrays.";
  pp::BindErrors(m);
  pp::BindShapes(m);
  pp::BindModel(m);
  pp::BindOptions(m);
  pp::BindEntries(m);
  pp::BindStats(m);
  pp::BindLayers(m);
  pp::BindTp(m);
  pp::BindClient(m);
}

// The entry and stats values (primecache/entry.h) and the Client class of
// the Python binding. Every call into the daemon runs without the GIL.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <tuple>
#include <string>

#include "python/primecache/binding.h"
#include "python/primecache/cuda_runtime.h"

namespace primecache::python {

void BindEntries(py::module_& m) {
  py::enum_<EntryState>(m, "EntryState")
      .value("LIVE", EntryState::kLive)
      .value("QUARANTINED", EntryState::kQuarantined);
  py::class_<LookupHit> hit(m, "LookupHit", "The longest stored boundary that prefixes a query.");
  hit.def_readonly("id", &LookupHit::id)
      .def_readonly("length", &LookupHit::length)
      .def_readonly("layers", &LookupHit::layers)
      .def_readonly("ranks", &LookupHit::ranks)
      .def_readonly("chunk_bytes", &LookupHit::chunk_bytes)
      .def_readonly("raw_bytes", &LookupHit::raw_bytes);
  FieldRepr(hit, {"id", "length", "layers", "ranks", "chunk_bytes", "raw_bytes"});
  py::class_<PublishResult> pub(m, "PublishResult", "What a publish did.");
  pub.def_readonly("id", &PublishResult::id)
      .def_readonly("existed", &PublishResult::existed)
      .def_readonly("new_chunk_bytes", &PublishResult::new_chunk_bytes)
      .def_readonly("shared_chunk_bytes", &PublishResult::shared_chunk_bytes)
      .def_readonly("evicted", &PublishResult::evicted)
      .def_readonly("group_pending", &PublishResult::group_pending);
  FieldRepr(pub, {"id", "existed", "new_chunk_bytes", "shared_chunk_bytes", "evicted", "group_pending"});
  py::class_<EntryInfo> info(m, "EntryInfo", "One stored entry.");
  info.def_readonly("id", &EntryInfo::id)
      .def_readonly("state", &EntryInfo::state)
      .def_readonly("model", &EntryInfo::model)
      .def_readonly("model_name", &EntryInfo::model_name)
      .def_property_readonly("model_descriptor",
                             [](const EntryInfo& e) { return py::bytes(e.model_descriptor); })
      .def_readonly("ns", &EntryInfo::ns)
      .def_readonly("length", &EntryInfo::length)
      .def_readonly("tokens", &EntryInfo::tokens)
      .def_readonly("layers", &EntryInfo::layers)
      .def_readonly("ranks", &EntryInfo::ranks)
      .def_readonly("chunk_bytes", &EntryInfo::chunk_bytes)
      .def_readonly("raw_bytes", &EntryInfo::raw_bytes)
      .def_readonly("meta_bytes", &EntryInfo::meta_bytes)
      .def_readonly("flops", &EntryInfo::flops)
      .def_readonly("created_unix_ms", &EntryInfo::created_unix_ms)
      .def_readonly("last_access", &EntryInfo::last_access)
      .def_readonly("hits", &EntryInfo::hits)
      .def_readonly("reason", &EntryInfo::reason)
      .def_property_readonly("quarantined", &EntryInfo::quarantined);
  FieldRepr(info, {"id", "model_name", "ns", "length", "layers", "chunk_bytes", "hits"});
  py::class_<EntryDetail> detail(m, "EntryDetail",
                                 "An entry and, when asked for, its layers' serialized headers.");
  detail.def_readonly("info", &EntryDetail::info)
      .def_property_readonly("layer_headers", [](const EntryDetail& d) {
        py::list out;
        for (const std::string& h : d.layer_headers) out.append(py::bytes(h));
        return out;
      });
  py::class_<ListPage>(m, "ListPage")
      .def_readonly("entries", &ListPage::entries)
      .def_readonly("next_page_token", &ListPage::next_page_token);
  py::class_<client::EntryCheckReport> verify(m, "EntryCheckReport");
  verify.def_readonly("ok", &client::EntryCheckReport::ok)
      .def_readonly("message", &client::EntryCheckReport::message)
      .def_readonly("layers", &client::EntryCheckReport::layers)
      .def_readonly("bytes", &client::EntryCheckReport::bytes);
  FieldRepr(verify, {"ok", "message", "layers", "bytes"});
}

void BindStats(py::module_& m) {
  py::class_<StoreStats> store(m, "StoreStats");
  store.def_readonly("entries", &StoreStats::entries)
      .def_readonly("quarantined", &StoreStats::quarantined)
      .def_readonly("chunks", &StoreStats::chunks)
      .def_readonly("stored_bytes", &StoreStats::stored_bytes)
      .def_readonly("logical_bytes", &StoreStats::logical_bytes)
      .def_readonly("raw_bytes", &StoreStats::raw_bytes)
      .def_readonly("dedup_saved_bytes", &StoreStats::dedup_saved_bytes)
      .def_readonly("hits", &StoreStats::hits)
      .def_readonly("misses", &StoreStats::misses)
      .def_readonly("evictions", &StoreStats::evictions)
      .def_readonly("admission_refusals", &StoreStats::admission_refusals)
      .def_readonly("active_leases", &StoreStats::active_leases)
      .def_readonly("byte_budget", &StoreStats::byte_budget)
      .def_readonly("disk_bytes", &StoreStats::disk_bytes)
      .def_readonly("staged_bytes", &StoreStats::staged_bytes)
      .def_readonly("block_cache_used_bytes", &StoreStats::block_cache_used_bytes)
      .def_readonly("block_cache_capacity_bytes", &StoreStats::block_cache_capacity_bytes)
      .def_readonly("memtable_bytes", &StoreStats::memtable_bytes)
      .def_readonly("table_reader_bytes", &StoreStats::table_reader_bytes)
      .def_readonly("write_error", &StoreStats::write_error);
  FieldRepr(store, {"entries", "chunks", "stored_bytes", "hits", "misses", "evictions"});
  py::class_<RemoteStats> remote(m, "RemoteStats", "The daemon's remote tier (docs/cluster.md).");
  remote.def_readonly("hits", &RemoteStats::hits)
      .def_readonly("misses", &RemoteStats::misses)
      .def_readonly("errors", &RemoteStats::errors)
      .def_readonly("misses_cached", &RemoteStats::misses_cached)
      .def_readonly("fetched_bytes", &RemoteStats::fetched_bytes)
      .def_readonly("queued", &RemoteStats::queued)
      .def_readonly("put", &RemoteStats::put)
      .def_readonly("dropped", &RemoteStats::dropped)
      .def_readonly("put_bytes", &RemoteStats::put_bytes)
      .def_readonly("queue_depth", &RemoteStats::queue_depth)
      .def_readonly("evicted", &RemoteStats::evicted)
      .def_readonly("damaged", &RemoteStats::damaged)
      .def_readonly("refused", &RemoteStats::refused)
      .def_readonly("breaker_open", &RemoteStats::breaker_open)
      .def_readonly("breaker_opens", &RemoteStats::breaker_opens)
      .def_readonly("fast_failures", &RemoteStats::fast_failures)
      .def_readonly("moved", &RemoteStats::moved)
      .def_readonly("asked", &RemoteStats::asked);
  py::class_<DaemonStats> daemon(m, "DaemonStats");
  daemon.def_readonly("store", &DaemonStats::store)
      .def_readonly("connections", &DaemonStats::connections)
      .def_readonly("publishes_in_flight", &DaemonStats::publishes_in_flight)
      .def_readonly("uncommitted_bytes", &DaemonStats::uncommitted_bytes)
      .def_readonly("fetch_window_waits", &DaemonStats::fetch_window_waits)
      .def_readonly("rss_bytes", &DaemonStats::rss_bytes)
      .def_readonly("heap_in_use_bytes", &DaemonStats::heap_in_use_bytes)
      .def_readonly("heap_free_bytes", &DaemonStats::heap_free_bytes)
      .def_readonly("remote", &DaemonStats::remote);
  FieldRepr(daemon, {"store", "connections", "publishes_in_flight"});
}

namespace {

// A connection to the daemon. close() drops it; a call running on another
// thread keeps its own reference until it returns. The GIL guards client_.
// A device window: one whole device allocation (an IPC handle names one)
// that the daemon copies raw chunks into; freed after the connection that
// named it is gone.
class DeviceWindow {
 public:
  DeviceWindow(const CudaRuntime* cuda, int device, std::byte* base, std::uint64_t bytes)
      : cuda_(cuda), device_(device), base_(base), bytes_(bytes) {}
  ~DeviceWindow() {
    if (cuda_->SetDevice(device_).ok()) (void)cuda_->Free(base_);
  }
  DeviceWindow(const DeviceWindow&) = delete;
  DeviceWindow& operator=(const DeviceWindow&) = delete;
  int device() const { return device_; }
  std::byte* base() const { return base_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  const CudaRuntime* cuda_;
  int device_;
  std::byte* base_;
  std::uint64_t bytes_;
};

// Allocates a window on `device`, exports it and attaches it to the client's
// daemon; the Status says why not.
Result<std::unique_ptr<DeviceWindow>> AttachWindow(client::Client& c, int device, std::uint64_t bytes) {
  std::string why;
  const CudaRuntime* cuda = CudaRuntime::Get(&why);
  if (cuda == nullptr) return Status::NotSupported(why);
  if (!c.server_info().device_copies) return Status::NotSupported("the daemon makes no device copies");
  PC_RETURN_IF_ERROR(cuda->SetDevice(device));
  void* base = nullptr;
  PC_RETURN_IF_ERROR(cuda->Malloc(bytes, &base));
  auto window = std::make_unique<DeviceWindow>(cuda, device, static_cast<std::byte*>(base), bytes);
  client::DeviceWindowSpec spec;
  spec.size = bytes;
  PC_RETURN_IF_ERROR(cuda->PciBusId(device, &spec.pci_bus_id));
  PC_RETURN_IF_ERROR(cuda->IpcHandle(base, &spec.handle));
  PC_RETURN_IF_ERROR(c.AttachDeviceWindow(spec));
  return window;
}

class PyClient {
 public:
  explicit PyClient(std::unique_ptr<client::Client> c) : client_(std::move(c)) {}

  // The client's device window on `device`, attached now if it has none
  // there (replacing one on another device). Raises why not.
  const DeviceWindow& WindowOn(int device, std::uint64_t bytes) {
    auto c = Get();
    if (window_ && window_->device() == device) return *window_;
    std::unique_ptr<DeviceWindow> w = ValueOrRaise(WithoutGil([&] { return AttachWindow(*c, device, bytes); }));
    window_ = std::move(w);  // the old one is no longer named by the daemon
    return *window_;
  }

  static std::shared_ptr<PyClient> Connect(client::ClientOptions options) {
    auto c = ValueOrRaise(WithoutGil([&] { return client::Client::Connect(std::move(options)); }));
    return std::make_shared<PyClient>(std::move(c));
  }
  std::shared_ptr<client::Client> Get() const {
    if (!client_) Raise(Status::FailedPrecondition("the client is closed"));
    return client_;
  }
  void Close() {
    client_.reset();
    window_.reset();
  }

 private:
  std::unique_ptr<DeviceWindow> window_;    // destroyed after client_: the connection goes first
  std::shared_ptr<client::Client> client_;
};

EncodeOptions EncodeOptionsFrom(const std::optional<std::string>& transform, std::int32_t level,
                                std::uint64_t chunk_bytes) {
  if (chunk_bytes == 0) throw py::value_error("chunk_bytes must be positive");
  EncodeOptions o;
  if (transform) o.all_planes = TransformSpec{*transform, level};
  o.target_chunk_bytes = chunk_bytes;
  return o;
}

void BindCalls(py::class_<PyClient, std::shared_ptr<PyClient>>& cls) {
  cls.def(
         "lookup",
         [](const PyClient& self, const client::ModelId& model, const py::object& tokens,
            bool shared) -> py::object {
           auto c = self.Get();
           const auto ids = TokensFrom(tokens);
           std::uint64_t shared_tokens = 0;
           auto hit = ValueOrRaise(WithoutGil([&] { return c->Lookup(model, ids, shared ? &shared_tokens : nullptr); }));
           if (!shared) return py::cast(hit);
           return py::make_tuple(hit, shared_tokens);
         },
         py::arg("model"), py::arg("tokens"), py::kw_only(), py::arg("shared") = false)
      .def(
          "publish",
          [](const PyClient& self, const client::ModelId& model, const py::object& tokens,
             const py::sequence& layers, const std::optional<std::string>& transform, std::int32_t level,
             std::uint64_t chunk_bytes, const std::optional<std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>>& group) {
            std::optional<PublishGroup> g;
            if (group) g = PublishGroup{std::get<0>(*group), std::get<1>(*group), std::get<2>(*group)};
            return PublishArrays(*self.Get(), model, TokensFrom(tokens), layers,
                                 EncodeOptionsFrom(transform, level, chunk_bytes), g);
          },
          py::arg("model"), py::arg("tokens"), py::arg("layers"), py::kw_only(),
          py::arg("transform") = py::none(), py::arg("level") = 0,
          py::arg("chunk_bytes") = kDefaultChunkBytes, py::arg("group") = py::none())
      .def(
          "fetch",
          [](const PyClient& self, std::uint64_t entry,
             const std::optional<std::vector<std::uint32_t>>& layers, bool decode) {
            return FetchArrays(*self.Get(), entry, layers.value_or(std::vector<std::uint32_t>{}), decode);
          },
          py::arg("entry"), py::arg("layers") = py::none(), py::kw_only(), py::arg("decode") = true)
      .def(
          "fetch_into",
          [](const PyClient& self, std::uint64_t entry, const py::dict& planes) {
            return FetchInto(*self.Get(), entry, planes);
          },
          py::arg("entry"), py::arg("planes"))
      .def(
          "attach_device_window",
          [](PyClient& self, int device, std::uint64_t bytes) -> std::optional<std::string> {
            try {
              (void)self.WindowOn(device, bytes);
              return std::nullopt;
            } catch (const py::error_already_set& e) {
              return std::string(py::str(e.value()));
            }
          },
          py::arg("device"), py::arg("bytes") = std::uint64_t{256} << 20,
          "Gives the daemon a device window on CUDA device `device` to copy raw chunks into (once per "
          "connection and device). None when attached, else why not (no CUDA runtime, a daemon without device "
          "copies, a TCP connection).")
      .def(
          "fetch_into_device",
          [](PyClient& self, std::uint64_t entry, const py::dict& planes, int device, std::uintptr_t stream,
             std::uint64_t window_bytes) {
            const DeviceWindow& w = self.WindowOn(device, window_bytes);
            DeviceTarget target{CudaRuntime::Get(), device, reinterpret_cast<void*>(stream), w.base(), w.bytes()};
            return FetchIntoDevice(*self.Get(), target, entry, planes);
          },
          py::arg("entry"), py::arg("planes"), py::kw_only(), py::arg("device"), py::arg("stream") = 0,
          py::arg("window_bytes") = std::uint64_t{256} << 20)
      .def(
          "describe",
          [](const PyClient& self, std::uint64_t entry, bool layer_headers) {
            auto c = self.Get();
            return ValueOrRaise(WithoutGil([&] { return c->Describe(entry, client::DescribeOptions{std::nullopt, layer_headers}); }));
          },
          py::arg("entry"), py::arg("layer_headers") = false)
      .def("stats", [](const PyClient& self) {
        auto c = self.Get();
        return ValueOrRaise(WithoutGil([&] { return c->Stat(); }));
      });
}

void BindMore(py::class_<PyClient, std::shared_ptr<PyClient>>& cls) {
  cls.def(
         "list",
         [](const PyClient& self, const std::optional<Hash128>& model, std::uint32_t page_size,
            const std::string& page_token, bool omit_tokens) {
           auto c = self.Get();
           client::ListOptions o;
           o.model = model;
           o.limit = page_size;
           o.page_token = page_token;
           o.omit_tokens = omit_tokens;
           return ValueOrRaise(WithoutGil([&] { return c->List(o); }));
         },
         py::arg("model") = py::none(), py::arg("page_size") = 100, py::arg("page_token") = "",
         py::arg("omit_tokens") = false)
      .def(
          "check_entry",
          [](const PyClient& self, std::uint64_t entry) {
            auto c = self.Get();
            return ValueOrRaise(WithoutGil([&] { return c->CheckEntry(entry); }));
          },
          py::arg("entry"))
      .def_property_readonly("server_info", [](const PyClient& self) { return self.Get()->server_info(); })
      .def_property_readonly("connected", [](const PyClient& self) { return self.Get()->connected(); })
      .def("close", &PyClient::Close)
      .def("__enter__", [](const py::object& self) { return self; })
      .def("__exit__", [](PyClient& self, const py::args&) { self.Close(); });
}

}  // namespace

void BindClient(py::module_& m) {
  py::class_<PyClient, std::shared_ptr<PyClient>> cls(m, "Client", "A connection to primecached (client.h).");
  cls.def_static("connect", &PyClient::Connect, py::arg("options"));
  m.def(
      "cuda_runtime_available",
      [] {
        std::string why;
        return CudaRuntime::Get(&why) != nullptr;
      },
      "Whether this process has a CUDA runtime the binding can copy with (Client.fetch_into_device).");
  BindCalls(cls);
  BindMore(cls);
}

}  // namespace primecache::python

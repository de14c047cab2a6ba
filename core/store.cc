// The parts of the store interface (primecache/internal/store.h) that are the same for
// every store: the publisher's and the sink's defaults, leases, the helpers
// built on the operations, and StoreWrapper's forwarding.
#include "primecache/internal/store.h"

#include <utility>

namespace primecache {

Status Publisher::AddLayer(const LayerBytes& layer) {
  PC_RETURN_IF_ERROR(BeginLayer(layer.header, static_cast<std::uint32_t>(layer.chunks.size())));
  for (const std::string& chunk : layer.chunks) PC_RETURN_IF_ERROR(AddChunk(std::string_view(chunk)));
  return EndLayer();
}

// ---- leases ---------------------------------------------------------------------------------

Lease::~Lease() {
  Release();
}
Lease::Lease(Lease&& other) noexcept : table_(std::move(other.table_)), id_(other.id_) {
  other.table_.reset();
}
Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::move(other.table_);
    id_ = other.id_;
    other.table_.reset();
  }
  return *this;
}
void Lease::Release() {
  if (table_ != nullptr) table_->Release(id_);
  table_.reset();
}

// ---- FetchSink defaults ----------------------------------------------------------------------

Result<std::optional<std::span<std::byte>>> FetchSink::ChunkBuffer(std::uint32_t layer, std::uint32_t chunk,
                                                                   std::uint64_t size, bool may_wait) {
  (void)layer, (void)chunk, (void)size, (void)may_wait;
  return std::optional<std::span<std::byte>>(std::span<std::byte>());
}
Status FetchSink::OnMappedChunk(std::uint32_t layer, std::uint32_t chunk, std::span<const std::byte> bytes,
                                const MappedRegion& mapping) {
  (void)mapping;
  return OnChunk(layer, chunk, bytes);
}
Result<MappingPin> FetchSink::Pin(const MappedRegion& mapping) {
  (void)mapping;
  return MappingPin{};
}

// ---- helpers over the operations -------------------------------------------------------------

Result<PublishResult> Store::Publish(PublishRequest request, std::span<const LayerBytes> layers) {
  PC_ASSIGN_OR_RETURN(PublishStart start, BeginPublish(std::move(request)));
  if (start.existing) return PublishResult{*start.existing, true, 0, 0, 0};
  for (const auto& layer : layers) PC_RETURN_IF_ERROR(start.publisher->AddLayer(layer));
  return start.publisher->Commit();
}

namespace {

// Counts what a fetch hands out (CheckEntry).
class CountingSink final : public FetchSink {
 public:
  Status OnLayer(std::uint32_t, std::string_view header, std::uint32_t) override {
    ++layers;
    bytes += header.size();
    return Status::Ok();
  }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
    bytes += b.size();
    return Status::Ok();
  }
  std::uint32_t layers = 0;
  std::uint64_t bytes = 0;
};

}  // namespace

Result<EntryCheckReport> Store::CheckEntry(EntryId id, const FetchOptions& options) {
  CountingSink counted;
  const Status s = Fetch(id, {}, counted, options);
  // A failed check is the report's answer; anything else (no such entry, an
  // I/O error) is the call's.
  if (!s.ok() && !s.IsCorruption()) return s;
  EntryCheckReport report;
  report.ok = s.ok();
  report.message = s.ok() ? "" : s.ToString();
  report.layers = counted.layers;
  report.bytes = counted.bytes;
  return report;
}

Result<std::vector<LayerBytes>> Store::FetchAll(EntryId id, const FetchOptions& options) {
  class Collect final : public FetchSink {
   public:
    std::vector<LayerBytes> layers;
    Status OnLayer(std::uint32_t, std::string_view header, std::uint32_t chunks) override {
      layers.push_back({std::string(header), {}});
      layers.back().chunks.reserve(chunks);
      return Status::Ok();
    }
    Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> bytes) override {
      layers.back().chunks.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      return Status::Ok();
    }
  } sink;
  PC_RETURN_IF_ERROR(Fetch(id, {}, sink, options));
  return std::move(sink.layers);
}

// ---- StoreWrapper ----------------------------------------------------------------------------

Result<PublishStart> StoreWrapper::BeginPublish(PublishRequest request) {
  return target_->BeginPublish(std::move(request));
}
Result<std::optional<LookupHit>> StoreWrapper::Lookup(const Hash128& model, std::string_view ns,
                                                      std::span<const std::uint32_t> tokens,
                                                      const LookupOptions& options) {
  return target_->Lookup(model, ns, tokens, options);
}
Result<EntryDetail> StoreWrapper::Describe(EntryId id, const DescribeOptions& options) {
  return target_->Describe(id, options);
}
Status StoreWrapper::Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
                           const FetchOptions& options) {
  return target_->Fetch(id, layers, sink, options);
}
Status StoreWrapper::Delete(EntryId id) {
  return target_->Delete(id);
}
Result<ListPage> StoreWrapper::List(const ListOptions& options) {
  return target_->List(options);
}
Result<StoreStats> StoreWrapper::Stat() {
  return target_->Stat();
}
Status StoreWrapper::SetByteBudget(std::uint64_t bytes) {
  return target_->SetByteBudget(bytes);
}
Result<StoreCheckReport> StoreWrapper::CheckStore(const CheckStoreOptions& options) {
  return target_->CheckStore(options);
}
Status StoreWrapper::Compact() {
  return target_->Compact();
}

}  // namespace primecache

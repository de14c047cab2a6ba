#include "ipc/memory_backend.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

namespace primecache::ipc {

namespace {

struct Layer {
  std::string header;
  std::vector<std::string> chunks;
};

struct Entry {
  EntrySummary summary;
  std::vector<Layer> layers;
};

class MemoryBackend;

class MemorySink : public PublishSink {
 public:
  MemorySink(MemoryBackend* b, BoundaryKey key, std::uint32_t layers) : b_(b) {
    e_.summary.boundary = std::move(key);
    e_.summary.layer_count = layers;
  }
  Status BeginLayer(std::uint32_t, std::span<const std::byte> header, std::uint32_t) override {
    e_.layers.push_back({std::string(reinterpret_cast<const char*>(header.data()), header.size()), {}});
    return Status::Ok();
  }
  Status AddChunk(std::span<const std::byte> bytes) override {
    if (e_.layers.empty()) return Status::FailedPrecondition("chunk before a layer");
    e_.layers.back().chunks.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    e_.summary.bytes += bytes.size();
    return Status::Ok();
  }
  Result<Committed> Commit() override;
  void Abort() override {}

 private:
  MemoryBackend* b_;
  Entry e_;
};

class MemoryBackend : public StoreBackend {
 public:
  Result<std::unique_ptr<PublishSink>> BeginPublish(const BoundaryKey& boundary, std::uint32_t layer_count) override {
    return std::unique_ptr<PublishSink>(new MemorySink(this, boundary, layer_count));
  }
  Result<std::optional<LookupHit>> Lookup(const Hash128& digest, const std::string& ns,
                                          std::span<const std::uint32_t> tokens) override {
    std::lock_guard<std::mutex> l(mu_);
    std::optional<LookupHit> best;
    for (auto& [id, e] : entries_) {
      const auto& b = e.summary.boundary;
      if (!(b.digest == digest) || b.ns != ns || b.tokens.size() > tokens.size()) continue;
      if (!std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin())) continue;
      if (!best || best->length < b.tokens.size()) {
        best = LookupHit{id, static_cast<std::uint32_t>(b.tokens.size()), e.summary.layer_count, e.summary.bytes};
      }
    }
    if (best) {
      ++stats_.hits;
    } else {
      ++stats_.misses;
    }
    return best;
  }
  Result<EntrySummary> Describe(std::uint64_t entry) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = entries_.find(entry);
    if (it == entries_.end()) return Status::NotFound("no entry " + std::to_string(entry));
    return it->second.summary;
  }
  Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, FetchVisitor* v) override {
    Entry e;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = entries_.find(entry);
      if (it == entries_.end()) return Status::NotFound("no entry " + std::to_string(entry));
      e = it->second;
    }
    std::vector<std::uint32_t> order(layers.begin(), layers.end());
    if (order.empty()) {
      for (std::uint32_t i = 0; i < e.layers.size(); ++i) order.push_back(i);
    }
    for (std::uint32_t i : order) {
      if (i >= e.layers.size()) return Status::InvalidArgument("no layer " + std::to_string(i));
      const Layer& L = e.layers[i];
      PC_RETURN_IF_ERROR(v->OnLayer(i, std::as_bytes(std::span(L.header.data(), L.header.size())),
                                    static_cast<std::uint32_t>(L.chunks.size())));
      for (std::uint32_t k = 0; k < L.chunks.size(); ++k) {
        PC_RETURN_IF_ERROR(v->OnChunk(i, k, std::as_bytes(std::span(L.chunks[k].data(), L.chunks[k].size()))));
      }
    }
    return Status::Ok();
  }
  Status Delete(std::uint64_t entry) override {
    std::lock_guard<std::mutex> l(mu_);
    if (entries_.erase(entry) == 0) return Status::NotFound("no entry " + std::to_string(entry));
    return Status::Ok();
  }
  Result<ListPage> List(const ListFilter& f) override {
    std::lock_guard<std::mutex> l(mu_);
    ListPage page;
    const std::uint64_t from = f.page_token.empty() ? 0 : std::stoull(f.page_token);
    for (auto it = entries_.lower_bound(from); it != entries_.end(); ++it) {
      const auto& b = it->second.summary.boundary;
      if (f.digest && !(b.digest == *f.digest)) continue;
      if (f.ns && b.ns != *f.ns) continue;
      if (page.entries.size() == f.page_size) {
        page.next_page_token = std::to_string(it->first);
        break;
      }
      page.entries.push_back(it->second.summary);
    }
    return page;
  }
  Result<StoreStats> Stat() override {
    std::lock_guard<std::mutex> l(mu_);
    StoreStats s = stats_;
    s.entries = entries_.size();
    for (auto& [id, e] : entries_) s.bytes_stored += e.summary.bytes;
    return s;
  }
  Status SetCapacity(std::uint64_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    stats_.capacity_bytes = bytes;
    return Status::Ok();
  }

  std::uint64_t Add(Entry e) {
    std::lock_guard<std::mutex> l(mu_);
    const std::uint64_t id = next_++;
    e.summary.entry = id;
    entries_[id] = std::move(e);
    return id;
  }

 private:
  std::mutex mu_;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t next_ = 1;
  StoreStats stats_;
};

Result<Committed> MemorySink::Commit() {
  if (e_.layers.size() != e_.summary.layer_count) return Status::InvalidArgument("layer count mismatch");
  return Committed{b_->Add(std::move(e_)), false};
}

}  // namespace

std::unique_ptr<StoreBackend> NewMemoryBackend() { return std::make_unique<MemoryBackend>(); }

}  // namespace primecache::ipc

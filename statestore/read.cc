// Reading: lookup through the prefix index, fetch with checks, leases, and
// quarantine of what fails a check.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

Status Store::Impl::GetValue(rocksdb::ColumnFamilyHandle* cf, const std::string& key, std::string* value,
                             bool* found, const rocksdb::ReadOptions& ro) {
  rocksdb::Status s = db->Get(ro, cf, key, value);
  *found = s.ok();
  if (s.IsNotFound()) return Status::Ok();
  return FromRocks(s, std::string("read ") + cf->GetName());
}

Result<bool> Store::Impl::TokensMatch(EntryId id, std::span<const std::uint32_t> tokens, bool quarantine) {
  rocksdb::PinnableSlice v;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), cf_tokens, IdKey(id), &v);
  if (s.IsNotFound()) return false;  // removed meanwhile
  Status st = FromRocks(s, "read tokens");
  if (st.ok()) {
    auto body = CheckTrailer(v.ToStringView(), "tokens record");
    if (body.ok()) {
      // body: count (LE32) then the tokens (LE32 each), which is their native layout.
      if (body->size() != 4 + tokens.size_bytes()) return false;
      Reader r(*body);
      std::uint32_t n = 0;
      r.U32(&n);
      if (n != tokens.size()) return false;
      return std::memcmp(body->data() + 4, tokens.data(), tokens.size_bytes()) == 0;
    }
    st = body.status();
  }
  if (!st.IsCorruption()) return st;
  if (quarantine) {
    v.Reset();
    Quarantine(id, "tokens record: " + st.message(), std::nullopt);
  } else {
    spdlog::error("statestore {}: entry {}: {}", path, id, st.ToString());
  }
  return false;
}

Result<std::optional<EntryId>> Store::Impl::FindIdentity(std::uint64_t scope,
                                                         std::span<const std::uint32_t> tokens,
                                                         const BoundaryPlace& place, bool quarantine) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(GetValue(cf_index, ExactKey(scope, tokens.size(), place.exact_hash), &v, &found));
  if (!found) return std::optional<EntryId>();
  PC_ASSIGN_OR_RETURN(auto ids, DecodeIds(v));
  for (EntryId id : ids) {
    PC_ASSIGN_OR_RETURN(bool match, TokensMatch(id, tokens, quarantine));
    if (match) return std::optional<EntryId>(id);
  }
  return std::optional<EntryId>();
}

Result<std::optional<EntryId>> Store::FindExact(const Hash128& model, std::string_view ns,
                                                std::span<const std::uint32_t> tokens) {
  if (tokens.empty() || tokens.size() > kMaxTokens) return std::optional<EntryId>();
  auto scope = impl_->FindScope(model, ns);
  if (!scope) return std::optional<EntryId>();
  return impl_->FindIdentity(*scope, tokens, PlaceOf(*impl_->hasher, tokens, impl_->params.block_tokens),
                             true);
}

// ---- lookup ---------------------------------------------------------------------------------

Result<std::optional<LookupHit>> Store::Lookup(const Hash128& model, std::string_view ns,
                                               std::span<const std::uint32_t> tokens,
                                               const LookupOptions& options) {
  if (tokens.empty()) return Status::InvalidArgument("lookup of no tokens");
  if (tokens.size() > kMaxTokens) return Status::InvalidArgument("lookup longer than 2^22 tokens");
  Impl& s = *impl_;
  const std::uint32_t block = s.params.block_tokens;
  const std::size_t q = tokens.size();
  const std::size_t top = (q - 1) / block;  // deepest node a with a*B < q
  std::vector<std::uint64_t> h = ChainHashes(*s.hasher, tokens, block, top);
  auto query_hash = [&] { return s.hasher->Hash(tokens.subspan(top * block), h[top]); };

  std::optional<LookupHit> hit;
  if (auto scope = s.FindScope(model, ns)) {
    // The chain nodes of the query that exist (the in-memory filter rules
    // out the others), read in one batch, then walked deepest first.
    std::vector<std::size_t> levels;
    {
      std::shared_lock g(s.node_filter.mu);
      for (std::size_t a = 0; a <= top; ++a) {
        if (s.node_filter.MayContain(NodeFilter::Fingerprint(*scope, a, h[a]))) levels.push_back(a);
      }
    }
    const std::size_t n = levels.size();
    std::vector<std::string> keys(n);
    std::vector<rocksdb::Slice> slices(n);
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = NodeKey(*scope, levels[i], h[levels[i]]);
      slices[i] = keys[i];
    }
    std::vector<rocksdb::PinnableSlice> values(n);
    std::vector<rocksdb::Status> statuses(n);
    // Node keys sort by level, which is the order they were made in.
    if (n > 0) {
      s.db->MultiGet(rocksdb::ReadOptions(), s.cf_index, n, slices.data(), values.data(), statuses.data(),
                     /*sorted_input=*/true);
    }
    for (std::size_t i = n; i-- > 0 && !hit;) {
      const std::size_t a = levels[i];
      if (statuses[i].IsNotFound()) continue;
      PC_RETURN_IF_ERROR(FromRocks(statuses[i], "read index"));
      auto slots = DecodeNode(values[i].ToStringView(), block);
      if (!slots.ok()) {
        spdlog::error("statestore {}: index node {}/{}: {}", s.path, *scope, a, slots.status().ToString());
        continue;
      }
      // The query's hash at every slot length it covers, in one pass, then
      // the exact records that exist, longest first.
      std::vector<std::uint32_t> rs;
      for (const auto& sl : *slots) {
        if (a * block + sl.r <= q) rs.push_back(sl.r);
      }
      std::vector<std::uint64_t> exacts(rs.size());
      s.hasher->HashPrefixes(tokens.subspan(a * block, std::min<std::size_t>(block, q - a * block)), h[a], rs,
                             exacts);
      std::vector<std::pair<std::size_t, std::uint64_t>> present;  // (length, exact hash), longest first
      {
        std::shared_lock g(s.exact_filter.mu);
        for (std::size_t k = rs.size(); k-- > 0;) {
          const std::size_t length = a * block + rs[k];
          if (s.exact_filter.MayContain(NodeFilter::Fingerprint(*scope, length, exacts[k]))) {
            present.emplace_back(length, exacts[k]);
          }
        }
      }
      for (auto it = present.begin(); it != present.end() && !hit; ++it) {
        const std::size_t length = it->first;
        const std::uint64_t exact = it->second;
        std::string v;
        bool found = false;
        PC_RETURN_IF_ERROR(s.GetValue(s.cf_index, ExactKey(*scope, length, exact), &v, &found));
        if (!found) continue;
        auto ids = DecodeIds(v);
        if (!ids.ok()) {
          spdlog::error("statestore {}: index: {}", s.path, ids.status().ToString());
          continue;
        }
        for (EntryId id : *ids) {
          PC_ASSIGN_OR_RETURN(bool match, s.TokensMatch(id, tokens.first(length), true));
          if (!match) continue;
          PC_ASSIGN_OR_RETURN(hit, HitFor(id, length, options.lease));  // nullopt: being removed, look further
          if (hit) break;
        }
      }
    }
  }
  if (options.record) {
    if (hit) {
      ++s.hits;
      s.Touch(hit->id, true);
    } else {
      ++s.misses;
    }
    if (!hit || hit->length < q) s.NoteSighting(Impl::SightingKey(model, ns, q, query_hash()));
  }
  return hit;
}

Result<std::optional<LookupHit>> Store::HitFor(EntryId id, std::uint64_t length, Lease* lease) {
  std::string record;
  if (lease != nullptr) {
    auto held = LeaseLive(id, &record);
    if (held.status().IsNotFound()) return std::optional<LookupHit>();
    PC_RETURN_IF_ERROR(held.status());
    *lease = std::move(held).value();
  } else {
    bool found = false;
    PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_entries, IdKey(id), &record, &found));
    if (!found) return std::optional<LookupHit>();
  }
  PC_ASSIGN_OR_RETURN(EntrySummary sum, DecodeSummary(record));
  return std::optional<LookupHit>(LookupHit{id, length, sum.layers, sum.chunk_bytes, sum.raw_bytes});
}

// ---- leases -----------------------------------------------------------------------------------

Result<Lease> Store::LeaseLive(EntryId id, std::string* record) {
  if (!impl_->leases->TryAcquire(id))
    return Status::NotFound("entry " + std::to_string(id) + " is being removed");
  Lease lease(impl_->leases, id);
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_entries, IdKey(id), record, &found));
  if (!found) return Status::NotFound("no live entry " + std::to_string(id));
  return lease;
}

Result<Lease> Store::AcquireLease(EntryId id) {
  std::string record;
  return LeaseLive(id, &record);
}

Status Store::Impl::CheckNamespace(EntryId id, std::string_view record, const std::string& ns) const {
  PC_ASSIGN_OR_RETURN(EntrySummary sum, DecodeSummary(record));
  auto scope = ScopeById(sum.scope);
  // Another tenant's entry is reported as absent, not as forbidden.
  if (!scope || scope->ns != ns) return Status::NotFound("no entry " + std::to_string(id));
  return Status::Ok();
}

// ---- fetch ------------------------------------------------------------------------------------

Status Store::Impl::ReadChunk(const Hash128& h, std::uint64_t size, rocksdb::PinnableSlice* pinned,
                              std::string* joined, std::span<const std::byte>* out) {
  rocksdb::ReadOptions ro;
  // The content address below covers every byte; RocksDB's own block
  // checksums on this path would only check the same bytes again.
  ro.verify_checksums = false;
  std::string_view data;
  if (params.chunk_layout == static_cast<std::uint8_t>(ChunkLayout::kPieces)) {
    const std::uint64_t pieces = (size + params.piece_bytes - 1) / params.piece_bytes;
    std::vector<std::string> keys(pieces);
    std::vector<rocksdb::Slice> slices(pieces);
    for (std::uint64_t i = 0; i < pieces; ++i) {
      keys[i] = PieceKey(h, static_cast<std::uint32_t>(i));
      slices[i] = keys[i];
    }
    std::vector<rocksdb::PinnableSlice> values(pieces);
    std::vector<rocksdb::Status> statuses(pieces);
    db->MultiGet(ro, cf_chunks, pieces, slices.data(), values.data(), statuses.data(), /*sorted_input=*/true);
    joined->clear();
    joined->reserve(size);
    for (std::uint64_t i = 0; i < pieces; ++i) {
      if (statuses[i].IsNotFound()) {
        return Status::Corruption("chunk " + HashHex(h) + " piece " + std::to_string(i) + " is missing");
      }
      PC_RETURN_IF_ERROR(FromRocks(statuses[i], "read chunk " + HashHex(h)));
      joined->append(values[i].data(), values[i].size());
    }
    data = *joined;
  } else {
    rocksdb::Status s = db->Get(ro, cf_chunks, ChunkKey(h), pinned);
    if (s.IsNotFound()) return Status::Corruption("chunk " + HashHex(h) + " is missing");
    PC_RETURN_IF_ERROR(FromRocks(s, "read chunk " + HashHex(h)));
    data = pinned->ToStringView();
  }
  if (data.size() != size) {
    return Status::Corruption("chunk " + HashHex(h) + " holds " + std::to_string(data.size()) +
                              " bytes, not " + std::to_string(size));
  }
  auto bytes = std::as_bytes(std::span(data.data(), data.size()));
  if (!(Checksum128(bytes) == h)) {
    return Status::Corruption("chunk " + HashHex(h) + ": content does not match its address (XXH3-128)");
  }
  *out = bytes;
  return Status::Ok();
}

Status Store::Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
                    const FetchOptions& options) {
  Impl& s = *impl_;
  // What becomes of a damaged entry (a read-only store leaves it as it is).
  const std::string fate = s.opts.read_only ? "" : " quarantined";
  std::string record;
  PC_ASSIGN_OR_RETURN(Lease lease, LeaseLive(id, &record));
  if (options.ns) PC_RETURN_IF_ERROR(s.CheckNamespace(id, record, *options.ns));
  std::string mv;
  bool found = false;
  Status ms = s.GetValue(s.cf_manifests, IdKey(id), &mv, &found);
  if (ms.IsCorruption()) {
    lease.Release();
    s.Quarantine(id, "manifest unreadable: " + ms.message(), std::nullopt);
    return ms.WithContext("entry " + std::to_string(id) + fate);
  }
  PC_RETURN_IF_ERROR(ms);
  if (!found) {
    s.Quarantine(id, "manifest missing", std::nullopt);
    return Status::Corruption("entry " + std::to_string(id) + ": manifest missing" + (fate.empty() ? "" : ";" + fate));
  }
  auto manifest = DecodeManifest(mv, kMaxChunkBytesLimit);
  if (!manifest.ok()) {
    lease.Release();
    s.Quarantine(id, manifest.status().message(), std::nullopt);
    return manifest.status().WithContext("entry " + std::to_string(id) + fate);
  }
  std::vector<std::uint32_t> order;
  if (layers.empty()) {
    order.resize(manifest->layers.size());
    for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  } else {
    for (std::uint32_t l : layers) {
      if (l >= manifest->layers.size()) {
        return Status::InvalidArgument("entry " + std::to_string(id) + " has " +
                                       std::to_string(manifest->layers.size()) + " layers; asked for layer " +
                                       std::to_string(l));
      }
    }
    order.assign(layers.begin(), layers.end());
  }
  // Chunks are read (and their addresses checked) ahead on the store's read
  // pool, up to a window of chunks and bytes, and handed to the sink in order
  // on this thread; so reading overlaps the sink's work and other reads.
  struct Slot {
    std::uint32_t layer = 0, chunk = 0;
    rocksdb::PinnableSlice pinned;
    std::string joined;
    std::span<std::byte> target;  // the sink's buffer; empty: the store's own
    std::span<const std::byte> bytes;
    Status status;
    bool done = false;
  };
  // Reads one chunk, checked, into the sink's buffer when it gave one.
  auto read_chunk = [&s](const ChunkRef& ref, Slot* slot) {
    Status st = s.ReadChunk(ref.hash, ref.size, &slot->pinned, &slot->joined, &slot->bytes);
    if (st.ok() && !slot->target.empty()) {
      std::memcpy(slot->target.data(), slot->bytes.data(), slot->bytes.size());
      slot->bytes = slot->target;
    }
    return st;
  };
  // What the sink receives, in order: each layer announced, then its chunks.
  struct Step {
    std::uint32_t layer;
    std::int64_t chunk;  // -1: the layer's announcement
  };
  std::vector<Step> steps;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> plan;  // the chunk steps: (layer, chunk)
  for (std::uint32_t l : order) {
    steps.push_back({l, -1});
    for (std::uint32_t c = 0; c < manifest->layers[l].chunks.size(); ++c) {
      steps.push_back({l, c});
      plan.emplace_back(l, c);
    }
  }
  const std::size_t window = s.read_pool ? s.opts.fetch_read_ahead : 1;
  std::deque<Slot> slots;  // stable addresses: slots are added at the back, removed at the front
  std::mutex slot_mu;
  std::condition_variable slot_cv;
  std::size_t outstanding = 0;
  std::uint64_t bytes_ahead = 0;
  // No read may outlive this frame, whatever path leaves it.
  struct Drain {
    std::mutex& mu;
    std::condition_variable& cv;
    std::size_t& n;
    ~Drain() {
      std::unique_lock g(mu);
      cv.wait(g, [&] { return n == 0; });
    }
  } drain{slot_mu, slot_cv, outstanding};
  std::size_t next_read = 0;
  auto start_reads = [&]() -> Status {
    while (next_read < plan.size() && slots.size() < window &&
           (slots.empty() || bytes_ahead < s.opts.fetch_read_ahead_bytes)) {
      const auto [l, c] = plan[next_read];
      const ChunkRef& ref = manifest->layers[l].chunks[c];
      const bool may_wait = slots.empty();
      PC_ASSIGN_OR_RETURN(auto target, sink.ChunkBuffer(l, c, ref.size, may_wait));
      if (!target) {
        if (may_wait) return Status::Internal("fetch sink gave no buffer for a chunk it had to take");
        break;  // no room yet: asked again after the next chunk is handed out
      }
      if (!target->empty() && target->size() != ref.size) {
        return Status::Internal("fetch sink gave a buffer of the wrong size");
      }
      ++next_read;
      Slot& slot = slots.emplace_back();
      slot.layer = l;
      slot.chunk = c;
      slot.target = *target;
      bytes_ahead += ref.size;
      if (!s.read_pool) {
        slot.status = read_chunk(ref, &slot);
        slot.done = true;
        continue;
      }
      {
        std::lock_guard g(slot_mu);
        ++outstanding;
      }
      s.read_pool->Post([&read_chunk, &slot, &slot_mu, &slot_cv, &outstanding, ref] {
        Status st = read_chunk(ref, &slot);
        std::lock_guard g(slot_mu);
        slot.status = std::move(st);
        slot.done = true;
        --outstanding;
        slot_cv.notify_all();
      });
    }
    return Status::Ok();
  };
  for (const Step& step : steps) {
    PC_RETURN_IF_ERROR(start_reads());
    if (step.chunk < 0) {
      const auto& ml = manifest->layers[step.layer];
      PC_RETURN_IF_ERROR(sink.OnLayer(step.layer, ml.header, static_cast<std::uint32_t>(ml.chunks.size())));
      continue;
    }
    Slot& slot = slots.front();
    {
      std::unique_lock g(slot_mu);
      slot_cv.wait(g, [&] { return slot.done; });
    }
    const std::uint32_t l = slot.layer, c = slot.chunk;
    Status rs = std::move(slot.status);
    if (rs.IsCorruption()) {
      lease.Release();
      const Hash128 bad = manifest->layers[l].chunks[c].hash;
      {
        std::unique_lock g(slot_mu);  // reads in flight finish before the quarantine batch
        slot_cv.wait(g, [&] { return outstanding == 0; });
      }
      slots.clear();
      s.Quarantine(id, "layer " + std::to_string(l) + " chunk " + std::to_string(c) + ": " + rs.message(), bad);
      return rs.WithContext("entry " + std::to_string(id) + fate);
    }
    PC_RETURN_IF_ERROR(rs);
    PC_RETURN_IF_ERROR(sink.OnChunk(l, c, slot.bytes));
    bytes_ahead -= manifest->layers[l].chunks[c].size;
    slots.pop_front();
  }
  s.Touch(id, false);
  return Status::Ok();
}

Result<std::vector<LayerBytes>> Store::FetchAll(EntryId id) {
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
  PC_RETURN_IF_ERROR(Fetch(id, {}, sink));
  return std::move(sink.layers);
}

Result<std::vector<std::uint32_t>> Store::Tokens(EntryId id) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_tokens, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no live entry " + std::to_string(id));
  return DecodeTokens(v);
}

Result<std::vector<std::string>> Store::LayerHeaders(EntryId id) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_manifests, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no live entry " + std::to_string(id));
  auto manifest = DecodeManifest(v, kMaxChunkBytesLimit);
  if (!manifest.ok()) return manifest.status().WithContext("entry " + std::to_string(id));
  std::vector<std::string> headers;
  headers.reserve(manifest->layers.size());
  for (auto& layer : manifest->layers) headers.push_back(std::move(layer.header));
  return headers;
}

// ---- quarantine -------------------------------------------------------------------------------

void Store::Impl::Quarantine(EntryId id, const std::string& reason, std::optional<Hash128> bad_chunk) {
  if (opts.read_only) {
    spdlog::error("statestore {}: entry {} is damaged ({}); open read-only, so it is not quarantined", path, id,
                  reason);
    return;
  }
  std::lock_guard wl(write_mu);
  Txn t(*this);
  auto removed = t.RemoveEntry(id, reason);
  Status s;
  if (!removed.ok()) {
    // Its own record is unreadable: drop what is keyed by its id and rebuild
    // what the remaining entries imply.
    spdlog::error("statestore {}: entry {}: {}", path, id, removed.status().ToString());
    Status fs = ForceRemove(id);
    if (!fs.ok()) spdlog::error("statestore {}: removing entry {}: {}", path, id, fs.ToString());
    return;
  } else if (!*removed) {
    return;  // already gone
  }
  if (bad_chunk) {
    auto r = t.Ref(*bad_chunk);
    if (r.ok() && (*r)->refs > 0) (*r)->flags |= kChunkCorrupt;  // rewritten by the next publish that has it
  }
  s = t.Commit(CommitWriteOptions(), "quarantine.before_write", "quarantine.after_write");
  if (s.ok() && t.needs_rebuild()) s = RebuildDerived();
  if (s.ok()) {
    spdlog::error("statestore {}: entry {} quarantined: {}", path, id, reason);
  } else {
    spdlog::error("statestore {}: quarantining entry {} ({}) failed: {}", path, id, reason, s.ToString());
  }
}

}  // namespace primecache

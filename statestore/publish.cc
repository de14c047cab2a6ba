// Publishing: admission, staging chunk bytes, and the atomic commit.
//
// Chunk bytes are staged as they arrive, each under its content address with
// a collection record beside it ('G' + hash), outside the store's write lock.
// The first direct_write_bytes of a publish go through the WAL; the rest skip
// it and are flushed to SST/blob files before the commit, so big entries are
// written once. The commit is one synced batch: manifest, tokens, summary,
// reference counts, index, recency and counters. A crash before it leaves
// only staged bytes with collection records, which the next open removes.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

class PublisherImpl final : public Publisher {
 public:
  PublisherImpl(Store::Impl& s, PublishRequest req, BoundaryPlace place)
      : s_(s), req_(std::move(req)), place_(place) {}
  ~PublisherImpl() override {
    if (!done_) Abort();
  }

  Status BeginLayer(std::string_view header) override {
    PC_RETURN_IF_ERROR(Usable());
    if (in_layer_) return Fail(Status::FailedPrecondition("BeginLayer inside a layer"));
    if (header.size() > kMaxHeaderBytes) return Fail(Status::InvalidArgument("layer header too long"));
    if (layers_.size() >= kMaxLayers) return Fail(Status::InvalidArgument("too many layers"));
    layers_.push_back(ManifestLayer{std::string(header), {}});
    facts_.clear();
    in_layer_ = true;
    return Status::Ok();
  }

  Status AddChunk(std::span<const std::byte> bytes) override {
    PC_RETURN_IF_ERROR(Usable());
    if (!in_layer_) return Fail(Status::FailedPrecondition("AddChunk outside a layer"));
    if (bytes.empty() || bytes.size() > s_.opts.max_chunk_bytes) {
      return Fail(Status::InvalidArgument("chunk of " + std::to_string(bytes.size()) +
                                          " bytes; must be in [1, " +
                                          std::to_string(s_.opts.max_chunk_bytes) + "]"));
    }
    auto& layer = layers_.back();
    if (layer.chunks.size() >= kMaxChunksPerLayer)
      return Fail(Status::InvalidArgument("too many chunks in a layer"));
    Hash128 h = Checksum128(bytes);
    facts_.push_back({bytes.size(), Checksum64(bytes)});
    layer.chunks.push_back({h, bytes.size()});
    chunk_bytes_ += bytes.size();
    auto [it, first] = staged_.try_emplace(h);
    Staged& st = it->second;
    if (!first) {
      if (st.size != bytes.size())
        return Fail(Status::InvalidArgument("two chunks with one address and two sizes"));
      ++st.count;
      return Status::Ok();
    }
    st.size = bytes.size();
    st.count = 1;
    Store::Impl::StageDecision d = s_.PinChunk(h);
    pinned_.push_back(h);
    needs_flush_ |= d.needs_flush;
    if (d.write) {
      Status rs = s_.ReserveStaged(bytes.size());
      if (!rs.ok()) return Fail(rs);
      reserved_ += bytes.size();
      bool direct = written_bytes_ >= s_.opts.direct_write_bytes;
      Status ws = s_.WriteChunkBytes(h, bytes, direct);
      if (!ws.ok()) return Fail(ws.WithContext("stage chunk"));
      st.wrote = true;
      written_bytes_ += bytes.size();
      needs_flush_ |= direct;
      if (direct) {
        // Start writing what is staged to blob/SST files while the rest
        // arrives; the commit then waits only for the tail.
        unflushed_bytes_ += bytes.size();
        if (unflushed_bytes_ >= s_.opts.flush_step_bytes) {
          unflushed_bytes_ = 0;
          Status fs = s_.StartFlush();
          if (!fs.ok()) return Fail(fs.WithContext("stage chunk"));
          TEST_KILL_POINT("publish.stage.flush_started");
        }
      }
    }
    return Status::Ok();
  }

  Status EndLayer() override {
    PC_RETURN_IF_ERROR(Usable());
    if (!in_layer_) return Fail(Status::FailedPrecondition("EndLayer outside a layer"));
    in_layer_ = false;
    auto facts = s_.validator->Check(layers_.back().header, facts_, req_.tokens.size());
    if (!facts.ok()) {
      return Fail(facts.status().WithContext("layer " + std::to_string(layers_.size() - 1) + " refused"));
    }
    raw_bytes_ += facts->raw_bytes;
    return Status::Ok();
  }

  Result<PublishResult> Commit() override {
    PC_RETURN_IF_ERROR(Usable());
    if (in_layer_) return Fail(Status::FailedPrecondition("Commit inside a layer"));
    if (layers_.empty()) return Fail(Status::FailedPrecondition("Commit of a publish with no layers"));
    auto r = CommitImpl();
    if (!r.ok()) return Fail(r.status());
    return r;
  }

  void Abort() override {
    if (done_) return;
    done_ = true;
    s_.AbortPublish(pinned_, written_bytes_);
    pinned_.clear();
    s_.ReleaseStaged(reserved_);
    reserved_ = 0;
  }

 private:
  struct Staged {
    std::uint64_t size = 0;
    std::uint64_t count = 0;
    bool wrote = false;
  };

  Status Usable() const {
    if (done_) return Status::FailedPrecondition("the publish is over");
    return failed_;
  }
  Status Fail(Status s) {
    if (failed_.ok()) failed_ = s;
    return s;
  }

  Result<PublishResult> CommitImpl();

  Store::Impl& s_;
  PublishRequest req_;
  BoundaryPlace place_;
  std::vector<ManifestLayer> layers_;
  std::vector<ChunkFacts> facts_;
  bool in_layer_ = false;
  bool done_ = false;
  Status failed_;
  std::unordered_map<Hash128, Staged, Hash128Hasher> staged_;
  std::vector<Hash128> pinned_;
  std::uint64_t chunk_bytes_ = 0;
  std::uint64_t raw_bytes_ = 0;
  std::uint64_t written_bytes_ = 0;
  std::uint64_t reserved_ = 0;  // counted against max_staged_bytes
  std::uint64_t unflushed_bytes_ = 0;
  bool needs_flush_ = false;
};

Result<PublishResult> PublisherImpl::CommitImpl() {
  if (needs_flush_) {
    TEST_KILL_POINT("publish.commit.before_flush");
    PC_RETURN_IF_ERROR(s_.FlushChunks());
    TEST_KILL_POINT("publish.commit.after_flush");
  }
  PublishResult result;
  {
    std::lock_guard wl(s_.write_mu);
    const std::uint64_t budget = s_.byte_budget;
    if (budget > 0) PC_RETURN_IF_ERROR(s_.FlushTouches());
    Txn t(s_);
    const std::uint64_t length = req_.tokens.size();
    bool scope_existed = s_.FindScope(req_.model, req_.ns).has_value();
    PC_ASSIGN_OR_RETURN(std::uint64_t scope, t.ScopeFor(req_.model, req_.model_name, req_.ns, req_.model_descriptor));
    if (scope_existed) {
      PC_ASSIGN_OR_RETURN(auto existing, s_.FindIdentity(scope, req_.tokens, place_, /*quarantine=*/false));
      if (existing) {
        result.id = *existing;
        result.existed = true;
      }
    }
    if (!result.existed) {
      const EntryId id = t.counters().next_entry_id++;
      const std::string key = IdKey(id);
      Manifest m;
      m.layers = std::move(layers_);
      std::string manifest = EncodeManifest(m);
      layers_ = std::move(m.layers);
      std::string tokens = EncodeTokens(req_.tokens);
      EntrySummary sum;
      sum.scope = scope;
      sum.length = length;
      sum.layers = static_cast<std::uint32_t>(layers_.size());
      sum.chunk_bytes = chunk_bytes_;
      sum.raw_bytes = raw_bytes_;
      sum.flops = EstimatePrefillFlops(req_.cost, length);
      sum.created_unix_ms = NowUnixMs();
      sum.node_hash = place_.node_hash;
      sum.exact_hash = place_.exact_hash;
      sum.meta_bytes = manifest.size() + tokens.size() + EncodeSummary(sum).size();

      for (const auto& [h, st] : staged_) {
        PC_ASSIGN_OR_RETURN(ChunkRefRecord * r, t.Ref(h));
        if (r->refs > 0) {
          result.shared_chunk_bytes += st.size;
        } else {
          result.new_chunk_bytes += st.size;
        }
        PC_RETURN_IF_ERROR(t.AddRefs(h, st.size, st.count, st.wrote));
      }
      PC_RETURN_IF_ERROR(t.IndexAdd(scope, length, place_, id));
      std::uint64_t tick = s_.clock.fetch_add(1);
      t.batch().Put(s_.cf_lru, AgeKey(tick, id), "");
      t.batch().Put(s_.cf_lru, AccessKey(id), EncodeAccess({tick, 0}));
      t.batch().Put(s_.cf_entries, key, EncodeSummary(sum));
      t.batch().Put(s_.cf_manifests, key, manifest);
      t.batch().Put(s_.cf_tokens, key, tokens);
      auto& c = t.counters();
      ++c.entries;
      c.logical_chunk_bytes += sum.chunk_bytes;
      c.meta_bytes += sum.meta_bytes;
      c.raw_bytes += sum.raw_bytes;
      if (budget > 0) PC_RETURN_IF_ERROR(t.EvictToBudget(budget, id, &result.evicted));
      PC_RETURN_IF_ERROR(
          t.Commit(s_.CommitWriteOptions(), "publish.commit.before_write", "publish.commit.after_write"));
      result.id = id;
    }
  }
  if (result.existed) {
    // Someone else stored this boundary first: forget our staged bytes.
    Abort();
    return result;
  }
  done_ = true;
  s_.UnpinChunks(pinned_, needs_flush_);
  pinned_.clear();
  s_.ReleaseStaged(reserved_);
  reserved_ = 0;
  return result;
}

}  // namespace

// ---- chunk pinning and staging ---------------------------------------------------------

Store::Impl::StageDecision Store::Impl::PinChunk(const Hash128& h) {
  std::unique_lock lk(chunk_mu);
  chunk_cv.wait(lk, [&] {
    auto it = live_chunks.find(h);
    return it == live_chunks.end() || !it->second.deleting;
  });
  LiveChunk& lc = live_chunks[h];
  ++lc.pins;
  if (lc.present) return {false, lc.unflushed};
  std::string v;
  bool found = false;
  Status s = GetValue(cf_chunk_refs, HashKey(h), &v, &found);
  if (s.ok() && found) {
    auto r = DecodeChunkRef(v);
    if (r.ok() && r->refs > 0 && (r->flags & kChunkCorrupt) == 0) {
      lc.present = true;
      return {false, false};
    }
  }
  return {true, false};  // absent, corrupt, or unreadable: write the bytes
}

Status Store::Impl::WriteChunkBytes(const Hash128& h, std::span<const std::byte> bytes, bool direct) {
  rocksdb::WriteBatch b;
  std::string_view data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (params.chunk_layout == static_cast<std::uint8_t>(ChunkLayout::kPieces)) {
    std::uint32_t piece = 0;
    for (std::size_t off = 0; off < data.size(); off += params.piece_bytes, ++piece) {
      b.Put(cf_chunks, PieceKey(h, piece), data.substr(off, params.piece_bytes));
    }
  } else {
    b.Put(cf_chunks, ChunkKey(h), data);
  }
  b.Put(cf_chunks, GcKey(h), "");
  rocksdb::WriteOptions wo;
  wo.disableWAL = direct;
  TEST_KILL_POINT("publish.stage.before_write");
  PC_RETURN_IF_ERROR(Write(wo, &b, "write chunk"));
  TEST_KILL_POINT("publish.stage.after_write");
  std::lock_guard g(chunk_mu);
  LiveChunk& lc = live_chunks[h];
  lc.present = true;
  if (direct) lc.unflushed = true;
  return Status::Ok();
}

void Store::Impl::AppendChunkDeletion(rocksdb::WriteBatch* batch, const Hash128& h, std::uint64_t size) {
  if (params.chunk_layout == static_cast<std::uint8_t>(ChunkLayout::kPieces)) {
    std::uint64_t pieces = (size + params.piece_bytes - 1) / params.piece_bytes;
    for (std::uint64_t i = 0; i < pieces; ++i)
      batch->Delete(cf_chunks, PieceKey(h, static_cast<std::uint32_t>(i)));
  } else {
    batch->Delete(cf_chunks, ChunkKey(h));
  }
  batch->Delete(cf_chunks, GcKey(h));
}

Status Store::Impl::StartFlush() {
  PC_RETURN_IF_ERROR(Recover());
  rocksdb::FlushOptions fo;
  fo.wait = false;
  fo.allow_write_stall = true;
  return AfterWriteError(FromRocks(db->Flush(fo, cf_chunks), "flush staged chunks"));
}

Status Store::Impl::FlushChunks() {
  PC_RETURN_IF_ERROR(Recover());
  rocksdb::FlushOptions fo;
  fo.wait = true;
  fo.allow_write_stall = true;
  return AfterWriteError(FromRocks(db->Flush(fo, cf_chunks), "flush staged chunks"));
}

void Store::Impl::UnpinChunks(const std::vector<Hash128>& chunks, bool flushed) {
  std::lock_guard g(chunk_mu);
  for (const auto& h : chunks) {
    auto it = live_chunks.find(h);
    if (it == live_chunks.end()) continue;
    if (flushed) it->second.unflushed = false;
    if (it->second.pins > 0) --it->second.pins;
    if (it->second.pins == 0 && !it->second.deleting) live_chunks.erase(it);
  }
}

// Forgets a publish's staged chunks: those nobody references or pins any
// more lose their bytes and collection records, and the space they took is
// reclaimed (Reclaim) without waiting for a compaction to pass by.
void Store::Impl::AbortPublish(const std::vector<Hash128>& chunks, std::uint64_t written_bytes) {
  if (chunks.empty()) return;
  std::uint64_t dropped = 0;
  Status s;
  {
    std::lock_guard wl(write_mu);
    s = DropStaged(chunks, /*unpin=*/true, "abort.before_write", &dropped);
  }
  if (!s.ok()) {
    // Collected by the next CollectStaged (Compact, the next publish, or the next open).
    collect_pending.store(true);
    spdlog::warn("statestore {}: abandoned publish: {} (collected later)", path, s.ToString());
    return;
  }
  if (dropped > 0) NoteDropped(written_bytes);
}

Status Store::Impl::DropStaged(const std::vector<Hash128>& chunks, bool unpin, const char* kill_point,
                               std::uint64_t* dropped) {
  rocksdb::WriteBatch b;
  std::vector<Hash128> deleting;
  Status first_error;
  {
    std::lock_guard g(chunk_mu);
    for (const auto& h : chunks) {
      auto it = live_chunks.find(h);
      if (unpin) {
        if (it == live_chunks.end()) continue;
        if (it->second.pins > 0) --it->second.pins;
      }
      if (it != live_chunks.end() && (it->second.pins > 0 || it->second.deleting)) continue;
      std::string v;
      bool found = false;
      Status rs = GetValue(cf_chunk_refs, HashKey(h), &v, &found);
      std::optional<ChunkRefRecord> ref;
      if (rs.ok() && found) {
        auto r = DecodeChunkRef(v);
        if (r.ok()) {
          ref = *r;
        } else {
          rs = r.status();
        }
      }
      if (!rs.ok() || (ref && ref->refs > 0)) {
        // Referenced: the bytes stay, the collection record goes. Unreadable:
        // left for Verify to report.
        if (rs.ok()) b.Delete(cf_chunks, GcKey(h));
        if (first_error.ok() && !rs.ok()) first_error = rs;
        if (it != live_chunks.end()) live_chunks.erase(it);
        continue;
      }
      Status ds = AppendStagedDeletion(&b, h);
      if (!ds.ok()) {
        if (first_error.ok()) first_error = ds;
        continue;
      }
      if (ref) b.Delete(cf_chunk_refs, HashKey(h));  // a record of no reference
      live_chunks[h].deleting = true;
      deleting.push_back(h);
    }
  }
  Status s;
  if (b.Count() > 0) {
    TEST_KILL_POINT(kill_point);
    s = Write(rocksdb::WriteOptions(), &b, "drop staged chunks");
  }
  {
    std::lock_guard g(chunk_mu);
    for (const auto& h : deleting) {
      auto it = live_chunks.find(h);
      if (it == live_chunks.end()) continue;
      it->second.deleting = false;
      if (it->second.pins == 0) live_chunks.erase(it);
    }
  }
  chunk_cv.notify_all();
  if (s.ok()) *dropped += deleting.size();
  return s.ok() ? first_error : s;
}

Status Store::Impl::AppendStagedDeletion(rocksdb::WriteBatch* batch, const Hash128& h) {
  if (params.chunk_layout == static_cast<std::uint8_t>(ChunkLayout::kPieces)) {
    // An unreferenced chunk's size is recorded nowhere: every piece there is.
    const std::string ck = ChunkKey(h);
    std::vector<std::string> pieces;
    std::unique_ptr<rocksdb::Iterator> pit(db->NewIterator(rocksdb::ReadOptions(), cf_chunks));
    for (pit->Seek(ck); pit->Valid() && pit->key().starts_with(ck); pit->Next())
      pieces.push_back(pit->key().ToString());
    PC_RETURN_IF_ERROR(FromRocks(pit->status(), "find staged pieces"));
    for (const auto& k : pieces) batch->Delete(cf_chunks, k);
  } else {
    batch->Delete(cf_chunks, ChunkKey(h));
  }
  batch->Delete(cf_chunks, GcKey(h));
  return Status::Ok();
}

// Chunk bytes staged by publishes that never committed carry a collection
// record; those no publish pins and no entry references go now.
Status Store::Impl::CollectStaged() {
  collect_pending.store(false);
  std::uint64_t dropped = 0;
  {
    std::lock_guard wl(write_mu);
    std::vector<Hash128> staged;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_chunks));
    const std::string prefix(1, kGcTag);
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (it->key().size() != 17) return Status::Corruption("malformed collection key in chunks");
      staged.push_back(HashFromKey(it->key().ToStringView().substr(1)));
    }
    PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan collection records"));
    Status s = DropStaged(staged, /*unpin=*/false, "gc.before_write", &dropped);
    if (!s.ok()) {
      collect_pending.store(true);
      return s;
    }
  }
  if (dropped > 0) {
    spdlog::info("statestore {}: collected {} chunks of publishes that never committed", path, dropped);
    NoteDropped(opts.reclaim_after_bytes);
  }
  return Status::Ok();
}

// ---- BeginPublish / Publish ---------------------------------------------------------------

Result<std::unique_ptr<Publisher>> Store::BeginPublish(PublishRequest req) {
  if (req.tokens.empty()) return Status::InvalidArgument("a boundary needs at least one token");
  if (req.tokens.size() > kMaxTokens) return Status::InvalidArgument("boundary longer than 2^22 tokens");
  if (req.ns.size() > kMaxNamespaceBytes) return Status::InvalidArgument("namespace longer than 1024 bytes");
  if (req.model_name.size() > kMaxModelNameBytes)
    return Status::InvalidArgument("model name longer than 1024 bytes");
  if (req.model_descriptor.size() > kMaxDescriptorBytes)
    return Status::InvalidArgument("model descriptor longer than 64 KiB");
  if (!req.model_descriptor.empty() &&
      Checksum128(std::as_bytes(std::span(req.model_descriptor.data(), req.model_descriptor.size()))) !=
          req.model) {
    return Status::InvalidArgument("the model descriptor does not hash to the model digest");
  }
  PC_RETURN_IF_ERROR(impl_->Writable());
  if (impl_->collect_pending.load()) {
    Status c = impl_->CollectStaged();
    if (!c.ok()) spdlog::warn("statestore {}: collecting abandoned chunks: {}", impl_->path, c.ToString());
  }
  BoundaryPlace place = PlaceOf(*impl_->hasher, req.tokens, impl_->params.block_tokens);
  // Already stored: admission does not apply; a descriptor the scope lacks is
  // kept (so an entry published without one becomes exportable).
  if (auto scope = impl_->FindScope(req.model, req.ns)) {
    PC_ASSIGN_OR_RETURN(auto existing, impl_->FindIdentity(*scope, req.tokens, place, /*quarantine=*/true));
    if (existing) {
      auto rec = impl_->ScopeById(*scope);
      if (!req.model_descriptor.empty() && rec.has_value() && rec->descriptor.empty()) {
        std::lock_guard wl(impl_->write_mu);
        Txn t(*impl_);
        PC_RETURN_IF_ERROR(t.ScopeFor(req.model, req.model_name, req.ns, req.model_descriptor).status());
        PC_RETURN_IF_ERROR(t.Commit(impl_->CommitWriteOptions(), "scope.before_write", "scope.after_write"));
      }
      return Status::AlreadyExists("boundary already stored as entry " + std::to_string(*existing));
    }
  }
  if (impl_->opts.admit_after_sightings > 1) {
    std::uint32_t seen =
        impl_->Sightings(Impl::SightingKey(req.model, req.ns, req.tokens.size(), place.exact_hash));
    if (seen < impl_->opts.admit_after_sightings) {
      ++impl_->refusals;
      return Status::Aborted("not admitted: boundary seen " + std::to_string(seen) + " of " +
                             std::to_string(impl_->opts.admit_after_sightings) + " times");
    }
  }
  TEST_KILL_POINT("publish.begin");
  return std::unique_ptr<Publisher>(new PublisherImpl(*impl_, std::move(req), place));
}

Result<PublishResult> Store::Publish(PublishRequest req, std::span<const LayerBytes> layers) {
  auto model = req.model;
  std::string ns = req.ns;
  std::vector<std::uint32_t> tokens = req.tokens;
  auto p = BeginPublish(std::move(req));
  if (!p.ok()) {
    if (p.status().code() == StatusCode::kAlreadyExists) {
      PC_ASSIGN_OR_RETURN(auto id, FindExact(model, ns, tokens));
      if (id) return PublishResult{*id, true, 0, 0, 0};
    }
    return p.status();
  }
  for (const auto& layer : layers) PC_RETURN_IF_ERROR((*p)->AddLayer(layer));
  return (*p)->Commit();
}

}  // namespace primecache

// Publishing: admission, appending chunk bytes to a segment, and the atomic
// commit.
//
// A publisher takes a writable segment of its own from the store's pool (no
// lock on the data path) and appends each chunk that no committed entry
// holds yet as one frame; chunks already committed are only referenced.
// Commit makes the segment durable (fdatasync), then writes one synced
// batch: manifest, tokens, summary, chunk records with their extents, the
// segment's committed length, index, recency and counters. A crash before
// the batch leaves only a tail past the segment's committed length, which
// the next open cuts off; an abort cuts its bytes from the segment at once.
// While the segment syncs, the chunks written are read back and checked
// against their addresses (ReadBack).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

// The chunks a publish wrote, read back from its segment and checked against
// their addresses on the read pool (while the segment syncs). A chunk's
// address is computed where the caller holds its bytes, which may be memory
// a client can still change (its shared region) while the store writes from
// it; a chunk stored under an address its bytes do not have would be found
// by dedup and fail every entry that shares it, so such a publish is
// refused instead. Wait must be called before the object goes.
class ReadBack {
 public:
  struct Chunk {
    Hash128 hash;
    Extent at;
    std::uint64_t size;
  };
  explicit ReadBack(LocalStore::Impl& s) : s_(s) {}

  // `end`: the segment's length, all written out.
  void Start(std::shared_ptr<RandomAccessFile> file, std::uint64_t end, std::vector<Chunk> chunks) {
    file_ = std::move(file);
    chunks_ = std::move(chunks);
    // Checked where the bytes lie in the page cache when the file can be
    // mapped (a mapping of this call's own: the tail past the committed
    // length must not reach the store's shared mappings), else read back.
    if (auto m = file_->Map(end); m.ok()) mapping_ = std::move(m).value();
    const std::size_t jobs = s_.read_pool ? s_.read_pool->size() : 1;
    const std::size_t per = (chunks_.size() + jobs - 1) / jobs;
    for (std::size_t from = 0; from < chunks_.size(); from += per) {
      const std::size_t to = std::min(chunks_.size(), from + per);
      {
        MutexLock g(&mu_);
        ++left_;
      }
      if (s_.read_pool) {
        s_.read_pool->Post([this, from, to] { Check(from, to); });
      } else {
        Check(from, to);
      }
    }
  }

  Status Wait() {
    MutexLock g(&mu_);
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return left_ == 0; });
    return first_;
  }

 private:
  void Check(std::size_t from, std::size_t to) {
    std::vector<std::byte> buf;
    Status st;
    for (std::size_t i = from; i < to && st.ok(); ++i) {
      const Chunk& c = chunks_[i];
      if (mapping_.owner == nullptr) {
        buf.resize(c.size);
        st = s_.ReadExtent(file_, c.at, c.hash, buf);
      } else if (c.at.offset > mapping_.size || c.size > mapping_.size - c.at.offset) {
        st = Status::Corruption("chunk " + HashHex(c.hash) + " lies past the end of segment " +
                                SegmentHex(c.at.segment));
      } else {
        st = LocalStore::Impl::CheckAddress(std::span(mapping_.data + c.at.offset, c.size), c.hash, c.at);
      }
    }
    MutexLock g(&mu_);
    if (!st.ok() && first_.ok()) first_ = std::move(st);
    --left_;
    cv_.SignalAll();
  }

  LocalStore::Impl& s_;
  std::shared_ptr<RandomAccessFile> file_;
  MappedRegion mapping_;  // unset: read back with ReadExtent
  std::vector<Chunk> chunks_;
  Mutex mu_;
  CondVar cv_;
  std::size_t left_ GUARDED_BY(mu_) = 0;
  Status first_ GUARDED_BY(mu_);
};

class PublisherImpl final : public Publisher {
 public:
  PublisherImpl(LocalStore::Impl& s, PublishRequest req, BoundaryPlace place)
      : s_(s), req_(std::move(req)), place_(place) {}
  ~PublisherImpl() override {
    if (!done_) Abort();
  }

  Status BeginLayer(std::string_view header, std::uint32_t chunk_count) override {
    PC_RETURN_IF_ERROR(Usable());
    if (in_layer_) return Fail(Status::FailedPrecondition("BeginLayer inside a layer"));
    if (header.size() > kMaxHeaderBytes) return Fail(Status::InvalidArgument("layer header too long"));
    if (layers_.size() >= StoreLimits::kMaxLayers) return Fail(Status::InvalidArgument("too many layers"));
    if (chunk_count > kMaxChunksPerLayer) return Fail(Status::InvalidArgument("too many chunks in a layer"));
    layers_.push_back(ManifestLayer{std::string(header), {}});
    facts_.clear();
    chunks_announced_ = chunk_count;
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
    if (layer.chunks.size() >= chunks_announced_) {
      return Fail(Status::InvalidArgument("layer " + std::to_string(layers_.size() - 1) + " announced " +
                                          std::to_string(chunks_announced_) + " chunk(s); got more"));
    }
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
    auto seen = CommittedExtent(h);
    if (!seen.ok()) return Fail(seen.status());
    st.seen = *seen;
    if (st.seen) return Status::Ok();  // committed already: only referenced
    return Stage(h, bytes, &st);
  }

  Status EndLayer() override {
    PC_RETURN_IF_ERROR(Usable());
    if (!in_layer_) return Fail(Status::FailedPrecondition("EndLayer outside a layer"));
    in_layer_ = false;
    if (layers_.back().chunks.size() != chunks_announced_) {
      return Fail(Status::InvalidArgument("layer " + std::to_string(layers_.size() - 1) + " announced " +
                                          std::to_string(chunks_announced_) + " chunk(s); got " +
                                          std::to_string(layers_.back().chunks.size())));
    }
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
    PC_RETURN_IF_ERROR(CheckModel());
    auto r = CommitImpl();
    if (!r.ok()) return Fail(r.status());
    return r;
  }

  void Abort() override {
    if (done_) return;
    done_ = true;
    if (batch_attempted_) {
      s_.ReleaseWriter(std::move(writer_), /*reuse=*/false);  // its tail is cut at the next open if unrecorded
      s_.NoteDropped(written_bytes_);
    } else {
      s_.AbortPublish(std::move(writer_), written_bytes_);
    }
    s_.ReleaseStaged(reserved_);
    reserved_ = 0;
  }

 private:
  struct Staged {
    std::uint64_t size = 0;
    std::uint64_t count = 0;
    std::optional<Extent> wrote;  // where this publish wrote the bytes
    std::optional<Extent> seen;   // where a committed copy was when the chunk arrived
  };

  // Where the committed copy of a chunk is; nullopt when there is none that
  // can be used (absent, or marked corrupt).
  Result<std::optional<Extent>> CommittedExtent(const Hash128& h) {
    std::string v;
    bool found = false;
    PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_chunk_refs, HashKey(h), &v, &found));
    if (!found) return std::optional<Extent>();
    auto r = DecodeChunkRef(v);
    if (!r.ok() || !r->placed || r->refs == 0 || (r->flags & kChunkCorrupt) != 0 || r->segment == 0)
      return std::optional<Extent>();  // unreadable or unusable: write the bytes again
    return std::optional<Extent>(Extent{r->segment, r->offset});
  }

  // Appends a chunk to this publish's segment.
  Status Stage(const Hash128& h, std::span<const std::byte> bytes, Staged* st) {
    Status rs = s_.ReserveStaged(bytes.size());
    if (!rs.ok()) return Fail(rs);
    reserved_ += bytes.size();
    if (writer_ == nullptr) {
      auto w = s_.AcquireWriter();
      if (!w.ok()) return Fail(w.status().WithContext("stage chunk"));
      writer_ = std::move(w).value();
    }
    auto at = writer_->Append(h, bytes);
    if (!at.ok()) return Fail(s_.AfterSegmentError(at.status()).WithContext("stage chunk"));
    // While the disk is full each chunk is written through, so that a chunk
    // the disk cannot take is refused at once rather than at commit, and the
    // first write that fits ends the state.
    if (s_.segment_full.load()) {
      Status ws = writer_->WriteOut();
      if (!ws.ok()) return Fail(s_.AfterSegmentError(ws).WithContext("stage chunk"));
      s_.SegmentWritesOk();
    }
    st->wrote = Extent{writer_->id(), *at};
    written_bytes_ += bytes.size();
    return Status::Ok();
  }

  Status Usable() const {
    if (done_) return Status::FailedPrecondition("the publish is over");
    return failed_;
  }
  Status Fail(Status s) {
    if (failed_.ok()) failed_ = s;
    return s;
  }

  // The layers together against the model they are filed under (LayerValidator::CheckModel).
  Status CheckModel() {
    std::vector<std::string_view> headers;
    headers.reserve(layers_.size());
    for (const ManifestLayer& l : layers_) headers.emplace_back(l.header);
    Status s = s_.validator->CheckModel(req_.model_descriptor, headers);
    return s.ok() ? s : Fail(s.WithContext("entry refused"));
  }
  Result<PublishResult> CommitImpl();
  Status SyncAndReadBack();
  Status AddEntry(Txn& t, std::uint64_t scope, std::uint64_t budget, PublishResult* result) REQUIRES(t.mu());

  LocalStore::Impl& s_;
  PublishRequest req_;
  BoundaryPlace place_;
  std::vector<ManifestLayer> layers_;
  std::vector<ChunkFacts> facts_;
  std::uint32_t chunks_announced_ = 0;  // by the current layer's BeginLayer
  bool in_layer_ = false;
  bool done_ = false;
  Status failed_;
  std::unordered_map<Hash128, Staged, Hash128Hasher> staged_;
  std::unique_ptr<SegmentWriter> writer_;  // taken at the first chunk written
  std::uint64_t chunk_bytes_ = 0;
  std::uint64_t raw_bytes_ = 0;
  std::uint64_t written_bytes_ = 0;
  std::uint64_t reserved_ = 0;  // counted against max_staged_bytes
  bool batch_attempted_ = false;  // Commit began writing the metadata batch
};

Result<PublishResult> PublisherImpl::CommitImpl() {
  if (writer_ != nullptr) {
    // The bytes are durable, and are what their addresses say, before any
    // record points at them.
    TEST_KILL_POINT("publish.commit.before_sync");
    Status ss = writer_->WriteOut();
    if (!ss.ok()) return s_.AfterSegmentError(ss);
    PC_RETURN_IF_ERROR(SyncAndReadBack());
    s_.SegmentWritesOk();
  }
  PublishResult result;
  {
    MutexLock wl(&s_.write_mu);
    const std::uint64_t budget = s_.byte_budget;
    if (budget > 0) PC_RETURN_IF_ERROR(s_.FlushTouches());
    Txn t(s_);
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
      // From here a failure may still leave the batch applied (a WAL write
      // that failed after all): the bytes must stay where it says they are.
      batch_attempted_ = true;
      PC_RETURN_IF_ERROR(AddEntry(t, scope, budget, &result));
    }
  }
  if (result.existed) {
    // Someone else stored this boundary first: our bytes are dead space.
    Abort();
    return result;
  }
  done_ = true;
  if (writer_ != nullptr) {
    writer_->MarkCommitted();
    s_.ReleaseWriter(std::move(writer_), /*reuse=*/true);
  }
  s_.ReleaseStaged(reserved_);
  reserved_ = 0;
  return result;
}

// Syncs the segment while the chunks this publish wrote are read back.
Status PublisherImpl::SyncAndReadBack() {
  std::vector<ReadBack::Chunk> chunks;
  for (const auto& [h, st] : staged_) {
    if (st.wrote && st.wrote->segment == writer_->id()) chunks.push_back({h, *st.wrote, st.size});
  }
  PC_ASSIGN_OR_RETURN(auto file, s_.SegmentFile(writer_->id()));
  ReadBack check(s_);
  check.Start(std::move(file), writer_->end(), std::move(chunks));
  const Status synced = writer_->Sync();
  const Status checked = check.Wait();
  if (!synced.ok()) return s_.AfterSegmentError(synced);
  return checked.WithContext("publish refused: a chunk's bytes changed while they were written");
}

// The entry's records, its chunks' references and extents, and its
// segment's new committed length, in one batch (under write_mu).
Status PublisherImpl::AddEntry(Txn& t, std::uint64_t scope, std::uint64_t budget, PublishResult* result) {
  const EntryId id = t.counters().next_entry_id++;
  const std::string key = IdKey(id);
  const std::uint64_t length = req_.tokens.size();
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

  if (writer_ != nullptr) {
    const bool seal = writer_->end() >= s_.opts.segment_bytes;
    t.SetSegment(writer_->id(), writer_->end(), seal ? SegmentState::kSealed : SegmentState::kOpen);
  }
  for (const auto& [h, st] : staged_) {
    PC_ASSIGN_OR_RETURN(ChunkRefRecord * r, t.Ref(h));
    (r->refs > 0 ? result->shared_chunk_bytes : result->new_chunk_bytes) += st.size;
    PC_RETURN_IF_ERROR(t.AddRefs(h, st.size, st.count, st.wrote, st.seen));
  }
  PC_RETURN_IF_ERROR(t.IndexAdd(scope, length, place_, id));
  for (const std::string& k : PassKeys(*s_.hasher, scope, req_.tokens, id)) t.batch().Put(s_.cf_index, k, "");
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
  if (budget > 0) PC_RETURN_IF_ERROR(t.EvictToBudget(budget, id, &result->evicted));
  PC_RETURN_IF_ERROR(
      t.Commit(s_.CommitWriteOptions(), "publish.commit.before_write", "publish.commit.after_write"));
  result->id = id;
  return Status::Ok();
}

}  // namespace

// The writer of a publish that ends without a commit.
void LocalStore::Impl::AbortPublish(std::unique_ptr<SegmentWriter> w, std::uint64_t written_bytes) {
  if (w == nullptr) return;
  // Cut back to what is committed (also when a write failed: a full disk
  // must get the space back at once); failing that, segment gc retries the
  // cut (and the next open makes it).
  Status s = w->Rewind();
  if (!s.ok()) {
    spdlog::warn("statestore {}: giving back an aborted publish's bytes: {} (retried by the next segment gc)",
                 path, s.ToString());
    {
      MutexLock g(&pool_mu);
      uncut_tails[w->id()] = w->fresh() ? 0 : w->committed();
    }
    if (written_bytes > 0) NoteDropped(written_bytes);
  }
  ReleaseWriter(std::move(w), /*reuse=*/true);
}

Status LocalStore::Impl::AfterSegmentError(const Status& s) {
  if (s.code() != StatusCode::kResourceExhausted) return s;
  Status full = Status::ResourceExhausted("no space left on the disk of the store at " + path + " (" + s.message() +
                                          "); writes are refused until space is freed, reads go on");
  MutexLock g(&recover_mu);
  segment_error = full;
  segment_full.store(true);
  return full;
}

void LocalStore::Impl::SegmentWritesOk() {
  if (!segment_full.load()) return;
  MutexLock g(&recover_mu);
  segment_full.store(false);
  segment_error = Status::Ok();
}

// ---- BeginPublish ---------------------------------------------------------------------------

namespace {

// The request against the StoreLimits bounds, and its descriptor against its digest.
Status CheckRequest(const PublishRequest& req) {
  if (req.tokens.empty()) return Status::InvalidArgument("a boundary needs at least one token");
  if (req.tokens.size() > StoreLimits::kMaxTokens) return Status::InvalidArgument("boundary longer than 2^22 tokens");
  if (req.ns.size() > StoreLimits::kMaxNamespaceBytes) {
    return Status::InvalidArgument("namespace longer than " + std::to_string(StoreLimits::kMaxNamespaceBytes) +
                                   " bytes");
  }
  if (req.model_name.size() > StoreLimits::kMaxModelNameBytes) {
    return Status::InvalidArgument("model name longer than " + std::to_string(StoreLimits::kMaxModelNameBytes) +
                                   " bytes");
  }
  if (req.model_descriptor.size() > StoreLimits::kMaxDescriptorBytes) {
    return Status::InvalidArgument("model descriptor longer than " +
                                   std::to_string(StoreLimits::kMaxDescriptorBytes >> 10) + " KiB");
  }
  if (!req.model_descriptor.empty() &&
      Checksum128(std::as_bytes(std::span(req.model_descriptor.data(), req.model_descriptor.size()))) !=
          req.model) {
    return Status::InvalidArgument("the model descriptor does not hash to the model digest");
  }
  return Status::Ok();
}

}  // namespace

Result<PublishStart> LocalStore::BeginPublish(PublishRequest req) {
  PC_RETURN_IF_ERROR(CheckRequest(req));
  PC_RETURN_IF_ERROR(impl_->Writable());
  BoundaryPlace place = PlaceOf(*impl_->hasher, req.tokens, impl_->params.block_tokens);
  // Already stored: admission does not apply; a descriptor the scope lacks is
  // kept (so an entry published without one becomes exportable).
  if (auto scope = impl_->FindScope(req.model, req.ns)) {
    PC_ASSIGN_OR_RETURN(auto existing, impl_->FindIdentity(*scope, req.tokens, place, /*quarantine=*/true));
    if (existing) {
      auto rec = impl_->ScopeById(*scope);
      if (!req.model_descriptor.empty() && rec.has_value() && rec->descriptor.empty()) {
        MutexLock wl(&impl_->write_mu);
        Txn t(*impl_);
        PC_RETURN_IF_ERROR(t.ScopeFor(req.model, req.model_name, req.ns, req.model_descriptor).status());
        PC_RETURN_IF_ERROR(t.Commit(impl_->CommitWriteOptions(), "scope.before_write", "scope.after_write"));
      }
      return PublishStart{nullptr, existing};
    }
  }
  if (impl_->opts.eviction.admit_after_sightings > 1) {
    std::uint32_t seen =
        impl_->Sightings(Impl::SightingKey(req.model, req.ns, req.tokens.size(), place.exact_hash));
    if (seen < impl_->opts.eviction.admit_after_sightings) {
      ++impl_->refusals;
      return Status::Aborted("not admitted: boundary seen " + std::to_string(seen) + " of " +
                             std::to_string(impl_->opts.eviction.admit_after_sightings) + " times");
    }
  }
  if (impl_->opts.eviction.admission == AdmissionPolicy::kReuse) {
    if (Status a = impl_->AdmitReused(req.model, req.ns, req.tokens); !a.ok()) {
      ++impl_->refusals;
      return a;
    }
  }
  TEST_KILL_POINT("publish.begin");
  return PublishStart{std::unique_ptr<Publisher>(new PublisherImpl(*impl_, std::move(req), place)), std::nullopt};
}

}  // namespace primecache

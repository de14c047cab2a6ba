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

#include "statestore/group.h"
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
  PublisherImpl(LocalStore::Impl& s, PublishRequest req, BoundaryPlace place,
                std::shared_ptr<GroupTable::Group> group)
      : s_(s), req_(std::move(req)), place_(place), group_(std::move(group)) {}
  ~PublisherImpl() override {
    if (!done_) Abort();
  }

  Status BeginLayer(std::string_view header, std::uint32_t chunk_count) override {
    PC_RETURN_IF_ERROR(Usable());
    if (in_layer_) return Fail(Status::FailedPrecondition("BeginLayer inside a layer"));
    if (header.size() > kMaxHeaderBytes) return Fail(Status::InvalidArgument("layer header too long"));
    if (part_.layers.size() >= StoreLimits::kMaxLayers) return Fail(Status::InvalidArgument("too many layers"));
    if (chunk_count > kMaxChunksPerLayer) return Fail(Status::InvalidArgument("too many chunks in a layer"));
    part_.layers.push_back(ManifestLayer{std::string(header), {}});
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
    auto& layer = part_.layers.back();
    if (layer.chunks.size() >= chunks_announced_) {
      return Fail(Status::InvalidArgument("layer " + std::to_string(part_.layers.size() - 1) + " announced " +
                                          std::to_string(chunks_announced_) + " chunk(s); got more"));
    }
    Hash128 h = Checksum128(bytes);
    facts_.push_back({bytes.size(), Checksum64(bytes)});
    layer.chunks.push_back({h, bytes.size()});
    part_.chunk_bytes += bytes.size();
    auto [it, first] = part_.chunks.try_emplace(h);
    StagedChunk& st = it->second;
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
    const std::size_t l = part_.layers.size() - 1;
    if (part_.layers.back().chunks.size() != chunks_announced_) {
      return Fail(Status::InvalidArgument("layer " + std::to_string(l) + " announced " +
                                          std::to_string(chunks_announced_) + " chunk(s); got " +
                                          std::to_string(part_.layers.back().chunks.size())));
    }
    auto facts = s_.validator->Check(part_.layers.back().header, facts_, req_.tokens.size());
    if (!facts.ok()) return Fail(facts.status().WithContext("layer " + std::to_string(l) + " refused"));
    part_.raw_bytes += facts->raw_bytes;
    return Status::Ok();
  }

  Result<PublishResult> Commit() override {
    PC_RETURN_IF_ERROR(Usable());
    if (in_layer_) return Fail(Status::FailedPrecondition("Commit inside a layer"));
    if (part_.layers.empty()) return Fail(Status::FailedPrecondition("Commit of a publish with no layers"));
    auto r = group_ ? CommitPart() : CommitAlone();
    if (!r.ok()) return Fail(r.status());
    return r;
  }

  void Abort() override {
    if (done_) return;
    done_ = true;
    s_.AbortPart(part_);
    if (group_) s_.groups->Abandon(group_, Status::Aborted("rank " + std::to_string(req_.group->rank) +
                                                            " ended its part without a commit"));
  }

 private:
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
  Status Stage(const Hash128& h, std::span<const std::byte> bytes, StagedChunk* st) {
    Status rs = s_.ReserveStaged(bytes.size());
    if (!rs.ok()) return Fail(rs);
    part_.reserved += bytes.size();
    if (part_.writer == nullptr) {
      auto w = s_.AcquireWriter();
      if (!w.ok()) return Fail(w.status().WithContext("stage chunk"));
      part_.writer = std::move(w).value();
    }
    auto at = part_.writer->Append(h, bytes);
    if (!at.ok()) return Fail(s_.AfterSegmentError(at.status()).WithContext("stage chunk"));
    // While the disk is full each chunk is written through, so that a chunk
    // the disk cannot take is refused at once rather than at commit, and the
    // first write that fits ends the state.
    if (s_.segment_full.load()) {
      Status ws = part_.writer->WriteOut();
      if (!ws.ok()) return Fail(s_.AfterSegmentError(ws).WithContext("stage chunk"));
      s_.SegmentWritesOk();
    }
    st->wrote = Extent{part_.writer->id(), *at};
    part_.written_bytes += bytes.size();
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

  // One publisher's entry: its bytes made durable, then its batch.
  Result<PublishResult> CommitAlone() {
    PC_RETURN_IF_ERROR(s_.CheckModel(req_, std::span<const StagedPart>(&part_, 1)));
    PC_RETURN_IF_ERROR(s_.MakeDurable(part_));
    done_ = true;  // the part is given back or committed below, whatever happens
    std::vector<StagedPart> parts;
    parts.push_back(std::move(part_));
    return s_.CommitParts(req_, place_, parts);
  }

  // A group part: its bytes made durable and parked; the part that completes
  // the group writes the entry of every part.
  Result<PublishResult> CommitPart();

  LocalStore::Impl& s_;
  PublishRequest req_;
  BoundaryPlace place_;
  std::shared_ptr<GroupTable::Group> group_;  // null: not a group part
  StagedPart part_;
  std::vector<ChunkFacts> facts_;
  std::uint32_t chunks_announced_ = 0;  // by the current layer's BeginLayer
  bool in_layer_ = false;
  bool done_ = false;
  Status failed_;
};

Result<PublishResult> PublisherImpl::CommitPart() {
  PC_RETURN_IF_ERROR(s_.MakeDurable(part_));
  done_ = true;  // from here the part belongs to its group
  PC_ASSIGN_OR_RETURN(auto all, s_.groups->Park(group_, req_.group->rank, std::move(part_)));
  if (!all) {
    PublishResult pending;
    pending.group_pending = true;
    return pending;
  }
  TEST_KILL_POINT("group.commit.begin");
  Status checked = s_.CheckModel(req_, *all);
  Result<PublishResult> r = checked.ok() ? s_.CommitParts(req_, place_, *all) : Result<PublishResult>(checked);
  if (!checked.ok()) {
    for (StagedPart& p : *all) s_.AbortPart(p);
  }
  s_.groups->Finish(group_);
  return r;
}

// The entry's records, its chunks' references and extents, and its parts'
// segments' new committed lengths, in one batch (under write_mu). A chunk
// two parts both wrote is placed at the first one's copy; the other copy is
// dead space.
Status AddEntry(LocalStore::Impl& s, Txn& t, const PublishRequest& req, const BoundaryPlace& place,
                std::uint64_t scope, std::uint64_t budget, std::span<StagedPart> parts, PublishResult* result)
    REQUIRES(t.mu()) {
  const EntryId id = t.counters().next_entry_id++;
  const std::string key = IdKey(id);
  const std::uint64_t length = req.tokens.size();
  Manifest m;
  EntrySummary sum;
  for (StagedPart& p : parts) {
    for (ManifestLayer& l : p.layers) m.layers.push_back(std::move(l));
    p.layers.clear();
    sum.chunk_bytes += p.chunk_bytes;
    sum.raw_bytes += p.raw_bytes;
  }
  std::string manifest = EncodeManifest(m);
  std::string tokens = EncodeTokens(req.tokens);
  sum.scope = scope;
  sum.length = length;
  sum.layers = static_cast<std::uint32_t>(m.layers.size());
  sum.ranks = req.EntryRanks();
  sum.flops = EstimatePrefillFlops(req.cost, length);
  sum.created_unix_ms = NowUnixMs();
  sum.node_hash = place.node_hash;
  sum.exact_hash = place.exact_hash;
  sum.meta_bytes = manifest.size() + tokens.size() + EncodeSummary(sum).size();

  std::uint64_t duplicate_bytes = 0;
  for (StagedPart& p : parts) {
    if (p.writer != nullptr) {
      const bool seal = p.writer->end() >= s.opts.segment_bytes;
      t.SetSegment(p.writer->id(), p.writer->end(), seal ? SegmentState::kSealed : SegmentState::kOpen);
    }
    for (const auto& [h, st] : p.chunks) {
      PC_ASSIGN_OR_RETURN(ChunkRefRecord * r, t.Ref(h));
      // As AddRefs decides: a usable copy is kept, and this part's is dead.
      const bool usable = r->refs > 0 && (r->flags & kChunkCorrupt) == 0 && r->segment != 0;
      if (usable && st.wrote) duplicate_bytes += st.size;
      (r->refs > 0 ? result->shared_chunk_bytes : result->new_chunk_bytes) += st.size;
      PC_RETURN_IF_ERROR(t.AddRefs(h, st.size, st.count, st.wrote, st.seen));
    }
  }
  PC_RETURN_IF_ERROR(t.IndexAdd(scope, length, place, id));
  for (const std::string& k : PassKeys(*s.hasher, scope, req.tokens, id)) t.batch().Put(s.cf_index, k, "");
  std::uint64_t tick = s.clock.fetch_add(1);
  t.batch().Put(s.cf_lru, AgeKey(tick, id), "");
  t.batch().Put(s.cf_lru, AccessKey(id), EncodeAccess({tick, 0}));
  t.batch().Put(s.cf_entries, key, EncodeSummary(sum));
  t.batch().Put(s.cf_manifests, key, manifest);
  t.batch().Put(s.cf_tokens, key, tokens);
  auto& c = t.counters();
  ++c.entries;
  c.logical_chunk_bytes += sum.chunk_bytes;
  c.meta_bytes += sum.meta_bytes;
  c.raw_bytes += sum.raw_bytes;
  if (budget > 0) PC_RETURN_IF_ERROR(t.EvictToBudget(budget, id, &result->evicted));
  const bool group = parts.size() > 1;
  PC_RETURN_IF_ERROR(t.Commit(s.CommitWriteOptions(), group ? "group.commit.before_write" : "publish.commit.before_write",
                              group ? "group.commit.after_write" : "publish.commit.after_write"));
  if (duplicate_bytes > 0) s.NoteDropped(duplicate_bytes);
  result->id = id;
  return Status::Ok();
}

}  // namespace

// ---- committing parts (one publisher's, or every part of a group) ------------------------

void LocalStore::Impl::AbortPart(StagedPart& part) {
  if (part.batch_attempted) {
    ReleaseWriter(std::move(part.writer), /*reuse=*/false);  // its tail is cut at the next open if unrecorded
    NoteDropped(part.written_bytes);
  } else {
    AbortPublish(std::move(part.writer), part.written_bytes);
  }
  ReleaseStaged(part.reserved);
  part.reserved = 0;
}

// The layers together against the model they are filed under
// (LayerValidator::CheckModel): every part's, in rank order.
Status LocalStore::Impl::CheckModel(const PublishRequest& req, std::span<const StagedPart> parts) {
  std::vector<std::string_view> headers;
  for (const StagedPart& p : parts) {
    for (const ManifestLayer& l : p.layers) headers.emplace_back(l.header);
  }
  Status s = validator->CheckModel(req.model_descriptor, headers, req.EntryRanks());
  return s.ok() ? s : s.WithContext("entry refused");
}

// The bytes are durable, and are what their addresses say, before any
// record points at them.
Status LocalStore::Impl::MakeDurable(StagedPart& part) {
  if (part.writer == nullptr) return Status::Ok();
  TEST_KILL_POINT("publish.commit.before_sync");
  Status ss = part.writer->WriteOut();
  if (!ss.ok()) return AfterSegmentError(ss);
  std::vector<ReadBack::Chunk> chunks;
  for (const auto& [h, st] : part.chunks) {
    if (st.wrote && st.wrote->segment == part.writer->id()) chunks.push_back({h, *st.wrote, st.size});
  }
  PC_ASSIGN_OR_RETURN(auto file, SegmentFile(part.writer->id()));
  ReadBack check(*this);
  check.Start(std::move(file), part.writer->end(), std::move(chunks));
  const Status synced = part.writer->Sync();
  const Status checked = check.Wait();
  if (!synced.ok()) return AfterSegmentError(synced);
  PC_RETURN_IF_ERROR(checked.WithContext("publish refused: a chunk's bytes changed while they were written"));
  SegmentWritesOk();
  return Status::Ok();
}

Result<PublishResult> LocalStore::Impl::CommitParts(const PublishRequest& req, const BoundaryPlace& place,
                                                   std::span<StagedPart> parts) {
  PublishResult result;
  Status st;
  {
    MutexLock wl(&write_mu);
    const std::uint64_t budget = byte_budget;
    if (budget > 0) st = FlushTouches();
    Txn t(*this);
    std::optional<std::uint64_t> scope;
    if (st.ok()) {
      const bool scope_existed = FindScope(req.model, req.ns).has_value();
      auto s = t.ScopeFor(req.model, req.model_name, req.ns, req.model_descriptor);
      if (!s.ok()) st = s.status();
      if (st.ok()) scope = *s;
      if (st.ok() && scope_existed) {
        auto existing = FindIdentity(*scope, req.tokens, place, /*quarantine=*/false);
        if (!existing.ok()) st = existing.status();
        if (st.ok() && *existing) result.id = **existing, result.existed = true;
      }
    }
    if (st.ok() && !result.existed) {
      // From here a failure may still leave the batch applied (a WAL write
      // that failed after all): the bytes must stay where it says they are.
      for (StagedPart& p : parts) p.batch_attempted = true;
      st = AddEntry(*this, t, req, place, *scope, budget, parts, &result);
    }
  }
  if (!st.ok() || result.existed) {
    // A failure, or someone else stored this boundary first: our bytes are dead space.
    for (StagedPart& p : parts) AbortPart(p);
    if (!st.ok()) return st;
    return result;
  }
  for (StagedPart& p : parts) {
    if (p.writer != nullptr) {
      p.writer->MarkCommitted();
      ReleaseWriter(std::move(p.writer), /*reuse=*/true);
    }
    ReleaseStaged(p.reserved);
    p.reserved = 0;
  }
  return result;
}

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
  if (req.ranks == 0 || req.ranks > StoreLimits::kMaxGroupRanks) {
    return Status::InvalidArgument("a tensor-parallel entry has 1.." + std::to_string(StoreLimits::kMaxGroupRanks) +
                                   " ranks, not " + std::to_string(req.ranks));
  }
  if (req.group && req.ranks != 1) {
    return Status::InvalidArgument("a group part names its ranks in its group, not as a whole entry's");
  }
  if (req.group) {
    const PublishGroup& g = *req.group;
    if (g.token == 0) return Status::InvalidArgument("a group publish needs a token other than 0");
    if (g.ranks < 2 || g.ranks > StoreLimits::kMaxGroupRanks) {
      return Status::InvalidArgument("a group publish has 2.." + std::to_string(StoreLimits::kMaxGroupRanks) +
                                     " ranks, not " + std::to_string(g.ranks));
    }
    if (g.rank >= g.ranks) {
      return Status::InvalidArgument("rank " + std::to_string(g.rank) + " of a group of " +
                                     std::to_string(g.ranks));
    }
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
  // A group's parts are admitted together: its first part decides for all.
  std::shared_ptr<GroupTable::Group> group;
  bool first = true;
  if (req.group) {
    PC_ASSIGN_OR_RETURN(group, impl_->groups->Join(req, &first));
  }
  if (first) {
    if (Status admitted = impl_->Admit(req, place); !admitted.ok()) {
      if (group) impl_->groups->Abandon(group, admitted);
      return admitted;
    }
  }
  TEST_KILL_POINT("publish.begin");
  return PublishStart{std::unique_ptr<Publisher>(new PublisherImpl(*impl_, std::move(req), place, std::move(group))),
                      std::nullopt};
}

// Admission (StoreOptions::eviction): kAborted when the boundary is not
// stored yet.
Status LocalStore::Impl::Admit(const PublishRequest& req, const BoundaryPlace& place) {
  if (opts.eviction.admit_after_sightings > 1) {
    std::uint32_t seen = Sightings(SightingKey(req.model, req.ns, req.tokens.size(), place.exact_hash));
    if (seen < opts.eviction.admit_after_sightings) {
      ++refusals;
      return Status::Aborted("not admitted: boundary seen " + std::to_string(seen) + " of " +
                             std::to_string(opts.eviction.admit_after_sightings) + " times");
    }
  }
  if (opts.eviction.admission == AdmissionPolicy::kReuse) {
    if (Status a = AdmitReused(req.model, req.ns, req.tokens); !a.ok()) {
      ++refusals;
      return a;
    }
  }
  return Status::Ok();
}

}  // namespace primecache

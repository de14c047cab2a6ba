// Metadata batches: chunk references, the prefix index, entry removal and
// the atomic write that ends each batch (eviction's choice of victims:
// recency.cc).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache::statestore_internal {

std::uint64_t IdCount(const std::optional<std::string>& v) {
  if (!v) return 0;
  auto ids = DecodeIds(*v);
  return ids.ok() ? ids->size() : 0;
}

std::uint64_t SlotTotal(const std::optional<std::string>& v, std::uint32_t block) {
  if (!v) return 0;
  auto slots = DecodeNode(*v, block);
  if (!slots.ok()) return 0;
  std::uint64_t n = 0;
  for (const auto& sl : *slots) n += sl.count;
  return n;
}

Txn::~Txn() {
  for (EntryId id : dying_) s_.leases->ClearDying(id);
}

bool Txn::MarkDying(EntryId id) {
  if (!s_.leases->MarkDying(id)) return false;
  dying_.push_back(id);
  return true;
}

// ---- references -----------------------------------------------------------------------

Result<ChunkRefRecord*> Txn::Ref(const Hash128& h) {
  auto it = refs_.find(h);
  if (it != refs_.end()) return &it->second.rec;
  RefState st;
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_chunk_refs, HashKey(h), &v, &found));
  if (found) {
    PC_ASSIGN_OR_RETURN(st.rec, DecodeChunkRef(v));
    if (!st.rec.placed) {
      return Status::Corruption("chunk " + HashHex(h) + " has a reference record of schema 2 (not migrated)");
    }
    st.loaded_present = st.rec.refs > 0;
    st.loaded = st.rec;
  }
  return &refs_.emplace(h, st).first->second.rec;
}

Status Txn::AddRefs(const Hash128& h, std::uint64_t size, std::uint64_t n, std::optional<Extent> wrote,
                    std::optional<Extent> seen) {
  PC_ASSIGN_OR_RETURN(ChunkRefRecord * r, Ref(h));
  if (r->refs > 0 && r->size != size) {
    return Status::Corruption("chunk " + HashHex(h) + " is recorded with size " + std::to_string(r->size) +
                              ", published with " + std::to_string(size));
  }
  const bool usable = r->refs > 0 && (r->flags & kChunkCorrupt) == 0 && r->segment != 0;
  if (!usable) {
    // Place the chunk: at the bytes this publish wrote, else at the committed
    // copy it found when it began, when that copy's segment is still there.
    std::optional<Extent> at = wrote;
    if (!at && seen && r->refs == 0 && SegmentLive(seen->segment)) at = seen;
    if (!at) {
      return Status::Aborted("chunk " + HashHex(h) +
                             " was removed or found corrupt while this publish was in flight; publish again");
    }
    r->placed = true;
    r->segment = at->segment;
    r->offset = at->offset;
    r->flags &= ~kChunkCorrupt;
  }
  if (r->refs == 0) {
    r->size = size;
    ++c_.chunks;
    c_.chunk_bytes += size;
  }
  r->refs += n;
  return Status::Ok();
}

bool Txn::SegmentLive(std::uint64_t id) const {
  auto it = segs_.find(id);
  if (it != segs_.end()) return it->second.has_value();
  return s_.segments.count(id) != 0;
}

Status Txn::Repoint(const Hash128& h, const Extent& from, const Extent& to, bool* moved) {
  PC_ASSIGN_OR_RETURN(ChunkRefRecord * r, Ref(h));
  *moved = r->refs > 0 && r->segment == from.segment && r->offset == from.offset;
  if (*moved) {
    r->segment = to.segment;
    r->offset = to.offset;
    if (to.segment == 0) r->flags |= kChunkCorrupt;  // its bytes failed their address: lost
  }
  return Status::Ok();
}

void Txn::SetSegment(std::uint64_t id, std::uint64_t committed, SegmentState state) {
  auto it = segs_.find(id);
  SegmentRecord rec;
  if (it != segs_.end() && it->second) {
    rec = *it->second;
  } else if (auto cur = s_.segments.find(id); cur != s_.segments.end()) {
    rec = cur->second;
  }
  rec.committed = committed;
  rec.state = state;
  segs_[id] = rec;
}

void Txn::DropSegment(std::uint64_t id) {
  segs_[id] = std::nullopt;
}

Status Txn::DropRefs(const Hash128& h, std::uint64_t n) {
  PC_ASSIGN_OR_RETURN(ChunkRefRecord * r, Ref(h));
  if (r->refs < n) {
    return Status::Corruption("chunk " + HashHex(h) + " has " + std::to_string(r->refs) +
                              " references; dropping " + std::to_string(n));
  }
  r->refs -= n;
  if (r->refs == 0) {
    --c_.chunks;
    c_.chunk_bytes -= r->size;
  }
  return Status::Ok();
}

// Live bytes of every segment whose chunks this batch moved, added or
// dropped; then every changed segment record into the batch.
Status Txn::ApplySegments() {
  std::map<std::uint64_t, std::int64_t> delta;
  for (auto& [h, st] : refs_) {
    if (st.loaded_present && st.loaded.segment != 0)
      delta[st.loaded.segment] -= static_cast<std::int64_t>(FrameBytes(st.loaded.size));
    if (st.rec.refs > 0 && st.rec.segment != 0)
      delta[st.rec.segment] += static_cast<std::int64_t>(FrameBytes(st.rec.size));
  }
  for (const auto& [id, d] : delta) {
    if (d == 0) continue;
    if (segs_.count(id) == 0) {
      auto cur = s_.segments.find(id);
      if (cur == s_.segments.end()) {
        // Damage Verify reports (a record naming a segment that has none).
        spdlog::error("statestore {}: chunk records name segment {}, which has no record", s_.path, SegmentHex(id));
        continue;
      }
      segs_[id] = cur->second;
    }
    auto& rec = segs_[id];
    if (!rec) continue;  // dropped by gc, which checked that every live chunk left it
    const std::int64_t live = static_cast<std::int64_t>(rec->live) + d;
    if (live < 0 || static_cast<std::uint64_t>(live) > rec->committed) {
      return Status::Corruption("segment " + SegmentHex(id) + ": live bytes out of range after this batch");
    }
    rec->live = static_cast<std::uint64_t>(live);
  }
  for (const auto& [id, rec] : segs_) {
    if (rec) {
      batch_.Put(s_.cf_segments, IdKey(id), EncodeSegment(*rec));
    } else {
      batch_.Delete(s_.cf_segments, IdKey(id));
    }
  }
  return Status::Ok();
}

// ---- index ------------------------------------------------------------------------------

Result<std::optional<std::string>> Txn::IndexValue(const std::string& key) {
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_index, key, &v, &found));
  std::optional<std::string> r;
  if (found) r = std::move(v);
  if (!key.empty() && key[0] == kNodeTag) filter_base_[key] = SlotTotal(r, s_.params.block_tokens);
  if (!key.empty() && key[0] == kExactTag) filter_base_[key] = IdCount(r);
  index_[key] = r;
  return r;
}

void Txn::SetIndexValue(const std::string& key, std::optional<std::string> value) {
  index_[key] = std::move(value);
}

Result<std::vector<std::uint64_t>> Txn::ExactIds(const std::string& key) {
  PC_ASSIGN_OR_RETURN(auto v, IndexValue(key));
  if (!v) return std::vector<std::uint64_t>();
  return DecodeIds(*v);
}

Result<std::vector<NodeSlot>> Txn::NodeSlots(const std::string& key) {
  PC_ASSIGN_OR_RETURN(auto v, IndexValue(key));
  if (!v) return std::vector<NodeSlot>();
  return DecodeNode(*v, s_.params.block_tokens);
}

namespace {

// Where a boundary of `length` tokens at `place` sits in the index: its
// node's key, its slot r within the node, and its exact record's key.
struct IndexPlace {
  std::string node_key;
  std::uint32_t r = 0;
  std::string exact_key;
};

IndexPlace PlaceInIndex(std::uint64_t scope, std::uint64_t length, const BoundaryPlace& place, std::uint32_t block) {
  return {NodeKey(scope, place.level, place.node_hash), static_cast<std::uint32_t>(length - place.level * block),
          ExactKey(scope, length, place.exact_hash)};
}

}  // namespace

Status Txn::IndexAdd(std::uint64_t scope, std::uint64_t length, const BoundaryPlace& place, EntryId id) {
  const IndexPlace at = PlaceInIndex(scope, length, place, s_.params.block_tokens);
  const std::string& nk = at.node_key;
  const std::string& xk = at.exact_key;
  const std::uint32_t r = at.r;
  PC_ASSIGN_OR_RETURN(std::vector<std::uint64_t> ids, ExactIds(xk));
  bool new_exact = ids.empty();
  ids.push_back(id);
  SetIndexValue(xk, EncodeIds(ids));
  if (new_exact) {
    // A new (length, hash) under this node: count it in the node's slot.
    PC_ASSIGN_OR_RETURN(std::vector<NodeSlot> slots, NodeSlots(nk));
    auto it = std::lower_bound(slots.begin(), slots.end(), r,
                               [](const NodeSlot& s, std::uint32_t v) { return s.r < v; });
    if (it != slots.end() && it->r == r) {
      ++it->count;
    } else {
      slots.insert(it, NodeSlot{r, 1});
    }
    SetIndexValue(nk, EncodeNode(slots));
  }
  batch_.Put(s_.cf_index, MemberKey(scope, id), "");
  return Status::Ok();
}

Status Txn::IndexRemove(std::uint64_t scope, std::uint64_t length, const BoundaryPlace& place, EntryId id) {
  const IndexPlace at = PlaceInIndex(scope, length, place, s_.params.block_tokens);
  const std::string& nk = at.node_key;
  const std::string& xk = at.exact_key;
  const std::uint32_t r = at.r;
  PC_ASSIGN_OR_RETURN(std::vector<std::uint64_t> ids, ExactIds(xk));
  auto pos = std::find(ids.begin(), ids.end(), id);
  if (pos == ids.end()) {
    return Status::Corruption("index has no exact record for entry " + std::to_string(id));
  }
  ids.erase(pos);
  if (ids.empty()) {
    SetIndexValue(xk, std::nullopt);
    PC_ASSIGN_OR_RETURN(std::vector<NodeSlot> slots, NodeSlots(nk));
    auto it = std::find_if(slots.begin(), slots.end(), [&](const NodeSlot& s) { return s.r == r; });
    if (it == slots.end())
      return Status::Corruption("index node lacks the slot of entry " + std::to_string(id));
    if (--it->count == 0) slots.erase(it);
    SetIndexValue(nk, slots.empty() ? std::nullopt : std::optional<std::string>(EncodeNode(slots)));
  } else {
    SetIndexValue(xk, EncodeIds(ids));
  }
  batch_.Delete(s_.cf_index, MemberKey(scope, id));
  return Status::Ok();
}

// ---- scopes -------------------------------------------------------------------------------

Result<std::uint64_t> Txn::ScopeFor(const Hash128& model, std::string_view model_name, std::string_view ns,
                                    std::string_view descriptor) {
  for (const auto& sc : new_scopes_) {
    if (sc.digest == model && sc.ns == ns) return sc.id;
  }
  if (auto id = s_.FindScope(model, ns)) {
    std::optional<ScopeRecord> rec = s_.ScopeById(*id);
    if (descriptor.empty() || !rec.has_value() || !rec->descriptor.empty()) return *id;
    rec->descriptor = std::string(descriptor);
    batch_.Put(s_.cf_meta, ScopeByIdKey(rec->id), EncodeScope(*rec));
    new_scopes_.push_back(std::move(*rec));
    return *id;
  }
  ScopeRecord rec;
  rec.id = c_.next_scope_id++;
  rec.digest = model;
  rec.model_name = std::string(model_name.substr(0, StoreLimits::kMaxModelNameBytes));
  rec.ns = std::string(ns);
  rec.descriptor = std::string(descriptor);
  std::string id_value;
  PutLE64(&id_value, rec.id);
  batch_.Put(s_.cf_meta, ScopeByNameKey(rec.digest, rec.ns), id_value);
  batch_.Put(s_.cf_meta, ScopeByIdKey(rec.id), EncodeScope(rec));
  new_scopes_.push_back(rec);
  return rec.id;
}

// ---- removal --------------------------------------------------------------------------------

Result<bool> Txn::RemoveEntry(EntryId id, const std::optional<std::string>& quarantine_reason) {
  if (removed_.count(id) != 0) return false;
  std::string sv;
  bool found = false;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_entries, IdKey(id), &sv, &found));
  if (!found) return false;
  auto summary = DecodeSummary(sv);
  if (!summary.ok()) {
    // Without its record the entry cannot be unlinked piece by piece; the
    // references are rebuilt from the manifests that remain.
    return summary.status();
  }
  const EntrySummary& s = *summary;
  const std::string key = IdKey(id);

  std::string mv;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_manifests, key, &mv, &found));
  bool refs_released = false;
  if (found) {
    auto manifest = DecodeManifest(mv, StoreLimits::kMaxChunkBytes);
    if (manifest.ok()) {
      std::unordered_map<Hash128, std::uint64_t, Hash128Hasher> counts;
      for (const auto& layer : manifest->layers) {
        for (const auto& c : layer.chunks) ++counts[c.address];
      }
      for (const auto& [h, n] : counts) PC_RETURN_IF_ERROR(DropRefs(h, n));
      refs_released = true;
    } else if (!quarantine_reason) {
      return manifest.status().WithContext("entry " + std::to_string(id));
    }
  }
  if (!refs_released && !quarantine_reason) {
    return Status::Corruption("entry " + std::to_string(id) + " has no manifest");
  }

  PC_RETURN_IF_ERROR(
      IndexRemove(s.scope, s.length,
                  BoundaryPlace{(s.length - 1) / s_.params.block_tokens, s.node_hash, s.exact_hash}, id));
  // Its pass records go with it: found from its tokens, or, when those
  // cannot be read (a damaged record, quarantined), by a scan of its scope's.
  std::string tv;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_tokens, key, &tv, &found));
  auto tokens = found ? DecodeTokens(tv) : Result<std::vector<std::uint32_t>>(Status::NotFound("no tokens"));
  if (tokens.ok()) {
    for (const std::string& k : PassKeys(*s_.hasher, s.scope, *tokens, id)) batch_.Delete(s_.cf_index, k);
  } else {
    PC_RETURN_IF_ERROR(DeletePassRecordsByScan(s.scope, id));
  }
  PC_RETURN_IF_ERROR(DeleteEntryRecords(id, /*tolerate_bad_access=*/false));
  --c_.entries;
  c_.logical_chunk_bytes -= s.chunk_bytes;
  c_.meta_bytes -= s.meta_bytes;
  c_.raw_bytes -= s.raw_bytes;
  if (quarantine_reason) {
    QuarantineRecord q;
    q.summary = s;
    q.when_unix_ms = NowUnixMs();
    q.reason = *quarantine_reason;
    batch_.Put(s_.cf_quarantine, key, EncodeQuarantine(q));
    ++c_.quarantined;
    if (!refs_released) needs_rebuild_ = true;
  }
  removed_.insert(id);
  return true;
}

Status Txn::DeletePassRecordsByScan(std::uint64_t scope, EntryId id) {
  std::string prefix(1, kPassTag);
  PutBE64(&prefix, scope);
  std::unique_ptr<rocksdb::Iterator> it(s_.db->NewIterator(rocksdb::ReadOptions(), s_.cf_index));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (k.size() == 33 && GetBE64(k.data() + 25) == id) batch_.Delete(s_.cf_index, k);
  }
  return FromRocks(it->status(), "scan pass records");
}

Status Txn::DeleteEntryRecords(EntryId id, bool tolerate_bad_access) {
  std::string av;
  bool found = false;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_lru, AccessKey(id), &av, &found));
  if (found) {
    auto a = DecodeAccess(av);
    if (a.ok()) {
      batch_.Delete(s_.cf_lru, AgeKey(a->tick, id));
    } else if (!tolerate_bad_access) {
      return a.status();
    }
    batch_.Delete(s_.cf_lru, AccessKey(id));
  }
  const std::string key = IdKey(id);
  for (auto* cf : {s_.cf_entries, s_.cf_manifests, s_.cf_tokens}) batch_.Delete(cf, key);
  return Status::Ok();
}

// ---- commit ------------------------------------------------------------------------------------

Status Txn::Commit(const rocksdb::WriteOptions& wo, const char* kill_before, const char* kill_after) {
  // Reference records; a chunk that lost its last reference loses its
  // record, and its bytes are dead space in their segment until gc.
  for (auto& [h, st] : refs_) {
    if (st.rec.refs > 0) {
      if (!st.loaded_present || !(st.rec == st.loaded)) batch_.Put(s_.cf_chunk_refs, HashKey(h), EncodeChunkRef(st.rec));
    } else if (st.loaded_present) {
      batch_.Delete(s_.cf_chunk_refs, HashKey(h));
      dropped_bytes_ += st.rec.size;
    }
  }
  PC_RETURN_IF_ERROR(ApplySegments());
  for (auto& [k, v] : index_) {
    if (v) {
      batch_.Put(s_.cf_index, k, *v);
    } else {
      batch_.Delete(s_.cf_index, k);
    }
  }
  c_.hits = s_.hits;
  c_.misses = s_.misses;
  c_.admission_refusals = s_.refusals;
  batch_.Put(s_.cf_meta, std::string(kMetaCountersKey), EncodeCounters(c_));

  TEST_KILL_POINT(kill_before);
  PC_RETURN_IF_ERROR(s_.Write(wo, &batch_, "commit"));
  TEST_KILL_POINT(kill_after);

  s_.counters = c_;
  s_.PublishCounters(c_);
  for (auto& [id, rec] : segs_) {
    if (rec) {
      s_.segments[id] = *rec;
    } else {
      s_.segments.erase(id);
    }
  }
  // Dead bytes (an entry removed or evicted) come back when gc rewrites
  // their segment: the same reclaim as for aborted publishes, or churn under
  // a byte budget grows the directory without bound.
  if (dropped_bytes_ > 0) s_.NoteDropped(dropped_bytes_);
  if (!filter_base_.empty()) {
    MutexLock gn(&s_.node_filter.mu);
    MutexLock gx(&s_.exact_filter.mu);
    for (const auto& [key, base] : filter_base_) {
      const bool node = key[0] == kNodeTag;
      std::uint64_t after = node ? SlotTotal(index_[key], s_.params.block_tokens) : IdCount(index_[key]);
      if (after == base || key.size() != 25) continue;
      NodeFilter& filter = node ? s_.node_filter : s_.exact_filter;
      filter.mu.AssertHeld();  // both are held (above)
      filter.Adjust(
          NodeFilter::Fingerprint(GetBE64(key.data() + 1), GetBE64(key.data() + 9), GetBE64(key.data() + 17)),
          static_cast<std::int64_t>(after) - static_cast<std::int64_t>(base));
    }
  }
  if (!new_scopes_.empty()) {
    MutexLock g(&s_.scope_mu);
    for (auto& sc : new_scopes_) {
      s_.scope_by_name[ScopeByNameKey(sc.digest, sc.ns)] = sc.id;
      s_.scopes[sc.id] = sc;
    }
  }
  return Status::Ok();
}

}  // namespace primecache::statestore_internal

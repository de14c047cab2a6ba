// Verify: recompute what the entries imply and compare it with what the
// store records. RebuildDerived: rewrite what disagrees.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <unordered_set>
#include <map>
#include <set>

#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

struct Expected {
  std::map<std::string, ChunkRefRecord> refs;  // HashKey -> refs, size
  std::map<std::string, std::string> index;    // index key -> value
  Counters counters;                           // entries .. raw_bytes, next ids
  std::vector<std::string> problems;  // the first 1000
  std::uint64_t problem_count = 0;    // all of them
  std::map<EntryId, std::uint64_t> access_ticks;  // from the E records of live entries
  std::vector<EntryId> live;
};

void Problem(Expected* e, std::string p) {
  ++e->problem_count;
  if (e->problems.size() < 1000) e->problems.push_back(std::move(p));
}

// One live entry's records, decoded.
struct EntryRecords {
  EntryId id = 0;
  EntrySummary sum;
  Manifest manifest;
  std::vector<std::uint32_t> tokens;
  std::uint64_t record_bytes = 0;  // the entry, manifest and tokens records, encoded
};

// What the index must hold, gathered entry by entry.
struct IndexTally {
  std::map<std::string, std::map<std::uint32_t, std::uint32_t>> nodes;  // key -> r -> count
  std::map<std::string, std::vector<std::uint64_t>> exacts;
};

std::string Where(EntryId id) {
  return "entry " + std::to_string(id) + ": ";
}

// Entry `id`'s records (`value` is its entry record); nullopt, with the
// problem noted, when one is missing or unreadable.
Result<std::optional<EntryRecords>> ReadEntry(LocalStore::Impl& s, const rocksdb::ReadOptions& ro, EntryId id,
                                              std::string_view value, Expected* e) {
  const std::string where = Where(id);
  const std::optional<EntryRecords> none;
  auto sum = DecodeSummary(value);
  if (!sum.ok()) {
    Problem(e, where + sum.status().ToString());
    return none;
  }
  if (!s.ScopeById(sum->scope)) Problem(e, where + "unknown scope");
  std::string mv, tv;
  bool found = false;
  PC_RETURN_IF_ERROR(s.GetValue(s.cf_manifests, IdKey(id), &mv, &found, ro));
  if (!found) {
    Problem(e, where + "no manifest");
    return none;
  }
  auto m = DecodeManifest(mv, StoreLimits::kMaxChunkBytes);
  if (!m.ok()) {
    Problem(e, where + m.status().ToString());
    return none;
  }
  PC_RETURN_IF_ERROR(s.GetValue(s.cf_tokens, IdKey(id), &tv, &found, ro));
  if (!found) {
    Problem(e, where + "no tokens");
    return none;
  }
  auto tokens = DecodeTokens(tv);
  if (!tokens.ok()) {
    Problem(e, where + tokens.status().ToString());
    return none;
  }
  return std::optional<EntryRecords>(
      EntryRecords{id, *sum, std::move(*m), std::move(*tokens), mv.size() + tv.size() + value.size()});
}

// Adds the chunk references of entry `r` and checks its record against its
// manifest and tokens.
void TallyChunks(const EntryRecords& r, Expected* e) {
  const std::string where = Where(r.id);
  std::uint64_t chunk_bytes = 0;
  for (const auto& layer : r.manifest.layers) {
    for (const auto& c : layer.chunks) {
      auto& ref = e->refs[HashKey(c.address)];
      if (ref.refs > 0 && ref.size != c.size) Problem(e, where + "chunk " + HashHex(c.address) + " with two sizes");
      ++ref.refs;
      ref.size = c.size;
      chunk_bytes += c.size;
    }
  }
  const EntrySummary& sum = r.sum;
  if (r.manifest.layers.size() != sum.layers) Problem(e, where + "layer count disagrees with its record");
  if (chunk_bytes != sum.chunk_bytes) Problem(e, where + "chunk bytes disagree with its record");
  if (r.tokens.size() != sum.length) Problem(e, where + "token count disagrees with its length");
  if (sum.meta_bytes != r.record_bytes) Problem(e, where + "meta bytes disagree with its records");
}

// Adds what entry `r` implies for the index, recency and counters.
Status TallyEntry(LocalStore::Impl& s, const rocksdb::ReadOptions& ro, const EntryRecords& r, IndexTally* t,
                  Expected* e) {
  const std::string where = Where(r.id);
  const EntrySummary& sum = r.sum;
  const std::uint32_t block = s.params.block_tokens;
  BoundaryPlace place = PlaceOf(*s.hasher, r.tokens, block);
  if (place.node_hash != sum.node_hash || place.exact_hash != sum.exact_hash) {
    Problem(e, where + "index hashes disagree with its tokens");
  }
  auto slot = static_cast<std::uint32_t>(sum.length - place.level * block);
  auto& ids = t->exacts[ExactKey(sum.scope, sum.length, place.exact_hash)];
  if (ids.empty()) ++t->nodes[NodeKey(sum.scope, place.level, place.node_hash)][slot];
  ids.push_back(r.id);
  e->index[MemberKey(sum.scope, r.id)] = "";
  if (s.pass_index) {
    for (const std::string& k : PassKeys(*s.hasher, sum.scope, r.tokens, r.id)) e->index[k] = "";
  }
  std::string av;
  bool found = false;
  PC_RETURN_IF_ERROR(s.GetValue(s.cf_lru, AccessKey(r.id), &av, &found, ro));
  if (!found) {
    Problem(e, where + "no access record");
  } else if (auto a = DecodeAccess(av); a.ok()) {
    e->access_ticks[r.id] = a->tick;
  } else {
    Problem(e, where + a.status().ToString());
  }
  ++e->counters.entries;
  e->counters.logical_chunk_bytes += sum.chunk_bytes;
  e->counters.meta_bytes += sum.meta_bytes;
  e->counters.raw_bytes += sum.raw_bytes;
  return Status::Ok();
}

// The index values and chunk totals the tallies add up to.
void Conclude(IndexTally& t, Expected* e) {
  for (auto& [k, slots] : t.nodes) {
    std::vector<NodeSlot> v;
    for (auto& [r, n] : slots) v.push_back({r, n});
    e->index[k] = EncodeNode(v);
  }
  for (auto& [k, ids] : t.exacts) {
    std::sort(ids.begin(), ids.end());
    e->index[k] = EncodeIds(ids);
  }
  for (auto& [h, r] : e->refs) {
    ++e->counters.chunks;
    e->counters.chunk_bytes += r.size;
  }
}

// Reads every live entry and derives references, index and counters.
Status Derive(LocalStore::Impl& s, const rocksdb::ReadOptions& ro, Expected* e) {
  IndexTally tally;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(ro, s.cf_entries));
  std::uint64_t max_id = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto id = IdFromKey(it->key().ToStringView());
    if (!id.ok()) {
      Problem(e, "entries: malformed key");
      continue;
    }
    max_id = std::max(max_id, *id);
    PC_ASSIGN_OR_RETURN(std::optional<EntryRecords> r, ReadEntry(s, ro, *id, it->value().ToStringView(), e));
    if (!r) continue;
    e->live.push_back(*id);
    TallyChunks(*r, e);
    PC_RETURN_IF_ERROR(TallyEntry(s, ro, *r, &tally, e));
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan entries"));
  Conclude(tally, e);
  e->counters.next_entry_id = max_id + 1;
  return Status::Ok();
}

std::string Canonical(const std::string& key, const std::string& value) {
  // Id lists compare as sets.
  if (!key.empty() && key[0] == kExactTag) {
    auto ids = DecodeIds(value);
    if (ids.ok()) {
      std::sort(ids->begin(), ids->end());
      return EncodeIds(*ids);
    }
  }
  return value;
}

// Where the reference records place live chunks: each segment's frame bytes,
// and every placed chunk with its record.
struct Placement {
  std::map<std::uint64_t, std::uint64_t> live;  // segment -> frame bytes recorded in it
  std::vector<std::pair<Hash128, ChunkRefRecord>> placed;
};

// The reference records against the references the entries hold.
Status CheckChunkRefs(LocalStore::Impl& s, const rocksdb::ReadOptions& ro, Expected* e, Placement* p) {
  std::set<std::string> seen;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(ro, s.cf_chunk_refs));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    std::string k = it->key().ToString();
    std::string name = k.size() == 16 ? HashHex(HashFromKey(k)) : "(malformed)";
    auto r = DecodeChunkRef(it->value().ToStringView());
    auto want = e->refs.find(k);
    if (!r.ok()) {
      Problem(e, "chunk " + name + ": " + r.status().ToString());
    } else if (want == e->refs.end()) {
      Problem(e, "chunk " + name + ": " + std::to_string(r->refs) + " references recorded, none by any entry");
    } else if (r->refs != want->second.refs || r->size != want->second.size) {
      Problem(e, "chunk " + name + ": " + std::to_string(r->refs) + " references recorded, " +
                     std::to_string(want->second.refs) + " held by entries");
    }
    if (r.ok() && !r->placed) Problem(e, "chunk " + name + ": not migrated to a segment");
    if (r.ok() && r->placed && r->segment == 0) Problem(e, "chunk " + name + ": its bytes are lost");
    if (r.ok() && r->placed && r->segment != 0 && k.size() == 16) {
      p->live[r->segment] += FrameBytes(r->size);
      p->placed.emplace_back(HashFromKey(k), *r);
    }
    seen.insert(k);
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan chunk references"));
  for (auto& [k, r] : e->refs) {
    if (seen.count(k) == 0) Problem(e, "chunk " + HashHex(HashFromKey(k)) + ": referenced but has no record");
  }
  return Status::Ok();
}

// The index records against those the entries imply.
Status CheckIndex(LocalStore::Impl& s, const rocksdb::ReadOptions& ro, Expected* e) {
  std::set<std::string> index_seen;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(ro, s.cf_index));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    std::string k = it->key().ToString();
    auto want = e->index.find(k);
    if (want == e->index.end()) {
      Problem(e, std::string("index: record '") + k[0] + "' that no entry implies");
    } else if (Canonical(k, it->value().ToString()) != want->second) {
      Problem(e, std::string("index: record '") + k[0] + "' disagrees with the entries");
    }
    index_seen.insert(k);
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan index"));
  for (auto& [k, v] : e->index) {
    if (index_seen.count(k) == 0) Problem(e, std::string("index: record '") + k[0] + "' missing");
  }
  return Status::Ok();
}

// The recency records: one age and one access record per live entry, the
// age record at the access record's tick.
Status CheckRecency(LocalStore::Impl& s, const rocksdb::ReadOptions& ro, Expected* e) {
  std::map<EntryId, std::uint64_t> ages;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(ro, s.cf_lru));
  std::uint64_t access_records = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto k = it->key().ToStringView();
    if (k.size() == 17 && k[0] == kAgeTag) {
      EntryId id = GetBE64(k.data() + 9);
      if (!ages.emplace(id, GetBE64(k.data() + 1)).second) Problem(e, "recency: two age records for one entry");
    } else if (k.size() == 9 && k[0] == kAccessTag) {
      ++access_records;
    } else {
      Problem(e, "recency: malformed key");
    }
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan recency"));
  if (access_records != e->access_ticks.size()) Problem(e, "recency: access records of entries that are gone");
  for (auto& [id, tick] : e->access_ticks) {
    auto a = ages.find(id);
    if (a == ages.end() || a->second != tick) Problem(e, "entry " + std::to_string(id) + ": age record missing");
  }
  if (ages.size() != e->access_ticks.size()) Problem(e, "recency: age records of entries that are gone");
  return Status::Ok();
}

// The stored counters against the entries and the quarantine, and against
// `mem`, the store's counters when the snapshot was taken.
Status CheckCounters(LocalStore::Impl& s, const rocksdb::ReadOptions& ro, Counters mem, Expected* e) {
  std::uint64_t quarantined = 0;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(ro, s.cf_quarantine));
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++quarantined;
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan quarantine"));
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(s.GetValue(s.cf_meta, std::string(kMetaCountersKey), &v, &found, ro));
  if (!found) {
    Problem(e, "no counters record");
    return Status::Ok();
  }
  auto c = DecodeCounters(v);
  if (!c.ok()) {
    Problem(e, c.status().ToString());
    return Status::Ok();
  }
  auto check = [&](const char* name, std::uint64_t got, std::uint64_t want) {
    if (got != want) {
      Problem(e, std::string("counter ") + name + " is " + std::to_string(got) + ", entries imply " +
                     std::to_string(want));
    }
  };
  check("entries", c->entries, e->counters.entries);
  check("chunks", c->chunks, e->counters.chunks);
  check("chunk_bytes", c->chunk_bytes, e->counters.chunk_bytes);
  check("logical_chunk_bytes", c->logical_chunk_bytes, e->counters.logical_chunk_bytes);
  check("meta_bytes", c->meta_bytes, e->counters.meta_bytes);
  check("raw_bytes", c->raw_bytes, e->counters.raw_bytes);
  check("quarantined", c->quarantined, quarantined);
  if (c->next_entry_id < e->counters.next_entry_id) Problem(e, "counter next_entry_id is behind the entries");
  if (!(*c == mem)) {
    // Hits, misses and refusals are saved only at close: not compared.
    mem.hits = c->hits;
    mem.misses = c->misses;
    mem.admission_refusals = c->admission_refusals;
    if (!(mem == *c)) Problem(e, "counters in memory differ from the stored ones");
  }
  return Status::Ok();
}

}  // namespace

Result<StoreCheckReport> LocalStore::Impl::CheckStore(bool read_chunks) {
  // Every metadata change is one batch under write_mu, so a snapshot taken
  // under it is consistent; the checks then read that snapshot while
  // publishes, deletes and evictions go on. Segment gc waits: a segment it
  // dropped after the snapshot would read as missing.
  MutexLock gc(&gc_mu);
  Counters mem;
  const rocksdb::Snapshot* snapshot = nullptr;
  {
    MutexLock wl(&write_mu);
    if (!opts.read_only) PC_RETURN_IF_ERROR(FlushTouches());
    snapshot = db->GetSnapshot();
    mem = counters;
  }
  std::unique_ptr<const rocksdb::Snapshot, std::function<void(const rocksdb::Snapshot*)>> release(
      snapshot, [this](const rocksdb::Snapshot* x) { db->ReleaseSnapshot(x); });
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot;
  ro.fill_cache = false;  // one pass over everything must not evict what lookups use
  Expected e;
  PC_RETURN_IF_ERROR(Derive(*this, ro, &e));
  StoreCheckReport report;
  report.entries = e.live.size();
  report.chunks = e.refs.size();

  Placement p;
  PC_RETURN_IF_ERROR(CheckChunkRefs(*this, ro, &e, &p));
  PC_RETURN_IF_ERROR(
      VerifySegments(ro, p.live, p.placed, read_chunks, [&](std::string x) { Problem(&e, std::move(x)); }));
  PC_RETURN_IF_ERROR(CheckIndex(*this, ro, &e));
  PC_RETURN_IF_ERROR(CheckRecency(*this, ro, &e));
  PC_RETURN_IF_ERROR(CheckCounters(*this, ro, mem, &e));
  report.problems = std::move(e.problems);
  report.problem_count = e.problem_count;
  return report;
}

// Segment records against the chunk records (live bytes, extents within the
// committed length) and their files (present, long enough); with
// read_chunks, every chunk's bytes against its address. The chunks column
// family of a schema-3 store is empty.
Status LocalStore::Impl::VerifySegments(const rocksdb::ReadOptions& ro, const std::map<std::uint64_t, std::uint64_t>& live,
                                   const std::vector<std::pair<Hash128, ChunkRefRecord>>& placed, bool read_chunks,
                                   const std::function<void(std::string)>& problem) {
  std::map<std::uint64_t, SegmentRecord> recs;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, cf_segments));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto id = IdFromKey(it->key().ToStringView());
    auto rec = DecodeSegment(it->value().ToStringView());
    if (!id.ok() || !rec.ok()) {
      problem("segments: a malformed record");
      continue;
    }
    recs[*id] = *rec;
    auto l = live.find(*id);
    const std::uint64_t want = l == live.end() ? 0 : l->second;
    if (rec->live != want) {
      problem("segment " + SegmentHex(*id) + ": " + std::to_string(rec->live) + " live bytes recorded, chunks hold " +
              std::to_string(want));
    }
    auto size = env->GetFileSize(seg_dir + "/" + SegmentFileName(*id));
    if (!size.ok()) {
      problem("segment " + SegmentHex(*id) + ": its file is missing");
    } else if (*size < rec->committed) {
      problem("segment " + SegmentHex(*id) + ": its file holds " + std::to_string(*size) + " bytes, fewer than the " +
              std::to_string(rec->committed) + " committed");
    }
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan segments"));
  for (const auto& [h, r] : placed) {
    auto rec = recs.find(r.segment);
    const std::string name = "chunk " + HashHex(h);
    if (rec == recs.end()) {
      problem(name + ": in segment " + SegmentHex(r.segment) + ", which has no record");
    } else if (r.offset < kSegmentHeaderBytes + kFrameHeaderBytes || r.offset + r.size > rec->second.committed) {
      problem(name + ": its extent lies outside segment " + SegmentHex(r.segment) + "'s committed bytes");
    } else if (read_chunks) {
      std::vector<std::byte> buf(r.size);
      auto file = SegmentFile(r.segment);
      Status rs = file.ok() ? ReadExtent(*file, {r.segment, r.offset}, h, buf) : file.status();
      if (!rs.ok()) problem(name + ": " + rs.ToString());
    }
  }
  if (stored_schema >= kFirstSegmentSchema) {
    std::unique_ptr<rocksdb::Iterator> ci(db->NewIterator(ro, cf_chunks));
    ci->SeekToFirst();
    if (ci->Valid()) problem("chunks: records left in a schema-3 store");
    PC_RETURN_IF_ERROR(FromRocks(ci->status(), "scan chunks"));
  }
  return Status::Ok();
}

Status LocalStore::Impl::RebuildDerived() {
  Expected e;
  PC_RETURN_IF_ERROR(Derive(*this, rocksdb::ReadOptions(), &e));
  rocksdb::WriteBatch b;
  PC_RETURN_IF_ERROR(RebuildRefs(e.refs, &b));
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_index));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (e.index.count(it->key().ToString()) == 0) b.Delete(cf_index, it->key());
    }
    PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan index"));
    for (auto& [k, v] : e.index) b.Put(cf_index, k, v);
  }
  Counters c = counters;
  c.entries = e.counters.entries;
  c.chunks = e.counters.chunks;
  c.chunk_bytes = e.counters.chunk_bytes;
  c.logical_chunk_bytes = e.counters.logical_chunk_bytes;
  c.meta_bytes = e.counters.meta_bytes;
  c.raw_bytes = e.counters.raw_bytes;
  c.next_entry_id = std::max(c.next_entry_id, e.counters.next_entry_id);
  b.Put(cf_meta, std::string(kMetaCountersKey), EncodeCounters(c));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  PC_RETURN_IF_ERROR(Write(wo, &b, "rebuild derived records"));
  counters = c;
  PublishCounters(c);
  PC_RETURN_IF_ERROR(LoadSegments());
  PC_RETURN_IF_ERROR(LoadFilters());
  spdlog::warn("statestore {}: rebuilt chunk references, index and counters from {} entries", path,
               e.live.size());
  return Status::Ok();
}

// The reference records the entries imply, keeping each surviving chunk's
// extent and flags (a referenced chunk with no record has lost its bytes),
// and every segment's live bytes recomputed from them.
Status LocalStore::Impl::RebuildRefs(std::map<std::string, ChunkRefRecord>& want, rocksdb::WriteBatch* b) {
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_chunk_refs));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    std::string k = it->key().ToString();
    auto w = want.find(k);
    auto r = DecodeChunkRef(it->value().ToStringView());
    if (w == want.end() || !r.ok()) {
      b->Delete(cf_chunk_refs, k);
      continue;
    }
    const std::uint64_t refs = w->second.refs, size = w->second.size;
    w->second = *r;
    w->second.refs = refs;
    w->second.size = size;
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan chunk references"));
  std::map<std::uint64_t, std::uint64_t> live;
  for (auto& [k, r] : want) {
    if (!r.placed) {  // no record: the bytes are nowhere
      r.placed = true;
      r.segment = 0;
      r.flags |= kChunkCorrupt;
    }
    if (r.segment != 0) live[r.segment] += FrameBytes(r.size);
    b->Put(cf_chunk_refs, k, EncodeChunkRef(r));
  }
  for (auto [id, rec] : segments) {
    auto l = live.find(id);
    rec.live = std::min(rec.committed, l == live.end() ? 0 : l->second);
    b->Put(cf_segments, IdKey(id), EncodeSegment(rec));
  }
  return Status::Ok();
}

}  // namespace primecache

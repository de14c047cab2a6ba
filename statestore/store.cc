// The store's shared machinery: metadata writes and what follows a failed
// one, scopes, counters and statistics, admission sightings, and deletion.
// The other topics have files of their own: store_open.cc (open, close),
// publish.cc, read.cc (lookup), fetch.cc, list.cc, leases.cc, recency.cc
// (recency, eviction), txn.cc (metadata batches), verify.cc, and the segment
// files (segment_store.cc, segment_gc.cc).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string_view>
#include <utility>

#include "statestore/group.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace statestore_internal {
std::uint64_t NowUnixMs() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}
}  // namespace statestore_internal

// ---- misc public helpers -----------------------------------------------------------

double EstimatePrefillFlops(const ModelCost& cost, std::uint64_t tokens) {
  double l = static_cast<double>(tokens);
  if (cost.flops_per_token == 0 && cost.attention_layers == 0) return l;
  return l * static_cast<double>(cost.flops_per_token) +
         static_cast<double>(cost.attention_layers) * static_cast<double>(cost.attention_flops_per_pair) * l *
             (l + 1) / 2;
}

namespace {
constexpr std::pair<EvictionPolicy, std::string_view> kEvictionNames[] = {
    {EvictionPolicy::kLru, "lru"}, {EvictionPolicy::kUtility, "utility"}, {EvictionPolicy::kMarginal, "marginal"}};
}  // namespace

Status ParseEvictionPolicy(std::string_view name, EvictionOptions* options) {
  for (const auto& [policy, n] : kEvictionNames) {
    if (n == name) {
      options->policy = policy;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("eviction policy must be lru, utility or marginal, not '" + std::string(name) + "'");
}

std::string_view EvictionPolicyName(EvictionPolicy policy) {
  for (const auto& [p, n] : kEvictionNames) {
    if (p == policy) return n;
  }
  return "unknown";
}

Status ParseAdmission(std::string_view name, EvictionOptions* options) {
  if (name == "all" || name == "seen-twice") {
    options->admission = AdmissionPolicy::kAll;
    options->admit_after_sightings = name == "all" ? 1 : 2;
  } else if (name == "reuse") {
    options->admission = AdmissionPolicy::kReuse;
    options->admit_after_sightings = 1;
  } else {
    return Status::InvalidArgument("admission must be all, seen-twice or reuse, not '" + std::string(name) + "'");
  }
  return Status::Ok();
}

std::string_view AdmissionName(const EvictionOptions& options) {
  if (options.admission == AdmissionPolicy::kReuse) return "reuse";
  return options.admit_after_sightings > 1 ? "seen-twice" : "all";
}

// ---- writes and write errors ---------------------------------------------------------

rocksdb::WriteOptions LocalStore::Impl::CommitWriteOptions() const {
  rocksdb::WriteOptions wo;
  wo.sync = opts.sync_commits;
  return wo;
}

Status LocalStore::Impl::Write(const rocksdb::WriteOptions& wo, rocksdb::WriteBatch* batch,
                          std::string_view what) {
  PC_RETURN_IF_ERROR(Writable());
  PC_RETURN_IF_ERROR(Recover());
  return AfterWriteError(FromRocks(db->Write(wo, batch), what));
}

Status LocalStore::Impl::Writable() const {
  if (opts.read_only) return Status::FailedPrecondition("the store at " + path + " is open read-only");
  return Status::Ok();
}

Status LocalStore::Impl::AfterWriteError(const Status& s) {
  if (s.ok() || (frozen && frozen->load())) return s;
  if (s.code() != StatusCode::kIOError && s.code() != StatusCode::kResourceExhausted &&
      s.code() != StatusCode::kCorruption) {
    return s;
  }
  {
    MutexLock g(&recover_mu);
    if (!stopped.load()) stop_cause = s;
    stopped.store(true);
  }
  // Often RocksDB can go on at once (the failure left nothing to redo).
  const bool still_stopped = !Recover().ok();
  if (s.code() != StatusCode::kResourceExhausted) return s;
  return Status::ResourceExhausted(
      "no space left on the disk of the store at " + path + " (" + s.message() +
      (still_stopped ? "); writes are refused until space is freed, reads go on" : ")"));
}

Status LocalStore::Impl::Recover() {
  if (!stopped.load()) return Status::Ok();
  MutexLock g(&recover_mu);
  if (!fatal.ok()) return fatal;
  if (!stopped.load()) return Status::Ok();
  rocksdb::Status r = db->Resume();
  if (r.ok()) {
    stopped.store(false);
    spdlog::info("statestore {}: writes resumed after: {}", path, stop_cause.ToString());
    return Status::Ok();
  }
  if (r.severity() >= rocksdb::Status::Severity::kFatalError) {
    spdlog::error(
        "statestore {}: RocksDB cannot resume after {} ({}); writes are refused until the store is "
        "reopened",
        path, stop_cause.ToString(), r.ToString());
    fatal = Status::Unavailable("the store must be reopened after a failed write (" + stop_cause.ToString() +
                                ")");
    return fatal;
  }
  Status why = FromRocks(r, "resume writes");
  if (why.code() == StatusCode::kResourceExhausted || stop_cause.code() == StatusCode::kResourceExhausted) {
    return Status::ResourceExhausted(
        "the disk of the store at " + path +
        " is full: writes are refused until space is freed (reads go on): " + why.message());
  }
  return Status::Unavailable("writes to the store at " + path +
                             " are refused until a failed write is redone: " + why.message());
}

// ---- scopes --------------------------------------------------------------------------

std::optional<std::uint64_t> LocalStore::Impl::FindScope(const Hash128& digest, std::string_view ns) const {
  ReaderLock g(&scope_mu);
  auto it = scope_by_name.find(ScopeByNameKey(digest, ns));
  if (it == scope_by_name.end()) return std::nullopt;
  return it->second;
}

std::optional<ScopeRecord> LocalStore::Impl::ScopeById(std::uint64_t id) const {
  ReaderLock g(&scope_mu);
  auto it = scopes.find(id);
  if (it == scopes.end()) return std::nullopt;
  return it->second;
}

// ---- counters and stats --------------------------------------------------------------

void LocalStore::Impl::PublishCounters(const Counters& c) {
  MutexLock g(&stats_mu);
  stats_copy = c;
}

LocalStore::Impl::Counters LocalStore::Impl::WithLiveStats(Counters c) const {
  c.hits = hits;
  c.misses = misses;
  c.admission_refusals = refusals;
  return c;
}

Result<StoreStats> LocalStore::Stat() {
  Impl::Counters c;
  {
    MutexLock g(&impl_->stats_mu);
    c = impl_->stats_copy;
  }
  StoreStats st;
  st.entries = c.entries;
  st.quarantined = c.quarantined;
  st.chunks = c.chunks;
  st.stored_bytes = impl_->StoredBytes(c);
  st.logical_bytes = c.logical_chunk_bytes + c.meta_bytes;
  st.raw_bytes = c.raw_bytes;
  st.dedup_saved_bytes = c.logical_chunk_bytes >= c.chunk_bytes ? c.logical_chunk_bytes - c.chunk_bytes : 0;
  st.hits = impl_->hits;
  st.misses = impl_->misses;
  st.evictions = c.evictions;
  st.admission_refusals = impl_->refusals;
  {
    MutexLock g(&impl_->leases->mu);
    st.active_leases = impl_->leases->active;
  }
  st.byte_budget = impl_->byte_budget;
  st.staged_bytes = impl_->staged_bytes.load();
  st.group_publishes_open = impl_->groups->open_groups();
  st.group_publishes_aborted = impl_->groups->aborted_groups();
  if (impl_->stopped.load()) {
    MutexLock g(&impl_->recover_mu);
    st.write_error = impl_->fatal.ok() ? impl_->stop_cause.ToString() : impl_->fatal.ToString();
  } else if (impl_->segment_full.load()) {
    MutexLock g(&impl_->recover_mu);
    st.write_error = impl_->segment_error.ToString();
  }
  // Every file of the directory: segment files, tables, the write-ahead
  // log and RocksDB's own records (files vanishing meanwhile are skipped).
  if (auto files = impl_->env->GetChildren(impl_->path); files.ok()) {
    for (const std::string& f : *files) {
      if (auto size = impl_->env->GetFileSize(impl_->path + "/" + f); size.ok()) st.disk_bytes += *size;
    }
  }
  if (auto seg = impl_->SegmentDiskBytes(); seg.ok()) st.disk_bytes += *seg;
  impl_->AddRocksMemory(&st);
  return st;
}

void LocalStore::Impl::AddRocksMemory(StoreStats* st) const {
  if (block_cache != nullptr) {
    st->block_cache_used_bytes = block_cache->GetUsage();
    st->block_cache_capacity_bytes = block_cache->GetCapacity();
  }
  if (db == nullptr) return;
  // Summed over the column families; a property RocksDB cannot give stays 0.
  std::uint64_t v = 0;
  if (db->GetAggregatedIntProperty(rocksdb::DB::Properties::kSizeAllMemTables, &v)) st->memtable_bytes = v;
  if (db->GetAggregatedIntProperty(rocksdb::DB::Properties::kEstimateTableReadersMem, &v)) {
    st->table_reader_bytes = v;
  }
}

// ---- sightings (admission) -------------------------------------------------------------

std::string LocalStore::Impl::SightingKey(const Hash128& model, std::string_view ns, std::uint64_t length,
                                     std::uint64_t exact_hash) {
  std::string k = HashKey(model);
  PutBE64(&k, length);
  PutBE64(&k, exact_hash);
  k += ns;
  return k;
}

void LocalStore::Impl::NoteSighting(const std::string& key) {
  if (opts.eviction.admit_after_sightings <= 1) return;
  MutexLock g(&sight_mu);
  auto [it, inserted] = sightings.try_emplace(key, 0);
  if (it->second < UINT32_MAX) ++it->second;
  if (inserted) {
    sighting_order.push_back(key);
    while (sighting_order.size() > std::max<std::size_t>(opts.eviction.sighting_capacity, 1)) {
      sightings.erase(sighting_order.front());
      sighting_order.pop_front();
    }
  }
}

std::uint32_t LocalStore::Impl::Sightings(const std::string& key) {
  MutexLock g(&sight_mu);
  auto it = sightings.find(key);
  return it == sightings.end() ? 0 : it->second;
}

void LocalStore::RecordSighting(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> tokens) {
  if (tokens.empty()) return;
  BoundaryPlace place = PlaceOf(*impl_->hasher, tokens, impl_->params.block_tokens);
  impl_->NoteSighting(Impl::SightingKey(model, ns, tokens.size(), place.exact_hash));
  if (impl_->opts.eviction.admission == AdmissionPolicy::kReuse) {
    const std::size_t levels = tokens.size() / Impl::kSightingBlock;
    impl_->NotePrefixSightings(model, ns, ChainHashes(*impl_->hasher, tokens, Impl::kSightingBlock, levels), levels);
  }
}

std::uint64_t LocalStore::Impl::PrefixSightingKey(const Hash128& model, std::string_view ns, std::uint64_t level,
                                             std::uint64_t h) {
  std::string k = HashKey(model);
  PutBE64(&k, level);
  k += ns;
  return Checksum64(k, h);
}

void LocalStore::Impl::NotePrefixSightings(const Hash128& model, std::string_view ns, const std::vector<std::uint64_t>& h,
                                      std::size_t levels) {
  const std::size_t cap = std::max<std::size_t>(opts.eviction.sighting_capacity, 1) * 4;
  std::vector<std::uint64_t> keys;
  keys.reserve(levels);
  for (std::size_t a = 1; a <= levels && a < h.size(); ++a) keys.push_back(PrefixSightingKey(model, ns, a, h[a]));
  MutexLock g(&sight_mu);
  for (std::uint64_t key : keys) {
    auto [it, inserted] = prefix_sightings.try_emplace(key, 0);
    if (it->second < UINT32_MAX) ++it->second;
    if (!inserted) continue;
    prefix_order.push_back(key);
    while (prefix_order.size() > cap) {
      prefix_sightings.erase(prefix_order.front());
      prefix_order.pop_front();
    }
  }
}

Status LocalStore::Impl::AdmitReused(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> tokens) {
  const std::uint32_t block = kSightingBlock;
  const std::size_t levels = tokens.size() / block;
  const double share = std::clamp(opts.eviction.admit_reuse_share, 0.0, 1.0);
  const auto need = static_cast<std::uint64_t>(std::ceil(share * static_cast<double>(tokens.size())));
  const std::size_t lowest = std::max<std::size_t>(1, (need + block - 1) / block);
  if (levels >= lowest) {
    const std::vector<std::uint64_t> h = ChainHashes(*hasher, tokens, block, levels);
    MutexLock g(&sight_mu);
    for (std::size_t a = levels; a >= lowest; --a) {
      auto it = prefix_sightings.find(PrefixSightingKey(model, ns, a, h[a]));
      if (it != prefix_sightings.end() && it->second >= 2) return Status::Ok();
    }
  }
  return Status::Aborted("not admitted: no earlier lookup shared " + std::to_string(need) + " of its " +
                         std::to_string(tokens.size()) + " tokens (admission: reuse)");
}

// ---- delete ------------------------------------------------------------------------------

Status LocalStore::Delete(EntryId id) {
  PC_RETURN_IF_ERROR(impl_->Writable());
  MutexLock wl(&impl_->write_mu);
  Txn t(*impl_);
  // A quarantined entry holds no references: only its record goes.
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_quarantine, IdKey(id), &v, &found));
  if (found) {
    t.batch().Delete(impl_->cf_quarantine, IdKey(id));
    if (t.counters().quarantined > 0) --t.counters().quarantined;
    return t.Commit(impl_->CommitWriteOptions(), "delete.before_write", "delete.after_write");
  }
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_entries, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no entry " + std::to_string(id));
  if (!t.MarkDying(id)) return Status::Unavailable("entry " + std::to_string(id) + " is leased; retry later");
  auto removed = t.RemoveEntry(id, std::nullopt);
  if (!removed.ok() && removed.status().IsCorruption()) {
    // Its records cannot be read: remove what is keyed by its id and rebuild
    // what the remaining entries imply.
    spdlog::error("statestore {}: deleting entry {}: {}", impl_->path, id, removed.status().ToString());
    return impl_->ForceRemove(id);
  }
  PC_RETURN_IF_ERROR(removed.status());
  if (!*removed) return Status::NotFound("no entry " + std::to_string(id));
  return t.Commit(impl_->CommitWriteOptions(), "delete.before_write", "delete.after_write");
}

Status LocalStore::Impl::ForceRemove(EntryId id) {
  Txn t(*this);
  PC_RETURN_IF_ERROR(t.DeleteEntryRecords(id, /*tolerate_bad_access=*/true));
  PC_RETURN_IF_ERROR(t.Commit(CommitWriteOptions(), "delete.before_write", "delete.after_write"));
  return RebuildDerived();
}

Result<StoreCheckReport> LocalStore::CheckStore(const CheckStoreOptions& options) {
  return impl_->CheckStore(options.read_chunks);
}

}  // namespace primecache

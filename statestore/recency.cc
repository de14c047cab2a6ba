// Recency and eviction: the logical clock of accesses (buffered, written in
// batches), and evicting entries (LRU, or the utility of their compute saved
// per stored byte, whole or beyond their stored parent) until the stored
// bytes fit the budget.
#include <spdlog/spdlog.h>

#include <rocksdb/perf_context.h>
#include <rocksdb/perf_level.h>

#include <algorithm>

#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"
#include "statestore/test_hooks.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

// TestHooks::victim_scan_max_skipped: raised to the deleted records this
// thread's last scan skipped; the perf context is turned off again.
void NoteSkipped(std::atomic<std::uint64_t>& max) {
  const std::uint64_t n = rocksdb::get_perf_context()->internal_delete_skipped_count;
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);
  for (std::uint64_t cur = max.load(); n > cur && !max.compare_exchange_weak(cur, n);) {
  }
}

}  // namespace

// ---- recency ---------------------------------------------------------------------------

void LocalStore::Impl::Touch(EntryId id, bool hit) {
  if (opts.read_only) return;
  bool flush = false;
  {
    MutexLock g(&touch_mu);
    auto& t = pending_touches[id];
    t.tick = clock.fetch_add(1);
    if (hit) ++t.hits;
    flush = pending_touches.size() >= 4096;
  }
  if (flush) {
    MutexLock wl(&write_mu);
    Status s = FlushTouches();
    if (!s.ok()) spdlog::warn("statestore {}: recording recency: {}", path, s.ToString());
  }
}

Status LocalStore::Impl::FlushTouches() {
  std::unordered_map<EntryId, PendingTouch> pending;
  {
    MutexLock g(&touch_mu);
    pending.swap(pending_touches);
  }
  if (pending.empty()) return Status::Ok();
  rocksdb::WriteBatch b;
  for (auto& [id, t] : pending) {
    std::string v;
    bool found = false;
    PC_RETURN_IF_ERROR(GetValue(cf_lru, AccessKey(id), &v, &found));
    if (!found) continue;  // removed meanwhile
    PC_ASSIGN_OR_RETURN(AccessRecord a, DecodeAccess(v));
    if (t.tick <= a.tick) t.tick = a.tick;
    b.Delete(cf_lru, AgeKey(a.tick, id));
    a.tick = t.tick;
    a.hits += t.hits;
    b.Put(cf_lru, AgeKey(a.tick, id), "");
    b.Put(cf_lru, AccessKey(id), EncodeAccess(a));
  }
  if (b.Count() == 0) return Status::Ok();
  return Write(rocksdb::WriteOptions(), &b, "record recency");
}

Status LocalStore::SetByteBudget(std::uint64_t bytes) {
  PC_RETURN_IF_ERROR(impl_->Writable());
  impl_->byte_budget = bytes;
  if (bytes == 0) return Status::Ok();
  MutexLock wl(&impl_->write_mu);
  PC_RETURN_IF_ERROR(impl_->FlushTouches());
  Txn t(*impl_);
  std::uint64_t evicted = 0;
  PC_RETURN_IF_ERROR(t.EvictToBudget(bytes, std::nullopt, &evicted));
  if (evicted == 0) return Status::Ok();
  return t.Commit(impl_->CommitWriteOptions(), "evict.before_write", "evict.after_write");
}

namespace statestore_internal {

// ---- eviction ---------------------------------------------------------------------------------

// Bytes evicting `id` would free now: its chunks no other entry references,
// plus its metadata.
Result<double> Txn::ExclusiveBytes(EntryId id, const EntrySummary& s) {
  std::string mv;
  bool found = false;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_manifests, IdKey(id), &mv, &found));
  double bytes = static_cast<double>(s.meta_bytes);
  if (!found) return bytes;
  PC_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(mv, StoreLimits::kMaxChunkBytes));
  std::unordered_map<Hash128, std::pair<std::uint64_t, std::uint64_t>, Hash128Hasher> counts;  // n, size
  for (const auto& layer : m.layers) {
    for (const auto& c : layer.chunks) {
      auto& e = counts[c.address];
      ++e.first;
      e.second = c.size;
    }
  }
  for (const auto& [h, e] : counts) {
    PC_ASSIGN_OR_RETURN(ChunkRefRecord * r, Ref(h));
    if (r->refs <= e.first) bytes += static_cast<double>(e.second);
  }
  return bytes;
}

// What evicting `id` costs a later request that reaches its tokens: the
// FLOPs of prefilling from the longest shorter boundary of them still stored
// (its parent; both were priced with the same model cost) instead of from `id`.
Result<double> Txn::MarginalFlops(EntryId id, const EntrySummary& s) {
  auto memo = marginal_.find(id);
  if (memo != marginal_.end() && (!memo->second.parent || removed_.count(*memo->second.parent) == 0)) {
    return memo->second.flops;
  }
  std::string tv;
  bool found = false;
  PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_tokens, IdKey(id), &tv, &found));
  if (!found) return s.flops;
  PC_ASSIGN_OR_RETURN(std::vector<std::uint32_t> tokens, DecodeTokens(tv));
  if (tokens.size() < 2) return s.flops;
  auto usable = [&](EntryId e) { return e != id && removed_.count(e) == 0; };
  PC_ASSIGN_OR_RETURN(std::optional<EntryId> parent,
                      s_.LongestStoredPrefix(s.scope, std::span(tokens).first(tokens.size() - 1), usable));
  Marginal m{parent, s.flops};
  if (parent) {
    std::string pv;
    PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_entries, IdKey(*parent), &pv, &found));
    if (found) {
      PC_ASSIGN_OR_RETURN(EntrySummary ps, DecodeSummary(pv));
      m.flops = std::max(s.flops - ps.flops, 0.0);
    }
  }
  marginal_[id] = m;
  return m.flops;
}

Result<std::optional<EntryId>> Txn::PickVictim(std::optional<EntryId> keep) {
  struct Candidate {
    EntryId id;
    std::uint64_t tick;
    double flops_per_byte;
  };
  std::vector<Candidate> window;
  const bool lru = s_.opts.eviction.policy == EvictionPolicy::kLru;
  const std::size_t want = lru ? 1 : s_.opts.eviction.utility_window;
  const auto* counted = s_.hooks != nullptr ? s_.hooks->victim_scan_max_skipped.get() : nullptr;
  if (counted != nullptr) {
    rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableCount);
    rocksdb::get_perf_context()->Reset();
  }
  std::unique_ptr<rocksdb::Iterator> it(s_.db->NewIterator(rocksdb::ReadOptions(), s_.cf_lru));
  std::string prefix(1, kAgeTag);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix) && window.size() < want; it->Next()) {
    if (it->key().size() != 17) return Status::Corruption("malformed recency key");
    std::uint64_t tick = GetBE64(it->key().data() + 1);
    EntryId id = GetBE64(it->key().data() + 9);
    if ((keep && id == *keep) || removed_.count(id) != 0 || s_.leases->Leased(id)) continue;
    if (lru) {
      window.push_back({id, tick, 0});
      break;
    }
    std::string sv;
    bool found = false;
    PC_RETURN_IF_ERROR(s_.GetValue(s_.cf_entries, IdKey(id), &sv, &found));
    if (!found) continue;
    PC_ASSIGN_OR_RETURN(EntrySummary s, DecodeSummary(sv));
    PC_ASSIGN_OR_RETURN(double freed, ExclusiveBytes(id, s));
    double saved = s.flops;
    if (s_.opts.eviction.policy == EvictionPolicy::kMarginal) {
      PC_ASSIGN_OR_RETURN(saved, MarginalFlops(id, s));
    }
    window.push_back({id, tick, saved / std::max(freed, 1.0)});
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan recency"));
  if (counted != nullptr) NoteSkipped(*s_.hooks->victim_scan_max_skipped);
  if (window.empty()) return std::optional<EntryId>();
  if (lru) return std::optional<EntryId>(window.front().id);

  // Marconi-style utility: recency and FLOPs saved per byte freed, each
  // normalised over the window; the lowest goes (ties: the older).
  std::uint64_t t0 = window.front().tick, t1 = window.front().tick;
  double e1 = 0;
  for (const auto& c : window) {
    t0 = std::min(t0, c.tick);
    t1 = std::max(t1, c.tick);
    e1 = std::max(e1, c.flops_per_byte);
  }
  const Candidate* best = nullptr;
  double best_u = 0;
  for (const auto& c : window) {
    double rec = t1 > t0 ? static_cast<double>(c.tick - t0) / static_cast<double>(t1 - t0) : 0.0;
    double eff = e1 > 0 ? c.flops_per_byte / e1 : 0.0;
    double u = rec + s_.opts.eviction.utility_alpha * eff;
    if (best == nullptr || u < best_u || (u == best_u && c.tick < best->tick)) {
      best = &c;
      best_u = u;
    }
  }
  return std::optional<EntryId>(best->id);
}

Status Txn::EvictToBudget(std::uint64_t budget, std::optional<EntryId> keep, std::uint64_t* evicted) {
  *evicted = 0;
  while (s_.StoredBytes(c_) > budget) {
    PC_ASSIGN_OR_RETURN(auto victim, PickVictim(keep));
    if (!victim) {
      return Status::ResourceExhausted("byte budget " + std::to_string(budget) +
                                       " exceeded: " + std::to_string(s_.StoredBytes(c_)) +
                                       " bytes needed and nothing left that may be evicted");
    }
    if (!MarkDying(*victim)) {  // leased since the scan: try the next
      removed_.insert(*victim);
      continue;
    }
    PC_ASSIGN_OR_RETURN(bool removed, RemoveEntry(*victim, std::nullopt));
    if (!removed) {  // a recency record without its entry: never pick it again here
      removed_.insert(*victim);
      continue;
    }
    ++c_.evictions;
    ++*evicted;
  }
  return Status::Ok();
}

}  // namespace statestore_internal
}  // namespace primecache

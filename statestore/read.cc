// Reading: lookup through the prefix index, the records of a live entry,
// and quarantine of what fails a check (the streaming fetch: fetch.cc;
// leases: leases.cc).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

Status LocalStore::Impl::GetValue(rocksdb::ColumnFamilyHandle* cf, const std::string& key, std::string* value,
                             bool* found, const rocksdb::ReadOptions& ro) {
  rocksdb::Status s = db->Get(ro, cf, key, value);
  *found = s.ok();
  if (s.IsNotFound()) return Status::Ok();
  return FromRocks(s, std::string("read ") + cf->GetName());
}

Result<bool> LocalStore::Impl::TokensMatch(EntryId id, std::span<const std::uint32_t> tokens, bool quarantine) {
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

Result<std::optional<EntryId>> LocalStore::Impl::FindIdentity(std::uint64_t scope,
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

Result<std::optional<EntryId>> LocalStore::FindExact(const Hash128& model, std::string_view ns,
                                                std::span<const std::uint32_t> tokens) {
  if (tokens.empty() || tokens.size() > StoreLimits::kMaxTokens) return std::optional<EntryId>();
  auto scope = impl_->FindScope(model, ns);
  if (!scope) return std::optional<EntryId>();
  return impl_->FindIdentity(*scope, tokens, PlaceOf(*impl_->hasher, tokens, impl_->params.block_tokens),
                             true);
}

// ---- lookup ---------------------------------------------------------------------------------

namespace {

// The hit for entry `id` matched at `length` (nullopt: being removed).
using HitFn = std::function<Result<std::optional<LookupHit>>(EntryId id, std::uint64_t length)>;

// The levels of the query's chain nodes that may exist (the in-memory filter
// rules out the others), shallowest first.
std::vector<std::size_t> CandidateLevels(LocalStore::Impl& s, std::uint64_t scope, const std::vector<std::uint64_t>& h) {
  std::vector<std::size_t> levels;
  ReaderLock g(&s.node_filter.mu);
  for (std::size_t a = 0; a < h.size(); ++a) {
    if (s.node_filter.MayContain(NodeFilter::Fingerprint(scope, a, h[a]))) levels.push_back(a);
  }
  return levels;
}

// The exact records node `a` may lead to: the query's hash at every slot
// length the node has and the query covers (in one pass), kept where the
// in-memory filter says the record may exist; (length, exact hash), longest first.
std::vector<std::pair<std::size_t, std::uint64_t>> CandidateExacts(LocalStore::Impl& s, std::uint64_t scope,
                                                                   std::size_t a, const std::vector<NodeSlot>& slots,
                                                                   std::span<const std::uint32_t> tokens,
                                                                   std::uint64_t chain_hash) {
  const std::size_t block = s.params.block_tokens;
  const std::size_t q = tokens.size();
  std::vector<std::uint32_t> rs;
  for (const auto& sl : slots) {
    if (a * block + sl.r <= q) rs.push_back(sl.r);
  }
  std::vector<std::uint64_t> exacts(rs.size());
  s.hasher->HashPrefixes(tokens.subspan(a * block, std::min<std::size_t>(block, q - a * block)), chain_hash, rs,
                         exacts);
  std::vector<std::pair<std::size_t, std::uint64_t>> present;
  ReaderLock g(&s.exact_filter.mu);
  for (std::size_t k = rs.size(); k-- > 0;) {
    const std::size_t length = a * block + rs[k];
    if (s.exact_filter.MayContain(NodeFilter::Fingerprint(scope, length, exacts[k]))) {
      present.emplace_back(length, exacts[k]);
    }
  }
  return present;
}

// The first entry of exact record (scope, length, exact) whose stored
// tokens are the query's first `length`, if any (`quarantine`: as TokensMatch's).
Result<std::optional<LookupHit>> MatchExact(LocalStore::Impl& s, std::uint64_t scope, std::size_t length,
                                            std::uint64_t exact, std::span<const std::uint32_t> tokens,
                                            const HitFn& hit_for, bool quarantine) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(s.GetValue(s.cf_index, ExactKey(scope, length, exact), &v, &found));
  if (!found) return std::optional<LookupHit>();
  auto ids = DecodeIds(v);
  if (!ids.ok()) {
    spdlog::error("statestore {}: index: {}", s.path, ids.status().ToString());
    return std::optional<LookupHit>();
  }
  for (EntryId id : *ids) {
    PC_ASSIGN_OR_RETURN(bool match, s.TokensMatch(id, tokens.first(length), quarantine));
    if (!match) continue;
    PC_ASSIGN_OR_RETURN(std::optional<LookupHit> hit, hit_for(id, length));  // nullopt: being removed
    if (hit) return hit;
  }
  return std::optional<LookupHit>();
}

// The longest stored prefix of the query in `scope`: the chain nodes that
// exist, read in one batch, then walked deepest first. `h` holds the chain
// hashes of the query's nodes.
Result<std::optional<LookupHit>> FindLongest(LocalStore::Impl& s, std::uint64_t scope, std::span<const std::uint32_t> tokens,
                                             const std::vector<std::uint64_t>& h, const HitFn& hit_for,
                                             bool quarantine = true) {
  const std::vector<std::size_t> levels = CandidateLevels(s, scope, h);
  const std::size_t n = levels.size();
  std::vector<std::string> keys(n);
  std::vector<rocksdb::Slice> slices(n);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = NodeKey(scope, levels[i], h[levels[i]]);
    slices[i] = keys[i];
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  // Node keys sort by level, which is the order they were made in.
  if (n > 0) {
    s.db->MultiGet(rocksdb::ReadOptions(), s.cf_index, n, slices.data(), values.data(), statuses.data(),
                   /*sorted_input=*/true);
  }
  for (std::size_t i = n; i-- > 0;) {
    const std::size_t a = levels[i];
    if (statuses[i].IsNotFound()) continue;
    PC_RETURN_IF_ERROR(FromRocks(statuses[i], "read index"));
    auto slots = DecodeNode(values[i].ToStringView(), s.params.block_tokens);
    if (!slots.ok()) {
      spdlog::error("statestore {}: index node {}/{}: {}", s.path, scope, a, slots.status().ToString());
      continue;
    }
    for (const auto& [length, exact] : CandidateExacts(s, scope, a, *slots, tokens, h[a])) {
      PC_ASSIGN_OR_RETURN(std::optional<LookupHit> hit,
                          MatchExact(s, scope, length, exact, tokens, hit_for, quarantine));
      if (hit) return hit;
    }
  }
  return std::optional<LookupHit>();
}

}  // namespace

Result<std::optional<EntryId>> LocalStore::Impl::LongestStoredPrefix(std::uint64_t scope,
                                                                std::span<const std::uint32_t> tokens,
                                                                const std::function<bool(EntryId)>& usable) {
  if (tokens.empty()) return std::optional<EntryId>();
  const std::size_t top = (tokens.size() - 1) / params.block_tokens;
  const std::vector<std::uint64_t> h = ChainHashes(*hasher, tokens, params.block_tokens, top);
  auto hit_for = [&](EntryId id, std::uint64_t length) -> Result<std::optional<LookupHit>> {
    if (!usable(id)) return std::optional<LookupHit>();
    return std::optional<LookupHit>(LookupHit{id, length, 0, 1, 0, 0});
  };
  PC_ASSIGN_OR_RETURN(std::optional<LookupHit> hit, FindLongest(*this, scope, tokens, h, hit_for, false));
  if (!hit) return std::optional<EntryId>();
  return std::optional<EntryId>(hit->id);
}

Result<std::optional<LookupHit>> LocalStore::Lookup(const Hash128& model, std::string_view ns,
                                               std::span<const std::uint32_t> tokens,
                                               const LookupOptions& options) {
  if (tokens.empty()) return Status::InvalidArgument("lookup of no tokens");
  if (tokens.size() > StoreLimits::kMaxTokens) return Status::InvalidArgument("lookup longer than 2^22 tokens");
  Impl& s = *impl_;
  const std::uint32_t block = s.params.block_tokens;
  const std::size_t q = tokens.size();
  const std::size_t top = (q - 1) / block;  // deepest node a with a*B < q
  std::vector<std::uint64_t> h = ChainHashes(*s.hasher, tokens, block, top);

  std::optional<LookupHit> hit;
  if (options.shared_tokens != nullptr) *options.shared_tokens = 0;
  if (auto scope = s.FindScope(model, ns)) {
    auto hit_for = [&](EntryId id, std::uint64_t length) { return HitFor(id, length, options.lease); };
    PC_ASSIGN_OR_RETURN(hit, FindLongest(s, *scope, tokens, h, hit_for));
    if (options.shared_tokens != nullptr) {
      // The hit stands on its own: a branch point that cannot be read is
      // only the hit's length.
      auto shared = s.BranchPoint(*scope, tokens, hit ? hit->length : 0);
      if (!shared.ok()) spdlog::warn("statestore {}: branch point: {}", s.path, shared.status().ToString());
      *options.shared_tokens = shared.ok() ? *shared : (hit ? hit->length : 0);
    }
  }
  if (options.record) {
    if (hit) {
      ++s.hits;
      s.Touch(hit->id, true);
    } else {
      ++s.misses;
    }
    if (s.opts.eviction.admission == AdmissionPolicy::kReuse) {
      const std::size_t levels = q / Impl::kSightingBlock;
      s.NotePrefixSightings(model, ns, ChainHashes(*s.hasher, tokens, Impl::kSightingBlock, levels), levels);
    }
    if (!hit || hit->length < q) {
      const std::uint64_t query_hash = s.hasher->Hash(tokens.subspan(top * block), h[top]);
      s.NoteSighting(Impl::SightingKey(model, ns, q, query_hash));
    }
  }
  return hit;
}

Result<std::optional<LookupHit>> LocalStore::HitFor(EntryId id, std::uint64_t length, Lease* lease) {
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
  return std::optional<LookupHit>(LookupHit{id, length, sum.layers, sum.ranks, sum.chunk_bytes, sum.raw_bytes});
}

Status LocalStore::Impl::CheckNamespace(EntryId id, std::string_view record, const std::string& ns) const {
  PC_ASSIGN_OR_RETURN(EntrySummary sum, DecodeSummary(record));
  auto scope = ScopeById(sum.scope);
  // Another tenant's entry is reported as absent, not as forbidden.
  if (!scope || scope->ns != ns) return Status::NotFound("no entry " + std::to_string(id));
  return Status::Ok();
}

// ---- an entry's tokens and headers (the streaming itself: fetch.cc) -------------------------

Result<std::vector<std::uint32_t>> LocalStore::Tokens(EntryId id) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_tokens, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no live entry " + std::to_string(id));
  return DecodeTokens(v);
}

Result<std::vector<std::string>> LocalStore::LayerHeaders(EntryId id) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_manifests, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no live entry " + std::to_string(id));
  auto manifest = DecodeManifest(v, StoreLimits::kMaxChunkBytes);
  if (!manifest.ok()) return manifest.status().WithContext("entry " + std::to_string(id));
  std::vector<std::string> headers;
  headers.reserve(manifest->layers.size());
  for (auto& layer : manifest->layers) headers.push_back(std::move(layer.header));
  return headers;
}

// ---- quarantine -------------------------------------------------------------------------------

void LocalStore::Impl::Quarantine(EntryId id, const std::string& reason, std::optional<Hash128> bad_chunk) {
  if (opts.read_only) {
    spdlog::error("statestore {}: entry {} is damaged ({}); open read-only, so it is not quarantined", path, id,
                  reason);
    return;
  }
  MutexLock wl(&write_mu);
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

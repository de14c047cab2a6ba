// Describing and listing entries: an entry's record as EntryInfo, and pages
// of live or quarantined entries, by id or by the scopes of one fingerprint.
#include <algorithm>
#include <functional>
#include <set>
#include <shared_mutex>

#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

// ---- describe / list ---------------------------------------------------------------------

Result<EntryInfo> LocalStore::Impl::MakeInfo(EntryId id, const EntrySummary& s, EntryState state) {
  EntryInfo info;
  info.id = id;
  info.state = state;
  if (auto scope = ScopeById(s.scope)) {
    info.model = scope->digest;
    info.model_name = scope->model_name;
    info.ns = scope->ns;
    info.model_descriptor = scope->descriptor;
  } else {
    return Status::Corruption("entry " + std::to_string(id) + " names unknown scope " +
                              std::to_string(s.scope));
  }
  info.length = s.length;
  info.layers = s.layers;
  info.ranks = s.ranks;
  info.chunk_bytes = s.chunk_bytes;
  info.raw_bytes = s.raw_bytes;
  info.meta_bytes = s.meta_bytes;
  info.flops = s.flops;
  info.created_unix_ms = s.created_unix_ms;
  if (state == EntryState::kLive) {
    std::string v;
    bool found = false;
    PC_RETURN_IF_ERROR(GetValue(cf_lru, AccessKey(id), &v, &found));
    if (found) {
      PC_ASSIGN_OR_RETURN(AccessRecord a, DecodeAccess(v));
      info.last_access = a.tick;
      info.hits = a.hits;
    }
    MutexLock g(&touch_mu);
    auto it = pending_touches.find(id);
    if (it != pending_touches.end()) {
      info.last_access = std::max(info.last_access, it->second.tick);
      info.hits += it->second.hits;
    }
  }
  return info;
}

Result<EntryInfo> LocalStore::Info(EntryId id) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_entries, IdKey(id), &v, &found));
  if (found) {
    PC_ASSIGN_OR_RETURN(EntrySummary s, DecodeSummary(v));
    return impl_->MakeInfo(id, s, EntryState::kLive);
  }
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_quarantine, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no entry " + std::to_string(id));
  PC_ASSIGN_OR_RETURN(QuarantineRecord q, DecodeQuarantine(v));
  PC_ASSIGN_OR_RETURN(EntryInfo info, impl_->MakeInfo(id, q.summary, EntryState::kQuarantined));
  info.reason = q.reason;
  return info;
}

Result<EntryDetail> LocalStore::Describe(EntryId id, const DescribeOptions& options) {
  EntryDetail d;
  PC_ASSIGN_OR_RETURN(d.info, Info(id));
  // Another namespace's entry, or a quarantined one asked for by namespace,
  // is reported as absent.
  if (options.ns && (d.info.quarantined() || d.info.ns != *options.ns)) {
    return Status::NotFound("no entry " + std::to_string(id));
  }
  if (d.info.quarantined()) return d;
  PC_ASSIGN_OR_RETURN(d.info.tokens, Tokens(id));
  if (options.layer_headers) {
    PC_ASSIGN_OR_RETURN(d.layer_headers, LayerHeaders(id));
  }
  return d;
}

namespace {

// The scopes of fingerprint `model` (and namespace `ns`, when given), in id order.
std::vector<std::uint64_t> ScopesOf(const LocalStore::Impl& s, const Hash128& model,
                                    const std::optional<std::string>& ns) {
  std::vector<std::uint64_t> ids;
  ReaderLock g(&s.scope_mu);
  for (const auto& [id, sc] : s.scopes) {
    if (sc.digest == model && (!ns || sc.ns == *ns)) ids.push_back(id);
  }
  return ids;
}

// Appends the entry whose record (live or quarantined, as `state` says) is `value`.
Status AppendInfo(LocalStore::Impl& s, EntryState state, EntryId id, std::string_view value, ListPage* page) {
  if (state == EntryState::kLive) {
    PC_ASSIGN_OR_RETURN(EntrySummary sum, DecodeSummary(value));
    PC_ASSIGN_OR_RETURN(EntryInfo info, s.MakeInfo(id, sum, EntryState::kLive));
    page->entries.push_back(std::move(info));
  } else {
    PC_ASSIGN_OR_RETURN(QuarantineRecord q, DecodeQuarantine(value));
    PC_ASSIGN_OR_RETURN(EntryInfo info, s.MakeInfo(id, q.summary, EntryState::kQuarantined));
    info.reason = q.reason;
    page->entries.push_back(std::move(info));
  }
  return Status::Ok();
}

rocksdb::ColumnFamilyHandle* RecordsOf(const LocalStore::Impl& s, EntryState state) {
  return state == EntryState::kLive ? s.cf_entries : s.cf_quarantine;
}

// Walks the records by id (filtering quarantined ones by scope). The page
// token is the last id returned (8 bytes).
Result<ListPage> ListById(LocalStore::Impl& s, const ListOptions& o) {
  std::uint64_t after = 0;
  if (!o.page_token.empty()) {
    if (o.page_token.size() != 8) return Status::InvalidArgument("malformed page token");
    after = GetBE64(o.page_token.data());
  }
  std::optional<std::set<std::uint64_t>> wanted;
  if (o.model) {
    std::vector<std::uint64_t> ids = ScopesOf(s, *o.model, o.ns);
    wanted.emplace(ids.begin(), ids.end());
  }
  ListPage page;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(rocksdb::ReadOptions(), RecordsOf(s, o.state)));
  for (it->Seek(IdKey(after + 1)); it->Valid(); it->Next()) {
    PC_ASSIGN_OR_RETURN(std::uint64_t id, IdFromKey(it->key().ToStringView()));
    if (wanted) {
      PC_ASSIGN_OR_RETURN(QuarantineRecord q, DecodeQuarantine(it->value().ToStringView()));
      if (wanted->count(q.summary.scope) == 0) continue;
    }
    if (page.entries.size() == o.limit) {
      page.next_page_token = IdKey(page.entries.back().id);
      break;
    }
    PC_RETURN_IF_ERROR(AppendInfo(s, o.state, id, it->value().ToStringView(), &page));
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "list entries"));
  return page;
}

// Live entries of one fingerprint (and maybe one namespace): walks the
// membership keys of each matching scope, in scope order. The page token is
// the scope (8 bytes) and id (8) of the last entry returned.
Result<ListPage> ListByScope(LocalStore::Impl& s, const ListOptions& o) {
  std::uint64_t from_scope = 0, after_id = 0;
  if (!o.page_token.empty()) {
    if (o.page_token.size() != 16) return Status::InvalidArgument("malformed page token");
    from_scope = GetBE64(o.page_token.data());
    after_id = GetBE64(o.page_token.data() + 8);
  }
  ListPage page;
  std::uint64_t last_scope = 0;
  for (std::uint64_t scope : ScopesOf(s, *o.model, o.ns)) {
    if (scope < from_scope) continue;
    std::string prefix = MemberPrefix(scope);
    std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(rocksdb::ReadOptions(), s.cf_index));
    it->Seek(scope == from_scope ? MemberKey(scope, after_id + 1) : prefix);
    for (; it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (it->key().size() != 17) return Status::Corruption("malformed membership key");
      EntryId id = GetBE64(it->key().data() + 9);
      if (page.entries.size() == o.limit) {
        page.next_page_token = IdKey(last_scope) + IdKey(page.entries.back().id);
        return page;
      }
      std::string v;
      bool found = false;
      PC_RETURN_IF_ERROR(s.GetValue(RecordsOf(s, o.state), IdKey(id), &v, &found));
      if (!found) continue;  // removed meanwhile
      PC_RETURN_IF_ERROR(AppendInfo(s, o.state, id, v, &page));
      last_scope = scope;
    }
    PC_RETURN_IF_ERROR(FromRocks(it->status(), "list entries"));
  }
  return page;
}

// Fills the tokens of a page's live entries; one removed meanwhile leaves the page.
Status FillTokens(ListPage* page, const std::function<Result<std::vector<std::uint32_t>>(EntryId)>& tokens) {
  std::vector<EntryInfo> kept;
  kept.reserve(page->entries.size());
  for (EntryInfo& e : page->entries) {
    auto t = tokens(e.id);
    if (t.status().IsNotFound()) continue;  // evicted while listing
    PC_RETURN_IF_ERROR(t.status());
    e.tokens = std::move(t).value();
    kept.push_back(std::move(e));
  }
  page->entries = std::move(kept);
  return Status::Ok();
}

}  // namespace

Result<ListPage> LocalStore::List(const ListOptions& o) {
  if (o.limit == 0 || o.limit > StoreLimits::kMaxListLimit) {
    return Status::InvalidArgument("list limit must be in [1, " + std::to_string(StoreLimits::kMaxListLimit) + "]");
  }
  ListPage page;
  if (!o.model || o.state == EntryState::kQuarantined) {
    PC_ASSIGN_OR_RETURN(page, ListById(*impl_, o));
  } else {
    PC_ASSIGN_OR_RETURN(page, ListByScope(*impl_, o));
  }
  // By id, entries of every scope are walked: the namespace is filtered
  // here (a page may then come back short while more follow).
  std::erase_if(page.entries, [&](const EntryInfo& e) { return o.ns.has_value() && e.ns != *o.ns; });
  if (o.state == EntryState::kQuarantined || o.omit_tokens) return page;
  PC_RETURN_IF_ERROR(FillTokens(&page, [this](EntryId id) { return Tokens(id); }));
  return page;
}

}  // namespace primecache

// Branch points: the pass records ('P', format.h) every entry leaves along
// its token chain, kept in the same batches as the entry itself; the
// lookup's branch point, found from them and confirmed on stored tokens; and
// the backfill that gives the entries of an older store their records.
//
// The branch point of a query is the longest prefix of it that some live
// entry of the scope shares token for token, whether or not a boundary lies
// there. A hybrid model's recurrent state cannot be cut back, so a prefix
// shared by many requests (a system prompt, a few-shot block) is reached
// only if someone captures the state at that point: the serving path takes
// it from here.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstddef>

#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace statestore_internal {

std::vector<std::string> PassKeys(const TokenHasher& hasher, std::uint64_t scope,
                                  std::span<const std::uint32_t> tokens, std::uint64_t id) {
  const std::size_t levels = tokens.size() / kPassBlockTokens;
  const std::vector<std::uint64_t> h = ChainHashes(hasher, tokens, kPassBlockTokens, levels);
  std::vector<std::string> keys;
  keys.reserve(levels);
  for (std::size_t a = 1; a <= levels; ++a) keys.push_back(PassKey(scope, a, h[a], id));
  return keys;
}

}  // namespace statestore_internal

namespace {

// How many entries passing the deepest shared level are read to extend the
// branch point past it (each is a read of its tokens record).
constexpr std::size_t kBranchCandidates = 4;

// The number of leading tokens `query` shares with `stored`, a tokens
// record's bytes in place (TokenBytes: little-endian u32, the query's own
// layout): the first differing byte's token.
std::size_t CommonPrefix(std::span<const std::uint32_t> query, std::string_view stored) {
  const auto q = std::as_bytes(query);
  const std::size_t n = std::min(q.size(), stored.size());
  const auto* s = reinterpret_cast<const std::byte*>(stored.data());
  const auto at = std::mismatch(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n), s).first;
  return static_cast<std::size_t>(at - q.begin()) / sizeof(std::uint32_t);
}

// Up to `limit` ids of the pass records under `prefix` (25 bytes).
std::vector<EntryId> IdsUnder(rocksdb::Iterator& it, const std::string& prefix, std::size_t limit) {
  std::vector<EntryId> ids;
  for (it.Seek(prefix); it.Valid() && ids.size() < limit && it.key().starts_with(prefix); it.Next()) {
    if (it.key().size() == prefix.size() + 8) ids.push_back(GetBE64(it.key().data() + prefix.size()));
  }
  return ids;
}

}  // namespace

Result<std::uint64_t> LocalStore::Impl::BranchPoint(std::uint64_t scope, std::span<const std::uint32_t> tokens,
                                               std::uint64_t at_least) {
  const std::size_t levels = tokens.size() / kPassBlockTokens;
  if (at_least >= tokens.size() || levels == 0) return at_least;
  const std::vector<std::uint64_t> h = ChainHashes(*hasher, tokens, kPassBlockTokens, levels);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_index));
  auto passed = [&](std::size_t a) {
    const std::string prefix = PassPrefix(scope, a, h[a]);
    it->Seek(prefix);
    return it->Valid() && it->key().starts_with(prefix);
  };
  // An entry that passes level a passes every level below it: the deepest
  // level some entry passes is found by bisection (levels [1, lo] passed).
  std::size_t lo = 0, hi = levels;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo + 1) / 2;
    if (passed(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "read pass records"));
  if (lo == 0) return at_least;
  // Hashes only find candidates: their stored tokens say how far each
  // really agrees with the query, to the exact token.
  std::uint64_t best = at_least;
  for (EntryId id : IdsUnder(*it, PassPrefix(scope, lo, h[lo]), kBranchCandidates)) {
    rocksdb::PinnableSlice v;
    rocksdb::Status s = db->Get(rocksdb::ReadOptions(), cf_tokens, IdKey(id), &v);
    if (s.IsNotFound()) continue;  // removed meanwhile: not a branch any more
    PC_RETURN_IF_ERROR(FromRocks(s, "read tokens"));
    auto stored = TokenBytes(v.ToStringView());
    if (!stored.ok()) continue;  // a damaged record is the fetch's to quarantine
    best = std::max<std::uint64_t>(best, CommonPrefix(tokens, *stored));
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "read pass records"));
  return best;
}

Status LocalStore::Impl::BuildPassIndex() {
  std::string marker;
  bool found = false;
  PC_RETURN_IF_ERROR(GetValue(cf_meta, std::string(kMetaPassIndexKey), &marker, &found));
  if (found) {
    pass_index = true;
    return Status::Ok();
  }
  if (opts.read_only) return Status::Ok();  // branch points then reach no older entry
  // Under write_mu: no entry comes or goes while the records are written.
  MutexLock wl(&write_mu);
  rocksdb::WriteBatch b;
  std::uint64_t entries = 0;
  auto flush = [&]() -> Status {
    if (b.Count() == 0) return Status::Ok();
    Status s = Write(CommitWriteOptions(), &b, "write pass records");
    b.Clear();
    return s;
  };
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_entries));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto id = IdFromKey(it->key().ToStringView());
    auto sum = DecodeSummary(it->value().ToStringView());
    if (!id.ok() || !sum.ok()) continue;  // verify reports these; they lead no lookup anywhere
    rocksdb::PinnableSlice v;
    rocksdb::Status s = db->Get(rocksdb::ReadOptions(), cf_tokens, IdKey(*id), &v);
    if (!s.ok()) continue;
    auto tokens = DecodeTokens(v.ToStringView());
    if (!tokens.ok()) continue;
    for (const std::string& k : PassKeys(*hasher, sum->scope, *tokens, *id)) b.Put(cf_index, k, "");
    ++entries;
    if (b.Count() >= 4096) PC_RETURN_IF_ERROR(flush());
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "scan entries"));
  std::string version;
  PutLE32(&version, kPassIndexVersion);
  b.Put(cf_meta, std::string(kMetaPassIndexKey), version);
  PC_RETURN_IF_ERROR(flush());
  pass_index = true;
  if (entries > 0) spdlog::info("statestore {}: gave {} entries their branch-point records", path, entries);
  return Status::Ok();
}

}  // namespace primecache

#include "remote/tier.h"

#include <charconv>
#include <cstdio>
#include <map>
#include <utility>

#include "primecache/internal/codec.h"
#include "core/token_hash.h"

namespace primecache::remote {
namespace {


Hash128 TokensId(std::span<const std::uint32_t> tokens) { return Checksum128(std::as_bytes(tokens)); }

std::string NodeKey(std::string_view ns, const Hash128& model, std::uint64_t level, std::uint64_t node_hash) {
  return NamespaceKeyPrefix(ns) + "n:" + HexDigits(model) + ":" + std::to_string(level) + ":" +
         HexDigits(node_hash);
}

std::string Member(std::uint64_t length, std::uint64_t exact_hash) {
  return std::to_string(length) + ":" + HexDigits(exact_hash);
}

// "<length>:<16 hex>", or nullopt for anything else.
std::optional<std::pair<std::uint64_t, std::uint64_t>> ParseMember(std::string_view m) {
  const std::size_t colon = m.find(':');
  if (colon == std::string_view::npos || m.size() - colon - 1 != 16) return std::nullopt;
  std::uint64_t length = 0, hash = 0;
  auto a = std::from_chars(m.data(), m.data() + colon, length);
  auto b = std::from_chars(m.data() + colon + 1, m.data() + m.size(), hash, 16);
  if (a.ec != std::errc() || a.ptr != m.data() + colon || b.ec != std::errc() || b.ptr != m.data() + m.size()) {
    return std::nullopt;
  }
  return std::pair{length, hash};
}

// Buffers of the receive pool lent to one fetch: given back unless released.
struct Lent {
  ReceivePool& pool;
  std::vector<std::string> chunks;
  ~Lent() {
    for (std::string& c : chunks) pool.Give(std::move(c));
  }
};

bool SameIdentity(const PublishRequest& e, const Hash128& model, std::string_view ns,
                  std::span<const std::uint32_t> boundary) {
  return e.model == model && e.ns == ns && std::equal(e.tokens.begin(), e.tokens.end(), boundary.begin(), boundary.end());
}

}  // namespace

std::string NamespaceKeyPrefix(std::string_view ns) {
  return "pc:t:" + HexDigits(Checksum128(AsBytes(ns))) + ":";
}

std::string ChunkKey(std::string_view ns, const Hash128& address) {
  return NamespaceKeyPrefix(ns) + "c:" + HexDigits(address);
}

std::string ManifestKey(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> boundary) {
  return NamespaceKeyPrefix(ns) + "m:" + HexDigits(model) + ":" + HexDigits(TokensId(boundary));
}

std::string NamespaceAclRules(std::span<const std::string> namespaces) {
  // Every command a RemoteTier sends (the data path's GET and SET included)
  // and what the cluster client needs to route them; SCAN (tools only) is
  // left out: its replies are not limited by the key patterns.
  std::string rules =
      "on resetkeys resetchannels -@all +get +set +del +sadd +srem +smembers +asking +cluster|slots";
  for (const std::string& ns : namespaces) rules += " ~" + NamespaceKeyPrefix(ns) + "*";
  return rules;
}

RemoteEntry& RemoteEntry::operator=(RemoteEntry&& other) noexcept {
  if (this == &other) return *this;
  if (pool) pool->Give(layers);
  entry = std::move(other.entry);
  layers = std::move(other.layers);
  chunk_bytes = other.chunk_bytes;
  pool = std::move(other.pool);
  return *this;
}

RemoteEntry::~RemoteEntry() {
  if (pool) pool->Give(layers);
}

RemoteTier::RemoteTier(std::shared_ptr<ClusterClient> client, RemoteTierOptions options)
    : client_(std::move(client)),
      options_(options),
      pool_(std::make_shared<ReceivePool>(options.receive_pool_bytes)),
      verify_(options.verify_threads) {}

Status RemoteTier::Put(const PublishRequest& entry, const std::vector<LayerBytes>& layers) {
  if (entry.tokens.empty()) return Status::InvalidArgument("remote put of no tokens");
  const RemoteManifest m = ManifestOf(entry, layers);
  // Chunks first, each address once (entries share chunks).
  std::map<std::string, const std::string*> chunks;
  std::uint64_t bytes = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    for (std::size_t c = 0; c < layers[l].chunks.size(); ++c) {
      if (chunks.emplace(ChunkKey(entry.ns, m.layers[l].chunks[c].address), &layers[l].chunks[c]).second) {
        bytes += layers[l].chunks[c].size();
      }
    }
  }
  std::vector<std::string> keys;
  std::vector<std::span<const std::byte>> values;
  keys.reserve(chunks.size());
  values.reserve(chunks.size());
  for (const auto& [key, value] : chunks) {
    keys.push_back(key);
    values.push_back(AsBytes(*value));
  }
  PC_RETURN_IF_ERROR(client_->SetFrom(keys, values));
  // Then the manifest, then the index member that makes it findable.
  PC_RETURN_IF_ERROR(client_->Set(ManifestKey(entry.model, entry.ns, entry.tokens), EncodeManifest(m)));
  const BoundaryPlace place = PlaceOf(DefaultTokenHasher(), entry.tokens, options_.block_tokens);
  PC_RETURN_IF_ERROR(client_->AddMember(NodeKey(entry.ns, entry.model, place.level, place.node_hash),
                                        Member(entry.tokens.size(), place.exact_hash)));
  Count(&RemoteTierStats::puts, 1);
  Count(&RemoteTierStats::put_bytes, bytes);
  return Status::Ok();
}

Result<std::optional<RemoteHit>> RemoteTier::Lookup(const Hash128& model, std::string_view ns,
                                                    std::span<const std::uint32_t> tokens) {
  if (tokens.empty()) return Status::InvalidArgument("remote lookup of no tokens");
  Count(&RemoteTierStats::lookups, 1);
  const TokenHasher& hasher = DefaultTokenHasher();
  const std::uint32_t block = options_.block_tokens;
  const std::size_t top = (tokens.size() - 1) / block;
  const std::vector<std::uint64_t> h = ChainHashes(hasher, tokens, block, top);
  std::vector<std::string> keys;
  for (std::size_t a = 0; a <= top; ++a) keys.push_back(NodeKey(ns, model, a, h[a]));
  PC_ASSIGN_OR_RETURN(auto nodes, client_->MembersMany(keys, options_.max_node_members));
  for (std::size_t a = top + 1; a-- > 0;) {
    std::uint64_t best = 0;
    for (const std::string& member : nodes[a]) {
      const auto m = ParseMember(member);
      // A boundary of length L hangs at level (L - 1) / B; anything else is not ours to read.
      if (!m || m->first <= a * block || m->first > tokens.size() || m->first > (a + 1) * block) continue;
      if (m->first <= best) continue;
      const auto tail = tokens.subspan(a * block, m->first - a * block);
      if (hasher.Hash(tail, h[a]) == m->second) best = m->first;
    }
    if (best != 0) {
      Count(&RemoteTierStats::index_hits, 1);
      return std::optional<RemoteHit>(RemoteHit{best, ManifestKey(model, ns, tokens.first(best))});
    }
  }
  return std::optional<RemoteHit>();
}

Status RemoteTier::Remove(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> boundary) {
  const BoundaryPlace place = PlaceOf(DefaultTokenHasher(), boundary, options_.block_tokens);
  PC_RETURN_IF_ERROR(client_->RemoveMember(NodeKey(ns, model, place.level, place.node_hash),
                                           Member(boundary.size(), place.exact_hash)));
  return client_->Del(ManifestKey(model, ns, boundary)).status();
}

Result<std::optional<std::vector<std::string>>> RemoteTier::FetchChunks(const RemoteManifest& m,
                                                                        std::span<const std::uint32_t> boundary) {
  std::vector<std::string> keys;
  std::vector<const ChunkRef*> refs;
  for (const ManifestLayer& l : m.layers) {
    for (const ChunkRef& c : l.chunks) {
      keys.push_back(ChunkKey(m.entry.ns, c.address));
      refs.push_back(&c);
    }
  }
  Lent out{*pool_, {}};
  PC_ASSIGN_OR_RETURN(auto checks, ReceiveChunks(refs, keys, out.chunks));
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const ChunkCheck check = checks[i];
    if (check == ChunkCheck::kMissing) {  // evicted: the entry is gone as a whole
      Count(&RemoteTierStats::evicted, 1);
      (void)Remove(m.entry.model, m.entry.ns, boundary);
      return std::optional<std::vector<std::string>>();
    }
    if (check != ChunkCheck::kOk) {
      Count(&RemoteTierStats::damaged, 1);
      (void)client_->Del(keys[i]);
      (void)Remove(m.entry.model, m.entry.ns, boundary);
      return std::optional<std::vector<std::string>>();
    }
  }
  return std::optional<std::vector<std::string>>(std::exchange(out.chunks, {}));
}

Result<std::vector<ChunkCheck>> RemoteTier::ReceiveChunks(std::span<const ChunkRef* const> refs,
                                                          std::span<const std::string> keys,
                                                          std::vector<std::string>& out) {
  const std::size_t limit = client_->max_value_bytes();
  for (const ChunkRef* ref : refs) {
    if (ref->size > limit) {
      return Status::Corruption("a remote chunk of " + std::to_string(ref->size) + " bytes is over the limit of " +
                                std::to_string(limit));
    }
  }
  // Each chunk's buffer is taken by the thread about to receive it (each
  // element by one thread at a time), so its pages are written while hot;
  // a key resent gets the buffer it had.
  out.assign(refs.size(), std::string());
  const std::function<std::span<std::byte>(std::size_t)> into = [&](std::size_t i) {
    if (out[i].size() != refs[i]->size) out[i] = pool_->Take(refs[i]->size);
    return std::as_writable_bytes(std::span(out[i]));
  };
  // Verdicts written by the pool, each element by one job; read once every
  // posted job is done (the mutex orders them).
  std::vector<std::uint8_t> matches(refs.size(), 0);
  Mutex mu;
  CondVar cv;
  std::size_t posted = 0, done = 0;
  auto filled = [&](std::size_t i) {
    {
      MutexLock l(&mu);
      ++posted;
    }
    verify_.Post([&, i] {
      matches[i] = Checksum128(std::as_bytes(std::span(out[i]))) == refs[i]->address ? 1 : 0;
      MutexLock l(&mu);
      ++done;
      cv.SignalAll();
    });
  };
  auto states = client_->GetInto(keys, into, filled);
  {
    MutexLock l(&mu);
    while (done != posted) cv.Wait(&mu);
  }
  PC_RETURN_IF_ERROR(states.status());
  std::vector<ChunkCheck> checks(refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    switch ((*states)[i]) {
      case ValueState::kAbsent:
        checks[i] = ChunkCheck::kMissing;
        break;
      case ValueState::kWrongSize:
        checks[i] = ChunkCheck::kWrongSize;
        break;
      case ValueState::kFilled:
        checks[i] = matches[i] != 0 ? ChunkCheck::kOk : ChunkCheck::kWrongAddress;
        break;
    }
  }
  return checks;
}

Result<std::optional<RemoteEntry>> RemoteTier::Fetch(const Hash128& model, std::string_view ns,
                                                     std::span<const std::uint32_t> tokens, const RemoteHit& hit) {
  if (hit.length == 0 || hit.length > tokens.size()) return Status::InvalidArgument("remote hit longer than its query");
  const auto boundary = tokens.first(hit.length);
  PC_ASSIGN_OR_RETURN(auto bytes, client_->Get(hit.manifest_key));
  if (!bytes) {
    Count(&RemoteTierStats::evicted, 1);
    (void)Remove(model, ns, boundary);
    return std::optional<RemoteEntry>();
  }
  auto m = DecodeManifest(*bytes);
  if (!m.ok()) {
    Count(&RemoteTierStats::damaged, 1);
    (void)Remove(model, ns, boundary);
    return std::optional<RemoteEntry>();
  }
  if (!SameIdentity(m->entry, model, ns, boundary)) {
    Count(&RemoteTierStats::foreign, 1);
    return std::optional<RemoteEntry>();
  }
  PC_ASSIGN_OR_RETURN(auto chunks, FetchChunks(*m, boundary));
  if (!chunks) return std::optional<RemoteEntry>();
  RemoteEntry e;
  e.pool = pool_;
  e.entry = std::move(m->entry);
  std::size_t next = 0;
  for (ManifestLayer& l : m->layers) {
    LayerBytes& out = e.layers.emplace_back();
    out.header = std::move(l.header);
    for (std::size_t c = 0; c < l.chunks.size(); ++c) {
      e.chunk_bytes += (*chunks)[next].size();
      out.chunks.push_back(std::move((*chunks)[next++]));
    }
  }
  Count(&RemoteTierStats::fetched, 1);
  Count(&RemoteTierStats::fetched_bytes, e.chunk_bytes);
  return std::optional<RemoteEntry>(std::move(e));
}

Result<std::vector<std::string>> RemoteTier::ManifestKeys(std::size_t limit) {
  return client_->Keys(kManifestKeyPattern, limit);
}

Result<std::vector<std::optional<Result<RemoteManifest>>>> RemoteTier::ReadManifests(std::span<const std::string> keys) {
  PC_ASSIGN_OR_RETURN(auto values, client_->GetMany(keys));
  std::vector<std::optional<Result<RemoteManifest>>> out;
  out.reserve(values.size());
  for (const auto& v : values) {
    if (!v) {
      out.emplace_back();
    } else {
      out.emplace_back(DecodeManifest(*v));
    }
  }
  return out;
}

Result<std::vector<std::optional<std::string>>> RemoteTier::ReadChunks(const RemoteManifest& m) {
  std::vector<std::string> keys;
  for (const ManifestLayer& l : m.layers) {
    for (const ChunkRef& c : l.chunks) keys.push_back(ChunkKey(m.entry.ns, c.address));
  }
  return client_->GetMany(keys);
}

RemoteTierStats RemoteTier::stats() const {
  MutexLock l(&stats_mu_);
  return stats_;
}

void RemoteTier::Count(std::uint64_t RemoteTierStats::*field, std::uint64_t n) {
  MutexLock l(&stats_mu_);
  stats_.*field += n;
}

}  // namespace primecache::remote

// The store's record formats (docs/format-store.md). Each record has its own
// Encode/Decode pair written field by field, in the order the format table
// lists: the pairs look alike, but a generic serializer would hide the byte
// layout the document specifies and the per-field bounds each Decode checks.
#include "statestore/format.h"

#include <cstring>

namespace primecache::statestore_internal {
namespace {

constexpr std::uint32_t kParamsMagic = 0x50435350;  // "PCSP"
// Version 2 appends `u32 ranks` (a tensor-parallel entry); an entry of one
// publisher is written as version 1, byte for byte as before.
constexpr std::uint8_t kSummaryVersion = 1;
constexpr std::uint8_t kGroupSummaryVersion = 2;
constexpr std::uint8_t kManifestVersion = 1;
constexpr std::uint8_t kScopeVersion = 2;  // 1: without the descriptor
constexpr std::uint8_t kQuarantineVersion = 1;
constexpr std::uint32_t kCounterFields = 13;
constexpr std::uint8_t kChunkRefPlacedVersion = 2;
constexpr std::uint8_t kSegmentRecordVersion = 1;

Status Bad(std::string_view what, std::string_view why) {
  return Status::Corruption(std::string(what) + ": " + std::string(why));
}

}  // namespace

void PutBE64(std::string* out, std::uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutBE32(std::string* out, std::uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutLE64(std::string* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutLE32(std::string* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t GetBE64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
std::uint32_t GetBE32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

bool Reader::U8(std::uint8_t* v) {
  if (remaining() < 1) return false;
  *v = static_cast<std::uint8_t>(data_[pos_++]);
  return true;
}
bool Reader::U32(std::uint32_t* v) {
  if (remaining() < 4) return false;
  std::uint32_t x = 0;
  for (int i = 3; i >= 0; --i) x = (x << 8) | static_cast<unsigned char>(data_[pos_ + i]);
  pos_ += 4;
  *v = x;
  return true;
}
bool Reader::U64(std::uint64_t* v) {
  if (remaining() < 8) return false;
  std::uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | static_cast<unsigned char>(data_[pos_ + i]);
  pos_ += 8;
  *v = x;
  return true;
}
bool Reader::F64(double* v) {
  std::uint64_t bits = 0;
  if (!U64(&bits)) return false;
  std::memcpy(v, &bits, sizeof bits);
  return true;
}
bool Reader::Bytes(std::size_t n, std::string_view* v) {
  if (remaining() < n) return false;
  *v = data_.substr(pos_, n);
  pos_ += n;
  return true;
}

void AppendChecksum(std::string* out) {
  PutLE64(out, Checksum64(*out));
}

Result<std::string_view> CheckTrailer(std::string_view value, std::string_view what) {
  if (value.size() < 8) return Bad(what, "shorter than its checksum");
  std::string_view body = value.substr(0, value.size() - 8);
  Reader r(value.substr(value.size() - 8));
  std::uint64_t stored = 0;
  r.U64(&stored);
  if (stored != Checksum64(body)) return Bad(what, "checksum mismatch");
  return body;
}

std::string HashKey(const Hash128& h) {
  std::string k;
  k.reserve(16);
  PutBE64(&k, h.hi);
  PutBE64(&k, h.lo);
  return k;
}
Hash128 HashFromKey(std::string_view k16) {
  return {GetBE64(k16.data() + 8), GetBE64(k16.data())};
}
std::string HashHex(const Hash128& h) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (std::uint64_t part : {h.hi, h.lo}) {
    for (int i = 15; i >= 0; --i) out.push_back(kHex[(part >> (4 * i)) & 0xf]);
  }
  return out;
}

// ---- meta ----------------------------------------------------------------------

std::string EncodeSchema(std::uint32_t version) {
  std::string v;
  PutLE32(&v, version);
  return v;
}
Result<std::uint32_t> DecodeSchema(std::string_view v) {
  Reader r(v);
  std::uint32_t version = 0;
  if (!r.U32(&version) || r.remaining() != 0) return Bad("schema record", "not 4 bytes");
  return version;
}

std::string EncodeParams(const Params& p) {
  std::string v;
  PutLE32(&v, kParamsMagic);
  PutLE32(&v, p.block_tokens);
  PutLE32(&v, p.hasher_id);
  v.push_back(static_cast<char>(p.chunk_layout));
  PutLE32(&v, p.piece_bytes);
  PutLE64(&v, p.created_unix_ms);
  AppendChecksum(&v);
  return v;
}
Result<Params> DecodeParams(std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(v, "params record"));
  Reader r(body);
  Params p;
  std::uint32_t magic = 0;
  if (!r.U32(&magic) || magic != kParamsMagic) return Bad("params record", "bad magic");
  if (!r.U32(&p.block_tokens) || !r.U32(&p.hasher_id) || !r.U8(&p.chunk_layout) || !r.U32(&p.piece_bytes) ||
      !r.U64(&p.created_unix_ms) || r.remaining() != 0) {
    return Bad("params record", "wrong size");
  }
  if (p.block_tokens == 0 || p.block_tokens > kMaxBlockTokens)
    return Bad("params record", "block size out of range");
  if (p.chunk_layout < kLayoutBlobFiles || p.chunk_layout > kLayoutSegments)
    return Bad("params record", "unknown chunk layout");
  if (p.chunk_layout == 2 && (p.piece_bytes < 4096 || p.piece_bytes > (64u << 20))) {
    return Bad("params record", "piece size out of range");
  }
  return p;
}

std::string EncodeCounters(const Counters& c) {
  std::string v;
  PutLE32(&v, kCounterFields);
  for (std::uint64_t x :
       {c.entries, c.quarantined, c.chunks, c.chunk_bytes, c.logical_chunk_bytes, c.meta_bytes, c.raw_bytes,
        c.next_entry_id, c.next_scope_id, c.evictions, c.hits, c.misses, c.admission_refusals}) {
    PutLE64(&v, x);
  }
  AppendChecksum(&v);
  return v;
}
Result<Counters> DecodeCounters(std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(v, "counters record"));
  Reader r(body);
  std::uint32_t n = 0;
  // A later schema may append fields; this one needs its 13 and reads no more.
  if (!r.U32(&n) || n < kCounterFields || r.remaining() != std::size_t{n} * 8) {
    return Bad("counters record", "wrong field count");
  }
  Counters c;
  for (std::uint64_t* x : {&c.entries, &c.quarantined, &c.chunks, &c.chunk_bytes, &c.logical_chunk_bytes,
                           &c.meta_bytes, &c.raw_bytes, &c.next_entry_id, &c.next_scope_id, &c.evictions,
                           &c.hits, &c.misses, &c.admission_refusals}) {
    r.U64(x);
  }
  return c;
}

std::string ScopeByNameKey(const Hash128& digest, std::string_view ns) {
  std::string k = "S";
  k += HashKey(digest);
  k += ns;
  return k;
}
std::string ScopeByIdKey(std::uint64_t id) {
  std::string k(1, kScopeByIdTag);
  PutBE64(&k, id);
  return k;
}
std::string EncodeScope(const ScopeRecord& s) {
  std::string v;
  v.push_back(static_cast<char>(kScopeVersion));
  v += HashKey(s.digest);
  PutLE32(&v, static_cast<std::uint32_t>(s.model_name.size()));
  v += s.model_name;
  PutLE32(&v, static_cast<std::uint32_t>(s.ns.size()));
  v += s.ns;
  PutLE32(&v, static_cast<std::uint32_t>(s.descriptor.size()));
  v += s.descriptor;
  AppendChecksum(&v);
  return v;
}
Result<ScopeRecord> DecodeScope(std::uint64_t id, std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(v, "scope record"));
  Reader r(body);
  ScopeRecord s;
  s.id = id;
  std::uint8_t version = 0;
  std::string_view digest, name, ns, descriptor;
  std::uint32_t name_len = 0, ns_len = 0, descriptor_len = 0;
  if (!r.U8(&version) || version < 1 || version > kScopeVersion) return Bad("scope record", "unknown version");
  if (!r.Bytes(16, &digest) || !r.U32(&name_len) || name_len > StoreLimits::kMaxModelNameBytes ||
      !r.Bytes(name_len, &name) || !r.U32(&ns_len) || ns_len > StoreLimits::kMaxNamespaceBytes || !r.Bytes(ns_len, &ns)) {
    return Bad("scope record", "malformed");
  }
  if (version >= 2 && (!r.U32(&descriptor_len) || descriptor_len > StoreLimits::kMaxDescriptorBytes ||
                       !r.Bytes(descriptor_len, &descriptor))) {
    return Bad("scope record", "malformed descriptor");
  }
  if (r.remaining() != 0) return Bad("scope record", "trailing bytes");
  s.digest = HashFromKey(digest);
  s.model_name = std::string(name);
  s.ns = std::string(ns);
  s.descriptor = std::string(descriptor);
  return s;
}

// ---- entries, manifests, tokens -------------------------------------------------

std::string IdKey(std::uint64_t id) {
  std::string k;
  PutBE64(&k, id);
  return k;
}
Result<std::uint64_t> IdFromKey(std::string_view k) {
  if (k.size() != 8) return Bad("entry key", "not 8 bytes");
  return GetBE64(k.data());
}

std::string EncodeSummary(const EntrySummary& s) {
  std::string v;
  v.push_back(static_cast<char>(s.ranks > 1 ? kGroupSummaryVersion : kSummaryVersion));
  PutLE64(&v, s.scope);
  PutLE64(&v, s.length);
  PutLE32(&v, s.layers);
  PutLE64(&v, s.chunk_bytes);
  PutLE64(&v, s.raw_bytes);
  PutLE64(&v, s.meta_bytes);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &s.flops, sizeof bits);
  PutLE64(&v, bits);
  PutLE64(&v, s.created_unix_ms);
  PutLE64(&v, s.node_hash);
  PutLE64(&v, s.exact_hash);
  if (s.ranks > 1) PutLE32(&v, s.ranks);
  AppendChecksum(&v);
  return v;
}
Result<EntrySummary> DecodeSummary(std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(v, "entry record"));
  Reader r(body);
  EntrySummary s;
  std::uint8_t version = 0;
  if (!r.U8(&version) || (version != kSummaryVersion && version != kGroupSummaryVersion)) {
    return Bad("entry record", "unknown version");
  }
  if (!r.U64(&s.scope) || !r.U64(&s.length) || !r.U32(&s.layers) || !r.U64(&s.chunk_bytes) ||
      !r.U64(&s.raw_bytes) || !r.U64(&s.meta_bytes) || !r.F64(&s.flops) || !r.U64(&s.created_unix_ms) ||
      !r.U64(&s.node_hash) || !r.U64(&s.exact_hash) ||
      (version == kGroupSummaryVersion && !r.U32(&s.ranks)) || r.remaining() != 0) {
    return Bad("entry record", "wrong size");
  }
  if (version == kGroupSummaryVersion && (s.ranks < 2 || s.ranks > StoreLimits::kMaxGroupRanks)) {
    return Bad("entry record", "rank count out of range");
  }
  if (s.length == 0 || s.length > StoreLimits::kMaxTokens) return Bad("entry record", "length out of range");
  if (s.layers > StoreLimits::kMaxLayers) return Bad("entry record", "layer count out of range");
  return s;
}

std::string EncodeManifest(const Manifest& m) {
  std::string v;
  v.push_back(static_cast<char>(kManifestVersion));
  PutLE32(&v, static_cast<std::uint32_t>(m.layers.size()));
  for (const auto& layer : m.layers) {
    PutLE32(&v, static_cast<std::uint32_t>(layer.header.size()));
    v += layer.header;
    PutLE32(&v, static_cast<std::uint32_t>(layer.chunks.size()));
    for (const auto& c : layer.chunks) {
      v += HashKey(c.address);
      PutLE64(&v, c.size);
    }
  }
  AppendChecksum(&v);
  return v;
}
Result<Manifest> DecodeManifest(std::string_view value, std::uint64_t max_chunk_bytes) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(value, "manifest"));
  Reader r(body);
  std::uint8_t version = 0;
  std::uint32_t layers = 0;
  if (!r.U8(&version) || version != kManifestVersion) return Bad("manifest", "unknown version");
  if (!r.U32(&layers) || layers > StoreLimits::kMaxLayers) return Bad("manifest", "layer count out of range");
  Manifest m;
  m.layers.resize(layers);
  for (auto& layer : m.layers) {
    std::uint32_t header_len = 0, chunks = 0;
    std::string_view header;
    if (!r.U32(&header_len) || header_len > kMaxHeaderBytes || !r.Bytes(header_len, &header)) {
      return Bad("manifest", "layer header truncated or too long");
    }
    layer.header = std::string(header);
    // Each chunk takes 24 bytes: bound the count by what is there before allocating.
    if (!r.U32(&chunks) || chunks > kMaxChunksPerLayer || std::size_t{chunks} * 24 > r.remaining()) {
      return Bad("manifest", "chunk count out of range");
    }
    layer.chunks.resize(chunks);
    for (auto& c : layer.chunks) {
      std::string_view h;
      r.Bytes(16, &h);
      r.U64(&c.size);
      c.address = HashFromKey(h);
      if (c.size == 0 || c.size > max_chunk_bytes) return Bad("manifest", "chunk size out of range");
    }
  }
  if (r.remaining() != 0) return Bad("manifest", "trailing bytes");
  return m;
}

std::string EncodeTokens(std::span<const std::uint32_t> tokens) {
  std::string v;
  v.reserve(4 + tokens.size() * 4 + 8);
  PutLE32(&v, static_cast<std::uint32_t>(tokens.size()));
  for (std::uint32_t t : tokens) PutLE32(&v, t);
  AppendChecksum(&v);
  return v;
}
Result<std::string_view> TokenBytes(std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(v, "tokens record"));
  Reader r(body);
  std::uint32_t n = 0;
  if (!r.U32(&n) || n == 0 || n > StoreLimits::kMaxTokens || r.remaining() != std::size_t{n} * 4) {
    return Bad("tokens record", "count disagrees with size");
  }
  return body.substr(4);
}

Result<std::vector<std::uint32_t>> DecodeTokens(std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view bytes, TokenBytes(v));
  Reader r(bytes);
  std::vector<std::uint32_t> tokens(bytes.size() / 4);
  for (auto& t : tokens) r.U32(&t);
  return tokens;
}

// ---- chunks ----------------------------------------------------------------------

std::string ChunkKey(const Hash128& h) {
  return std::string(1, kChunkTag) + HashKey(h);
}
std::string PieceKey(const Hash128& h, std::uint32_t piece) {
  std::string k = ChunkKey(h);
  PutBE32(&k, piece);
  return k;
}
std::string GcKey(const Hash128& h) {
  return std::string(1, kGcTag) + HashKey(h);
}

std::string EncodeChunkRef(const ChunkRefRecord& r) {
  std::string v;
  if (r.placed) v.push_back(static_cast<char>(kChunkRefPlacedVersion));
  PutLE64(&v, r.refs);
  PutLE64(&v, r.size);
  PutLE32(&v, r.flags);
  if (r.placed) {
    PutLE64(&v, r.segment);
    PutLE64(&v, r.offset);
  }
  return v;
}
Result<ChunkRefRecord> DecodeChunkRef(std::string_view v) {
  Reader r(v);
  ChunkRefRecord c;
  if (v.size() == 37) {
    std::uint8_t version = 0;
    r.U8(&version);
    if (version != kChunkRefPlacedVersion) return Bad("chunk reference record", "unknown version");
    c.placed = true;
  } else if (v.size() != 20) {
    return Bad("chunk reference record", "neither 20 nor 37 bytes");
  }
  r.U64(&c.refs);
  r.U64(&c.size);
  r.U32(&c.flags);
  if (c.placed) {
    r.U64(&c.segment);
    r.U64(&c.offset);
    if (c.segment == 0 && (c.flags & kChunkCorrupt) == 0)
      return Bad("chunk reference record", "no segment, yet not marked lost");
  }
  if (c.size == 0 || c.size > StoreLimits::kMaxChunkBytes) return Bad("chunk reference record", "size out of range");
  return c;
}

std::string EncodeSegment(const SegmentRecord& r) {
  std::string v;
  v.push_back(static_cast<char>(kSegmentRecordVersion));
  v.push_back(static_cast<char>(r.state));
  PutLE64(&v, r.committed);
  PutLE64(&v, r.live);
  AppendChecksum(&v);
  return v;
}
Result<SegmentRecord> DecodeSegment(std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(v, "segment record"));
  Reader r(body);
  std::uint8_t version = 0, state = 0;
  SegmentRecord s;
  if (!r.U8(&version) || !r.U8(&state) || !r.U64(&s.committed) || !r.U64(&s.live) || r.remaining() != 0) {
    return Bad("segment record", "not 18 bytes");
  }
  if (version != kSegmentRecordVersion) return Bad("segment record", "unknown version");
  if (state > 1) return Bad("segment record", "unknown state");
  if (s.live > s.committed) return Bad("segment record", "more live bytes than committed ones");
  s.state = static_cast<SegmentState>(state);
  return s;
}

// ---- index ----------------------------------------------------------------------

std::string NodeKey(std::uint64_t scope, std::uint64_t level, std::uint64_t node_hash) {
  std::string k(1, kNodeTag);
  PutBE64(&k, scope);
  PutBE64(&k, level);
  PutBE64(&k, node_hash);
  return k;
}
std::string ExactKey(std::uint64_t scope, std::uint64_t length, std::uint64_t exact_hash) {
  std::string k(1, kExactTag);
  PutBE64(&k, scope);
  PutBE64(&k, length);
  PutBE64(&k, exact_hash);
  return k;
}
std::string MemberKey(std::uint64_t scope, std::uint64_t id) {
  std::string k = MemberPrefix(scope);
  PutBE64(&k, id);
  return k;
}
std::string MemberPrefix(std::uint64_t scope) {
  std::string k(1, kMemberTag);
  PutBE64(&k, scope);
  return k;
}
std::string PassPrefix(std::uint64_t scope, std::uint64_t level, std::uint64_t pass_hash) {
  std::string k(1, kPassTag);
  PutBE64(&k, scope);
  PutBE64(&k, level);
  PutBE64(&k, pass_hash);
  return k;
}
std::string PassKey(std::uint64_t scope, std::uint64_t level, std::uint64_t pass_hash, std::uint64_t id) {
  std::string k = PassPrefix(scope, level, pass_hash);
  PutBE64(&k, id);
  return k;
}

std::string EncodeNode(const std::vector<NodeSlot>& slots) {
  std::string v;
  for (const auto& s : slots) {
    PutLE32(&v, s.r);
    PutLE32(&v, s.count);
  }
  return v;
}
Result<std::vector<NodeSlot>> DecodeNode(std::string_view v, std::uint32_t block) {
  if (v.size() % 8 != 0 || v.size() / 8 > block)
    return Bad("index node", "size is not a whole number of slots");
  Reader r(v);
  std::vector<NodeSlot> slots(v.size() / 8);
  std::uint32_t prev = 0;
  for (auto& s : slots) {
    r.U32(&s.r);
    r.U32(&s.count);
    if (s.r == 0 || s.r > block || s.r <= prev || s.count == 0)
      return Bad("index node", "slot out of order or range");
    prev = s.r;
  }
  return slots;
}
std::string EncodeIds(const std::vector<std::uint64_t>& ids) {
  std::string v;
  for (auto id : ids) PutLE64(&v, id);
  return v;
}
Result<std::vector<std::uint64_t>> DecodeIds(std::string_view v) {
  if (v.empty() || v.size() % 8 != 0) return Bad("index id list", "size is not a whole number of ids");
  Reader r(v);
  std::vector<std::uint64_t> ids(v.size() / 8);
  for (auto& id : ids) r.U64(&id);
  return ids;
}

// ---- recency ----------------------------------------------------------------------

std::string AgeKey(std::uint64_t tick, std::uint64_t id) {
  std::string k(1, kAgeTag);
  PutBE64(&k, tick);
  PutBE64(&k, id);
  return k;
}
std::string AccessKey(std::uint64_t id) {
  std::string k(1, kAccessTag);
  PutBE64(&k, id);
  return k;
}
std::string EncodeAccess(const AccessRecord& a) {
  std::string v;
  PutLE64(&v, a.tick);
  PutLE64(&v, a.hits);
  return v;
}
Result<AccessRecord> DecodeAccess(std::string_view v) {
  Reader r(v);
  AccessRecord a;
  if (!r.U64(&a.tick) || !r.U64(&a.hits) || r.remaining() != 0) return Bad("access record", "not 16 bytes");
  return a;
}

// ---- quarantine ------------------------------------------------------------------

std::string EncodeQuarantine(const QuarantineRecord& q) {
  std::string v;
  v.push_back(static_cast<char>(kQuarantineVersion));
  std::string summary = EncodeSummary(q.summary);
  PutLE32(&v, static_cast<std::uint32_t>(summary.size()));
  v += summary;
  PutLE64(&v, q.when_unix_ms);
  std::string reason = q.reason.substr(0, kMaxReasonBytes);
  PutLE32(&v, static_cast<std::uint32_t>(reason.size()));
  v += reason;
  AppendChecksum(&v);
  return v;
}
Result<QuarantineRecord> DecodeQuarantine(std::string_view v) {
  PC_ASSIGN_OR_RETURN(std::string_view body, CheckTrailer(v, "quarantine record"));
  Reader r(body);
  std::uint8_t version = 0;
  std::uint32_t summary_len = 0, reason_len = 0;
  std::string_view summary, reason;
  QuarantineRecord q;
  if (!r.U8(&version) || version != kQuarantineVersion) return Bad("quarantine record", "unknown version");
  if (!r.U32(&summary_len) || !r.Bytes(summary_len, &summary) || !r.U64(&q.when_unix_ms) ||
      !r.U32(&reason_len) || reason_len > kMaxReasonBytes || !r.Bytes(reason_len, &reason) ||
      r.remaining() != 0) {
    return Bad("quarantine record", "malformed");
  }
  PC_ASSIGN_OR_RETURN(q.summary, DecodeSummary(summary));
  q.reason = std::string(reason);
  return q;
}

}  // namespace primecache::statestore_internal

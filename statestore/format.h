// The store's on-disk schema: column families, keys and values, byte by byte
// (docs/format-store.md is the prose version; the two must agree).
//
// Integers in keys are big-endian (so that keys sort numerically); integers in
// values are little-endian. Every decoder bounds every length and count
// against the bytes it was given before using it, and refuses trailing bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/internal/manifest.h"
#include "primecache/status.h"
#include "primecache/internal/store.h"

namespace primecache::statestore_internal {

// 2: scope records may carry the model descriptor.
// 3: chunk bytes live in segment files (segments.h), not in RocksDB; chunk
//    reference records carry their extent; the segments column family.
// A version 1 or 2 store is migrated when opened for writing (migrate.cc)
// and refused when opened read-only.
inline constexpr std::uint32_t kSchemaVersion = 3;
inline constexpr std::uint32_t kFirstSegmentSchema = 3;

// Column families.
inline constexpr const char* kCfMeta = "meta";
inline constexpr const char* kCfEntries = "entries";
inline constexpr const char* kCfManifests = "manifests";
inline constexpr const char* kCfTokens = "tokens";
inline constexpr const char* kCfChunks = "chunks";
inline constexpr const char* kCfChunkRefs = "chunk_refs";
inline constexpr const char* kCfIndex = "index";
inline constexpr const char* kCfLru = "lru";
inline constexpr const char* kCfQuarantine = "quarantine";
inline constexpr const char* kCfSegments = "segments";
inline constexpr int kCfCount = 10;  // besides RocksDB's "default", which stays empty

// Bounds on what is read back (and so on what is accepted), besides the
// StoreLimits (primecache/internal/store.h) every store holds requests to.
inline constexpr std::uint32_t kMaxChunksPerLayer = 1u << 20;
inline constexpr std::uint32_t kMaxHeaderBytes = 16u << 20;
inline constexpr std::size_t kMaxReasonBytes = 4096;
inline constexpr std::uint32_t kMaxBlockTokens = 1u << 16;

// ---- byte helpers -------------------------------------------------------------

void PutBE64(std::string* out, std::uint64_t v);
void PutBE32(std::string* out, std::uint32_t v);
void PutLE64(std::string* out, std::uint64_t v);
void PutLE32(std::string* out, std::uint32_t v);
std::uint64_t GetBE64(const char* p);
std::uint32_t GetBE32(const char* p);

// A bounds-checked reader over a value; every Read fails once past the end.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool U8(std::uint8_t* v);
  bool U32(std::uint32_t* v);
  bool U64(std::uint64_t* v);
  bool F64(double* v);
  bool Bytes(std::size_t n, std::string_view* v);
  std::size_t remaining() const { return data_.size() - pos_; }
  std::size_t pos() const { return pos_; }

 private:
  std::string_view data_;
  std::size_t pos_ = 0;
};

// Appends XXH3-64 of everything in *out; CheckTrailer verifies and strips it.
void AppendChecksum(std::string* out);
Result<std::string_view> CheckTrailer(std::string_view value, std::string_view what);

std::string HashKey(const Hash128& h);  // 16 bytes: hi then lo, big-endian
Hash128 HashFromKey(std::string_view k16);
std::string HashHex(const Hash128& h);

// ---- meta ----------------------------------------------------------------------

inline constexpr std::string_view kMetaSchemaKey = "schema";
inline constexpr std::string_view kMetaParamsKey = "params";
inline constexpr std::string_view kMetaCountersKey = "counters";
// Present (value: the pass records' version, LE32) once every live entry has
// its pass records ('P', below): a store created with them, or one whose
// entries were given theirs at an open.
inline constexpr std::string_view kMetaPassIndexKey = "pass_index";
inline constexpr std::uint32_t kPassIndexVersion = 1;

std::string EncodeSchema(std::uint32_t version);
Result<std::uint32_t> DecodeSchema(std::string_view v);

// Where chunk bytes live: 1 blob files, 2 pieces (both in the chunks CF,
// schemas 1 and 2), 3 segment files (schema 3).
inline constexpr std::uint8_t kLayoutBlobFiles = 1;
inline constexpr std::uint8_t kLayoutPieces = 2;
inline constexpr std::uint8_t kLayoutSegments = 3;
struct Params {
  std::uint32_t block_tokens = 256;
  std::uint32_t hasher_id = 1;
  std::uint8_t chunk_layout = kLayoutSegments;
  std::uint32_t piece_bytes = 0;
  std::uint64_t created_unix_ms = 0;
};
std::string EncodeParams(const Params& p);
Result<Params> DecodeParams(std::string_view v);

// Exact totals, rewritten by every batch that changes them.
struct Counters {
  std::uint64_t entries = 0;
  std::uint64_t quarantined = 0;
  std::uint64_t chunks = 0;               // distinct chunks with references
  std::uint64_t chunk_bytes = 0;          // their bytes
  std::uint64_t logical_chunk_bytes = 0;  // sum over live entries of their chunk bytes
  std::uint64_t meta_bytes = 0;           // sum over live entries of meta bytes
  std::uint64_t raw_bytes = 0;            // sum over live entries of decoded bytes
  std::uint64_t next_entry_id = 1;
  std::uint64_t next_scope_id = 1;
  std::uint64_t evictions = 0;
  std::uint64_t hits = 0;  // hits .. refusals: best effort (flushed with batches)
  std::uint64_t misses = 0;
  std::uint64_t admission_refusals = 0;
  friend bool operator==(const Counters&, const Counters&) = default;
};
std::string EncodeCounters(const Counters& c);
Result<Counters> DecodeCounters(std::string_view v);

// Scopes: (fingerprint digest, namespace) interned as a u64 id.
// meta key 'S' digest(16) namespace -> id (LE64); meta key 'I' id(BE64) -> ScopeRecord.
std::string ScopeByNameKey(const Hash128& digest, std::string_view ns);
std::string ScopeByIdKey(std::uint64_t id);
inline constexpr char kScopeByIdTag = 'I';
struct ScopeRecord {
  std::uint64_t id = 0;
  Hash128 digest;
  std::string model_name;
  std::string ns;
  std::string descriptor;  // the model's canonical fingerprint encoding; may be empty
};
std::string EncodeScope(const ScopeRecord& s);
Result<ScopeRecord> DecodeScope(std::uint64_t id, std::string_view v);

// ---- entries, manifests, tokens -------------------------------------------------

std::string IdKey(std::uint64_t id);  // BE64
Result<std::uint64_t> IdFromKey(std::string_view k);

// entries CF: the small per-entry record.
struct EntrySummary {
  std::uint64_t scope = 0;
  std::uint64_t length = 0;
  std::uint32_t layers = 0;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t raw_bytes = 0;
  std::uint64_t meta_bytes = 0;
  double flops = 0;
  std::uint64_t created_unix_ms = 0;
  std::uint64_t node_hash = 0;
  std::uint64_t exact_hash = 0;
  std::uint32_t ranks = 1;  // a group publish's parts (PublishGroup); 1: one publisher
  friend bool operator==(const EntrySummary&, const EntrySummary&) = default;
};
std::string EncodeSummary(const EntrySummary& s);
Result<EntrySummary> DecodeSummary(std::string_view v);

// manifests CF: every layer's header and chunk list.
std::string EncodeManifest(const Manifest& m);
Result<Manifest> DecodeManifest(std::string_view v, std::uint64_t max_chunk_bytes);

// tokens CF.
std::string EncodeTokens(std::span<const std::uint32_t> tokens);
Result<std::vector<std::uint32_t>> DecodeTokens(std::string_view v);
// The record's token bytes in place (little-endian u32 each, unaligned),
// checked as DecodeTokens checks them: for a comparison without a copy.
Result<std::string_view> TokenBytes(std::string_view v);

// ---- chunks ----------------------------------------------------------------------

// chunks CF (schemas 1 and 2 only; empty once migrated): 'C' hash(16)
// [piece BE32] -> bytes; 'G' hash(16) -> "" (a collection candidate).
inline constexpr char kChunkTag = 'C';
inline constexpr char kGcTag = 'G';
std::string ChunkKey(const Hash128& h);
std::string PieceKey(const Hash128& h, std::uint32_t piece);
std::string GcKey(const Hash128& h);

// chunk_refs CF: hash(16) -> ChunkRefRecord. Version 1 (20 bytes, schemas 1
// and 2): refs, size, flags; the bytes are in the chunks CF. Version 2 (37
// bytes, schema 3): a version byte, then refs, size, flags, segment, offset.
inline constexpr std::uint32_t kChunkCorrupt = 1;
struct ChunkRefRecord {
  std::uint64_t refs = 0;
  std::uint64_t size = 0;
  std::uint32_t flags = 0;
  bool placed = false;        // version 2: the extent below is recorded
  std::uint64_t segment = 0;  // the segment holding the bytes; 0: none (lost, flags has kChunkCorrupt)
  std::uint64_t offset = 0;   // where the bytes start in it (after their frame header)
  friend bool operator==(const ChunkRefRecord&, const ChunkRefRecord&) = default;
};
std::string EncodeChunkRef(const ChunkRefRecord& r);
Result<ChunkRefRecord> DecodeChunkRef(std::string_view v);

// segments CF: id(BE64) -> SegmentRecord; one per segment file.
enum class SegmentState : std::uint8_t { kOpen = 0, kSealed = 1 };
struct SegmentRecord {
  SegmentState state = SegmentState::kOpen;  // kSealed: never appended to again
  std::uint64_t committed = 0;               // the file's durable length; bytes past it are a torn tail
  std::uint64_t live = 0;                    // frame bytes (header + chunk) of the chunks recorded in it
  friend bool operator==(const SegmentRecord&, const SegmentRecord&) = default;
};
std::string EncodeSegment(const SegmentRecord& r);
Result<SegmentRecord> DecodeSegment(std::string_view v);

// ---- index ----------------------------------------------------------------------

// 'N' scope(8) level(8) node_hash(8) -> NodeValue: the boundary lengths
// hanging off a chain node, as (r = L - level*B in [1, B], count) pairs.
// 'X' scope(8) length(8) exact_hash(8) -> ids (LE64 each) stored under it.
// 'M' scope(8) id(8) -> "": scope membership, for List.
// 'P' scope(8) level(8) pass_hash(8) id(8) -> "": entry `id` holds at least
// level * kPassBlockTokens tokens (level >= 1), and its first ones chain-hash
// (token_hash.h, B = kPassBlockTokens) to pass_hash. A lookup's branch point
// (the longest prefix any entry shares with the query) starts from them.
inline constexpr char kNodeTag = 'N';
inline constexpr char kExactTag = 'X';
inline constexpr char kMemberTag = 'M';
inline constexpr char kPassTag = 'P';
inline constexpr std::uint32_t kPassBlockTokens = 64;
std::string NodeKey(std::uint64_t scope, std::uint64_t level, std::uint64_t node_hash);
std::string ExactKey(std::uint64_t scope, std::uint64_t length, std::uint64_t exact_hash);
std::string MemberKey(std::uint64_t scope, std::uint64_t id);
std::string MemberPrefix(std::uint64_t scope);
std::string PassPrefix(std::uint64_t scope, std::uint64_t level, std::uint64_t pass_hash);  // 25 bytes
std::string PassKey(std::uint64_t scope, std::uint64_t level, std::uint64_t pass_hash, std::uint64_t id);

struct NodeSlot {
  std::uint32_t r = 0;
  std::uint32_t count = 0;
  friend bool operator==(const NodeSlot&, const NodeSlot&) = default;
};
std::string EncodeNode(const std::vector<NodeSlot>& slots);  // sorted by r, counts >= 1
Result<std::vector<NodeSlot>> DecodeNode(std::string_view v, std::uint32_t block);
std::string EncodeIds(const std::vector<std::uint64_t>& ids);
Result<std::vector<std::uint64_t>> DecodeIds(std::string_view v);

// ---- recency ----------------------------------------------------------------------

// lru CF: 'A' tick(8) id(8) -> "" (ordered by recency); 'E' id(8) -> AccessRecord.
inline constexpr char kAgeTag = 'A';
inline constexpr char kAccessTag = 'E';
std::string AgeKey(std::uint64_t tick, std::uint64_t id);
std::string AccessKey(std::uint64_t id);
struct AccessRecord {
  std::uint64_t tick = 0;
  std::uint64_t hits = 0;
  friend bool operator==(const AccessRecord&, const AccessRecord&) = default;
};
std::string EncodeAccess(const AccessRecord& a);
Result<AccessRecord> DecodeAccess(std::string_view v);

// ---- quarantine ------------------------------------------------------------------

struct QuarantineRecord {
  EntrySummary summary;
  std::uint64_t when_unix_ms = 0;
  std::string reason;
};
std::string EncodeQuarantine(const QuarantineRecord& q);
Result<QuarantineRecord> DecodeQuarantine(std::string_view v);

}  // namespace primecache::statestore_internal

// Codecs: how one layer snapshot becomes bytes and comes back.
//
// A layer is stored by the codec of its storage kind, named by an exact,
// versioned identity ("mla-latent/v1"). Each kind splits its snapshot into
// planes (PlaneLayout); each plane is encoded by a transform ("raw/v1",
// "shuffle-zstd/v1", lossy "bf16/v1" / "q8_0/v1" where the plane allows it)
// in chunks:
//  - an append-only plane (latent rows, pool keys, K/V rows) is cut at fixed
//    absolute row boundaries, every chunk_rows rows, so the leading full
//    chunks of a longer boundary of the same conversation are byte-identical
//    to those of a shorter one (same transform and level) and a store can keep
//    chunks content-addressed;
//  - an eager plane (index tail, conv ring, recurrent state) is one chunk.
// Every chunk is encoded independently and carries its raw and encoded sizes
// and the XXH3-64 of both byte strings; decoding checks all four.
//
// An EncodedLayer is a LayerHeader (kind, geometry, per-plane transform and
// chunk table) plus the chunks' bytes. SerializeLayer gives its flat form
// (header then chunks) for the .pcsnap container and for transport; the
// header also serializes alone. Byte layouts: docs/format-snapshot.md; kinds,
// transforms and error bounds: docs/codecs.md.
//
// Nothing read is trusted: every size, count and offset is bounded against
// the geometry, the buffer, CodecLimits and 64-bit overflow before use, and an
// unknown kind, transform or version is refused (fail closed, no default).
//
// Thread-safety: transforms, codecs and the registry are immutable and safe
// to use from many threads; encode/decode functions keep per-thread scratch
// state only. LayerDecoder is immutable after Create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "primecache/internal/layer_validator.h"
#include "primecache/internal/snapshot.h"
#include "primecache/status.h"
#include "primecache/internal/store.h"

namespace primecache {

// ---- Identities -------------------------------------------------------------

inline constexpr std::string_view kMlaLatentKind = "mla-latent/v1";
inline constexpr std::string_view kKdaRecurrentKind = "kda-recurrent/v1";
inline constexpr std::string_view kKvPlainKind = "kv-plain/v1";
inline constexpr std::string_view kKvRotatingKind = "kv-rotating/v1";
inline constexpr std::string_view kKvIndexedKind = "kv-indexed/v1";
inline constexpr std::string_view kLinearStateKind = "linear-state/v1";
// TurboQuant wraps the row store it encodes into: "outer/vN(inner/vM)".
inline constexpr std::string_view kTurboQuant2PlainKind = "turboquant2/v1(kv-plain/v1)";
inline constexpr std::string_view kTurboQuant4PlainKind = "turboquant4/v1(kv-plain/v1)";
inline constexpr std::string_view kTurboQuant2RotatingKind = "turboquant2/v1(kv-rotating/v1)";
inline constexpr std::string_view kTurboQuant4RotatingKind = "turboquant4/v1(kv-rotating/v1)";

inline constexpr std::string_view kRawTransform = "raw/v1";
inline constexpr std::string_view kShuffleZstdTransform = "shuffle-zstd/v1";
inline constexpr std::string_view kBf16Transform = "bf16/v1";
inline constexpr std::string_view kQ8_0Transform = "q8_0/v1";

// An identity "name/vN": name of [a-z0-9_-], 1 to 48 characters; N a decimal
// in [1, 2^32) without leading zeros. Identities compare as exact strings.
struct Identity {
  std::string name;
  std::uint32_t version = 0;
  std::string ToString() const;  // "name/vN"
};
Result<Identity> ParseIdentity(std::string_view text);

// The identity a wrapping transform reports for what it wraps: "outer(inner)".
std::string WrappedIdentity(std::string_view outer, std::string_view inner);

// ---- Planes -----------------------------------------------------------------

// The planes any kind may have; each kind uses a fixed subset in a fixed order.
enum class PlaneId : std::uint8_t {
  kLatentRows = 1,      // mla-latent: [len, width]
  kIndexTailRows = 2,   // mla-latent: [tail_rows, index_width]
  kPoolKeys = 3,        // mla-latent: [pools_ready, index_head_dim]
  kConvRing = 4,        // kda-recurrent: [3 * heads * head_dim, kernel - 1];
                        // linear-state: [conv_channels, conv_width]
  kRecurrentState = 5,  // kda-recurrent: [heads * head_dim, head_dim];
                        // linear-state: [state_heads * state_k_dim, state_v_dim]
  kKeyRows = 6,         // KV kinds: [held rows, k_width]
  kValueRows = 7,       // KV kinds: [held rows, v_width]
  kIndexKeys = 8,       // kv-indexed: [len, index_width]
};
std::string_view PlaneName(PlaneId id);  // "latent_rows", ...

// One plane of a layer of a given shape.
struct PlaneLayout {
  PlaneId id = PlaneId::kLatentRows;
  std::uint64_t rows = 0;
  std::uint32_t row_width = 0;  // values per row
  bool append_only = false;     // chunked at fixed row boundaries; else one chunk
  bool lossy_allowed = false;   // only f32 latent rows
  ElementType dtype = ElementType::kF32;
  std::uint64_t values() const { return rows * row_width; }
  std::uint64_t row_bytes() const { return std::uint64_t{row_width} * ElementBytes(dtype); }
  std::uint64_t raw_bytes() const { return values() * ElementBytes(dtype); }
  friend bool operator==(const PlaneLayout&, const PlaneLayout&) = default;
};

// A run of values in memory anywhere (host, pinned, mapped): their bytes and
// their element type. Converts from f32 spans, the reference engine's planes.
struct ElementSpan {
  std::span<const std::byte> bytes;
  ElementType type = ElementType::kF32;
  ElementSpan() = default;
  ElementSpan(std::span<const std::byte> b, ElementType t) : bytes(b), type(t) {}
  ElementSpan(std::span<const float> f) : bytes(std::as_bytes(f)) {}  // NOLINT(google-explicit-constructor)
  template <typename C>
    requires std::is_convertible_v<const C&, std::span<const float>>
  ElementSpan(const C& c) : ElementSpan(std::span<const float>(c)) {}  // NOLINT(google-explicit-constructor)
  std::uint64_t size() const { return bytes.size() / ElementBytes(type); }
};
struct MutableElementSpan {
  std::span<std::byte> bytes;
  ElementType type = ElementType::kF32;
  MutableElementSpan() = default;
  MutableElementSpan(std::span<std::byte> b, ElementType t) : bytes(b), type(t) {}
  MutableElementSpan(std::span<float> f) : bytes(std::as_writable_bytes(f)) {}  // NOLINT(google-explicit-constructor)
  template <typename C>
    requires std::is_convertible_v<C&, std::span<float>>
  MutableElementSpan(C& c) : MutableElementSpan(std::span<float>(c)) {}  // NOLINT(google-explicit-constructor)
  std::uint64_t size() const { return bytes.size() / ElementBytes(type); }
};

// Bounds applied to everything decoded (and to what is encoded, so that an
// encoded layer always decodes under the defaults).
struct CodecLimits {
  std::uint64_t max_tokens = 1ull << 22;        // len of a layer; tokens of a boundary
  std::uint64_t max_row_values = 1ull << 16;    // values in one row of any plane
  std::uint64_t max_layer_bytes = 16ull << 30;  // decoded bytes of one layer, all planes
  // Decoded bytes of one chunk: what a store takes by default (its
  // StoreOptions::max_chunk_bytes), so that what the codecs encode is stored.
  std::uint64_t max_chunk_bytes = StoreLimits::kDefaultMaxChunkBytes;
  std::uint64_t max_chunks = 1ull << 20;        // chunks of one layer
};

// ---- Transforms ----------------------------------------------------------------

// A transform turns a run of values into bytes and back. Lossless ones
// (raw/v1, shuffle-zstd/v1) take every element type and give back the exact
// bytes (NaN payloads and -0 included); lossy ones take f32 only and stay
// within the bound docs/codecs.md states and the tests hold:
//   bf16/v1: round to nearest even; |x - y| <= 2^-8 |x| for normal x,
//            <= 2^-134 for subnormal x; finite values that would round past
//            the largest bf16 saturate to it (|x - y| <= 2^-7 |x|); NaN stays
//            NaN and infinities stay.
//   q8_0/v1: blocks of 32 values (the last may be shorter), one f32 scale
//            d = amax/127 each; |x - y| <= amax/254 + 2^-20 amax + 2^-140,
//            amax the block's largest magnitude. Refuses non-finite input.
// Thread-safety: stateless; safe from many threads.
class Transform {
 public:
  virtual ~Transform() = default;
  virtual std::string_view id() const = 0;
  virtual bool lossy() const = 0;
  // Only shuffle-zstd takes a level (zstd's, within [ZSTD_minCLevel,
  // ZSTD_maxCLevel]); the others require 0.
  virtual Status CheckLevel(std::int32_t level) const = 0;
  // Whether it codes values of this type (InvalidArgument naming both if not).
  virtual Status CheckType(ElementType type) const = 0;
  // The exact encoded size of n values when it does not depend on the data.
  virtual std::optional<std::uint64_t> ExactEncodedSize(std::uint64_t values, ElementType type) const = 0;
  // An upper bound on the encoded size of n values, whatever the data.
  virtual std::uint64_t MaxEncodedSize(std::uint64_t values, ElementType type) const = 0;
  // Writes the encoding of values into `out`, which holds at least
  // MaxEncodedSize(values.size(), values.type) bytes, and returns the bytes
  // written. Deterministic: equal input and level give equal bytes (this is
  // what chunk dedup relies on).
  virtual Result<std::size_t> EncodeInto(ElementSpan values, std::int32_t level,
                                         std::span<std::byte> out) const = 0;
  // EncodeInto a string: replaces *out with the encoding of values.
  Status Encode(ElementSpan values, std::int32_t level, std::string* out) const;
  // Decodes exactly out.size() values of out.type from encoded; anything that
  // does not decode to exactly that many is refused as corruption.
  virtual Status Decode(std::span<const std::byte> encoded, MutableElementSpan out) const = 0;
  // This transform wrapping a storage kind: "id(inner_kind)".
  std::string WrappedId(std::string_view inner_kind) const { return WrappedIdentity(id(), inner_kind); }
};

// ---- Layer codecs (one per storage kind) -----------------------------------------

// The codec of one storage kind: the layer's metadata as header fields, and
// its planes. Thread-safety: stateless; safe from many threads.
class LayerCodec {
 public:
  virtual ~LayerCodec() = default;
  virtual std::string_view kind() const = 0;
  // Whether a shape is of this kind (the right variant alternative).
  virtual bool Accepts(const LayerShape& shape) const = 0;
  // The shape's metadata as the u64 fields the header stores, in fixed order.
  // Requires Accepts(shape).
  virtual std::vector<std::uint64_t> ShapeFields(const LayerShape& shape) const = 0;
  // Reads those fields back; refuses a wrong count or a field out of range.
  virtual Result<LayerShape> ShapeFromFields(std::span<const std::uint64_t> fields) const = 0;
  // The planes of a layer of this shape, in stored order. Refuses a shape of
  // another kind, one failing CheckShape, or one past the limits.
  virtual Result<std::vector<PlaneLayout>> Planes(const LayerShape& shape,
                                                  const CodecLimits& limits) const = 0;
  // A snapshot's planes in that order (f32). Requires a snapshot of this kind.
  virtual std::vector<std::span<const float>> PlaneData(const LayerSnapshot& layer) const = 0;
  virtual std::vector<std::span<float>> MutablePlaneData(LayerSnapshot& layer) const = 0;
};

// Maps exact identities to codecs and transforms. Unknown names, known names
// at unknown versions and malformed identities are refused with a message
// saying which (NotSupported, or InvalidArgument when malformed).
// Thread-safety: immutable; safe from many threads.
class CodecRegistry {
 public:
  // The built-in kinds and transforms. Never deleted.
  static const CodecRegistry& Default();

  // A kind by its exact identity: "name/vN", or a wrapper kind with its
  // inner kind "name/vN(inner/vM)"; each part must be well formed.
  Result<const LayerCodec*> FindKind(std::string_view identity) const;
  Result<const Transform*> FindTransform(std::string_view identity) const;
  // The current codec for a shape (the kind new snapshots are written with).
  Result<const LayerCodec*> KindFor(const LayerShape& shape) const;
  // Resolves a wrapped identity "transform(kind)"; both parts must be known
  // exactly and nothing may surround them. The kind may itself be a wrapped
  // kind ("turboquant4/v1(kv-plain/v1)"), known exactly as a whole.
  Result<std::pair<const Transform*, const LayerCodec*>> ResolveWrapped(std::string_view identity) const;
  // Every kind and transform identity, sorted. (A fingerprint's
  // codec_versions are only the kinds its model uses: CodecVersionsOf.)
  std::vector<std::string> Identities() const;

  CodecRegistry(std::vector<const LayerCodec*> kinds, std::vector<const Transform*> transforms);

 private:
  std::vector<const LayerCodec*> kinds_;
  std::vector<const Transform*> transforms_;
};

// ---- Encoding options -------------------------------------------------------------

struct TransformSpec {
  std::string id;
  std::int32_t level = 0;
  friend bool operator==(const TransformSpec&, const TransformSpec&) = default;
};

// The lossless transform each plane gets unless told otherwise, picked by
// measurement (docs/BENCHMARKS.md, "Choosing the default transform"):
// raw/v1 everywhere.
TransformSpec DefaultTransform(PlaneId plane);

inline constexpr std::uint64_t kDefaultChunkBytes = 1ull << 20;
// The most rows one chunk of an append-only plane holds by default. Without a
// cap a small plane (a tiny model's latent rows: 160 bytes a row) would be one
// chunk whose bytes change with its length, so two boundaries of one
// conversation would share none of it; with it they share every chunk but the
// last. The GLM-5-class latent rows already cut at 256 rows; the cap only
// cuts its pool keys (2,048 rows of 512 bytes) finer (docs/codecs.md).
inline constexpr std::uint64_t kDefaultMaxChunkRows = 1024;

struct EncodeOptions {
  // Applied to every plane not named in plane_transforms; DefaultTransform when unset.
  std::optional<TransformSpec> all_planes;
  // Per-plane choices. A lossy transform is refused on any plane other than
  // latent rows (index rows and pool keys decide top-k ties; they stay exact).
  std::vector<std::pair<PlaneId, TransformSpec>> plane_transforms;
  // Append-only planes are chunked every
  // ChunkRowsFor(row bytes, target_chunk_bytes, max_chunk_rows) rows.
  std::uint64_t target_chunk_bytes = kDefaultChunkBytes;
  std::uint64_t max_chunk_rows = kDefaultMaxChunkRows;

  TransformSpec ForPlane(PlaneId plane) const;
};

// The largest power of two of rows whose bytes fit target_bytes, and at most
// max_rows (at least 1): a function of the row size alone, so chunk boundaries
// do not move with len.
std::uint64_t ChunkRowsFor(std::uint64_t row_bytes, std::uint64_t target_bytes,
                           std::uint64_t max_rows = kDefaultMaxChunkRows);

// ---- The encoded layer ------------------------------------------------------------

struct ChunkRecord {
  std::uint64_t raw_bytes = 0;  // decoded bytes (values of the plane's type)
  std::uint64_t encoded_bytes = 0;
  std::uint64_t raw_checksum = 0;      // XXH3-64 of the bytes decoding must produce
  std::uint64_t encoded_checksum = 0;  // XXH3-64 of the encoded bytes
  friend bool operator==(const ChunkRecord&, const ChunkRecord&) = default;
};

// One plane: its transform, its extent, and its chunks (plane rows
// [k * chunk_rows, min((k + 1) * chunk_rows, rows)) for chunk k). A plane
// without values has chunk_rows 0 and no chunks; an eager plane has
// chunk_rows == rows.
struct PlaneRecord {
  PlaneId id = PlaneId::kLatentRows;
  std::string transform;
  std::int32_t level = 0;
  std::uint64_t rows = 0;
  std::uint32_t row_width = 0;
  std::uint64_t chunk_rows = 0;
  std::vector<ChunkRecord> chunks;
  friend bool operator==(const PlaneRecord&, const PlaneRecord&) = default;
};

struct LayerHeader {
  std::string kind;  // exact identity, e.g. "mla-latent/v1"
  LayerShape shape;
  std::vector<PlaneRecord> planes;

  std::size_t chunk_count() const;
  // The identity plane p is stored under: "transform(kind)"; empty when
  // there is no plane p.
  std::string PlaneIdentity(std::size_t plane) const;
  friend bool operator==(const LayerHeader&, const LayerHeader&) = default;
};

// A header and the encoded bytes of its chunks: plane by plane, in chunk order.
struct EncodedLayer {
  LayerHeader header;
  std::vector<std::string> chunks;
};

// Where chunk i of a layer lies.
struct ChunkLocation {
  std::size_t plane = 0;        // index into LayerHeader::planes
  std::size_t index = 0;        // chunk index within the plane
  std::uint64_t first_row = 0;  // absolute row within the plane
  std::uint64_t rows = 0;
  std::uint64_t value_offset = 0;  // first_row * row_width
  std::uint64_t value_count = 0;   // rows * row_width
};

// Encodes one layer, given as its shape and its planes (the kind's planes in
// stored order, anywhere in memory: e.g. views of pinned memory a capture
// downloaded into), chunk by chunk into buffers the caller gives, so that
// each chunk's bytes are written exactly once. Create refuses what
// EncodeLayer refuses. Thread-safety: EncodeChunk may run concurrently for
// different chunks; Finish after every chunk was encoded.
class LayerEncoder {
 public:
  // Each plane's type must be the shape's for that plane.
  static Result<LayerEncoder> Create(const LayerShape& shape, std::vector<ElementSpan> planes,
                                     const EncodeOptions& options = {});
  static Result<LayerEncoder> Create(const LayerShape& shape, const std::vector<std::span<const float>>& planes,
                                     const EncodeOptions& options = {});
  std::size_t chunk_count() const { return locations_.size(); }
  const ChunkLocation& chunk(std::size_t i) const { return locations_[i]; }
  // The most bytes chunk i can take: the space to give EncodeChunk.
  std::uint64_t MaxChunkBytes(std::size_t i) const;
  // Encodes chunk i into `out` (at least MaxChunkBytes(i) bytes) and records
  // it; returns the bytes written.
  Result<std::size_t> EncodeChunk(std::size_t i, std::span<std::byte> out);
  // The header, once every chunk was encoded (FailedPrecondition before).
  Result<LayerHeader> Finish() const;

 private:
  LayerEncoder() = default;
  LayerHeader header_;
  std::vector<ElementSpan> planes_;
  std::vector<const Transform*> transforms_;
  std::vector<ChunkLocation> locations_;
  std::vector<std::uint8_t> encoded_;  // per chunk: EncodeChunk succeeded
};

// Encodes a snapshot with the current codec of its kind (a LayerEncoder over
// its planes, each chunk into a string). Refuses a snapshot failing
// CheckSnapshot, one past the default CodecLimits, an unknown transform, a bad
// level, and a lossy transform on a plane that must stay exact.
Result<EncodedLayer> EncodeLayer(const LayerSnapshot& layer, const EncodeOptions& options = {});
// The same of a layer given as its shape and its planes, as LayerEncoder
// takes them (the planes must hold what the shape says; Create checks).
Result<EncodedLayer> EncodeLayer(const LayerShape& shape, const std::vector<std::span<const float>>& planes,
                                 const EncodeOptions& options = {});

// A layer header that passed every structural check, ready to decode chunks:
// the kind and every transform are known exactly, the shape passes CheckShape
// and the limits, the planes are the kind's planes in order with the shape's
// extents, chunk_rows and chunk counts agree with the rows, every chunk's raw
// size is what its rows make, and fixed-size transforms' encoded sizes agree.
// Thread-safety: immutable after Create; DecodeChunk may run concurrently for
// different chunks (each writes only its own rows).
class LayerDecoder {
 public:
  static Result<LayerDecoder> Create(LayerHeader header, const CodecLimits& limits = {});

  const LayerHeader& header() const { return header_; }
  const std::vector<PlaneLayout>& planes() const { return layouts_; }
  std::size_t chunk_count() const { return locations_.size(); }
  const ChunkLocation& chunk(std::size_t i) const { return locations_[i]; }

  // Decodes chunk i into its rows of `plane`, the whole destination plane
  // (planes()[chunk(i).plane].values() values of its dtype, e.g. a pinned
  // staging buffer). Checks size and checksum of the encoded bytes before
  // decoding and the checksum of the written bytes after; on error those
  // rows are garbage. A destination of another element type is refused.
  Status DecodeChunk(std::size_t i, std::span<const std::byte> encoded, MutableElementSpan plane) const;
  // Whether chunk i is stored raw/v1: its encoded bytes are its values, so
  // they may be copied where the plane lies (to a device) once
  // CheckEncoded(i, ...) passed, without DecodeChunk.
  bool ChunkIsRaw(std::size_t i) const;
  // Chunk i's encoded size and checksum (what DecodeChunk checks first).
  Status CheckEncoded(std::size_t i, std::span<const std::byte> encoded) const;
  // Every chunk into caller-provided planes, one span per plane in order.
  Status DecodeInto(std::span<const std::string> chunks, std::span<const MutableElementSpan> planes) const;
  Status DecodeInto(std::span<const std::string> chunks, std::span<const std::span<float>> planes) const;
  // Every chunk into a freshly allocated snapshot (f32 planes only).
  Result<LayerSnapshot> Decode(std::span<const std::string> chunks) const;

 private:
  friend struct LayerDecoderAccess;  // codecs-internal (fuzzing)
  LayerDecoder() = default;
  std::string ChunkWhere(std::size_t i) const;  // "kind plane chunk k (rows [a, b))" for messages
  LayerHeader header_;
  std::vector<PlaneLayout> layouts_;
  std::vector<const Transform*> transforms_;
  std::vector<ChunkLocation> locations_;
  bool verify_checksums_ = true;
};

Result<LayerSnapshot> DecodeLayer(const EncodedLayer& layer, const CodecLimits& limits = {});
Status DecodeLayerInto(const EncodedLayer& layer, std::span<const std::span<float>> planes,
                       const CodecLimits& limits = {});

// Structural checks of a header (what LayerDecoder::Create runs).
Status CheckHeader(const LayerHeader& header, const CodecLimits& limits = {});
// Whether an encoded layer fits a cache layer: Validate(header.shape, target).
Status Validate(const LayerHeader& header, const LayerGeometry& target);

// The header alone, checksummed (for a store that keeps chunks apart).
std::string SerializeLayerHeader(const LayerHeader& header);
// Parses exactly one serialized header, refusing trailing bytes; runs CheckHeader.
Result<LayerHeader> ParseLayerHeader(std::span<const std::byte> bytes, const CodecLimits& limits = {});

// The flat layer: the serialized header, then every chunk's bytes in order.
std::string SerializeLayer(const EncodedLayer& layer);
// Parses a flat layer: the header as above, then exactly the chunk bytes it
// announces (no more, no less), each checked against its encoded checksum.
Result<EncodedLayer> ParseLayer(std::span<const std::byte> bytes, const CodecLimits& limits = {});

// The store's check of these layers at commit (a LayerValidator): the header
// parses, its chunk table matches the chunks received, append-only planes
// hold one row per token of the boundary, and, when the publish carries its
// model's descriptor, the layers are that model's plan (CheckPlan). One
// shared, immutable instance.
std::shared_ptr<const LayerValidator> CodecLayerValidator();

// Decodes one layer and checks its planes against its shape, as a restore
// would (every chunk against its checksums, every plane its exact size), and
// returns the shape. The decoded values are dropped: this is a check of bytes
// from outside (a remote tier, a file) before they are kept. Planes of any
// element type.
Result<LayerShape> CheckDecodes(const EncodedLayer& layer, const CodecLimits& limits = {});

inline std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

}  // namespace primecache

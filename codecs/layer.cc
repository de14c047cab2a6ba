// Encoding a layer into chunks, and the checked decoder.
#include <algorithm>
#include <limits>

#include "core/bytes.h"
#include "codecs/internal.h"
#include "primecache/checksum.h"
#include "primecache/internal/codec.h"

namespace primecache {

using codecs::AsCorruption;

namespace {

std::string N(std::uint64_t v) {
  return std::to_string(v);
}

std::uint64_t ChecksumOf(std::span<const std::byte> v) {
  return Checksum64(v);
}

// The chunk rows an encoder uses for a plane: none for an empty plane, all
// of them for an eager plane, fixed absolute boundaries for an append-only one.
std::uint64_t EncoderChunkRows(const PlaneLayout& plane, const EncodeOptions& options) {
  if (plane.values() == 0) return 0;
  if (!plane.append_only) return plane.rows;
  return ChunkRowsFor(plane.row_bytes(), options.target_chunk_bytes, options.max_chunk_rows);
}

// raw/v1 stores the raw bytes themselves: its raw and encoded checksums are
// one hash of one byte string, computed (and verified) once.
bool IsIdentity(const Transform& t) {
  return t.id() == kRawTransform;
}

// Encodes one chunk's values into `out` and fills its record. The raw
// checksum covers the values decoding will give back: the input itself for a
// lossless transform, the decoded approximation for a lossy one.
Result<std::size_t> EncodeChunkInto(const Transform& t, std::int32_t level, ElementSpan values,
                                    std::span<std::byte> out, ChunkRecord* rec) {
  PC_ASSIGN_OR_RETURN(std::size_t n, t.EncodeInto(values, level, out));
  const std::span<const std::byte> encoded = out.first(n);
  rec->raw_bytes = values.bytes.size();
  rec->encoded_bytes = n;
  if (!t.lossy()) {
    rec->raw_checksum = ChecksumOf(values.bytes);
    rec->encoded_checksum = IsIdentity(t) ? rec->raw_checksum : Checksum64(encoded);
    return n;
  }
  rec->encoded_checksum = Checksum64(encoded);
  thread_local std::vector<std::byte> decoded;
  decoded.resize(values.bytes.size());
  PC_RETURN_IF_ERROR(t.Decode(encoded, MutableElementSpan(decoded, values.type))
                         .WithContext("decoding what was just encoded"));
  rec->raw_checksum = ChecksumOf(decoded);
  return n;
}

// A destination plane must be of the plane's type and hold all of it.
Status CheckDestination(const PlaneLayout& lay, const MutableElementSpan& plane) {
  if (plane.type != lay.dtype) {
    return Status::InvalidArgument(std::string("destination holds ") + ElementTypeName(plane.type) +
                                   " values; the plane is " + ElementTypeName(lay.dtype));
  }
  if (plane.bytes.size() != lay.raw_bytes()) {
    return Status::InvalidArgument("destination holds " + N(plane.bytes.size()) + " bytes; the plane has " +
                                   N(lay.values()) + " " + ElementTypeName(lay.dtype) + " values (" +
                                   N(lay.raw_bytes()) + " bytes)");
  }
  return Status::Ok();
}

// The number of chunks a plane of `rows` rows has at `chunk_rows` rows each.
std::uint64_t ChunksFor(std::uint64_t rows, std::uint64_t chunk_rows) {
  return chunk_rows == 0 ? 0 : rows / chunk_rows + (rows % chunk_rows != 0);
}

// Checks the chunking of one plane record against its layout: chunk_rows,
// chunk count, and every chunk's raw and encoded size. Appends the chunks'
// locations.
Status CheckPlaneChunks(const PlaneRecord& rec, const PlaneLayout& lay, const Transform& t, std::size_t plane,
                        const CodecLimits& limits, std::vector<ChunkLocation>* locations) {
  const std::uint64_t row_bytes = lay.row_bytes();
  if (lay.values() == 0) {
    if (rec.chunk_rows != 0 || !rec.chunks.empty()) {
      return Status::Corruption("holds no values but records chunk_rows " + N(rec.chunk_rows) + " and " +
                                N(rec.chunks.size()) + " chunks");
    }
    return Status::Ok();
  }
  if (!lay.append_only && rec.chunk_rows != lay.rows) {
    return Status::Corruption("is stored as one chunk of all " + N(lay.rows) + " rows; chunk_rows is " +
                              N(rec.chunk_rows));
  }
  if (rec.chunk_rows == 0 || rec.chunk_rows > limits.max_chunk_bytes / row_bytes) {
    return Status::Corruption("chunk_rows " + N(rec.chunk_rows) + " outside [1, " +
                              N(limits.max_chunk_bytes / row_bytes) + "] for rows of " + N(row_bytes) +
                              " bytes");
  }
  const std::uint64_t count = ChunksFor(lay.rows, rec.chunk_rows);
  if (rec.chunks.size() != count) {
    return Status::Corruption("records " + N(rec.chunks.size()) + " chunks; " + N(lay.rows) + " rows at " +
                              N(rec.chunk_rows) + " a chunk make " + N(count));
  }
  for (std::size_t k = 0; k < rec.chunks.size(); ++k) {
    const ChunkRecord& c = rec.chunks[k];
    const std::uint64_t first_row = k * rec.chunk_rows;
    const std::uint64_t rows = std::min(rec.chunk_rows, lay.rows - first_row);
    const std::uint64_t values = rows * lay.row_width;
    const std::string where = "chunk " + N(k) + " (rows [" + N(first_row) + ", " + N(first_row + rows) + "))";
    const std::uint64_t raw = values * ElementBytes(lay.dtype);
    if (c.raw_bytes != raw) {
      return Status::Corruption(where + " records " + N(c.raw_bytes) + " raw bytes; its rows make " + N(raw));
    }
    if (auto exact = t.ExactEncodedSize(values, lay.dtype); exact && c.encoded_bytes != *exact) {
      return Status::Corruption(where + " records " + N(c.encoded_bytes) + " encoded bytes; " +
                                std::string(t.id()) + " makes exactly " + N(*exact));
    }
    if (const std::uint64_t most = t.MaxEncodedSize(values, lay.dtype); c.encoded_bytes > most) {
      return Status::Corruption(where + " records " + N(c.encoded_bytes) + " encoded bytes; " +
                                std::string(t.id()) + " makes at most " + N(most));
    }
    locations->push_back({plane, k, first_row, rows, first_row * lay.row_width, values});
  }
  return Status::Ok();
}

}  // namespace

namespace codecs {

Status AsCorruption(Status s) {
  if (s.code() != StatusCode::kInvalidArgument) return s;
  return Status::Corruption(s.message());
}

Result<LayerSnapshot> DecodeLayer(const EncodedLayer& layer, const CodecLimits& limits, Checksums checksums) {
  PC_ASSIGN_OR_RETURN(LayerDecoder decoder, LayerDecoder::Create(layer.header, limits));
  if (checksums == Checksums::kSkip) LayerDecoderAccess::SkipChecksums(decoder);
  return decoder.Decode(layer.chunks);
}

}  // namespace codecs

// ---- Encoding ------------------------------------------------------------------------

Result<LayerEncoder> LayerEncoder::Create(const LayerShape& shape,
                                          const std::vector<std::span<const float>>& planes,
                                          const EncodeOptions& options) {
  return Create(shape, std::vector<ElementSpan>(planes.begin(), planes.end()), options);
}

Result<LayerEncoder> LayerEncoder::Create(const LayerShape& shape, std::vector<ElementSpan> planes,
                                          const EncodeOptions& options) {
  const CodecRegistry& registry = CodecRegistry::Default();
  const CodecLimits limits;
  PC_ASSIGN_OR_RETURN(const LayerCodec* codec, registry.KindFor(shape));
  PC_ASSIGN_OR_RETURN(std::vector<PlaneLayout> layouts, codec->Planes(shape, limits));
  if (options.target_chunk_bytes < sizeof(float) || options.target_chunk_bytes > limits.max_chunk_bytes) {
    return Status::InvalidArgument("target_chunk_bytes " + N(options.target_chunk_bytes) + " outside [4, " +
                                   N(limits.max_chunk_bytes) + "]");
  }
  if (options.max_chunk_rows == 0 || options.max_chunk_rows > limits.max_tokens) {
    return Status::InvalidArgument("max_chunk_rows " + N(options.max_chunk_rows) + " outside [1, " +
                                   N(limits.max_tokens) + "]");
  }
  if (planes.size() != layouts.size()) {
    return Status::InvalidArgument(std::string(codec->kind()) + ": " + N(planes.size()) + " planes given; the kind has " +
                                   N(layouts.size()));
  }
  LayerEncoder e;
  e.header_.kind = std::string(codec->kind());
  e.header_.shape = shape;
  for (std::size_t p = 0; p < layouts.size(); ++p) {
    const PlaneLayout& lay = layouts[p];
    const std::string where = std::string(codec->kind()) + " plane " + std::string(PlaneName(lay.id));
    if (planes[p].type != lay.dtype) {
      return Status::InvalidArgument(where + " is given " + ElementTypeName(planes[p].type) +
                                     " values; the shape says " + ElementTypeName(lay.dtype));
    }
    if (planes[p].bytes.size() != lay.raw_bytes()) {
      return Status::InvalidArgument(where + " holds " + N(planes[p].bytes.size()) + " bytes, the shape says " +
                                     N(lay.values()) + " " + ElementTypeName(lay.dtype) + " values (" +
                                     N(lay.raw_bytes()) + " bytes)");
    }
    const TransformSpec spec = options.ForPlane(lay.id);
    PC_ASSIGN_OR_RETURN(const Transform* t, registry.FindTransform(spec.id));
    if (t->lossy() && !lay.lossy_allowed) {
      return Status::InvalidArgument(where + " must be lossless; " + std::string(t->id()) +
                                     " refused (only latent rows may be stored lossy)");
    }
    PC_RETURN_IF_ERROR(t->CheckType(lay.dtype).WithContext(where));
    PC_RETURN_IF_ERROR(t->CheckLevel(spec.level).WithContext(where));
    PlaneRecord rec{lay.id, spec.id, spec.level, lay.rows, lay.row_width, EncoderChunkRows(lay, options), {}};
    for (std::uint64_t first = 0; first < lay.rows && rec.chunk_rows != 0; first += rec.chunk_rows) {
      const std::uint64_t rows = std::min(rec.chunk_rows, lay.rows - first);
      e.locations_.push_back({p, rec.chunks.size(), first, rows, first * lay.row_width, rows * lay.row_width});
      rec.chunks.emplace_back();
    }
    e.header_.planes.push_back(std::move(rec));
    e.transforms_.push_back(t);
  }
  if (e.locations_.size() > limits.max_chunks) {
    return Status::ResourceExhausted(N(e.locations_.size()) + " chunks exceed the limit of " + N(limits.max_chunks) +
                                     "; raise target_chunk_bytes");
  }
  e.planes_ = std::move(planes);
  e.encoded_.assign(e.locations_.size(), 0);
  return e;
}

std::uint64_t LayerEncoder::MaxChunkBytes(std::size_t i) const {
  if (i >= locations_.size()) return 0;
  const ChunkLocation& loc = locations_[i];
  return transforms_[loc.plane]->MaxEncodedSize(loc.value_count, planes_[loc.plane].type);
}

Result<std::size_t> LayerEncoder::EncodeChunk(std::size_t i, std::span<std::byte> out) {
  if (i >= locations_.size()) {
    return Status::InvalidArgument("chunk " + N(i) + " of a layer of " + N(locations_.size()) + " chunks");
  }
  const ChunkLocation& loc = locations_[i];
  PlaneRecord& rec = header_.planes[loc.plane];
  const ElementSpan& plane = planes_[loc.plane];
  const std::uint32_t width = ElementBytes(plane.type);
  const ElementSpan values(plane.bytes.subspan(loc.value_offset * width, loc.value_count * width), plane.type);
  const std::string where = header_.kind + " plane " + std::string(PlaneName(rec.id));
  Result<std::size_t> n = EncodeChunkInto(*transforms_[loc.plane], rec.level, values, out, &rec.chunks[loc.index]);
  if (!n.ok()) return n.status().WithContext(where);
  encoded_[i] = 1;
  return *n;
}

Result<LayerHeader> LayerEncoder::Finish() const {
  for (std::size_t i = 0; i < encoded_.size(); ++i) {
    if (encoded_[i] == 0) return Status::FailedPrecondition(header_.kind + ": chunk " + N(i) + " was not encoded");
  }
  return header_;
}

Result<EncodedLayer> EncodeLayer(const LayerSnapshot& layer, const EncodeOptions& options) {
  PC_ASSIGN_OR_RETURN(const LayerCodec* codec, CodecRegistry::Default().KindFor(ShapeOf(layer)));
  PC_RETURN_IF_ERROR(CheckSnapshot(layer).WithContext(codec->kind()));
  return EncodeLayer(ShapeOf(layer), codec->PlaneData(layer), options);
}

Result<EncodedLayer> EncodeLayer(const LayerShape& shape, const std::vector<std::span<const float>>& planes,
                                 const EncodeOptions& options) {
  PC_ASSIGN_OR_RETURN(LayerEncoder enc, LayerEncoder::Create(shape, planes, options));
  EncodedLayer out;
  out.chunks.resize(enc.chunk_count());
  for (std::size_t i = 0; i < enc.chunk_count(); ++i) {
    std::string& bytes = out.chunks[i];
    bytes.resize(enc.MaxChunkBytes(i));
    PC_ASSIGN_OR_RETURN(std::size_t n, enc.EncodeChunk(i, std::as_writable_bytes(std::span(bytes))));
    bytes.resize(n);
  }
  PC_ASSIGN_OR_RETURN(out.header, enc.Finish());
  return out;
}

// ---- Decoding --------------------------------------------------------------------------

Result<LayerDecoder> LayerDecoder::Create(LayerHeader header, const CodecLimits& limits) {
  const CodecRegistry& registry = CodecRegistry::Default();
  PC_ASSIGN_OR_RETURN(const LayerCodec* codec, registry.FindKind(header.kind));
  if (!codec->Accepts(header.shape)) {
    return Status::Corruption("header of kind " + header.kind + " carries a shape of another kind");
  }
  Result<std::vector<PlaneLayout>> layouts = codec->Planes(header.shape, limits);
  if (!layouts.ok()) return AsCorruption(layouts.status()).WithContext(header.kind);
  if (header.planes.size() != layouts->size()) {
    return Status::Corruption(header.kind + " has " + N(layouts->size()) + " planes; the header records " +
                              N(header.planes.size()));
  }

  LayerDecoder d;
  for (std::size_t p = 0; p < layouts->size(); ++p) {
    const PlaneRecord& rec = header.planes[p];
    const PlaneLayout& lay = (*layouts)[p];
    const std::string where =
        header.kind + " plane " + std::to_string(p) + " (" + std::string(PlaneName(lay.id)) + ")";
    if (rec.id != lay.id) {
      return Status::Corruption(where + " is recorded as " + std::string(PlaneName(rec.id)));
    }
    if (rec.rows != lay.rows || rec.row_width != lay.row_width) {
      return Status::Corruption(where + " records " + N(rec.rows) + " rows of " + N(rec.row_width) +
                                " values; the layer's metadata makes " + N(lay.rows) + " rows of " +
                                N(lay.row_width));
    }
    Result<const Transform*> t = registry.FindTransform(rec.transform);
    if (!t.ok()) return AsCorruption(t.status()).WithContext(where);
    if ((*t)->lossy() && !lay.lossy_allowed) {
      return Status::Corruption(where + " is stored " + rec.transform + "; it must be lossless");
    }
    PC_RETURN_IF_ERROR(AsCorruption((*t)->CheckType(lay.dtype)).WithContext(where));
    PC_RETURN_IF_ERROR(AsCorruption((*t)->CheckLevel(rec.level)).WithContext(where));
    if (rec.chunks.size() > limits.max_chunks - d.locations_.size()) {
      return Status::ResourceExhausted(where + ": more than " + N(limits.max_chunks) +
                                       " chunks in the layer");
    }
    PC_RETURN_IF_ERROR(CheckPlaneChunks(rec, lay, **t, p, limits, &d.locations_).WithContext(where));
    d.transforms_.push_back(*t);
  }
  d.layouts_ = std::move(layouts).value();
  d.header_ = std::move(header);
  return d;
}

std::string LayerDecoder::ChunkWhere(std::size_t i) const {
  const ChunkLocation& loc = locations_[i];
  return header_.kind + " " + std::string(PlaneName(layouts_[loc.plane].id)) + " chunk " + N(loc.index) +
         " (rows [" + N(loc.first_row) + ", " + N(loc.first_row + loc.rows) + "))";
}

bool LayerDecoder::ChunkIsRaw(std::size_t i) const {
  return i < locations_.size() && IsIdentity(*transforms_[locations_[i].plane]);
}

Status LayerDecoder::CheckEncoded(std::size_t i, std::span<const std::byte> encoded) const {
  if (i >= locations_.size()) {
    return Status::InvalidArgument("chunk " + N(i) + " of a layer of " + N(locations_.size()) + " chunks");
  }
  const ChunkLocation& loc = locations_[i];
  const ChunkRecord& rec = header_.planes[loc.plane].chunks[loc.index];
  if (encoded.size() != rec.encoded_bytes) {
    return Status::Corruption(ChunkWhere(i) + ": " + N(encoded.size()) + " encoded bytes; the header records " +
                              N(rec.encoded_bytes));
  }
  if (verify_checksums_ && Checksum64(encoded) != rec.encoded_checksum) {
    return Status::Corruption(ChunkWhere(i) + ": checksum mismatch on the encoded bytes");
  }
  // raw/v1's values are its encoded bytes: both checksums are one hash.
  if (verify_checksums_ && IsIdentity(*transforms_[loc.plane]) && rec.raw_checksum != rec.encoded_checksum) {
    return Status::Corruption(ChunkWhere(i) + ": checksum mismatch on the decoded (raw) bytes");
  }
  return Status::Ok();
}

Status LayerDecoder::DecodeChunk(std::size_t i, std::span<const std::byte> encoded,
                                 MutableElementSpan plane) const {
  if (i >= locations_.size()) {
    return Status::InvalidArgument("chunk " + N(i) + " of a layer of " + N(locations_.size()) + " chunks");
  }
  const ChunkLocation& loc = locations_[i];
  const PlaneLayout& lay = layouts_[loc.plane];
  const ChunkRecord& rec = header_.planes[loc.plane].chunks[loc.index];
  const std::string where = ChunkWhere(i);
  PC_RETURN_IF_ERROR(CheckDestination(lay, plane).WithContext(where));
  PC_RETURN_IF_ERROR(CheckEncoded(i, encoded));
  const std::uint32_t width = ElementBytes(lay.dtype);
  const MutableElementSpan dst(plane.bytes.subspan(loc.value_offset * width, loc.value_count * width), lay.dtype);
  const Transform& t = *transforms_[loc.plane];
  PC_RETURN_IF_ERROR(AsCorruption(t.Decode(encoded, dst)).WithContext(where));
  // For raw/v1 the bytes written are the encoded bytes just verified, so
  // their hash is the encoded checksum.
  const bool raw_ok =
      IsIdentity(t) ? rec.raw_checksum == rec.encoded_checksum : ChecksumOf(dst.bytes) == rec.raw_checksum;
  if (verify_checksums_ && !raw_ok) {
    return Status::Corruption(where + ": checksum mismatch on the decoded (raw) bytes");
  }
  return Status::Ok();
}

Status LayerDecoder::DecodeInto(std::span<const std::string> chunks,
                                std::span<const std::span<float>> planes) const {
  const std::vector<MutableElementSpan> typed(planes.begin(), planes.end());
  return DecodeInto(chunks, typed);
}

Status LayerDecoder::DecodeInto(std::span<const std::string> chunks,
                                std::span<const MutableElementSpan> planes) const {
  if (chunks.size() != locations_.size()) {
    return Status::Corruption(header_.kind + ": " + N(chunks.size()) + " chunks; the header records " +
                              N(locations_.size()));
  }
  if (planes.size() != layouts_.size()) {
    return Status::InvalidArgument(header_.kind + ": " + N(planes.size()) +
                                   " destination planes; the layer has " + N(layouts_.size()));
  }
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    PC_RETURN_IF_ERROR(DecodeChunk(i, AsBytes(chunks[i]), planes[locations_[i].plane]));
  }
  // Planes without values have no chunks; their destinations are checked here.
  for (std::size_t p = 0; p < layouts_.size(); ++p) {
    PC_RETURN_IF_ERROR(CheckDestination(layouts_[p], planes[p])
                           .WithContext(header_.kind + " " + std::string(PlaneName(layouts_[p].id))));
  }
  return Status::Ok();
}

Result<LayerSnapshot> LayerDecoder::Decode(std::span<const std::string> chunks) const {
  PC_ASSIGN_OR_RETURN(LayerSnapshot layer, MakeSnapshot(header_.shape));
  PC_ASSIGN_OR_RETURN(const LayerCodec* codec, CodecRegistry::Default().FindKind(header_.kind));
  std::vector<std::span<float>> planes = codec->MutablePlaneData(layer);
  PC_RETURN_IF_ERROR(DecodeInto(chunks, planes));
  return layer;
}

Result<LayerSnapshot> DecodeLayer(const EncodedLayer& layer, const CodecLimits& limits) {
  return codecs::DecodeLayer(layer, limits, codecs::Checksums::kVerify);
}

Result<LayerShape> CheckDecodes(const EncodedLayer& layer, const CodecLimits& limits) {
  PC_ASSIGN_OR_RETURN(LayerDecoder decoder, LayerDecoder::Create(layer.header, limits));
  std::vector<std::vector<std::byte>> bytes;
  std::vector<MutableElementSpan> planes;
  bytes.reserve(decoder.planes().size());
  for (const PlaneLayout& lay : decoder.planes()) {
    planes.emplace_back(bytes.emplace_back(lay.raw_bytes()), lay.dtype);
  }
  PC_RETURN_IF_ERROR(decoder.DecodeInto(layer.chunks, planes));
  return decoder.header().shape;
}

Status DecodeLayerInto(const EncodedLayer& layer, std::span<const std::span<float>> planes,
                       const CodecLimits& limits) {
  PC_ASSIGN_OR_RETURN(LayerDecoder decoder, LayerDecoder::Create(layer.header, limits));
  return decoder.DecodeInto(layer.chunks, planes);
}

Status CheckHeader(const LayerHeader& header, const CodecLimits& limits) {
  return LayerDecoder::Create(header, limits).status();
}

Status Validate(const LayerHeader& header, const LayerGeometry& target) {
  return Validate(header.shape, target);
}

}  // namespace primecache

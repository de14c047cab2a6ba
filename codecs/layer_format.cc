// The byte form of a layer header and of a flat layer (docs/format-snapshot.md).
#include <cstring>

#include "core/bytes.h"
#include "codecs/internal.h"
#include "primecache/checksum.h"
#include "primecache/internal/codec.h"

namespace primecache {

using codecs::AsCorruption;
using codecs::Checksums;

namespace {

constexpr char kHeaderMagic[4] = {'P', 'C', 'L', 'H'};
constexpr std::uint32_t kHeaderVersion = 1;
constexpr std::size_t kHeaderPrefix = 12;  // magic, version, body length
constexpr std::size_t kChunkRecordBytes = 32;
constexpr std::uint8_t kMaxFields = 32;
constexpr std::uint8_t kMaxPlanes = 16;
constexpr std::uint64_t kMaxString = 255;

std::string N(std::uint64_t v) {
  return std::to_string(v);
}

std::string_view Clip(std::string_view s) {
  return s.substr(0, kMaxString);
}

bool KnownPlaneId(std::uint8_t id) {
  return id >= static_cast<std::uint8_t>(PlaneId::kLatentRows) &&
         id <= static_cast<std::uint8_t>(PlaneId::kIndexKeys);
}

void WriteBody(const LayerHeader& h, std::string* body) {
  ByteWriter w(body);
  w.Str8(Clip(h.kind));
  std::vector<std::uint64_t> fields;
  if (auto codec = CodecRegistry::Default().KindFor(h.shape); codec.ok())
    fields = (*codec)->ShapeFields(h.shape);
  w.U8(static_cast<std::uint8_t>(fields.size()));
  for (std::uint64_t f : fields) w.U64(f);
  w.U8(static_cast<std::uint8_t>(h.planes.size()));
  for (const PlaneRecord& p : h.planes) {
    w.U8(static_cast<std::uint8_t>(p.id));
    w.Str8(Clip(p.transform));
    w.I32(p.level);
    w.U64(p.rows);
    w.U32(p.row_width);
    w.U64(p.chunk_rows);
    w.U32(static_cast<std::uint32_t>(p.chunks.size()));
    for (const ChunkRecord& c : p.chunks) {
      w.U64(c.raw_bytes);
      w.U64(c.encoded_bytes);
      w.U64(c.raw_checksum);
      w.U64(c.encoded_checksum);
    }
  }
}

Status ReadPlane(ByteReader& r, const CodecLimits& limits, std::uint64_t* chunks_so_far, PlaneRecord* p) {
  std::uint8_t id = 0;
  PC_RETURN_IF_ERROR(r.U8(&id, "plane id"));
  if (!KnownPlaneId(id)) return Status::Corruption("unknown plane id " + N(id));
  p->id = static_cast<PlaneId>(id);
  PC_RETURN_IF_ERROR(r.Str8(&p->transform, kMaxString, "transform"));
  PC_RETURN_IF_ERROR(r.I32(&p->level, "level"));
  PC_RETURN_IF_ERROR(r.U64(&p->rows, "rows"));
  PC_RETURN_IF_ERROR(r.U32(&p->row_width, "row width"));
  PC_RETURN_IF_ERROR(r.U64(&p->chunk_rows, "chunk rows"));
  std::uint32_t count = 0;
  PC_RETURN_IF_ERROR(r.U32(&count, "chunk count"));
  if (count > limits.max_chunks - *chunks_so_far) {
    return Status::ResourceExhausted("the layer records more than " + N(limits.max_chunks) + " chunks");
  }
  if (std::uint64_t{count} * kChunkRecordBytes > r.remaining()) {
    return Status::Corruption("truncated: " + N(count) + " chunk records at offset " + N(r.offset()) +
                              " need " + N(std::uint64_t{count} * kChunkRecordBytes) + " bytes, " +
                              N(r.remaining()) + " left");
  }
  *chunks_so_far += count;
  p->chunks.resize(count);
  for (ChunkRecord& c : p->chunks) {
    PC_RETURN_IF_ERROR(r.U64(&c.raw_bytes, "raw bytes"));
    PC_RETURN_IF_ERROR(r.U64(&c.encoded_bytes, "encoded bytes"));
    PC_RETURN_IF_ERROR(r.U64(&c.raw_checksum, "raw checksum"));
    PC_RETURN_IF_ERROR(r.U64(&c.encoded_checksum, "encoded checksum"));
  }
  return Status::Ok();
}

Result<LayerHeader> ReadBody(std::span<const std::byte> body, const CodecLimits& limits) {
  ByteReader r(body, kHeaderPrefix);
  LayerHeader h;
  PC_RETURN_IF_ERROR(r.Str8(&h.kind, kMaxString, "kind"));
  // Fail closed before reading anything the kind defines.
  Result<const LayerCodec*> codec = CodecRegistry::Default().FindKind(h.kind);
  if (!codec.ok()) return AsCorruption(codec.status());

  std::uint8_t field_count = 0;
  PC_RETURN_IF_ERROR(r.U8(&field_count, "field count"));
  if (field_count > kMaxFields) return Status::Corruption(N(field_count) + " header fields; at most 32");
  std::vector<std::uint64_t> fields(field_count);
  for (std::uint64_t& f : fields) PC_RETURN_IF_ERROR(r.U64(&f, "header field"));
  Result<LayerShape> shape = (*codec)->ShapeFromFields(fields);
  if (!shape.ok()) return AsCorruption(shape.status()).WithContext(h.kind);
  h.shape = *shape;

  std::uint8_t plane_count = 0;
  PC_RETURN_IF_ERROR(r.U8(&plane_count, "plane count"));
  if (plane_count > kMaxPlanes) return Status::Corruption(N(plane_count) + " planes; at most 16");
  h.planes.resize(plane_count);
  std::uint64_t chunks = 0;
  for (std::size_t i = 0; i < h.planes.size(); ++i) {
    PC_RETURN_IF_ERROR(ReadPlane(r, limits, &chunks, &h.planes[i]).WithContext("plane " + N(i)));
  }
  if (r.remaining() != 0) {
    return Status::Corruption(N(r.remaining()) + " unexpected bytes after the chunk table");
  }
  return h;
}

}  // namespace

std::string SerializeLayerHeader(const LayerHeader& header) {
  std::string body;
  WriteBody(header, &body);
  std::string out;
  ByteWriter w(&out);
  w.Bytes(std::string_view(kHeaderMagic, sizeof kHeaderMagic));
  w.U32(kHeaderVersion);
  w.U32(static_cast<std::uint32_t>(body.size()));
  w.Bytes(body);
  w.U64(Checksum64(AsBytes(out)));
  return out;
}

std::string SerializeLayer(const EncodedLayer& layer) {
  std::string out = SerializeLayerHeader(layer.header);
  for (const std::string& c : layer.chunks) out += c;
  return out;
}

namespace codecs {

Result<LayerHeader> ParseLayerHeaderPrefix(std::span<const std::byte> bytes, const CodecLimits& limits,
                                           Checksums checksums, std::size_t* consumed) {
  ByteReader r(bytes);
  std::span<const std::byte> magic;
  PC_RETURN_IF_ERROR(r.Bytes(sizeof kHeaderMagic, &magic, "layer header magic"));
  if (std::memcmp(magic.data(), kHeaderMagic, sizeof kHeaderMagic) != 0) {
    return Status::Corruption("not a primecache layer header (bad magic)");
  }
  std::uint32_t version = 0, body_len = 0;
  PC_RETURN_IF_ERROR(r.U32(&version, "layer header version"));
  if (version != kHeaderVersion) {
    return Status::NotSupported("layer header format version " + N(version) +
                                " is not supported (this build reads " + N(kHeaderVersion) + ")");
  }
  PC_RETURN_IF_ERROR(r.U32(&body_len, "layer header length"));
  std::span<const std::byte> body;
  PC_RETURN_IF_ERROR(r.Bytes(body_len, &body, "layer header body"));
  std::uint64_t stored = 0;
  PC_RETURN_IF_ERROR(r.U64(&stored, "layer header checksum"));
  if (checksums == Checksums::kVerify && Checksum64(bytes.first(kHeaderPrefix + body_len)) != stored) {
    return Status::Corruption("layer header checksum mismatch");
  }
  PC_ASSIGN_OR_RETURN(LayerHeader header, ReadBody(body, limits));
  PC_RETURN_IF_ERROR(CheckHeader(header, limits));
  *consumed = static_cast<std::size_t>(r.offset());
  return header;
}

Result<EncodedLayer> ParseLayer(std::span<const std::byte> bytes, const CodecLimits& limits,
                                Checksums checksums) {
  std::size_t consumed = 0;
  EncodedLayer layer;
  PC_ASSIGN_OR_RETURN(layer.header, ParseLayerHeaderPrefix(bytes, limits, checksums, &consumed));
  std::span<const std::byte> rest = bytes.subspan(consumed);
  std::uint64_t announced = 0;
  for (const PlaneRecord& p : layer.header.planes) {
    for (const ChunkRecord& c : p.chunks) {
      if (!CheckedAdd(announced, c.encoded_bytes, &announced)) {
        return Status::Corruption("the chunks' encoded sizes overflow 64 bits");
      }
    }
  }
  if (announced != rest.size()) {
    return Status::Corruption(announced > rest.size()
                                  ? "truncated: the header announces " + N(announced) + " chunk bytes, " +
                                        N(rest.size()) + " follow"
                                  : N(rest.size() - announced) + " bytes after the last chunk");
  }
  std::size_t offset = 0;
  layer.chunks.reserve(layer.header.chunk_count());
  for (std::size_t p = 0; p < layer.header.planes.size(); ++p) {
    const PlaneRecord& plane = layer.header.planes[p];
    for (std::size_t k = 0; k < plane.chunks.size(); ++k) {
      auto bytes_k = rest.subspan(offset, static_cast<std::size_t>(plane.chunks[k].encoded_bytes));
      offset += bytes_k.size();
      if (checksums == Checksums::kVerify && Checksum64(bytes_k) != plane.chunks[k].encoded_checksum) {
        return Status::Corruption(std::string(PlaneName(plane.id)) + " chunk " + N(k) +
                                  ": checksum mismatch on the encoded bytes");
      }
      layer.chunks.emplace_back(reinterpret_cast<const char*>(bytes_k.data()), bytes_k.size());
    }
  }
  return layer;
}

}  // namespace codecs

Result<LayerHeader> ParseLayerHeader(std::span<const std::byte> bytes, const CodecLimits& limits) {
  std::size_t consumed = 0;
  PC_ASSIGN_OR_RETURN(LayerHeader header,
                      codecs::ParseLayerHeaderPrefix(bytes, limits, Checksums::kVerify, &consumed));
  if (consumed != bytes.size()) {
    return Status::Corruption(N(bytes.size() - consumed) + " bytes after the layer header");
  }
  return header;
}

Result<EncodedLayer> ParseLayer(std::span<const std::byte> bytes, const CodecLimits& limits) {
  return codecs::ParseLayer(bytes, limits, Checksums::kVerify);
}

}  // namespace primecache

// Whole-boundary encoding and the .pcsnap container (docs/format-snapshot.md).
#include "primecache/internal/snapshot_file.h"

#include <cstring>

#include "core/bytes.h"
#include "codecs/internal.h"
#include "codecs/problems.h"
#include "primecache/checksum.h"

namespace primecache {

using codecs::Checksums;
using codecs::Problems;

namespace {

constexpr char kMagic[8] = {'\x89', 'P', 'C', 'S', 'N', 'A', 'P', '\n'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kPreambleBytes = 32;  // magic, version, header length, section count, flags, checksum
constexpr std::size_t kPreambleChecked = 24;
constexpr std::size_t kSectionEntryBytes = 32;
constexpr std::uint32_t kLayerSection = 1;

std::string N(std::uint64_t v) {
  return std::to_string(v);
}

std::vector<LayerShape> ShapesOf(const EncodedSnapshot& s) {
  std::vector<LayerShape> shapes;
  for (const EncodedLayer& l : s.layers) shapes.push_back(l.header.shape);
  return shapes;
}

// ---- The boundary header ----------------------------------------------------------

void WriteBoundaryHeader(const BoundaryHeader& h, std::string* out) {
  ByteWriter w(out);
  auto str = [&](std::string_view s) { w.Str16(s.substr(0, 0xffff)); };
  str(h.fingerprint.architecture);
  for (std::uint64_t v : {h.fingerprint.plan_digest.lo, h.fingerprint.plan_digest.hi,
                          h.fingerprint.weights_digest.lo, h.fingerprint.weights_digest.hi}) {
    w.U64(v);
  }
  w.U16(static_cast<std::uint16_t>(h.fingerprint.codec_versions.size()));
  for (const std::string& c : h.fingerprint.codec_versions) str(c);
  str(h.ns);
  w.U64(h.boundary_len);
  w.U64(h.tokens.size());
  for (std::uint32_t t : h.tokens) w.U32(t);
}

Result<BoundaryHeader> ReadBoundaryHeader(std::span<const std::byte> bytes, std::uint64_t base,
                                          const SnapshotLimits& limits) {
  ByteReader r(bytes, base);
  BoundaryHeader h;
  const std::uint64_t max_str = limits.max_string_bytes;
  PC_RETURN_IF_ERROR(r.Str16(&h.fingerprint.architecture, max_str, "architecture"));
  for (std::uint64_t* v : {&h.fingerprint.plan_digest.lo, &h.fingerprint.plan_digest.hi,
                           &h.fingerprint.weights_digest.lo, &h.fingerprint.weights_digest.hi}) {
    PC_RETURN_IF_ERROR(r.U64(v, "fingerprint digest"));
  }
  std::uint16_t versions = 0;
  PC_RETURN_IF_ERROR(r.U16(&versions, "codec version count"));
  if (versions > limits.max_codec_versions) {
    return Status::Corruption(N(versions) + " codec versions; at most " + N(limits.max_codec_versions));
  }
  h.fingerprint.codec_versions.resize(versions);
  for (std::string& c : h.fingerprint.codec_versions)
    PC_RETURN_IF_ERROR(r.Str16(&c, max_str, "codec version"));
  PC_RETURN_IF_ERROR(r.Str16(&h.ns, max_str, "namespace"));
  PC_RETURN_IF_ERROR(r.U64(&h.boundary_len, "boundary length"));
  std::uint64_t tokens = 0;
  PC_RETURN_IF_ERROR(r.U64(&tokens, "token count"));
  if (tokens > limits.codec.max_tokens) {
    return Status::ResourceExhausted(N(tokens) + " tokens exceed the limit of " + N(limits.codec.max_tokens));
  }
  if (tokens * sizeof(std::uint32_t) != r.remaining()) {
    return Status::Corruption(N(tokens) + " tokens take " + N(tokens * sizeof(std::uint32_t)) +
                              " bytes; the header has " + N(r.remaining()) + " left");
  }
  h.tokens.resize(tokens);
  for (std::uint32_t& t : h.tokens) PC_RETURN_IF_ERROR(r.U32(&t, "token"));
  return h;
}

// What a reader under the default limits accepts: refused on the writing
// side too, so that a file written is a file that reads.
Status CheckWritable(const BoundaryHeader& h, std::size_t layers, const SnapshotLimits& limits) {
  Problems p;
  auto str = [&](std::string_view what, const std::string& s) {
    if (s.size() > limits.max_string_bytes) {
      p.Add(std::string(what) + " of " + N(s.size()) + " bytes exceeds " + N(limits.max_string_bytes));
    }
  };
  str("architecture", h.fingerprint.architecture);
  str("namespace", h.ns);
  for (const std::string& c : h.fingerprint.codec_versions) str("codec version", c);
  if (h.fingerprint.codec_versions.size() > limits.max_codec_versions) {
    p.Add(N(h.fingerprint.codec_versions.size()) + " codec versions exceed " + N(limits.max_codec_versions));
  }
  if (h.tokens.size() > limits.codec.max_tokens) {
    p.Add(N(h.tokens.size()) + " tokens exceed " + N(limits.codec.max_tokens));
  }
  if (layers > limits.max_layers) p.Add(N(layers) + " layers exceed " + N(limits.max_layers));
  return p.ToStatus(StatusCode::kInvalidArgument);
}

// ---- Section table ------------------------------------------------------------------

struct SectionEntry {
  std::uint32_t type = 0;
  std::uint32_t reserved = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::uint64_t checksum = 0;
};

// Checks section i's place: it starts where the previous one ended (`next`),
// and ends within the file.
Status CheckSectionPlace(std::size_t i, const SectionEntry& e, std::uint64_t next, std::uint64_t file_size) {
  const std::string name = "section " + N(i);
  if (e.type != kLayerSection) return Status::NotSupported(name + " has unknown type " + N(e.type));
  if (e.reserved != 0) return Status::NotSupported(name + " has reserved field " + N(e.reserved));
  if (e.offset < next) {
    return Status::Corruption(name + " at offset " + N(e.offset) + " overlaps " +
                              (i == 0 ? std::string("the section table") : "section " + N(i - 1)) +
                              ", which ends at " + N(next));
  }
  if (e.offset > next) {
    return Status::Corruption(name + " at offset " + N(e.offset) + " leaves a gap of " + N(e.offset - next) +
                              " bytes after offset " + N(next));
  }
  std::uint64_t end = 0;
  if (!CheckedAdd(e.offset, e.length, &end))
    return Status::Corruption(name + ": offset + length overflows 64 bits");
  if (end > file_size) {
    return Status::Corruption("truncated: " + name + " ends at " + N(end) + "; the file has " + N(file_size) +
                              " bytes");
  }
  return Status::Ok();
}

}  // namespace

// ---- Encoding and validation ------------------------------------------------------------

Result<EncodedSnapshot> EncodeSnapshot(const BoundarySnapshot& snapshot, const EncodeOptions& options) {
  std::vector<LayerShape> shapes;
  for (const LayerSnapshot& l : snapshot.layers) shapes.push_back(ShapeOf(l));
  PC_RETURN_IF_ERROR(CheckBoundary(snapshot.header, shapes));
  PC_RETURN_IF_ERROR(CheckWritable(snapshot.header, snapshot.layers.size(), SnapshotLimits{}));
  EncodedSnapshot out;
  out.header = snapshot.header;
  for (std::size_t i = 0; i < snapshot.layers.size(); ++i) {
    Result<EncodedLayer> l = EncodeLayer(snapshot.layers[i], options);
    if (!l.ok()) return l.status().WithContext("layer " + N(i));
    out.layers.push_back(std::move(l).value());
  }
  return out;
}

Result<BoundarySnapshot> DecodeSnapshot(const EncodedSnapshot& snapshot, const CodecLimits& limits,
                                        const std::function<void(std::size_t done, std::size_t total)>& progress) {
  PC_RETURN_IF_ERROR(codecs::AsCorruption(CheckBoundary(snapshot.header, ShapesOf(snapshot))));
  BoundarySnapshot out;
  out.header = snapshot.header;
  for (std::size_t i = 0; i < snapshot.layers.size(); ++i) {
    Result<LayerSnapshot> l = DecodeLayer(snapshot.layers[i], limits);
    if (!l.ok()) return l.status().WithContext("layer " + N(i));
    out.layers.push_back(std::move(l).value());
    if (progress) progress(i + 1, snapshot.layers.size());
  }
  return out;
}

Status Validate(const EncodedSnapshot& snapshot, std::span<const LayerGeometry> targets) {
  Problems p;
  p.Add("boundary", CheckBoundary(snapshot.header, ShapesOf(snapshot)));
  if (targets.size() != snapshot.layers.size()) {
    p.Add(N(snapshot.layers.size()) + " layers; the plan has " + N(targets.size()));
  }
  for (std::size_t i = 0; i < snapshot.layers.size(); ++i) {
    const EncodedLayer& l = snapshot.layers[i];
    Problems layer;
    layer.Add("", CheckHeader(l.header));
    if (l.chunks.size() != l.header.chunk_count()) {
      layer.Add(N(l.chunks.size()) + " chunks; the header records " + N(l.header.chunk_count()));
    }
    if (i < targets.size()) layer.Add("", Validate(l.header, targets[i]));
    p.Add("layer " + N(i), layer.ToStatus());
  }
  return p.ToStatus();
}

// ---- The container -------------------------------------------------------------------------

std::string SerializePcsnap(const EncodedSnapshot& snapshot) {
  std::string header;
  WriteBoundaryHeader(snapshot.header, &header);
  std::vector<std::string> sections;
  for (const EncodedLayer& l : snapshot.layers) sections.push_back(SerializeLayer(l));

  std::string out;
  ByteWriter w(&out);
  w.Bytes(std::string_view(kMagic, sizeof kMagic));
  w.U32(kVersion);
  w.U32(static_cast<std::uint32_t>(header.size()));
  w.U32(static_cast<std::uint32_t>(sections.size()));
  w.U32(0);  // flags
  w.U64(Checksum64(AsBytes(out)));
  w.Bytes(header);
  w.U64(Checksum64(AsBytes(header)));

  std::string table;
  ByteWriter t(&table);
  std::uint64_t offset = out.size() + sections.size() * kSectionEntryBytes + 8;
  for (const std::string& s : sections) {
    t.U32(kLayerSection);
    t.U32(0);
    t.U64(offset);
    t.U64(s.size());
    t.U64(Checksum64(AsBytes(s)));
    offset += s.size();
  }
  w.Bytes(table);
  w.U64(Checksum64(AsBytes(table)));
  for (const std::string& s : sections) w.Bytes(s);
  return out;
}

namespace codecs {

Result<EncodedSnapshot> ParsePcsnap(std::span<const std::byte> bytes, const SnapshotLimits& limits,
                                    Checksums checksums) {
  const bool verify = checksums == Checksums::kVerify;
  if (bytes.size() > limits.max_file_bytes) {
    return Status::ResourceExhausted(N(bytes.size()) + " bytes exceed the limit of " +
                                     N(limits.max_file_bytes));
  }
  ByteReader r(bytes);
  std::span<const std::byte> magic;
  if (bytes.size() < kPreambleBytes) {
    return Status::Corruption("truncated: " + N(bytes.size()) + " bytes; a .pcsnap starts with " +
                              N(kPreambleBytes));
  }
  PC_RETURN_IF_ERROR(r.Bytes(sizeof kMagic, &magic, "magic"));
  if (std::memcmp(magic.data(), kMagic, sizeof kMagic) != 0)
    return Status::Corruption("not a .pcsnap file (bad magic)");
  std::uint32_t version = 0, header_len = 0, section_count = 0, flags = 0;
  std::uint64_t stored = 0;
  PC_RETURN_IF_ERROR(r.U32(&version, "version"));
  PC_RETURN_IF_ERROR(r.U32(&header_len, "header length"));
  PC_RETURN_IF_ERROR(r.U32(&section_count, "section count"));
  PC_RETURN_IF_ERROR(r.U32(&flags, "flags"));
  PC_RETURN_IF_ERROR(r.U64(&stored, "preamble checksum"));
  if (verify && Checksum64(bytes.first(kPreambleChecked)) != stored) {
    return Status::Corruption("preamble checksum mismatch");
  }
  if (version != kVersion) {
    return Status::NotSupported(".pcsnap version " + N(version) + " is not supported (this build reads " +
                                N(kVersion) + ")");
  }
  if (flags != 0) return Status::NotSupported(".pcsnap flags " + N(flags) + " are not supported");

  std::span<const std::byte> header_bytes;
  PC_RETURN_IF_ERROR(r.Bytes(header_len, &header_bytes, "boundary header"));
  PC_RETURN_IF_ERROR(r.U64(&stored, "boundary header checksum"));
  if (verify && Checksum64(header_bytes) != stored)
    return Status::Corruption("boundary header checksum mismatch");
  EncodedSnapshot out;
  PC_ASSIGN_OR_RETURN(out.header, ReadBoundaryHeader(header_bytes, kPreambleBytes, limits));

  if (section_count > limits.max_layers) {
    return Status::ResourceExhausted(N(section_count) + " sections exceed the limit of " +
                                     N(limits.max_layers));
  }
  std::span<const std::byte> table_bytes;
  PC_RETURN_IF_ERROR(
      r.Bytes(std::uint64_t{section_count} * kSectionEntryBytes, &table_bytes, "section table"));
  PC_RETURN_IF_ERROR(r.U64(&stored, "section table checksum"));
  if (verify && Checksum64(table_bytes) != stored)
    return Status::Corruption("section table checksum mismatch");

  ByteReader t(table_bytes, r.offset() - 8 - table_bytes.size());
  std::uint64_t next = r.offset();
  std::vector<SectionEntry> entries(section_count);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    SectionEntry& e = entries[i];
    PC_RETURN_IF_ERROR(t.U32(&e.type, "section type"));
    PC_RETURN_IF_ERROR(t.U32(&e.reserved, "section reserved"));
    PC_RETURN_IF_ERROR(t.U64(&e.offset, "section offset"));
    PC_RETURN_IF_ERROR(t.U64(&e.length, "section length"));
    PC_RETURN_IF_ERROR(t.U64(&e.checksum, "section checksum"));
    PC_RETURN_IF_ERROR(CheckSectionPlace(i, e, next, bytes.size()));
    next = e.offset + e.length;
  }
  if (next != bytes.size()) {
    return Status::Corruption(N(bytes.size() - next) + " bytes after the last section");
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    auto section = bytes.subspan(static_cast<std::size_t>(entries[i].offset),
                                 static_cast<std::size_t>(entries[i].length));
    if (verify && Checksum64(section) != entries[i].checksum) {
      return Status::Corruption("section " + N(i) + " checksum mismatch");
    }
    Result<EncodedLayer> layer = codecs::ParseLayer(section, limits.codec, checksums);
    if (!layer.ok()) return layer.status().WithContext("section " + N(i));
    out.layers.push_back(std::move(layer).value());
  }
  PC_RETURN_IF_ERROR(codecs::AsCorruption(CheckBoundary(out.header, ShapesOf(out))));
  return out;
}

}  // namespace codecs

Result<EncodedSnapshot> ParsePcsnap(std::span<const std::byte> bytes, const SnapshotLimits& limits) {
  return codecs::ParsePcsnap(bytes, limits, Checksums::kVerify);
}

Status WritePcsnap(Env* env, const std::string& path, const EncodedSnapshot& snapshot) {
  PC_RETURN_IF_ERROR(
      CheckWritable(snapshot.header, snapshot.layers.size(), SnapshotLimits{}).WithContext(path));
  return WriteFileAtomically(env, path, SerializePcsnap(snapshot));
}

Result<EncodedSnapshot> ReadPcsnap(Env* env, const std::string& path, const SnapshotLimits& limits) {
  PC_ASSIGN_OR_RETURN(std::uint64_t size, env->GetFileSize(path));
  if (size > limits.max_file_bytes) {
    return Status::ResourceExhausted(path + ": " + N(size) + " bytes exceed the limit of " +
                                     N(limits.max_file_bytes));
  }
  PC_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
  Result<EncodedSnapshot> s = ParsePcsnap(AsBytes(bytes), limits);
  if (!s.ok()) return s.status().WithContext(path);
  return s;
}

}  // namespace primecache

#include "remote/manifest.h"

#include "core/bytes.h"
#include "primecache/internal/codec.h"

namespace primecache::remote {
namespace {

constexpr std::uint32_t kMagic = 0x4d524350;  // "PCRM"
// Version 2 is version 1 with the entry's rank count after its tokens: a
// tensor-parallel entry. An entry of one publisher is written as version 1,
// byte for byte what it was.
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kTpVersion = 2;

void PutHash(ByteWriter& w, const Hash128& h) {
  w.U64(h.lo);
  w.U64(h.hi);
}

Status GetHash(ByteReader& r, Hash128* h, std::string_view field) {
  PC_RETURN_IF_ERROR(r.U64(&h->lo, field));
  return r.U64(&h->hi, field);
}

// A u32 length and that many bytes, at most max.
void PutLong(ByteWriter& w, std::string_view s) {
  w.U32(static_cast<std::uint32_t>(s.size()));
  w.Bytes(s);
}

Status GetLong(ByteReader& r, std::string* out, std::uint64_t max, std::string_view field) {
  std::uint32_t n = 0;
  PC_RETURN_IF_ERROR(r.U32(&n, field));
  if (n > max) {
    return Status::Corruption("remote manifest: " + std::string(field) + " of " + std::to_string(n) +
                              " bytes is over the limit of " + std::to_string(max));
  }
  std::span<const std::byte> b;
  PC_RETURN_IF_ERROR(r.Bytes(n, &b, field));
  out->assign(reinterpret_cast<const char*>(b.data()), b.size());
  return Status::Ok();
}

Status Count(ByteReader& r, std::uint32_t* n, std::uint64_t max, std::string_view field) {
  PC_RETURN_IF_ERROR(r.U32(n, field));
  if (*n > max) {
    return Status::Corruption("remote manifest: " + std::to_string(*n) + " " + std::string(field) +
                              " is over the limit of " + std::to_string(max));
  }
  return Status::Ok();
}

Status DecodeEntry(ByteReader& r, std::uint32_t version, PublishRequest* e) {
  PC_RETURN_IF_ERROR(GetHash(r, &e->model, "model"));
  PC_RETURN_IF_ERROR(GetLong(r, &e->model_name, StoreLimits::kMaxModelNameBytes, "model name"));
  PC_RETURN_IF_ERROR(GetLong(r, &e->model_descriptor, StoreLimits::kMaxDescriptorBytes, "model descriptor"));
  PC_RETURN_IF_ERROR(GetLong(r, &e->ns, StoreLimits::kMaxNamespaceBytes, "namespace"));
  PC_RETURN_IF_ERROR(r.U64(&e->cost.flops_per_token, "flops per token"));
  PC_RETURN_IF_ERROR(r.U32(&e->cost.attention_layers, "attention layers"));
  PC_RETURN_IF_ERROR(r.U64(&e->cost.attention_flops_per_pair, "attention flops"));
  std::uint32_t tokens = 0;
  PC_RETURN_IF_ERROR(Count(r, &tokens, StoreLimits::kMaxTokens, "tokens"));
  if (tokens == 0) return Status::Corruption("remote manifest: an entry of no tokens");
  // Each token takes 4 bytes: refuse a count the rest cannot hold before allocating for it.
  if (std::uint64_t{tokens} * 4 > r.remaining()) return Status::Corruption("remote manifest: tokens truncated");
  e->tokens.resize(tokens);
  for (std::uint32_t& t : e->tokens) PC_RETURN_IF_ERROR(r.U32(&t, "token"));
  if (version == kTpVersion) {
    PC_RETURN_IF_ERROR(r.U32(&e->ranks, "ranks"));
    if (e->ranks < 2 || e->ranks > StoreLimits::kMaxGroupRanks) {
      return Status::Corruption("remote manifest: a tensor-parallel entry of " + std::to_string(e->ranks) +
                                " ranks");
    }
  }
  return Status::Ok();
}

Status DecodeLayer(ByteReader& r, ManifestLayer* l) {
  PC_RETURN_IF_ERROR(GetLong(r, &l->header, kMaxLayerHeaderBytes, "layer header"));
  std::uint32_t chunks = 0;
  PC_RETURN_IF_ERROR(Count(r, &chunks, kMaxLayerChunks, "chunks"));
  // Each chunk reference takes 24 bytes: refuse a count the rest cannot hold
  // before allocating for it.
  if (std::uint64_t{chunks} * 24 > r.remaining()) return Status::Corruption("remote manifest: chunk table truncated");
  l->chunks.resize(chunks);
  for (ChunkRef& c : l->chunks) {
    PC_RETURN_IF_ERROR(r.U64(&c.size, "chunk size"));
    if (c.size > StoreLimits::kMaxChunkBytes) return Status::Corruption("remote manifest: a chunk over 1 GiB");
    PC_RETURN_IF_ERROR(GetHash(r, &c.address, "chunk address"));
  }
  return Status::Ok();
}

}  // namespace

RemoteManifest ManifestOf(PublishRequest entry, const std::vector<LayerBytes>& layers) {
  RemoteManifest m;
  m.entry = std::move(entry);
  m.entry.ranks = m.entry.EntryRanks();
  m.entry.group.reset();
  for (const LayerBytes& l : layers) {
    ManifestLayer& out = m.layers.emplace_back();
    out.header = l.header;
    for (const std::string& c : l.chunks) out.chunks.push_back({Checksum128(AsBytes(c)), c.size()});
  }
  return m;
}

ChunkCheck CheckChunk(const ChunkRef& ref, const std::optional<std::string>& value) {
  if (!value.has_value()) return ChunkCheck::kMissing;
  if (value->size() != ref.size) return ChunkCheck::kWrongSize;
  if (!(Checksum128(AsBytes(*value)) == ref.address)) return ChunkCheck::kWrongAddress;
  return ChunkCheck::kOk;
}

std::string ChunkCheckText(ChunkCheck check, const ChunkRef& ref, const std::optional<std::string>& value) {
  switch (check) {
    case ChunkCheck::kOk:
      return "ok";
    case ChunkCheck::kMissing:
      return "missing (evicted or deleted)";
    case ChunkCheck::kWrongSize:
      return std::to_string(value->size()) + " bytes where the manifest records " + std::to_string(ref.size) +
             " (truncated or replaced)";
    case ChunkCheck::kWrongAddress:
      return "its bytes do not match its content address (corrupted)";
  }
  return "unknown check";
}

std::string EncodeManifest(const RemoteManifest& m) {
  std::string out;
  ByteWriter w(&out);
  const std::uint32_t ranks = m.entry.EntryRanks();
  w.U32(kMagic);
  w.U32(ranks > 1 ? kTpVersion : kVersion);
  PutHash(w, m.entry.model);
  PutLong(w, m.entry.model_name);
  PutLong(w, m.entry.model_descriptor);
  PutLong(w, m.entry.ns);
  w.U64(m.entry.cost.flops_per_token);
  w.U32(m.entry.cost.attention_layers);
  w.U64(m.entry.cost.attention_flops_per_pair);
  w.U32(static_cast<std::uint32_t>(m.entry.tokens.size()));
  for (std::uint32_t t : m.entry.tokens) w.U32(t);
  if (ranks > 1) w.U32(ranks);
  w.U32(static_cast<std::uint32_t>(m.layers.size()));
  for (const ManifestLayer& l : m.layers) {
    PutLong(w, l.header);
    w.U32(static_cast<std::uint32_t>(l.chunks.size()));
    for (const ChunkRef& c : l.chunks) {
      w.U64(c.size);
      PutHash(w, c.address);
    }
  }
  w.U64(Checksum64(out));
  return out;
}

Result<RemoteManifest> DecodeManifest(std::string_view bytes) {
  if (bytes.size() < 16) return Status::Corruption("remote manifest: " + std::to_string(bytes.size()) + " bytes");
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  ByteReader tail(AsBytes(bytes.substr(body.size())));
  std::uint64_t sum = 0;
  PC_RETURN_IF_ERROR(tail.U64(&sum, "checksum"));
  if (sum != Checksum64(body)) return Status::Corruption("remote manifest: checksum mismatch");
  ByteReader r(AsBytes(body));
  std::uint32_t magic = 0, version = 0, layers = 0;
  PC_RETURN_IF_ERROR(r.U32(&magic, "magic"));
  PC_RETURN_IF_ERROR(r.U32(&version, "version"));
  if (magic != kMagic) return Status::Corruption("remote manifest: bad magic");
  if (version != kVersion && version != kTpVersion) {
    return Status::Corruption("remote manifest: version " + std::to_string(version));
  }
  RemoteManifest m;
  PC_RETURN_IF_ERROR(DecodeEntry(r, version, &m.entry));
  PC_RETURN_IF_ERROR(Count(r, &layers, kMaxManifestLayers, "layers"));
  m.layers.resize(layers);
  for (ManifestLayer& l : m.layers) PC_RETURN_IF_ERROR(DecodeLayer(r, &l));
  if (r.remaining() != 0) return Status::Corruption("remote manifest: " + std::to_string(r.remaining()) + " trailing bytes");
  return m;
}

}  // namespace primecache::remote

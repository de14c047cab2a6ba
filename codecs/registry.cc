// Identities, plane names, the registry, and the encoding defaults.
#include <algorithm>
#include <bit>
#include <limits>

#include "codecs/builtin.h"
#include "core/bytes.h"
#include "primecache/internal/codec.h"

namespace primecache {

std::string Identity::ToString() const {
  return name + "/v" + std::to_string(version);
}

Result<Identity> ParseIdentity(std::string_view text) {
  constexpr std::size_t kMaxName = 48;
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("malformed identity " + Quote(text) + ": " + std::string(why) +
                                   " (expected name/vN)");
  };
  std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) return bad("no '/'");
  std::string_view name = text.substr(0, slash), version = text.substr(slash + 1);
  if (name.empty() || name.size() > kMaxName) return bad("name must be 1 to 48 characters");
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_')) {
      return bad("name characters are a-z, 0-9, '-' and '_'");
    }
  }
  if (version.size() < 2 || version[0] != 'v') return bad("version must be v followed by digits");
  std::string_view digits = version.substr(1);
  if (digits[0] == '0') return bad("version is at least 1, without leading zeros");
  std::uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return bad("version must be v followed by digits");
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
    if (v > std::numeric_limits<std::uint32_t>::max()) return bad("version exceeds 32 bits");
  }
  return Identity{std::string(name), static_cast<std::uint32_t>(v)};
}

std::string WrappedIdentity(std::string_view outer, std::string_view inner) {
  std::string out(outer);
  out += '(';
  out += inner;
  out += ')';
  return out;
}

std::string_view PlaneName(PlaneId id) {
  switch (id) {
    case PlaneId::kLatentRows:
      return "latent_rows";
    case PlaneId::kIndexTailRows:
      return "index_tail_rows";
    case PlaneId::kPoolKeys:
      return "pool_keys";
    case PlaneId::kConvRing:
      return "conv_ring";
    case PlaneId::kRecurrentState:
      return "state";
    case PlaneId::kKeyRows:
      return "k_rows";
    case PlaneId::kValueRows:
      return "v_rows";
    case PlaneId::kIndexKeys:
      return "index_keys";
  }
  return "unknown_plane";
}

// ---- Registry -------------------------------------------------------------------

namespace {

// Finds an entry whose identity is exactly `identity`, or explains why none:
// malformed, a known name at another version, or an unknown name.
template <typename T, typename IdOf>
Result<const T*> FindExact(const std::vector<const T*>& entries, std::string_view identity,
                           std::string_view what, IdOf id_of) {
  Result<Identity> parsed = ParseIdentity(identity);
  if (!parsed.ok()) return Status::InvalidArgument(std::string(what) + ": " + parsed.status().message());
  std::vector<std::string> known, same_name;
  for (const T* e : entries) {
    std::string_view id = id_of(e);
    if (id == identity) return e;
    known.emplace_back(id);
    Result<Identity> k = ParseIdentity(id);
    if (k.ok() && k->name == parsed->name) same_name.push_back("v" + std::to_string(k->version));
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
  };
  if (!same_name.empty()) {
    return Status::NotSupported(std::string(what) + " " + Quote(identity) +
                                " is not supported: this build knows " + parsed->name + " at " +
                                join(same_name) + " only");
  }
  std::sort(known.begin(), known.end());
  return Status::NotSupported("unknown " + std::string(what) + " " + Quote(identity) +
                              "; known: " + join(known));
}

}  // namespace

CodecRegistry::CodecRegistry(std::vector<const LayerCodec*> kinds, std::vector<const Transform*> transforms)
    : kinds_(std::move(kinds)), transforms_(std::move(transforms)) {}

const CodecRegistry& CodecRegistry::Default() {
  static const CodecRegistry* registry =
      new CodecRegistry(codecs::BuiltinKinds(), codecs::BuiltinTransforms());
  return *registry;
}

Result<const LayerCodec*> CodecRegistry::FindKind(std::string_view identity) const {
  const std::size_t open = identity.find('(');
  if (open == std::string_view::npos) {
    return FindExact(kinds_, identity, "storage kind", [](const LayerCodec* c) { return c->kind(); });
  }
  // A wrapper kind: both parts well formed, one level, then an exact match.
  const std::string_view outer = identity.substr(0, open);
  const std::string_view inner =
      identity.back() == ')' ? identity.substr(open + 1, identity.size() - open - 2) : std::string_view();
  if (inner.empty() || inner.find_first_of("()") != std::string_view::npos) {
    return Status::InvalidArgument("storage kind: malformed wrapper kind " + Quote(identity) +
                                   " (expected outer/vN(inner/vM))");
  }
  for (std::string_view part : {outer, inner}) {
    if (Result<Identity> p = ParseIdentity(part); !p.ok()) {
      return Status::InvalidArgument("storage kind: " + p.status().message());
    }
  }
  std::vector<std::string> known;
  for (const LayerCodec* c : kinds_) {
    if (c->kind() == identity) return c;
    known.emplace_back(c->kind());
  }
  std::sort(known.begin(), known.end());
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  return Status::NotSupported("unknown storage kind " + Quote(identity) + "; known: " + list);
}

Result<const Transform*> CodecRegistry::FindTransform(std::string_view identity) const {
  return FindExact(transforms_, identity, "transform", [](const Transform* t) { return t->id(); });
}

Result<const LayerCodec*> CodecRegistry::KindFor(const LayerShape& shape) const {
  for (const LayerCodec* c : kinds_) {
    if (c->Accepts(shape)) return c;
  }
  return Status::NotSupported("no storage kind for this layer shape");
}

Result<std::pair<const Transform*, const LayerCodec*>> CodecRegistry::ResolveWrapped(
    std::string_view identity) const {
  std::size_t open = identity.find('(');
  if (open == std::string_view::npos || identity.empty() || identity.back() != ')') {
    return Status::InvalidArgument("malformed wrapped identity " + Quote(identity) +
                                   " (expected transform(kind))");
  }
  std::string_view outer = identity.substr(0, open);
  std::string_view inner = identity.substr(open + 1, identity.size() - open - 2);
  // The kind may be a wrapper kind itself; FindKind accepts exactly the known ones.
  if (inner.find('(') != std::string_view::npos) {
    if (Result<const LayerCodec*> k = FindKind(inner); !k.ok() && k.status().IsInvalidArgument()) {
      return Status::InvalidArgument("malformed wrapped identity " + Quote(identity) +
                                     ": transforms wrap a storage kind, not another transform");
    }
  }
  PC_ASSIGN_OR_RETURN(const Transform* t, FindTransform(outer));
  PC_ASSIGN_OR_RETURN(const LayerCodec* c, FindKind(inner));
  return std::pair{t, c};
}

std::vector<std::string> CodecRegistry::Identities() const {
  std::vector<std::string> out;
  for (const LayerCodec* c : kinds_) out.emplace_back(c->kind());
  for (const Transform* t : transforms_) out.emplace_back(t->id());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- Encoding defaults -------------------------------------------------------------

// raw/v1 for every plane: the hot restore copies a raw chunk from the page
// cache to the device by DMA, while shuffle-zstd stores real planes only
// 1.11-1.22x smaller and decodes on the host at ~5.7 GB/s, which made the
// default TTFT through the daemon 1.93x the in-process restore
// (docs/BENCHMARKS.md, "Choosing the default transform").
TransformSpec DefaultTransform(PlaneId) {
  return {std::string(kRawTransform), 0};
}

TransformSpec EncodeOptions::ForPlane(PlaneId plane) const {
  for (const auto& [id, spec] : plane_transforms) {
    if (id == plane) return spec;
  }
  return all_planes ? *all_planes : DefaultTransform(plane);
}

std::uint64_t ChunkRowsFor(std::uint64_t row_bytes, std::uint64_t target_bytes, std::uint64_t max_rows) {
  const std::uint64_t cap = std::bit_floor(std::max<std::uint64_t>(max_rows, 1));
  if (row_bytes == 0 || row_bytes >= target_bytes) return 1;
  return std::min(std::bit_floor(target_bytes / row_bytes), cap);
}

// ---- Header helpers ----------------------------------------------------------------

std::size_t LayerHeader::chunk_count() const {
  std::size_t n = 0;
  for (const PlaneRecord& p : planes) n += p.chunks.size();
  return n;
}

std::string LayerHeader::PlaneIdentity(std::size_t plane) const {
  return plane < planes.size() ? WrappedIdentity(planes[plane].transform, kind) : std::string();
}

}  // namespace primecache

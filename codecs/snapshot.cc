// Shapes, snapshots, target geometry and the boundary: the checks that need
// no codec.
#include "primecache/internal/snapshot.h"

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <type_traits>

#include "codecs/problems.h"
#include "core/bytes.h"
#include "primecache/internal/codec.h"

namespace primecache {

using codecs::Problems;

namespace {

std::string N(std::uint64_t v) {
  return std::to_string(v);
}

// Adds a problem when the f32 bytes of a * b (* c) overflow 64 bits.
bool FitsBytes(Problems& p, std::string_view what, std::uint64_t a, std::uint64_t b, std::uint64_t c = 1) {
  std::uint64_t v = 0;
  if (CheckedMul(a, b, &v) && CheckedMul(v, c, &v) && CheckedMul(v, sizeof(float), &v)) return true;
  p.Add(std::string(what) + " overflows 64 bits");
  return false;
}

// A dtype read from outside may hold any byte: it must name an ElementType.
void CheckDtype(Problems& p, std::string_view plane, ElementType t) {
  if (!IsElementType(static_cast<std::uint8_t>(t))) {
    p.Add(std::string(plane) + " dtype " + N(static_cast<std::uint8_t>(t)) + " is not an element type");
  }
}

void CompareDtype(Problems& p, std::string_view plane, ElementType have, ElementType plan) {
  if (have != plan) {
    p.Add(std::string(plane) + " dtype " + ElementTypeName(have) + " != plan " + ElementTypeName(plan));
  }
}

void CheckLatent(const LatentShape& s, Problems& p) {
  CheckDtype(p, "latent_rows", s.dtype);
  CheckDtype(p, "index rows", s.index_dtype);
  if (s.len == 0) p.Add("len is 0; a layer that holds no token is recorded as absent, not snapshotted");
  if (s.width == 0) p.Add("width is 0");
  FitsBytes(p, "len * width (" + N(s.len) + " * " + N(s.width) + ")", s.len, s.width);
  if (s.index_width == 0) {
    if (s.pool != 0) p.Add("pool " + N(s.pool) + " without an indexer (index_width 0)");
    if (s.pools_ready != 0) p.Add("pools_ready " + N(s.pools_ready) + " without an indexer (index_width 0)");
    if (s.index_is_ring) p.Add("index_is_ring without an indexer (index_width 0)");
    if (s.index_ring_rows != 0) p.Add("index_ring_rows " + N(s.index_ring_rows) + " without an indexer");
    if (s.index_dtype != ElementType::kF32) p.Add("index_dtype without an indexer (index_width 0)");
    return;
  }
  if (s.index_width % 2 != 0) p.Add("index_width " + N(s.index_width) + " is odd; it is 2 * index_head_dim");
  if (s.pool == 0) {
    p.Add("pool is 0 with an indexer (index_width " + N(s.index_width) + ")");
    return;
  }
  if (s.pools_ready != s.len / s.pool) {
    p.Add("pools_ready " + N(s.pools_ready) + " != len / pool = " + N(s.len / s.pool) + " (len " + N(s.len) +
          ", pool " + N(s.pool) + ")");
    return;  // the tail is undefined
  }
  FitsBytes(p, "pools_ready * index_head_dim", s.pools_ready, s.index_head_dim());
  FitsBytes(p, "tail rows * index_width", s.tail_rows(), s.index_width);
  if (s.index_is_ring) {
    if (s.index_ring_rows < s.pool || s.index_ring_rows % s.pool != 0) {
      p.Add("index_ring_rows " + N(s.index_ring_rows) + " is not a positive multiple of pool " + N(s.pool));
    } else if (s.tail_rows() > s.index_ring_rows) {
      p.Add("tail of " + N(s.tail_rows()) + " rows exceeds the ring of " + N(s.index_ring_rows));
    }
  } else if (s.index_ring_rows != 0) {
    p.Add("index_ring_rows " + N(s.index_ring_rows) + " on a flat index plane");
  }
}

void CheckRecurrent(const RecurrentShape& s, Problems& p) {
  CheckDtype(p, "conv_ring", s.conv_dtype);
  CheckDtype(p, "state", s.state_dtype);
  if (s.heads == 0) p.Add("heads is 0");
  if (s.head_dim == 0) p.Add("head_dim is 0");
  if (s.kernel < 2) p.Add("kernel " + N(s.kernel) + " < 2 (no conv ring)");
  FitsBytes(p, "conv ring 3 * heads * head_dim", 3ull * s.heads, s.head_dim,
            s.kernel == 0 ? 0 : s.kernel - 1);
  FitsBytes(p, "state heads * head_dim^2", s.heads, s.head_dim, s.head_dim);
}

// The format's own rules: a known kind; TurboQuant geometry (bits 2 or 4, a
// power-of-two head_dim in 16..512, widths of whole entries); nothing
// TurboQuant on f32 rows.
void CheckKvFormat(const KvShape& s, Problems& p) {
  const KvFormat& f = s.format;
  if (KvKindOf(f).empty()) {
    if (f.indexed()) {
      p.Add("indexer keys (index_width " + N(f.index_width) + ") on " +
            (f.rotating() ? "a rotating" : "a TurboQuant") +
            " layer: kv-indexed rows are plain and unquantized");
    } else {
      p.Add("kv_quant bits " + N(f.quant_bits) + " name no storage kind (0, 2 or 4)");
    }
    return;
  }
  if (!f.indexed() && s.index_dtype != ElementType::kF32)
    p.Add("index_dtype without indexer keys (index_width 0)");
  if (!f.quantized()) {
    if (f.head_dim != 0 || f.signs_digest != 0) p.Add("head_dim or sign digest on f32 rows");
    return;
  }
  if (f.head_dim < 16 || f.head_dim > 512 || (f.head_dim & (f.head_dim - 1)) != 0) {
    p.Add("TurboQuant head_dim " + N(f.head_dim) + " is not a power of two in 16..512");
    return;
  }
  const std::uint64_t entry = 1 + std::uint64_t{f.head_dim} * f.quant_bits / 32;
  if (s.dtype != ElementType::kF32) {
    p.Add(std::string("TurboQuant rows are 4-byte words; dtype ") + ElementTypeName(s.dtype) + " given");
  }
  if (s.k_width % entry != 0 || s.v_width % entry != 0) {
    p.Add("widths " + N(s.k_width) + "/" + N(s.v_width) + " are not whole TurboQuant entries of " + N(entry) +
          " words");
  }
}

void CheckKv(const KvShape& s, Problems& p) {
  CheckDtype(p, "K and V rows", s.dtype);
  if (s.len == 0) p.Add("len is 0; a layer that holds no token is recorded as absent, not snapshotted");
  if (s.k_width == 0) p.Add("k_width is 0");
  if (s.v_width == 0) p.Add("v_width is 0");
  CheckKvFormat(s, p);
  if (s.format.rotating()) {
    const std::uint64_t full = std::min<std::uint64_t>(s.len, s.format.window);
    if (s.rows == 0 || s.rows > full || s.rows + 1 < full) {
      p.Add("rotating buffer holds " + N(s.rows) + " rows; with len " + N(s.len) + " and window " +
            N(s.format.window) + " it holds " + N(full) + (full > 1 ? " or " + N(full - 1) : std::string()));
    }
  } else if (s.rows != 0) {
    p.Add("rows " + N(s.rows) + " on a plain KV layer (it holds every position)");
  }
  const std::string rows = s.format.rotating() ? "rows" : "len";
  FitsBytes(p, rows + " * k_width", s.held_rows(), s.k_width);
  FitsBytes(p, rows + " * v_width", s.held_rows(), s.v_width);
  if (s.format.indexed()) {
    CheckDtype(p, "index_keys", s.index_dtype);
    FitsBytes(p, "len * index_width", s.len, s.format.index_width);
  }
}

void CheckLinearState(const LinearStateShape& s, Problems& p) {
  CheckDtype(p, "conv_ring", s.conv_dtype);
  CheckDtype(p, "state", s.state_dtype);
  if (s.conv_channels == 0) p.Add("conv_channels is 0");
  if (s.conv_width == 0) p.Add("conv_width is 0");
  if (s.state_heads == 0) p.Add("state_heads is 0");
  if (s.state_k_dim == 0) p.Add("state_k_dim is 0");
  if (s.state_v_dim == 0) p.Add("state_v_dim is 0");
  FitsBytes(p, "conv_channels * conv_width", s.conv_channels, s.conv_width);
  FitsBytes(p, "state_heads * state_k_dim * state_v_dim", s.state_heads, s.state_k_dim, s.state_v_dim);
}

// Indexed by LayerShape's (and LayerGeometry's) alternative.
const char* KindName(std::size_t index) {
  constexpr const char* kNames[] = {"latent", "recurrent", "kv", "linear-state"};
  static_assert(std::size(kNames) == std::variant_size_v<LayerShape>);
  return kNames[index];
}

void CheckPlaneSize(Problems& p, std::string_view plane, std::size_t have, std::uint64_t want,
                    std::string_view formula) {
  if (have != want) {
    p.Add(std::string(plane) + " holds " + N(have) + " floats; " + std::string(formula) + " = " + N(want));
  }
}

// The geometry type that matches each shape type.
template <typename S>
struct TargetOf;
template <>
struct TargetOf<LatentShape> {
  using type = LatentGeometry;
};
template <>
struct TargetOf<RecurrentShape> {
  using type = RecurrentShape;
};
template <>
struct TargetOf<KvShape> {
  using type = KvGeometry;
};
template <>
struct TargetOf<LinearStateShape> {
  using type = LinearStateShape;
};

// The target comparison for each pair of shape and geometry of the same kind.
// `consistent`: the shape passed CheckShape, so derived counts are defined.
void CompareTarget(const LatentShape& s, const LatentGeometry& g, bool consistent, Problems& p) {
  if (s.width != g.width) p.Add("width " + N(s.width) + " != plan " + N(g.width));
  if (s.index_width != g.index_width)
    p.Add("index_width " + N(s.index_width) + " != plan " + N(g.index_width));
  if (s.pool != g.pool) p.Add("pool " + N(s.pool) + " != plan " + N(g.pool));
  CompareDtype(p, "latent_rows", s.dtype, g.dtype);
  if (s.index_width != 0) CompareDtype(p, "index rows", s.index_dtype, g.index_dtype);
  if (s.len > g.max_ctx) p.Add("len " + N(s.len) + " > max_ctx " + N(g.max_ctx));
  if (consistent && g.index_ring_rows != 0 && s.tail_rows() > g.index_ring_rows) {
    p.Add("tail of " + N(s.tail_rows()) + " rows exceeds the plan's ring of " + N(g.index_ring_rows));
  }
}
void CompareTarget(const RecurrentShape& s, const RecurrentShape& g, bool, Problems& p) {
  if (s.heads != g.heads) p.Add("heads " + N(s.heads) + " != plan " + N(g.heads));
  if (s.head_dim != g.head_dim) p.Add("head_dim " + N(s.head_dim) + " != plan " + N(g.head_dim));
  if (s.kernel != g.kernel) p.Add("kernel " + N(s.kernel) + " != plan " + N(g.kernel));
  CompareDtype(p, "conv_ring", s.conv_dtype, g.conv_dtype);
  CompareDtype(p, "state", s.state_dtype, g.state_dtype);
}
void CompareTarget(const KvShape& s, const KvGeometry& g, bool, Problems& p) {
  const std::string_view kind = KvKindOf(s.format), plan = KvKindOf(g.format);
  if (kind != plan) {
    // Another kind is refused by name, never read as a near relative.
    p.Add("kind " + std::string(kind.empty() ? "(none)" : kind) + " != plan " + std::string(plan));
    return;
  }
  if (s.format.window != g.format.window)
    p.Add("window " + N(s.format.window) + " != plan " + N(g.format.window));
  if (s.format.head_dim != g.format.head_dim)
    p.Add("TurboQuant head_dim " + N(s.format.head_dim) + " != plan " + N(g.format.head_dim));
  if (s.format.signs_digest != g.format.signs_digest) {
    p.Add("TurboQuant sign vector (digest " + Hex64(s.format.signs_digest) + ") != plan's (" +
          Hex64(g.format.signs_digest) + ")");
  }
  if (s.k_width != g.k_width) p.Add("k_width " + N(s.k_width) + " != plan " + N(g.k_width));
  if (s.v_width != g.v_width) p.Add("v_width " + N(s.v_width) + " != plan " + N(g.v_width));
  if (s.format.index_width != g.format.index_width)
    p.Add("index_width " + N(s.format.index_width) + " != plan " + N(g.format.index_width));
  CompareDtype(p, "K and V rows", s.dtype, g.dtype);
  if (s.format.indexed()) CompareDtype(p, "index_keys", s.index_dtype, g.index_dtype);
  if (s.len > g.max_ctx) p.Add("len " + N(s.len) + " > max_ctx " + N(g.max_ctx));
}
void CompareTarget(const LinearStateShape& s, const LinearStateShape& g, bool, Problems& p) {
  auto same = [&p](std::string_view field, std::uint32_t have, std::uint32_t plan) {
    if (have != plan) p.Add(std::string(field) + " " + N(have) + " != plan " + N(plan));
  };
  same("conv_channels", s.conv_channels, g.conv_channels);
  same("conv_width", s.conv_width, g.conv_width);
  same("state_heads", s.state_heads, g.state_heads);
  same("state_k_dim", s.state_k_dim, g.state_k_dim);
  same("state_v_dim", s.state_v_dim, g.state_v_dim);
  CompareDtype(p, "conv_ring", s.conv_dtype, g.conv_dtype);
  CompareDtype(p, "state", s.state_dtype, g.state_dtype);
}

// Little-endian canonical encodings for the digests.
void PutU64(std::string& out, std::uint64_t v) {
  ByteWriter(&out).U64(v);
}
void PutString(std::string& out, std::string_view s) {
  PutU64(out, s.size());
  out.append(s);
}
// A layer's element types, after its other fields. All f32 (the default)
// adds nothing, so the digests of f32 plans stay what they were before
// planes had types.
void PutDtypes(std::string& out, std::initializer_list<ElementType> types) {
  if (std::all_of(types.begin(), types.end(), [](ElementType t) { return t == ElementType::kF32; })) return;
  PutString(out, "dtypes");
  for (ElementType t : types) PutU64(out, static_cast<std::uint64_t>(t));
}

// Snapshots hold the reference engine's kinds, with f32 planes. The planes
// and their types are the kind's (LayerCodec::Planes), counted without
// limits: a snapshot's size is its caller's to bound.
Status CheckHasSnapshot(const LayerShape& shape) {
  const auto* kv = std::get_if<KvShape>(&shape);
  if (std::holds_alternative<LinearStateShape>(shape) || (kv != nullptr && kv->format.indexed())) {
    return Status::NotSupported(
        std::string(std::holds_alternative<LinearStateShape>(shape) ? kLinearStateKind : kKvIndexedKind) +
        " layers have no snapshot (the reference engine has none); they are encoded "
        "from and decoded into the caller's planes");
  }
  auto kind = CodecRegistry::Default().KindFor(shape);
  PC_RETURN_IF_ERROR(kind.status());
  constexpr std::uint64_t kAny = std::numeric_limits<std::uint64_t>::max();
  auto planes = (*kind)->Planes(shape, CodecLimits{kAny, kAny, kAny, kAny, kAny});
  PC_RETURN_IF_ERROR(planes.status());
  Problems p;
  for (const PlaneLayout& plane : *planes) {
    if (plane.dtype != ElementType::kF32) {
      p.Add(std::string(PlaneName(plane.id)) + " are " + ElementTypeName(plane.dtype) +
            "; a snapshot holds f32 planes only");
    }
  }
  return p.ToStatus();
}

}  // namespace

Status CheckShape(const LayerShape& shape) {
  Problems p;
  std::visit(
      [&](const auto& s) {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, LatentShape>) CheckLatent(s, p);
        if constexpr (std::is_same_v<T, RecurrentShape>) CheckRecurrent(s, p);
        if constexpr (std::is_same_v<T, KvShape>) CheckKv(s, p);
        if constexpr (std::is_same_v<T, LinearStateShape>) CheckLinearState(s, p);
      },
      shape);
  return p.ToStatus();
}

LayerShape ShapeOf(const LayerSnapshot& layer) {
  return std::visit([](const auto& l) -> LayerShape { return l.shape; }, layer);
}

Result<LayerSnapshot> MakeSnapshot(const LayerShape& shape) {
  PC_RETURN_IF_ERROR(CheckShape(shape));
  PC_RETURN_IF_ERROR(CheckHasSnapshot(shape));
  if (const auto* s = std::get_if<LatentShape>(&shape)) {
    LatentSnapshot l{*s, {}, {}, {}};
    l.latent_rows.resize(s->latent_values());
    l.index_tail_rows.resize(s->tail_values());
    l.pool_keys.resize(s->pool_key_values());
    return LayerSnapshot(std::move(l));
  }
  if (const auto* s = std::get_if<RecurrentShape>(&shape)) {
    RecurrentSnapshot r{*s, {}, {}};
    r.conv_ring.resize(s->conv_values());
    r.state.resize(s->state_values());
    return LayerSnapshot(std::move(r));
  }
  const auto& s = std::get<KvShape>(shape);
  KvSnapshot kv{s, {}, {}};
  kv.k_rows.resize(s.k_values());
  kv.v_rows.resize(s.v_values());
  return LayerSnapshot(std::move(kv));
}

namespace {

// CheckShape and CheckHasSnapshot: what every kind's CheckSnapshot starts with.
Status CheckSnapshotShape(const LayerShape& shape) {
  PC_RETURN_IF_ERROR(CheckShape(shape));
  return CheckHasSnapshot(shape);
}

}  // namespace

Status CheckSnapshot(const LatentSnapshot& l) {
  PC_RETURN_IF_ERROR(CheckSnapshotShape(l.shape));
  const LatentShape& s = l.shape;
  Problems p;
  CheckPlaneSize(p, "latent_rows", l.latent_rows.size(), s.latent_values(), "len * width");
  CheckPlaneSize(p, "index_tail_rows", l.index_tail_rows.size(), s.tail_values(),
                 "(len - pools_ready * pool) * index_width");
  CheckPlaneSize(p, "pool_keys", l.pool_keys.size(), s.pool_key_values(), "pools_ready * index_width / 2");
  return p.ToStatus();
}

Status CheckSnapshot(const RecurrentSnapshot& r) {
  PC_RETURN_IF_ERROR(CheckSnapshotShape(r.shape));
  const RecurrentShape& s = r.shape;
  Problems p;
  CheckPlaneSize(p, "conv_ring", r.conv_ring.size(), s.conv_values(), "3 * heads * head_dim * (kernel - 1)");
  CheckPlaneSize(p, "state", r.state.size(), s.state_values(), "heads * head_dim * head_dim");
  return p.ToStatus();
}

Status CheckSnapshot(const KvSnapshot& kv) {
  PC_RETURN_IF_ERROR(CheckSnapshotShape(kv.shape));
  const KvShape& s = kv.shape;
  const std::string rows = s.format.rotating() ? "rows" : "len";
  Problems p;
  CheckPlaneSize(p, "k_rows", kv.k_rows.size(), s.k_values(), rows + " * k_width");
  CheckPlaneSize(p, "v_rows", kv.v_rows.size(), s.v_values(), rows + " * v_width");
  return p.ToStatus();
}

Status CheckSnapshot(const LayerSnapshot& layer) {
  return std::visit([](const auto& l) { return CheckSnapshot(l); }, layer);
}

Status Validate(const LayerShape& shape, const LayerGeometry& target) {
  if (shape.index() != target.index()) {
    return Status::InvalidArgument(std::string("layer is a ") + KindName(shape.index()) +
                                   " layer; the plan expects a " + KindName(target.index()) + " layer");
  }
  Problems p;
  Status consistent = CheckShape(shape);
  p.Add("", consistent);
  std::visit(
      [&](const auto& s) {
        using G = typename TargetOf<std::decay_t<decltype(s)>>::type;
        CompareTarget(s, std::get<G>(target), consistent.ok(), p);
      },
      shape);
  return p.ToStatus();
}

Status Validate(const LayerSnapshot& layer, const LayerGeometry& target) {
  PC_RETURN_IF_ERROR(Validate(ShapeOf(layer), target));
  return CheckSnapshot(layer);
}

Hash128 GeometryDigest(std::span<const LayerGeometry> layers) {
  std::string canon = "primecache-geometry/1";
  PutU64(canon, layers.size());
  for (const LayerGeometry& g : layers) {
    PutU64(canon, g.index());
    if (const auto* l = std::get_if<LatentGeometry>(&g)) {
      for (std::uint64_t v : {std::uint64_t{l->width}, std::uint64_t{l->index_width}, std::uint64_t{l->pool},
                              l->index_ring_rows, l->max_ctx}) {
        PutU64(canon, v);
      }
      PutDtypes(canon, {l->dtype, l->index_dtype});
    } else if (const auto* r = std::get_if<RecurrentShape>(&g)) {
      for (std::uint64_t v : {r->heads, r->head_dim, r->kernel}) PutU64(canon, v);
      PutDtypes(canon, {r->conv_dtype, r->state_dtype});
    } else if (const auto* kv = std::get_if<KvGeometry>(&g)) {
      for (std::uint64_t v : {std::uint64_t{kv->k_width}, std::uint64_t{kv->v_width}, kv->max_ctx})
        PutU64(canon, v);
      // The default (plain f32) adds nothing, so digests of plain plans stay as they were.
      if (!(kv->format == KvFormat{})) {
        PutString(canon, KvKindOf(kv->format));
        for (std::uint64_t v : {std::uint64_t{kv->format.window}, std::uint64_t{kv->format.quant_bits},
                                std::uint64_t{kv->format.head_dim}, kv->format.signs_digest})
          PutU64(canon, v);
        if (kv->format.indexed()) PutU64(canon, kv->format.index_width);
      }
      if (kv->format.indexed()) {
        PutDtypes(canon, {kv->dtype, kv->index_dtype});
      } else {
        PutDtypes(canon, {kv->dtype});
      }
    } else {
      const auto& ls = std::get<LinearStateShape>(g);
      for (std::uint64_t v :
           {ls.conv_channels, ls.conv_width, ls.state_heads, ls.state_k_dim, ls.state_v_dim})
        PutU64(canon, v);
      PutDtypes(canon, {ls.conv_dtype, ls.state_dtype});
    }
  }
  return Checksum128(std::as_bytes(std::span(canon.data(), canon.size())));
}

LayerGeometry PlanGeometryOf(const LayerShape& shape) {
  if (const auto* l = std::get_if<LatentShape>(&shape)) {
    return LatentGeometry{l->width,      l->index_width, l->pool,       /*index_ring_rows=*/0,
                          /*max_ctx=*/0, l->dtype,       l->index_dtype};
  }
  if (const auto* r = std::get_if<RecurrentShape>(&shape)) return *r;
  if (const auto* ls = std::get_if<LinearStateShape>(&shape)) return *ls;
  const auto& kv = std::get<KvShape>(shape);
  return KvGeometry{kv.k_width, kv.v_width, /*max_ctx=*/0, kv.format, kv.dtype, kv.index_dtype};
}

Hash128 PlanDigest(std::span<const LayerShape> shapes) {
  std::vector<LayerGeometry> plan;
  plan.reserve(shapes.size());
  for (const LayerShape& s : shapes) plan.push_back(PlanGeometryOf(s));
  return GeometryDigest(plan);
}

std::vector<std::string> CodecVersionsOf(std::span<const LayerGeometry> plan) {
  std::vector<std::string> kinds;
  for (const LayerGeometry& g : plan) {
    std::string_view kind = kLinearStateKind;
    if (std::holds_alternative<LatentGeometry>(g)) kind = kMlaLatentKind;
    if (std::holds_alternative<RecurrentShape>(g)) kind = kKdaRecurrentKind;
    if (const auto* kv = std::get_if<KvGeometry>(&g)) kind = KvKindOf(kv->format);
    if (!kind.empty()) kinds.emplace_back(kind);
  }
  std::sort(kinds.begin(), kinds.end());
  kinds.erase(std::unique(kinds.begin(), kinds.end()), kinds.end());
  return kinds;
}

Status CheckPlan(const ModelFingerprint& fingerprint, std::span<const LayerShape> shapes) {
  const Hash128 got = PlanDigest(shapes);
  if (got == fingerprint.plan_digest) return Status::Ok();
  return Status::InvalidArgument("these " + std::to_string(shapes.size()) +
                                 " layers are not the plan of model " + Quote(fingerprint.architecture) +
                                 ": their plan digest is " + HexDigits(got) + ", the model's " +
                                 HexDigits(fingerprint.plan_digest));
}

namespace {
constexpr std::string_view kFingerprintTag = "primecache-fingerprint/1";
}  // namespace

std::string EncodeFingerprint(const ModelFingerprint& fp) {
  std::string canon(kFingerprintTag);
  PutString(canon, fp.architecture);
  for (std::uint64_t v : {fp.plan_digest.lo, fp.plan_digest.hi, fp.weights_digest.lo, fp.weights_digest.hi})
    PutU64(canon, v);
  PutU64(canon, fp.codec_versions.size());
  for (const std::string& c : fp.codec_versions) PutString(canon, c);
  return canon;
}

Result<ModelFingerprint> DecodeFingerprint(std::string_view bytes, std::uint64_t max_string_bytes,
                                           std::uint64_t max_codec_versions) {
  if (!bytes.starts_with(kFingerprintTag))
    return Status::Corruption("model descriptor: not a fingerprint encoding");
  bytes.remove_prefix(kFingerprintTag.size());
  ByteReader r(std::as_bytes(std::span(bytes.data(), bytes.size())), kFingerprintTag.size());
  auto str = [&](std::string* out, std::string_view field) -> Status {
    std::uint64_t len = 0;
    PC_RETURN_IF_ERROR(r.U64(&len, field));
    if (len > max_string_bytes) {
      return Status::Corruption("model descriptor: " + std::string(field) + " of " + N(len) +
                                " bytes exceeds " + N(max_string_bytes));
    }
    std::span<const std::byte> b;
    PC_RETURN_IF_ERROR(r.Bytes(len, &b, field));
    out->assign(reinterpret_cast<const char*>(b.data()), b.size());
    return Status::Ok();
  };
  ModelFingerprint fp;
  PC_RETURN_IF_ERROR(str(&fp.architecture, "architecture"));
  for (std::uint64_t* v :
       {&fp.plan_digest.lo, &fp.plan_digest.hi, &fp.weights_digest.lo, &fp.weights_digest.hi})
    PC_RETURN_IF_ERROR(r.U64(v, "digest"));
  std::uint64_t versions = 0;
  PC_RETURN_IF_ERROR(r.U64(&versions, "codec version count"));
  if (versions > max_codec_versions) {
    return Status::Corruption("model descriptor: " + N(versions) + " codec versions exceed " +
                              N(max_codec_versions));
  }
  fp.codec_versions.resize(versions);
  for (std::string& c : fp.codec_versions) PC_RETURN_IF_ERROR(str(&c, "codec version"));
  if (r.remaining() != 0)
    return Status::Corruption("model descriptor: " + N(r.remaining()) + " trailing bytes");
  return fp;
}

Hash128 ModelFingerprint::Digest() const {
  const std::string canon = EncodeFingerprint(*this);
  return Checksum128(std::as_bytes(std::span(canon.data(), canon.size())));
}

Status CheckBoundary(const BoundaryHeader& header, std::span<const LayerShape> shapes) {
  Problems p;
  if (header.tokens.empty()) p.Add("no tokens");
  if (header.boundary_len != header.tokens.size()) {
    p.Add("boundary_len " + N(header.boundary_len) + " != " + N(header.tokens.size()) + " tokens");
  }
  if (shapes.empty()) p.Add("no layers");
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    std::uint64_t len = 0;
    if (const auto* l = std::get_if<LatentShape>(&shapes[i])) len = l->len;
    if (const auto* kv = std::get_if<KvShape>(&shapes[i])) len = kv->len;
    const bool has_len =
        std::holds_alternative<LatentShape>(shapes[i]) || std::holds_alternative<KvShape>(shapes[i]);
    if (has_len && len != header.boundary_len) {
      p.Add("layer " + N(i) + ": len " + N(len) + " != boundary_len " + N(header.boundary_len));
    }
  }
  return p.ToStatus();
}

Status Validate(const BoundarySnapshot& snapshot, std::span<const LayerGeometry> targets) {
  std::vector<LayerShape> shapes;
  shapes.reserve(snapshot.layers.size());
  for (const LayerSnapshot& l : snapshot.layers) shapes.push_back(ShapeOf(l));
  Problems p;
  p.Add("boundary", CheckBoundary(snapshot.header, shapes));
  if (targets.size() != snapshot.layers.size()) {
    p.Add(N(snapshot.layers.size()) + " layers; the plan has " + N(targets.size()));
  }
  for (std::size_t i = 0; i < snapshot.layers.size() && i < targets.size(); ++i) {
    p.Add("layer " + N(i), Validate(snapshot.layers[i], targets[i]));
  }
  return p.ToStatus();
}

}  // namespace primecache

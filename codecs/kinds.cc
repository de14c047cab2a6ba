// The built-in storage kinds: mla-latent/v1, kda-recurrent/v1, the KV kinds
// (plain, rotating, TurboQuant 2/4 around either, and indexed) and
// linear-state/v1.
// Each fixes its header fields and its planes (docs/codecs.md).
#include <algorithm>
#include <initializer_list>
#include <limits>

#include "codecs/builtin.h"
#include "core/bytes.h"
#include "codecs/problems.h"

namespace primecache::codecs {
namespace {

std::string N(std::uint64_t v) {
  return std::to_string(v);
}

Status WrongKind(std::string_view kind) {
  return Status::InvalidArgument("shape is not a " + std::string(kind) + " shape");
}

// Reads a field that the shape keeps in 32 bits.
Status Field32(std::span<const std::uint64_t> fields, std::size_t i, std::string_view name,
               std::uint32_t* out) {
  if (fields[i] > std::numeric_limits<std::uint32_t>::max()) {
    return Status::Corruption(std::string(name) + " " + N(fields[i]) + " does not fit 32 bits");
  }
  *out = static_cast<std::uint32_t>(fields[i]);
  return Status::Ok();
}

// Element types are the header's last fields, written only when some plane
// is not f32, so that an f32 layer's header is what it was before planes had
// types. `fields` holds them (and nothing else); fills `out` in order.
void AppendDtypes(std::initializer_list<ElementType> types, std::vector<std::uint64_t>* fields) {
  if (std::all_of(types.begin(), types.end(), [](ElementType t) { return t == ElementType::kF32; })) return;
  for (ElementType t : types) fields->push_back(static_cast<std::uint64_t>(t));
}

Status DtypeFields(std::span<const std::uint64_t> fields, std::initializer_list<ElementType*> out) {
  if (fields.empty()) return Status::Ok();  // all f32
  auto it = out.begin();
  for (std::uint64_t f : fields) {
    if (!IsElementType(f)) {
      return Status::Corruption("element type " + N(f) + " is not one of f32, bf16, f16, f8e4m3");
    }
    **it++ = static_cast<ElementType>(f);
  }
  return Status::Ok();
}

// A kind's field count without and with its element types.
Status CheckFieldCount(std::string_view kind, std::span<const std::uint64_t> fields, std::size_t want,
                       std::size_t dtypes) {
  if (fields.size() == want || fields.size() == want + dtypes) return Status::Ok();
  return Status::Corruption(std::string(kind) + " has " + N(want) + " header fields, or " + N(want + dtypes) +
                            " with element types; got " + N(fields.size()));
}

Status CheckLen(std::uint64_t len, const CodecLimits& limits) {
  if (len <= limits.max_tokens) return Status::Ok();
  return Status::ResourceExhausted("len " + N(len) + " exceeds the limit of " + N(limits.max_tokens) +
                                   " tokens");
}

// The limits every kind's planes answer to: row width, one chunk for an
// eager plane, and the layer's total.
Status ApplyLimits(const std::vector<PlaneLayout>& planes, const CodecLimits& limits) {
  Problems p;
  std::uint64_t total = 0;
  for (const PlaneLayout& plane : planes) {
    if (plane.row_width > limits.max_row_values) {
      p.Add(std::string(PlaneName(plane.id)) + " rows of " + N(plane.row_width) +
 " values exceed the limit of " + N(limits.max_row_values));
    }
    if (!plane.append_only && plane.raw_bytes() > limits.max_chunk_bytes) {
      p.Add(std::string(PlaneName(plane.id)) + " (one chunk) takes " + N(plane.raw_bytes()) +
            " bytes; chunks are limited to " + N(limits.max_chunk_bytes));
    }
    if (!CheckedAdd(total, plane.raw_bytes(), &total)) total = std::numeric_limits<std::uint64_t>::max();
  }
  if (total > limits.max_layer_bytes) {
    p.Add("layer takes " + N(total) + " bytes decoded; the limit is " + N(limits.max_layer_bytes));
  }
  return p.ToStatus(StatusCode::kResourceExhausted);
}

template <typename Snapshot>
const Snapshot& As(const LayerSnapshot& layer) {
  return std::get<Snapshot>(layer);
}

class MlaLatentCodec final : public LayerCodec {
 public:
  std::string_view kind() const override { return kMlaLatentKind; }
  bool Accepts(const LayerShape& shape) const override { return std::holds_alternative<LatentShape>(shape); }

  std::vector<std::uint64_t> ShapeFields(const LayerShape& shape) const override {
    const auto& s = std::get<LatentShape>(shape);
    std::vector<std::uint64_t> f = {
        s.len, s.width, s.index_width, s.pool, s.pools_ready, s.index_is_ring ? 1u : 0u, s.index_ring_rows};
    AppendDtypes({s.dtype, s.index_dtype}, &f);
    return f;
  }

  Result<LayerShape> ShapeFromFields(std::span<const std::uint64_t> f) const override {
    PC_RETURN_IF_ERROR(CheckFieldCount(kind(), f, 7, 2));
    LatentShape s;
    s.len = f[0];
    PC_RETURN_IF_ERROR(Field32(f, 1, "width", &s.width));
    PC_RETURN_IF_ERROR(Field32(f, 2, "index_width", &s.index_width));
    PC_RETURN_IF_ERROR(Field32(f, 3, "pool", &s.pool));
    s.pools_ready = f[4];
    if (f[5] > 1) return Status::Corruption("index_is_ring is " + N(f[5]) + "; it is 0 or 1");
    s.index_is_ring = f[5] == 1;
    s.index_ring_rows = f[6];
    PC_RETURN_IF_ERROR(DtypeFields(f.subspan(7), {&s.dtype, &s.index_dtype}));
    return LayerShape(s);
  }

  Result<std::vector<PlaneLayout>> Planes(const LayerShape& shape, const CodecLimits& limits) const override {
    if (!Accepts(shape)) return WrongKind(kind());
    PC_RETURN_IF_ERROR(CheckShape(shape));
    const auto& s = std::get<LatentShape>(shape);
    PC_RETURN_IF_ERROR(CheckLen(s.len, limits));
    std::vector<PlaneLayout> planes = {
        {PlaneId::kLatentRows, s.len, s.width, /*append_only=*/true, /*lossy_allowed=*/true, s.dtype},
        {PlaneId::kIndexTailRows, s.tail_rows(), s.index_width, false, false, s.index_dtype},
        {PlaneId::kPoolKeys, s.pools_ready, s.index_head_dim(), true, false, s.index_dtype},
    };
    PC_RETURN_IF_ERROR(ApplyLimits(planes, limits));
    return planes;
  }

  std::vector<std::span<const float>> PlaneData(const LayerSnapshot& layer) const override {
    const auto& l = As<LatentSnapshot>(layer);
    return {l.latent_rows, l.index_tail_rows, l.pool_keys};
  }
  std::vector<std::span<float>> MutablePlaneData(LayerSnapshot& layer) const override {
    auto& l = std::get<LatentSnapshot>(layer);
    return {l.latent_rows, l.index_tail_rows, l.pool_keys};
  }
};

class KdaRecurrentCodec final : public LayerCodec {
 public:
  std::string_view kind() const override { return kKdaRecurrentKind; }
  bool Accepts(const LayerShape& shape) const override {
    return std::holds_alternative<RecurrentShape>(shape);
  }

  std::vector<std::uint64_t> ShapeFields(const LayerShape& shape) const override {
    const auto& s = std::get<RecurrentShape>(shape);
    std::vector<std::uint64_t> f = {s.heads, s.head_dim, s.kernel};
    AppendDtypes({s.conv_dtype, s.state_dtype}, &f);
    return f;
  }

  Result<LayerShape> ShapeFromFields(std::span<const std::uint64_t> f) const override {
    PC_RETURN_IF_ERROR(CheckFieldCount(kind(), f, 3, 2));
    RecurrentShape s;
    PC_RETURN_IF_ERROR(Field32(f, 0, "heads", &s.heads));
    PC_RETURN_IF_ERROR(Field32(f, 1, "head_dim", &s.head_dim));
    PC_RETURN_IF_ERROR(Field32(f, 2, "kernel", &s.kernel));
    PC_RETURN_IF_ERROR(DtypeFields(f.subspan(3), {&s.conv_dtype, &s.state_dtype}));
    return LayerShape(s);
  }

  Result<std::vector<PlaneLayout>> Planes(const LayerShape& shape, const CodecLimits& limits) const override {
    if (!Accepts(shape)) return WrongKind(kind());
    PC_RETURN_IF_ERROR(CheckShape(shape));
    const auto& s = std::get<RecurrentShape>(shape);
    std::vector<PlaneLayout> planes = {
        {PlaneId::kConvRing, s.conv_channels(), s.kernel - 1, false, false, s.conv_dtype},
        {PlaneId::kRecurrentState, std::uint64_t{s.heads} * s.head_dim, s.head_dim, false, false, s.state_dtype},
    };
    PC_RETURN_IF_ERROR(ApplyLimits(planes, limits));
    return planes;
  }

  std::vector<std::span<const float>> PlaneData(const LayerSnapshot& layer) const override {
    const auto& r = As<RecurrentSnapshot>(layer);
    return {r.conv_ring, r.state};
  }
  std::vector<std::span<float>> MutablePlaneData(LayerSnapshot& layer) const override {
    auto& r = std::get<RecurrentSnapshot>(layer);
    return {r.conv_ring, r.state};
  }
};

// Every KV kind: plain or rotating rows, f32 or TurboQuant words, or plain
// rows with indexer keys. The header fields are len, k_width, v_width, then
// window and rows when rotating, head_dim and signs_digest when TurboQuant,
// index_width when indexed. A rotating kind's planes are eager (generation
// overwrites every held row, so they are captured at the boundary); the
// others' are append-only. No KV plane may be lossy.
class KvCodec final : public LayerCodec {
 public:
  struct Form {
    bool rotating = false;
    std::uint32_t bits = 0;  // TurboQuant bits; 0 for rows of dtype
    bool indexed = false;
  };
  KvCodec(std::string_view kind, Form form) : kind_(kind), form_(form) {}
  std::string_view kind() const override { return kind_; }
  bool Accepts(const LayerShape& shape) const override {
    const auto* kv = std::get_if<KvShape>(&shape);
    return kv != nullptr && KvKindOf(kv->format) == kind_;
  }

  std::vector<std::uint64_t> ShapeFields(const LayerShape& shape) const override {
    const auto& s = std::get<KvShape>(shape);
    std::vector<std::uint64_t> f = {s.len, s.k_width, s.v_width};
    if (form_.rotating) f.insert(f.end(), {s.format.window, s.rows});
    if (form_.bits != 0) f.insert(f.end(), {s.format.head_dim, s.format.signs_digest});
    if (form_.indexed) {
      f.push_back(s.format.index_width);
      AppendDtypes({s.dtype, s.index_dtype}, &f);
    } else {
      AppendDtypes({s.dtype}, &f);
    }
    return f;
  }

  Result<LayerShape> ShapeFromFields(std::span<const std::uint64_t> f) const override {
    const std::size_t count = 3 + (form_.rotating ? 2 : 0) + (form_.bits != 0 ? 2 : 0) + (form_.indexed ? 1 : 0);
    PC_RETURN_IF_ERROR(CheckFieldCount(kind(), f, count, form_.indexed ? 2 : 1));
    KvShape s;
    s.len = f[0];
    PC_RETURN_IF_ERROR(Field32(f, 1, "k_width", &s.k_width));
    PC_RETURN_IF_ERROR(Field32(f, 2, "v_width", &s.v_width));
    std::size_t next = 3;
    if (form_.rotating) {
      PC_RETURN_IF_ERROR(Field32(f, next, "window", &s.format.window));
      if (s.format.window == 0) return Status::Corruption(std::string(kind_) + " with window 0");
      s.rows = f[next + 1];
      next += 2;
    }
    if (form_.bits != 0) {
      s.format.quant_bits = form_.bits;
      PC_RETURN_IF_ERROR(Field32(f, next, "head_dim", &s.format.head_dim));
      s.format.signs_digest = f[next + 1];
      next += 2;
    }
    if (form_.indexed) {
      PC_RETURN_IF_ERROR(Field32(f, next, "index_width", &s.format.index_width));
      if (s.format.index_width == 0) return Status::Corruption(std::string(kind_) + " with index_width 0");
      PC_RETURN_IF_ERROR(DtypeFields(f.subspan(count), {&s.dtype, &s.index_dtype}));
      return LayerShape(s);
    }
    PC_RETURN_IF_ERROR(DtypeFields(f.subspan(count), {&s.dtype}));
    return LayerShape(s);
  }

  Result<std::vector<PlaneLayout>> Planes(const LayerShape& shape, const CodecLimits& limits) const override {
    if (!Accepts(shape)) return WrongKind(kind());
    PC_RETURN_IF_ERROR(CheckShape(shape));
    const auto& s = std::get<KvShape>(shape);
    PC_RETURN_IF_ERROR(CheckLen(s.len, limits));
    const bool append_only = !form_.rotating;
    std::vector<PlaneLayout> planes = {
        {PlaneId::kKeyRows, s.held_rows(), s.k_width, append_only, false, s.dtype},
        {PlaneId::kValueRows, s.held_rows(), s.v_width, append_only, false, s.dtype},
    };
    if (form_.indexed) planes.push_back({PlaneId::kIndexKeys, s.len, s.format.index_width, true, false, s.index_dtype});
    PC_RETURN_IF_ERROR(ApplyLimits(planes, limits));
    return planes;
  }

  // Snapshots (the reference engine's) have no indexer keys: MakeSnapshot
  // refuses an indexed shape, so only the other forms come here.
  std::vector<std::span<const float>> PlaneData(const LayerSnapshot& layer) const override {
    const auto& kv = As<KvSnapshot>(layer);
    return {kv.k_rows, kv.v_rows};
  }
  std::vector<std::span<float>> MutablePlaneData(LayerSnapshot& layer) const override {
    auto& kv = std::get<KvSnapshot>(layer);
    return {kv.k_rows, kv.v_rows};
  }

 private:
  std::string_view kind_;
  Form form_;
};

// linear-state/v1: fields conv_channels, conv_width, state_heads,
// state_k_dim, state_v_dim; both planes eager (the state changes whole with
// every token).
class LinearStateCodec final : public LayerCodec {
 public:
  std::string_view kind() const override { return kLinearStateKind; }
  bool Accepts(const LayerShape& shape) const override {
    return std::holds_alternative<LinearStateShape>(shape);
  }

  std::vector<std::uint64_t> ShapeFields(const LayerShape& shape) const override {
    const auto& s = std::get<LinearStateShape>(shape);
    std::vector<std::uint64_t> f = {s.conv_channels, s.conv_width, s.state_heads, s.state_k_dim, s.state_v_dim};
    AppendDtypes({s.conv_dtype, s.state_dtype}, &f);
    return f;
  }

  Result<LayerShape> ShapeFromFields(std::span<const std::uint64_t> f) const override {
    PC_RETURN_IF_ERROR(CheckFieldCount(kind(), f, 5, 2));
    LinearStateShape s;
    PC_RETURN_IF_ERROR(Field32(f, 0, "conv_channels", &s.conv_channels));
    PC_RETURN_IF_ERROR(Field32(f, 1, "conv_width", &s.conv_width));
    PC_RETURN_IF_ERROR(Field32(f, 2, "state_heads", &s.state_heads));
    PC_RETURN_IF_ERROR(Field32(f, 3, "state_k_dim", &s.state_k_dim));
    PC_RETURN_IF_ERROR(Field32(f, 4, "state_v_dim", &s.state_v_dim));
    PC_RETURN_IF_ERROR(DtypeFields(f.subspan(5), {&s.conv_dtype, &s.state_dtype}));
    return LayerShape(s);
  }

  Result<std::vector<PlaneLayout>> Planes(const LayerShape& shape, const CodecLimits& limits) const override {
    if (!Accepts(shape)) return WrongKind(kind());
    PC_RETURN_IF_ERROR(CheckShape(shape));
    const auto& s = std::get<LinearStateShape>(shape);
    std::vector<PlaneLayout> planes = {
        {PlaneId::kConvRing, s.conv_channels, s.conv_width, false, false, s.conv_dtype},
        {PlaneId::kRecurrentState, s.state_rows(), s.state_v_dim, false, false, s.state_dtype},
    };
    PC_RETURN_IF_ERROR(ApplyLimits(planes, limits));
    return planes;
  }

  // No snapshot holds this kind (MakeSnapshot refuses it): its layers are
  // encoded from and decoded into the caller's memory only.
  std::vector<std::span<const float>> PlaneData(const LayerSnapshot&) const override { return {}; }
  std::vector<std::span<float>> MutablePlaneData(LayerSnapshot&) const override { return {}; }
};

}  // namespace

std::vector<const LayerCodec*> BuiltinKinds() {
  static const MlaLatentCodec mla;
  static const KdaRecurrentCodec kda;
  static const LinearStateCodec linear;
  static const KvCodec plain(kKvPlainKind, {}), rotating(kKvRotatingKind, {.rotating = true}),
      tq2_plain(kTurboQuant2PlainKind, {.bits = 2}), tq4_plain(kTurboQuant4PlainKind, {.bits = 4}),
      tq2_rotating(kTurboQuant2RotatingKind, {.rotating = true, .bits = 2}),
      tq4_rotating(kTurboQuant4RotatingKind, {.rotating = true, .bits = 4}),
      indexed(kKvIndexedKind, {.indexed = true});
  return {&mla, &kda, &plain, &rotating, &tq2_plain, &tq4_plain, &tq2_rotating, &tq4_rotating, &indexed, &linear};
}

}  // namespace primecache::codecs

namespace primecache {

std::string_view KvKindOf(const KvFormat& f) {
  if (f.indexed()) return f.rotating() || f.quantized() ? std::string_view{} : kKvIndexedKind;
  switch (f.quant_bits) {
    case 0:
      return f.rotating() ? kKvRotatingKind : kKvPlainKind;
    case 2:
      return f.rotating() ? kTurboQuant2RotatingKind : kTurboQuant2PlainKind;
    case 4:
      return f.rotating() ? kTurboQuant4RotatingKind : kTurboQuant4PlainKind;
    default:
      return {};
  }
}

}  // namespace primecache

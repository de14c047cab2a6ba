// The built-in transforms: raw/v1, shuffle-zstd/v1, bf16/v1, q8_0/v1.
// Formats and error bounds: docs/codecs.md.
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "codecs/builtin.h"
#include "core/bytes.h"
#include "codecs/internal.h"
#include "codecs/shuffle.h"

namespace primecache::codecs {
namespace {

// The f32 values of an f32 run (lossy transforms code f32 only; CheckType
// refused anything else before). The bytes may be unaligned: copied when so.
std::span<const float> F32Of(ElementSpan v, std::vector<float>& aligned) {
  if (reinterpret_cast<std::uintptr_t>(v.bytes.data()) % alignof(float) == 0) {
    return {reinterpret_cast<const float*>(v.bytes.data()), v.bytes.size() / sizeof(float)};
  }
  aligned.resize(v.bytes.size() / sizeof(float));
  if (!v.bytes.empty()) std::memcpy(aligned.data(), v.bytes.data(), v.bytes.size());
  return aligned;
}

Status AnyType(std::string_view, ElementType t) {
  if (IsElementType(static_cast<std::uint8_t>(t))) return Status::Ok();
  return Status::InvalidArgument("element type " + std::to_string(static_cast<int>(t)) + " is not one");
}

Status WholeValues(std::string_view id, std::size_t bytes, ElementType t) {
  if (bytes % ElementBytes(t) == 0) return Status::Ok();
  return Status::InvalidArgument(std::string(id) + ": " + std::to_string(bytes) + " bytes are not whole " +
                                 ElementTypeName(t) + " values");
}

Status F32Only(std::string_view id, ElementType t) {
  if (t == ElementType::kF32) return Status::Ok();
  return Status::InvalidArgument(std::string(id) + " codes f32 values; the plane is " + ElementTypeName(t) +
                                 " (its bytes are stored as they are: raw/v1 or shuffle-zstd/v1)");
}

Status SizeMismatch(std::string_view id, std::uint64_t got, std::uint64_t want, std::uint64_t values) {
  return Status::Corruption(std::string(id) + ": " + std::to_string(got) + " encoded bytes; " +
                            std::to_string(values) + " values take exactly " + std::to_string(want));
}

Status Room(std::string_view id, std::size_t have, std::uint64_t need) {
  if (have >= need) return Status::Ok();
  return Status::InvalidArgument(std::string(id) + ": " + std::to_string(have) + " bytes of room; encoding may take " +
                                 std::to_string(need));
}

Status NoLevel(std::string_view id, std::int32_t level) {
  if (level == 0) return Status::Ok();
  return Status::InvalidArgument(std::string(id) + " takes no level; got " + std::to_string(level));
}

// A growable byte buffer that is never zero-filled, kept per thread so that
// repeated chunk coding does not fault in fresh pages each time.
class Scratch {
 public:
  std::byte* Get(std::size_t n) {
    if (n > cap_) {
      buf_ = std::make_unique_for_overwrite<std::byte[]>(n);
      cap_ = n;
    }
    return buf_.get();
  }

 private:
  std::unique_ptr<std::byte[]> buf_;
  std::size_t cap_ = 0;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// ---- raw/v1: the little-endian bytes as they are ------------------------------

class RawTransform final : public Transform {
 public:
  std::string_view id() const override { return kRawTransform; }
  bool lossy() const override { return false; }
  Status CheckLevel(std::int32_t level) const override { return NoLevel(id(), level); }
  Status CheckType(ElementType type) const override { return AnyType(id(), type); }
  std::optional<std::uint64_t> ExactEncodedSize(std::uint64_t values, ElementType type) const override {
    return values * ElementBytes(type);
  }
  std::uint64_t MaxEncodedSize(std::uint64_t values, ElementType type) const override {
    return values * ElementBytes(type);
  }

  Result<std::size_t> EncodeInto(ElementSpan values, std::int32_t level, std::span<std::byte> out) const override {
    PC_RETURN_IF_ERROR(CheckLevel(level));
    PC_RETURN_IF_ERROR(CheckType(values.type));
    PC_RETURN_IF_ERROR(WholeValues(id(), values.bytes.size(), values.type));
    PC_RETURN_IF_ERROR(Room(id(), out.size(), values.bytes.size()));
    if (!values.bytes.empty()) std::memcpy(out.data(), values.bytes.data(), values.bytes.size());
    return values.bytes.size();
  }

  Status Decode(std::span<const std::byte> encoded, MutableElementSpan out) const override {
    PC_RETURN_IF_ERROR(CheckType(out.type));
    PC_RETURN_IF_ERROR(WholeValues(id(), out.bytes.size(), out.type));
    if (encoded.size() != out.bytes.size())
      return SizeMismatch(id(), encoded.size(), out.bytes.size(), out.size());
    if (!encoded.empty()) std::memcpy(out.bytes.data(), encoded.data(), encoded.size());
    return Status::Ok();
  }
};

// ---- shuffle-zstd/v1: byte shuffle, then one zstd frame ---------------------

struct ZstdContexts {
  ZSTD_CCtx* c = nullptr;
  ZSTD_DCtx* d = nullptr;
  ~ZstdContexts() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

ZstdContexts& ThreadZstd() {
  thread_local ZstdContexts ctx;
  return ctx;
}

class ShuffleZstdTransform final : public Transform {
 public:
  std::string_view id() const override { return kShuffleZstdTransform; }
  bool lossy() const override { return false; }

  Status CheckLevel(std::int32_t level) const override {
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) {
      return Status::InvalidArgument(std::string(id()) + ": zstd level " + std::to_string(level) +
                                     " outside [" + std::to_string(ZSTD_minCLevel()) + ", " +
                                     std::to_string(ZSTD_maxCLevel()) + "]");
    }
    return Status::Ok();
  }
  Status CheckType(ElementType type) const override { return AnyType(id(), type); }
  std::optional<std::uint64_t> ExactEncodedSize(std::uint64_t, ElementType) const override { return std::nullopt; }
  std::uint64_t MaxEncodedSize(std::uint64_t values, ElementType type) const override {
    return ZSTD_compressBound(static_cast<std::size_t>(values * ElementBytes(type)));
  }

  // The bytes regrouped by significance for 4- and 2-byte values; 1-byte
  // values (fp8) go to zstd as they are.
  Result<std::size_t> EncodeInto(ElementSpan values, std::int32_t level, std::span<std::byte> out) const override {
    PC_RETURN_IF_ERROR(CheckLevel(level));
    PC_RETURN_IF_ERROR(CheckType(values.type));
    PC_RETURN_IF_ERROR(WholeValues(id(), values.bytes.size(), values.type));
    PC_RETURN_IF_ERROR(Room(id(), out.size(), MaxEncodedSize(values.size(), values.type)));
    const std::size_t n = values.size(), raw = values.bytes.size();
    const std::byte* shuffled = values.bytes.data();
    if (ElementBytes(values.type) > 1) {
      std::byte* scratch = ThreadScratch().Get(raw);
      if (ElementBytes(values.type) == 4) ShuffleBytes4(values.bytes.data(), n, scratch);
      if (ElementBytes(values.type) == 2) ShuffleBytes2(values.bytes.data(), n, scratch);
      shuffled = scratch;
    }
    ZstdContexts& z = ThreadZstd();
    if (z.c == nullptr && (z.c = ZSTD_createCCtx()) == nullptr)
      return Status::ResourceExhausted("ZSTD_createCCtx");
    // ZSTD_compressCCtx sets every parameter from the level: the output is a
    // function of (input, level, library version) only, with the content size
    // recorded in the frame.
    std::size_t got = ZSTD_compressCCtx(z.c, out.data(), out.size(), shuffled, raw, level);
    if (ZSTD_isError(got))
      return Status::Internal(std::string("zstd compression: ") + ZSTD_getErrorName(got));
    return got;
  }

  Status Decode(std::span<const std::byte> encoded, MutableElementSpan out) const override {
    PC_RETURN_IF_ERROR(CheckType(out.type));
    PC_RETURN_IF_ERROR(WholeValues(id(), out.bytes.size(), out.type));
    const std::size_t raw = out.bytes.size();
    unsigned long long content = ZSTD_getFrameContentSize(encoded.data(), encoded.size());
    if (content == ZSTD_CONTENTSIZE_ERROR)
      return Status::Corruption(std::string(id()) + ": not a zstd frame");
    if (content == ZSTD_CONTENTSIZE_UNKNOWN) {
      return Status::Corruption(std::string(id()) + ": zstd frame does not record its content size");
    }
    if (content != raw) {
      return Status::Corruption(std::string(id()) + ": zstd frame holds " + std::to_string(content) +
                                " bytes; expected " + std::to_string(raw));
    }
    std::size_t frame = ZSTD_findFrameCompressedSize(encoded.data(), encoded.size());
    if (ZSTD_isError(frame) || frame != encoded.size()) {
      return Status::Corruption(std::string(id()) + ": encoded bytes are not exactly one zstd frame");
    }
    ZstdContexts& z = ThreadZstd();
    if (z.d == nullptr && (z.d = ZSTD_createDCtx()) == nullptr)
      return Status::ResourceExhausted("ZSTD_createDCtx");
    const std::uint32_t width = ElementBytes(out.type);
    std::byte* shuffled = width == 1 ? out.bytes.data() : ThreadScratch().Get(raw);
    std::size_t got = ZSTD_decompressDCtx(z.d, shuffled, raw, encoded.data(), encoded.size());
    if (ZSTD_isError(got)) {
      return Status::Corruption(std::string(id()) + ": zstd: " + ZSTD_getErrorName(got));
    }
    if (got != raw) {
      return Status::Corruption(std::string(id()) + ": zstd gave " + std::to_string(got) +
                                " bytes; expected " + std::to_string(raw));
    }
    if (width == 4) UnshuffleBytes4(shuffled, out.size(), out.bytes.data());
    if (width == 2) UnshuffleBytes2(shuffled, out.size(), out.bytes.data());
    return Status::Ok();
  }
};

// ---- bf16/v1: the top 16 bits, rounded to nearest even ----------------------

std::uint16_t ToBf16(float x) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = bits & 0x80000000u;
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload, force quiet
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  if ((bits & 0x7fffffffu) == 0x7f800000u) return static_cast<std::uint16_t>(bits >> 16);  // +-inf
  std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  std::uint16_t out = static_cast<std::uint16_t>(rounded >> 16);
  if ((out & 0x7fffu) == 0x7f80u) out = static_cast<std::uint16_t>((sign >> 16) | 0x7f7fu);  // saturate
  return out;
}

float FromBf16(std::uint16_t b) {
  return std::bit_cast<float>(std::uint32_t{b} << 16);
}

class Bf16Transform final : public Transform {
 public:
  std::string_view id() const override { return kBf16Transform; }
  bool lossy() const override { return true; }
  Status CheckLevel(std::int32_t level) const override { return NoLevel(id(), level); }
  Status CheckType(ElementType type) const override { return F32Only(id(), type); }
  std::optional<std::uint64_t> ExactEncodedSize(std::uint64_t values, ElementType) const override {
    return values * 2;
  }
  std::uint64_t MaxEncodedSize(std::uint64_t values, ElementType) const override { return values * 2; }

  Result<std::size_t> EncodeInto(ElementSpan in, std::int32_t level, std::span<std::byte> out) const override {
    PC_RETURN_IF_ERROR(CheckLevel(level));
    PC_RETURN_IF_ERROR(CheckType(in.type));
    PC_RETURN_IF_ERROR(Room(id(), out.size(), MaxEncodedSize(in.size(), in.type)));
    thread_local std::vector<float> aligned;
    const std::span<const float> values = F32Of(in, aligned);
    auto* dst = reinterpret_cast<unsigned char*>(out.data());
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::uint16_t b = ToBf16(values[i]);
      std::memcpy(dst + 2 * i, &b, 2);
    }
    return values.size() * 2;
  }

  Status Decode(std::span<const std::byte> encoded, MutableElementSpan out) const override {
    PC_RETURN_IF_ERROR(AsCorruption(CheckType(out.type)));
    if (encoded.size() != out.size() * 2)
      return SizeMismatch(id(), encoded.size(), out.size() * 2, out.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::uint16_t b;
      std::memcpy(&b, encoded.data() + 2 * i, 2);
      const float x = FromBf16(b);
      std::memcpy(out.bytes.data() + 4 * i, &x, 4);
    }
    return Status::Ok();
  }
};

// ---- q8_0/v1: blocks of 32 values, an f32 scale and 32 int8 each -----------

constexpr std::size_t kQ8Block = 32;

// The largest scale d with 127 * d finite: larger blocks' scales are clamped
// to it (costing far less than the bound's amax / 254), and a stored scale
// above it did not come from the encoder.
float MaxScale() {
  static const float max_scale = [] {
    float d = std::numeric_limits<float>::max() / 127.0f;
    while (!std::isfinite(127.0f * d)) d = std::nextafter(d, 0.0f);
    return d;
  }();
  return max_scale;
}

std::uint64_t Q8EncodedSize(std::uint64_t values) {
  return (values + kQ8Block - 1) / kQ8Block * sizeof(float) + values;
}

class Q8_0Transform final : public Transform {
 public:
  std::string_view id() const override { return kQ8_0Transform; }
  bool lossy() const override { return true; }
  Status CheckLevel(std::int32_t level) const override { return NoLevel(id(), level); }
  Status CheckType(ElementType type) const override { return F32Only(id(), type); }
  std::optional<std::uint64_t> ExactEncodedSize(std::uint64_t values, ElementType) const override {
    return Q8EncodedSize(values);
  }
  std::uint64_t MaxEncodedSize(std::uint64_t values, ElementType) const override { return Q8EncodedSize(values); }

  Result<std::size_t> EncodeInto(ElementSpan in, std::int32_t level, std::span<std::byte> out) const override {
    PC_RETURN_IF_ERROR(CheckLevel(level));
    PC_RETURN_IF_ERROR(CheckType(in.type));
    PC_RETURN_IF_ERROR(Room(id(), out.size(), MaxEncodedSize(in.size(), in.type)));
    thread_local std::vector<float> aligned;
    const std::span<const float> values = F32Of(in, aligned);
    auto* dst = reinterpret_cast<unsigned char*>(out.data());
    for (std::size_t start = 0; start < values.size(); start += kQ8Block) {
      const std::size_t len = std::min(kQ8Block, values.size() - start);
      float amax = 0.0f;
      for (std::size_t j = 0; j < len; ++j) {
        float x = values[start + j];
        if (!std::isfinite(x)) {
          return Status::InvalidArgument(std::string(id()) + " cannot encode the non-finite value at index " +
                                         std::to_string(start + j));
        }
        amax = std::max(amax, std::fabs(x));
      }
      const float d = std::min(amax / 127.0f, MaxScale());
      std::memcpy(dst, &d, sizeof d);
      dst += sizeof d;
      for (std::size_t j = 0; j < len; ++j) {
        float q = d == 0.0f ? 0.0f : std::nearbyint(values[start + j] / d);
        q = std::clamp(q, -127.0f, 127.0f);
        dst[j] = static_cast<unsigned char>(static_cast<std::int8_t>(q));
      }
      dst += len;
    }
    return static_cast<std::size_t>(Q8EncodedSize(values.size()));
  }

  Status Decode(std::span<const std::byte> encoded, MutableElementSpan out) const override {
    PC_RETURN_IF_ERROR(AsCorruption(CheckType(out.type)));
    const std::uint64_t want = Q8EncodedSize(out.size());
    if (encoded.size() != want) return SizeMismatch(id(), encoded.size(), want, out.size());
    const auto* src = reinterpret_cast<const unsigned char*>(encoded.data());
    for (std::size_t start = 0; start < out.size(); start += kQ8Block) {
      const std::size_t len = std::min(kQ8Block, out.size() - start);
      float d;
      std::memcpy(&d, src, sizeof d);
      src += sizeof d;
      // The encoder writes d = amax / 127 of finite values and |q| <= 127;
      // anything else did not come from it.
      if (!(d >= 0.0f && d <= MaxScale())) {
        return Status::Corruption(std::string(id()) + ": block " + std::to_string(start / kQ8Block) +
                                  " has scale " + std::to_string(d) + "; scales lie in [0, FLT_MAX / 127]");
      }
      for (std::size_t j = 0; j < len; ++j) {
        auto q = static_cast<std::int8_t>(src[j]);
        if (q == -128) {
          return Status::Corruption(std::string(id()) + ": value " + std::to_string(start + j) +
                                    " is -128; quantized values lie in [-127, 127]");
        }
        const float x = static_cast<float>(q) * d;
        std::memcpy(out.bytes.data() + 4 * (start + j), &x, 4);
      }
      src += len;
    }
    return Status::Ok();
  }
};

}  // namespace

}  // namespace primecache::codecs

namespace primecache {

Status Transform::Encode(ElementSpan values, std::int32_t level, std::string* out) const {
  PC_RETURN_IF_ERROR(CheckType(values.type));
  out->resize(MaxEncodedSize(values.size(), values.type));
  PC_ASSIGN_OR_RETURN(std::size_t n, EncodeInto(values, level, std::as_writable_bytes(std::span(*out))));
  out->resize(n);
  return Status::Ok();
}

}  // namespace primecache

namespace primecache::codecs {

std::vector<const Transform*> BuiltinTransforms() {
  static const RawTransform raw;
  static const ShuffleZstdTransform shuffle_zstd;
  static const Bf16Transform bf16;
  static const Q8_0Transform q8_0;
  return {&raw, &shuffle_zstd, &bf16, &q8_0};
}

}  // namespace primecache::codecs

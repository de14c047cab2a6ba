#include "codecs/shuffle.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace primecache::codecs {
namespace {

// Values [from, n) one byte at a time.
void ShuffleScalar(const std::byte* in, std::size_t from, std::size_t n, std::byte* out) {
  for (std::size_t i = from; i < n; ++i) {
    for (std::size_t b = 0; b < 4; ++b) out[b * n + i] = in[4 * i + b];
  }
}
void UnshuffleScalar(const std::byte* in, std::size_t from, std::size_t n, std::byte* out) {
  for (std::size_t i = from; i < n; ++i) {
    for (std::size_t b = 0; b < 4; ++b) out[4 * i + b] = in[b * n + i];
  }
}

#if defined(__x86_64__)

// SSE2: 16 values (64 bytes) a step. Three rounds of byte unpacks transpose
// the 16x4 byte matrix; a 64-bit unpack puts each significance in one register.
std::size_t ShuffleSse2(const std::byte* in, std::size_t n, std::byte* out) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto* src = reinterpret_cast<const __m128i*>(in + 4 * i);
    __m128i a0 = _mm_loadu_si128(src + 0), a1 = _mm_loadu_si128(src + 1);
    __m128i a2 = _mm_loadu_si128(src + 2), a3 = _mm_loadu_si128(src + 3);
    __m128i b0 = _mm_unpacklo_epi8(a0, a1), b1 = _mm_unpackhi_epi8(a0, a1);
    __m128i b2 = _mm_unpacklo_epi8(a2, a3), b3 = _mm_unpackhi_epi8(a2, a3);
    __m128i c0 = _mm_unpacklo_epi8(b0, b1), c1 = _mm_unpackhi_epi8(b0, b1);
    __m128i c2 = _mm_unpacklo_epi8(b2, b3), c3 = _mm_unpackhi_epi8(b2, b3);
    __m128i d0 = _mm_unpacklo_epi8(c0, c1), d1 = _mm_unpackhi_epi8(c0, c1);
    __m128i d2 = _mm_unpacklo_epi8(c2, c3), d3 = _mm_unpackhi_epi8(c2, c3);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 0 * n + i), _mm_unpacklo_epi64(d0, d2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 1 * n + i), _mm_unpackhi_epi64(d0, d2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * n + i), _mm_unpacklo_epi64(d1, d3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 3 * n + i), _mm_unpackhi_epi64(d1, d3));
  }
  return i;
}

std::size_t UnshuffleSse2(const std::byte* in, std::size_t n, std::byte* out) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i e0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 0 * n + i));
    __m128i e1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 1 * n + i));
    __m128i e2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * n + i));
    __m128i e3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 3 * n + i));
    __m128i f0 = _mm_unpacklo_epi8(e0, e1), f1 = _mm_unpackhi_epi8(e0, e1);
    __m128i f2 = _mm_unpacklo_epi8(e2, e3), f3 = _mm_unpackhi_epi8(e2, e3);
    auto* dst = reinterpret_cast<__m128i*>(out + 4 * i);
    _mm_storeu_si128(dst + 0, _mm_unpacklo_epi16(f0, f2));
    _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(f0, f2));
    _mm_storeu_si128(dst + 2, _mm_unpacklo_epi16(f1, f3));
    _mm_storeu_si128(dst + 3, _mm_unpackhi_epi16(f1, f3));
  }
  return i;
}

// AVX2: 32 values (128 bytes) a step. Per register of 8 values: a byte
// shuffle groups each lane's 4 values by significance, a dword permute joins
// the two lanes ([b0 of 8 | b1 | b2 | b3], 8 bytes each); a 4x4 transpose of
// those 8-byte pieces across the 4 registers gives 32 bytes per significance.
// The inverse runs the same steps backwards (the byte shuffle is its own inverse).
__attribute__((target("avx2"))) std::size_t ShuffleAvx2(const std::byte* in, std::size_t n, std::byte* out) {
  const __m256i group = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i join = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const auto* src = reinterpret_cast<const __m256i*>(in + 4 * i);
    __m256i r0 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(_mm256_loadu_si256(src + 0), group), join);
    __m256i r1 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(_mm256_loadu_si256(src + 1), group), join);
    __m256i r2 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(_mm256_loadu_si256(src + 2), group), join);
    __m256i r3 = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(_mm256_loadu_si256(src + 3), group), join);
    __m256i t0 = _mm256_unpacklo_epi64(r0, r1), t1 = _mm256_unpackhi_epi64(r0, r1);
    __m256i t2 = _mm256_unpacklo_epi64(r2, r3), t3 = _mm256_unpackhi_epi64(r2, r3);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 0 * n + i), _mm256_permute2x128_si256(t0, t2, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 1 * n + i), _mm256_permute2x128_si256(t1, t3, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * n + i), _mm256_permute2x128_si256(t0, t2, 0x31));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 3 * n + i), _mm256_permute2x128_si256(t1, t3, 0x31));
  }
  return i;
}

__attribute__((target("avx2"))) std::size_t UnshuffleAvx2(const std::byte* in, std::size_t n,
                                                          std::byte* out) {
  const __m256i group = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i e0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 0 * n + i));
    __m256i e1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 1 * n + i));
    __m256i e2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * n + i));
    __m256i e3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 3 * n + i));
    __m256i t0 = _mm256_permute2x128_si256(e0, e2, 0x20), t1 = _mm256_permute2x128_si256(e0, e2, 0x31);
    __m256i t2 = _mm256_permute2x128_si256(e1, e3, 0x20), t3 = _mm256_permute2x128_si256(e1, e3, 0x31);
    __m256i r[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                    _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    auto* dst = reinterpret_cast<__m256i*>(out + 4 * i);
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_si256(dst + k, _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(r[k], split), group));
    }
  }
  return i;
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

#endif  // __x86_64__

// The vector part for one ISA; returns how many values it did.
std::size_t ShuffleVector(ShuffleIsa isa, const std::byte* in, std::size_t n, std::byte* out) {
#if defined(__x86_64__)
  if (isa == ShuffleIsa::kAvx2) return ShuffleAvx2(in, n, out);
  if (isa == ShuffleIsa::kSse2) return ShuffleSse2(in, n, out);
#endif
  (void)isa, (void)in, (void)n, (void)out;
  return 0;
}
std::size_t UnshuffleVector(ShuffleIsa isa, const std::byte* in, std::size_t n, std::byte* out) {
#if defined(__x86_64__)
  if (isa == ShuffleIsa::kAvx2) return UnshuffleAvx2(in, n, out);
  if (isa == ShuffleIsa::kSse2) return UnshuffleSse2(in, n, out);
#endif
  (void)isa, (void)in, (void)n, (void)out;
  return 0;
}

ShuffleIsa BestIsa() {
#if defined(__x86_64__)
  return HaveAvx2() ? ShuffleIsa::kAvx2 : ShuffleIsa::kSse2;
#else
  return ShuffleIsa::kScalar;
#endif
}

}  // namespace

bool ShuffleIsaAvailable(ShuffleIsa isa) {
#if defined(__x86_64__)
  return isa != ShuffleIsa::kAvx2 || HaveAvx2();
#else
  return isa == ShuffleIsa::kScalar;
#endif
}

void ShuffleBytes4With(ShuffleIsa isa, const std::byte* in, std::size_t n, std::byte* out) {
  ShuffleScalar(in, ShuffleVector(isa, in, n, out), n, out);
}
void UnshuffleBytes4With(ShuffleIsa isa, const std::byte* in, std::size_t n, std::byte* out) {
  UnshuffleScalar(in, UnshuffleVector(isa, in, n, out), n, out);
}

void ShuffleBytes4(const std::byte* in, std::size_t n, std::byte* out) {
  ShuffleBytes4With(BestIsa(), in, n, out);
}
void UnshuffleBytes4(const std::byte* in, std::size_t n, std::byte* out) {
  UnshuffleBytes4With(BestIsa(), in, n, out);
}

}  // namespace primecache::codecs

namespace primecache::codecs {

// Two planes of n bytes each: a loop the compiler vectorizes on its own.
void ShuffleBytes2(const std::byte* in, std::size_t n, std::byte* out) {
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = in[2 * i];
    out[n + i] = in[2 * i + 1];
  }
}
void UnshuffleBytes2(const std::byte* in, std::size_t n, std::byte* out) {
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = in[i];
    out[2 * i + 1] = in[n + i];
  }
}

}  // namespace primecache::codecs

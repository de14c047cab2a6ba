#include "codecs/shuffle.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace primecache::codecs {

void ShuffleBytes4(const std::byte* in, std::size_t n, std::byte* out) {
  std::size_t i = 0;
#if defined(__SSE2__)
  // 16 values (64 bytes) a step: a byte transpose by three rounds of
  // unpacks, then one 64-bit unpack puts each significance in one register.
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
#endif
  for (; i < n; ++i) {
    for (std::size_t b = 0; b < 4; ++b) out[b * n + i] = in[4 * i + b];
  }
}

void UnshuffleBytes4(const std::byte* in, std::size_t n, std::byte* out) {
  std::size_t i = 0;
#if defined(__SSE2__)
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
#endif
  for (; i < n; ++i) {
    for (std::size_t b = 0; b < 4; ++b) out[4 * i + b] = in[b * n + i];
  }
}

}  // namespace primecache::codecs

// Byte shuffle of 4-byte values: the bytes of n f32 values regrouped by
// significance, so that the sign/exponent bytes of a smooth plane sit next to
// each other where a compressor finds them. Internal to primecache_codecs.
//
//   shuffled[b * n + i] = values[4 * i + b]      b in [0, 4), i in [0, n)
//
// SSE2 on x86-64 (16 values a step), scalar elsewhere and for the remainder.
// Pure functions; in and out must not overlap.
#pragma once

#include <cstddef>

namespace primecache::codecs {

void ShuffleBytes4(const std::byte* in, std::size_t n, std::byte* out);
void UnshuffleBytes4(const std::byte* in, std::size_t n, std::byte* out);

}  // namespace primecache::codecs

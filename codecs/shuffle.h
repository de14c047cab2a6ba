// Byte shuffle of 4-byte (and 2-byte) values: the bytes of n f32 values regrouped by
// significance, so that the sign/exponent bytes of a smooth plane sit next to
// each other where a compressor finds them. Internal to primecache_codecs.
//
//   shuffled[b * n + i] = values[4 * i + b]      b in [0, 4), i in [0, n)
//
// Three implementations give identical bytes: AVX2 (32 values a step, chosen
// at run time when the CPU has it), SSE2 (16 a step, the x86-64 baseline) and
// scalar (everything else, and every remainder). Pure functions; in and out
// must not overlap.
#pragma once

#include <cstddef>

namespace primecache::codecs {

void ShuffleBytes4(const std::byte* in, std::size_t n, std::byte* out);
void UnshuffleBytes4(const std::byte* in, std::size_t n, std::byte* out);

// The same for n 2-byte values (bf16, f16): shuffled[b * n + i] = values[2 * i + b].
void ShuffleBytes2(const std::byte* in, std::size_t n, std::byte* out);
void UnshuffleBytes2(const std::byte* in, std::size_t n, std::byte* out);

// The implementations, for tests that compare them.
enum class ShuffleIsa { kScalar, kSse2, kAvx2 };
bool ShuffleIsaAvailable(ShuffleIsa isa);
void ShuffleBytes4With(ShuffleIsa isa, const std::byte* in, std::size_t n, std::byte* out);
void UnshuffleBytes4With(ShuffleIsa isa, const std::byte* in, std::size_t n, std::byte* out);

}  // namespace primecache::codecs

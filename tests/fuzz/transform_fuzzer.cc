// libFuzzer target: one transform's decode (PC_FUZZ_TRANSFORM). Input: a
// little-endian u16 value count (taken mod 4097), then the encoded bytes. Whatever decodes is
// encoded again: a lossless transform must then give back the same values
// bit for bit (raw: the same bytes), a lossy one must take its own output.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_limits.h"
#include "primecache/internal/codec.h"

#ifndef PC_FUZZ_TRANSFORM
#error "PC_FUZZ_TRANSFORM names the transform this target decodes"
#endif

using namespace primecache;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::uint16_t raw_n;
  std::memcpy(&raw_n, data, 2);
  const std::size_t n = raw_n % 4097;  // small buffers keep runs fast; sizes past a few blocks add nothing
  const auto encoded = std::as_bytes(std::span(data + 2, size - 2));
  const Transform* t = *CodecRegistry::Default().FindTransform(PC_FUZZ_TRANSFORM);
  std::vector<float> values(n);
  if (!t->Decode(encoded, values).ok()) return 0;

  const std::int32_t level = t->id() == kShuffleZstdTransform ? 1 : 0;
  std::string again;
  PC_FUZZ_CHECK(t->Encode(values, level, &again).ok());
  std::vector<float> back(n);
  PC_FUZZ_CHECK(t->Decode(AsBytes(again), back).ok());
  if (!t->lossy()) PC_FUZZ_CHECK(n == 0 || std::memcmp(values.data(), back.data(), n * sizeof(float)) == 0);
  if (t->id() == kRawTransform)
    PC_FUZZ_CHECK(again.size() == encoded.size() &&
                  std::memcmp(again.data(), encoded.data(), again.size()) == 0);
  return 0;
}

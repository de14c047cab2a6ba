// libFuzzer target: the model descriptor decoder (DecodeFingerprint), which
// reads bytes a store kept from a client. Whatever decodes must be exactly
// one canonical encoding: encoding it again gives the input back.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_limits.h"
#include "primecache/internal/snapshot.h"

using namespace primecache;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto fp = DecodeFingerprint(bytes, /*max_string_bytes=*/256, /*max_codec_versions=*/16);
  if (fp.ok()) PC_FUZZ_CHECK(EncodeFingerprint(*fp) == bytes);
  return 0;
}

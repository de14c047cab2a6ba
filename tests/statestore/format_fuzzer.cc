// libFuzzer target: every record decoder of the store's schema (segment
// file headers and frame headers included) on arbitrary
// bytes. The first byte picks the decoder (low four bits) and whether a
// correct checksum trailer is appended first (high bit), so that the fuzzer
// also reaches the structure behind the checksums. Whatever decodes must
// encode back to the same bytes (or decode again to the same record).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "statestore/format.h"
#include "statestore/segments.h"

using namespace primecache::statestore_internal;  // NOLINT(google-build-using-namespace)

#define REQUIRE(cond)          \
  do {                         \
    if (!(cond)) std::abort(); \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int which = data[0] & 0x0f;
  std::string v(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 0x80) AppendChecksum(&v);
  switch (which) {
    case 0:
      if (auto r = DecodeSummary(v); r.ok()) REQUIRE(EncodeSummary(*r) == v);
      break;
    case 1:
      if (auto r = DecodeManifest(v, 1u << 30); r.ok()) REQUIRE(EncodeManifest(*r) == v);
      break;
    case 2:
      if (auto r = DecodeTokens(v); r.ok()) REQUIRE(EncodeTokens(*r) == v);
      break;
    case 3:
      if (auto r = DecodeParams(v); r.ok()) REQUIRE(EncodeParams(*r) == v);
      break;
    case 4:
      if (auto r = DecodeCounters(v); r.ok()) REQUIRE(DecodeCounters(EncodeCounters(*r)).ok());
      break;
    case 5:
      // A version-1 record reads, and is written back as version 2.
      if (auto r = DecodeScope(1, v); r.ok()) {
        const std::string again = EncodeScope(*r);
        if (v[0] == 2) REQUIRE(again == v);
        auto back = DecodeScope(1, again);
        REQUIRE(back.ok() && back->digest == r->digest && back->model_name == r->model_name && back->ns == r->ns &&
                back->descriptor == r->descriptor);
      }
      break;
    case 6:
      if (auto r = DecodeQuarantine(v); r.ok()) REQUIRE(DecodeQuarantine(EncodeQuarantine(*r)).ok());
      break;
    case 7:
      if (auto r = DecodeNode(v, 64); r.ok()) REQUIRE(EncodeNode(*r) == v);
      break;
    case 8:
      if (auto r = DecodeIds(v); r.ok()) REQUIRE(EncodeIds(*r) == v);
      break;
    case 9:
      if (auto r = DecodeChunkRef(v); r.ok()) REQUIRE(EncodeChunkRef(*r) == v);
      break;
    case 10:
      if (auto r = DecodeAccess(v); r.ok()) REQUIRE(EncodeAccess(*r) == v);
      break;
    case 11:
      if (auto r = DecodeSegment(v); r.ok()) REQUIRE(EncodeSegment(*r) == v);
      break;
    case 12:
      if (auto r = DecodeFrameHeader(v, 1u << 30); r.ok()) REQUIRE(EncodeFrameHeader(*r) == v);
      break;
    case 13:
      if (v.size() >= 24) {
        std::uint64_t id = 0;  // the header's own id (little-endian at 16)
        for (int i = 7; i >= 0; --i) id = (id << 8) | static_cast<unsigned char>(v[16 + i]);
        if (CheckSegmentHeader(v, id).ok()) REQUIRE(v.size() == kSegmentHeaderBytes && EncodeSegmentHeader(id) == v);
      }
      break;
    default:
      if (auto r = DecodeSchema(v); r.ok()) REQUIRE(EncodeSchema(*r) == v);
      break;
  }
  return 0;
}

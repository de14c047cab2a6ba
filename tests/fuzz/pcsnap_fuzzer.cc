// libFuzzer target: the .pcsnap container decoder. Every input is parsed
// twice, with checksums checked (what real files meet) and skipped (to reach
// the bounds checks behind them, as a crafted file would); whatever parses
// is decoded and validated. A file that parses with its checksums must
// re-serialize to exactly its own bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "codecs/internal.h"
#include "fuzz_limits.h"

using namespace primecache;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  const SnapshotLimits limits = fuzz::SmallSnapshotLimits();
  for (auto checksums : {codecs::Checksums::kVerify, codecs::Checksums::kSkip}) {
    Result<EncodedSnapshot> parsed = codecs::ParsePcsnap(bytes, limits, checksums);
    if (!parsed.ok()) continue;
    if (checksums == codecs::Checksums::kVerify) {
      std::string again = SerializePcsnap(*parsed);
      PC_FUZZ_CHECK(again.size() == size && std::memcmp(again.data(), data, size) == 0);
    }
    std::vector<LayerGeometry> plan;
    for (const EncodedLayer& l : parsed->layers) {
      (void)codecs::DecodeLayer(l, limits.codec, checksums);
      plan.push_back(RecurrentShape{1, 1, 2});
    }
    (void)Validate(*parsed, plan);
  }
  return 0;
}

// libFuzzer target: one storage kind's decode (PC_FUZZ_KIND), from a flat
// encoded layer. Parses with checksums checked and skipped; decodes what
// parses into fresh memory and, chunk by chunk, into caller-provided spans;
// a layer that parses with its checksums must re-serialize to its own bytes,
// and whatever decodes must pass CheckSnapshot.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "codecs/internal.h"
#include "fuzz_limits.h"

#ifndef PC_FUZZ_KIND
#error "PC_FUZZ_KIND names the storage kind this target decodes"
#endif

using namespace primecache;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  const CodecLimits limits = fuzz::SmallCodecLimits();
  for (auto checksums : {codecs::Checksums::kVerify, codecs::Checksums::kSkip}) {
    Result<EncodedLayer> parsed = codecs::ParseLayer(bytes, limits, checksums);
    if (!parsed.ok() || parsed->header.kind != PC_FUZZ_KIND) continue;
    if (checksums == codecs::Checksums::kVerify) {
      std::string again = SerializeLayer(*parsed);
      PC_FUZZ_CHECK(again.size() == size && std::memcmp(again.data(), data, size) == 0);
    }
    Result<LayerSnapshot> decoded = codecs::DecodeLayer(*parsed, limits, checksums);
    if (decoded.ok()) PC_FUZZ_CHECK(CheckSnapshot(*decoded).ok());

    Result<LayerDecoder> decoder = LayerDecoder::Create(parsed->header, limits);
    PC_FUZZ_CHECK(decoder.ok());  // ParseLayer ran the same checks
    std::vector<std::vector<float>> planes;
    for (const PlaneLayout& p : decoder->planes()) planes.emplace_back(p.values());
    for (std::size_t i = 0; i < decoder->chunk_count(); ++i) {
      (void)decoder->DecodeChunk(i, AsBytes(parsed->chunks[i]), planes[decoder->chunk(i).plane]);
    }
    (void)Validate(parsed->header, LatentGeometry{8, 8, 4, 8, 64});
  }
  return 0;
}

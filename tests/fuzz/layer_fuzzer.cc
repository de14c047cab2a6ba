// libFuzzer target: one storage kind's decode (PC_FUZZ_KIND), from a flat
// encoded layer. Parses with checksums checked and skipped; decodes what
// parses into fresh memory and, chunk by chunk, into caller-provided spans;
// a layer that parses with its checksums must re-serialize to its own bytes,
// and whatever decodes must pass CheckSnapshot.
// It also decodes chunk by chunk into planes of each plane's own element
// type (f32, f16, bf16, fp8), as the Python client's fetch and the daemon's
// CheckDecodes do: the float paths above refuse every plane that is not f32
// before its transform runs, so without this the bf16, f16 and fp8 planes of
// torch caches (linear-state conv rings, kv-indexed rows and indexer keys,
// any kind's planes in a model's dtype) would never be decoded here. With
// checksums checked, that decode succeeds exactly when CheckDecodes does
// (and whenever DecodeLayer does); an all-f32 layer's bytes are DecodeLayer's
// (for the kinds it decodes: kv-indexed and linear-state have no snapshot,
// so DecodeLayer refuses them whole); and a layer that decodes,
// encoded again raw from those planes, decodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codecs/internal.h"
#include "fuzz_limits.h"

#ifndef PC_FUZZ_KIND
#error "PC_FUZZ_KIND names the storage kind this target decodes"
#endif

using namespace primecache;

namespace {

bool AllF32(const std::vector<PlaneLayout>& planes) {
  for (const PlaneLayout& p : planes) {
    if (p.dtype != ElementType::kF32) return false;
  }
  return true;
}

// Decodes every chunk into `planes` (made here, each of its plane's element
// type and size); false when any chunk is refused, with a message.
bool DecodeTyped(const LayerDecoder& decoder, std::span<const std::string> chunks,
                 std::vector<std::vector<std::byte>>& planes) {
  std::vector<MutableElementSpan> spans;
  planes.reserve(decoder.planes().size());
  for (const PlaneLayout& p : decoder.planes())
    spans.emplace_back(planes.emplace_back(p.raw_bytes()), p.dtype);
  bool ok = chunks.size() == decoder.chunk_count();
  for (std::size_t i = 0; ok && i < decoder.chunk_count(); ++i) {
    const Status st = decoder.DecodeChunk(i, AsBytes(chunks[i]), spans[decoder.chunk(i).plane]);
    if (!st.ok()) PC_FUZZ_CHECK(!st.message().empty());
    ok = st.ok();
  }
  return ok;
}

// The decoded planes encoded again, raw, under the layer's shape: the same
// planes, and they decode to the same bytes.
void RoundTripRaw(const LayerHeader& header, const std::vector<PlaneLayout>& layouts,
                  const std::vector<std::vector<std::byte>>& planes, const CodecLimits& limits) {
  std::vector<ElementSpan> spans;
  for (std::size_t p = 0; p < planes.size(); ++p) spans.emplace_back(planes[p], layouts[p].dtype);
  EncodeOptions eo;
  eo.all_planes = TransformSpec{std::string(kRawTransform), 0};
  Result<LayerEncoder> enc = LayerEncoder::Create(header.shape, std::move(spans), eo);
  PC_FUZZ_CHECK(enc.ok());
  std::vector<std::string> chunks;
  for (std::size_t i = 0; i < enc->chunk_count(); ++i) {
    std::string& c = chunks.emplace_back(enc->MaxChunkBytes(i), '\0');
    Result<std::size_t> n = enc->EncodeChunk(i, std::as_writable_bytes(std::span(c)));
    PC_FUZZ_CHECK(n.ok());
    c.resize(*n);
  }
  Result<LayerHeader> again = enc->Finish();
  PC_FUZZ_CHECK(again.ok());
  Result<LayerDecoder> decoder = LayerDecoder::Create(*again, limits);
  PC_FUZZ_CHECK(decoder.ok());
  PC_FUZZ_CHECK(decoder->planes() == layouts);
  std::vector<std::vector<std::byte>> back;
  PC_FUZZ_CHECK(DecodeTyped(*decoder, chunks, back));
  PC_FUZZ_CHECK(back == planes);
}

}  // namespace

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

    Result<LayerDecoder> typed_decoder = LayerDecoder::Create(parsed->header, limits);
    PC_FUZZ_CHECK(typed_decoder.ok());
    if (checksums == codecs::Checksums::kSkip) LayerDecoderAccess::SkipChecksums(*typed_decoder);
    std::vector<std::vector<std::byte>> typed;
    const bool ok = DecodeTyped(*typed_decoder, parsed->chunks, typed);
    if (checksums == codecs::Checksums::kVerify) {
      Result<LayerShape> checked = CheckDecodes(*parsed, limits);
      PC_FUZZ_CHECK(checked.ok() == ok);
      // DecodeLayer takes all-f32 layers of the kinds with a snapshot
      // (kv-indexed and linear-state have none).
      if (decoded.ok()) PC_FUZZ_CHECK(ok);
      if (ok && AllF32(typed_decoder->planes()) && MakeSnapshot(parsed->header.shape).ok()) {
        PC_FUZZ_CHECK(decoded.ok());
      }
    }
    if (!ok) continue;
    if (decoded.ok()) {
      const auto floats =
          CodecRegistry::Default().FindKind(parsed->header.kind).value()->MutablePlaneData(*decoded);
      PC_FUZZ_CHECK(floats.size() == typed.size());
      for (std::size_t p = 0; p < typed.size(); ++p) {
        PC_FUZZ_CHECK(
            floats[p].size_bytes() == typed[p].size() &&
            (typed[p].empty() || std::memcmp(floats[p].data(), typed[p].data(), typed[p].size()) == 0));
      }
    }
    RoundTripRaw(parsed->header, typed_decoder->planes(), typed, limits);
  }
  return 0;
}

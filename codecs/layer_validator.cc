// The store's validator of encoded layers (CodecLayerValidator in codec.h).
#include <variant>
#include <vector>

#include "primecache/internal/codec.h"
#include "primecache/internal/layer_validator.h"
#include "primecache/internal/shard.h"
#include "primecache/internal/snapshot.h"

namespace primecache {
namespace {

class CodecValidator final : public LayerValidator {
 public:
  Result<LayerFacts> Check(std::string_view header, std::span<const ChunkFacts> chunks,
                           std::uint64_t boundary_tokens) const override {
    // ParseLayerHeader runs every structural check: kind and transforms known
    // exactly, shape valid, planes and chunk table consistent with the shape.
    PC_ASSIGN_OR_RETURN(LayerHeader h, ParseLayerHeader(AsBytes(header)));
    if (h.chunk_count() != chunks.size()) {
      return Status::InvalidArgument("header announces " + std::to_string(h.chunk_count()) + " chunks, " +
                                     std::to_string(chunks.size()) + " arrived");
    }
    LayerFacts facts;
    std::size_t i = 0;
    for (const auto& plane : h.planes) {
      for (const auto& rec : plane.chunks) {
        const ChunkFacts& got = chunks[i];
        if (rec.encoded_bytes != got.size) {
          return Status::InvalidArgument(
              "chunk " + std::to_string(i) + " (" + std::string(PlaneName(plane.id)) + ") has " +
              std::to_string(got.size) + " bytes; the header says " + std::to_string(rec.encoded_bytes));
        }
        if (rec.encoded_checksum != got.checksum) {
          return Status::InvalidArgument("chunk " + std::to_string(i) + " (" +
                                         std::string(PlaneName(plane.id)) +
                                         ") does not match the header's checksum");
        }
        facts.raw_bytes += rec.raw_bytes;
        ++i;
      }
    }
    // Planes with one row per token must be this boundary's.
    std::uint64_t rows = 0;
    if (const auto* l = std::get_if<LatentShape>(&h.shape)) rows = l->len;
    if (const auto* k = std::get_if<KvShape>(&h.shape)) rows = k->len;
    if (rows != 0 && rows != boundary_tokens) {
      return Status::InvalidArgument("a " + h.kind + " layer of " + std::to_string(rows) +
                                     " tokens in a boundary of " + std::to_string(boundary_tokens));
    }
    return facts;
  }

  Status CheckModel(std::string_view model_descriptor, std::span<const std::string_view> headers,
                    std::uint32_t ranks) const override {
    if (model_descriptor.empty() && ranks <= 1) return Status::Ok();
    std::vector<LayerShape> shapes;
    shapes.reserve(headers.size());
    for (std::string_view header : headers) {
      PC_ASSIGN_OR_RETURN(LayerHeader h, ParseLayerHeader(AsBytes(header)));
      shapes.push_back(h.shape);
    }
    // A TP entry's shards gather into the model's layers (checked with or
    // without a descriptor); the plan is the whole model's.
    if (ranks > 1) {
      PC_ASSIGN_OR_RETURN(shapes, GatherShapes(shapes, ranks));
    }
    if (model_descriptor.empty()) return Status::Ok();
    PC_ASSIGN_OR_RETURN(ModelFingerprint fingerprint, DecodeFingerprint(model_descriptor));
    return CheckPlan(fingerprint, shapes);
  }
};

}  // namespace

std::shared_ptr<const LayerValidator> CodecLayerValidator() {
  static const auto validator = std::make_shared<const CodecValidator>();
  return validator;
}

}  // namespace primecache

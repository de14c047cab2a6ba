// The seam between a store and the format of what it stores: a store keeps
// layers as opaque headers and chunks, and asks a LayerValidator at commit
// whether one layer's header and the chunks that arrived for it agree.
//
// The store depends on this interface only; the codecs library implements it
// for its encoded layers (CodecLayerValidator() in primecache/internal/codec.h), and a
// tool or test may pass another. Header-only: no library to link.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "primecache/status.h"

namespace primecache {

// What the validator learned about one layer.
struct LayerFacts {
  std::uint64_t raw_bytes = 0;  // decoded bytes of the layer (for Stat)
};

// The size and XXH3-64 (seed 0) of one chunk as received.
struct ChunkFacts {
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
};

// Checks one layer as it ends: the header parses, its chunk table agrees with
// the chunks received, and it describes this boundary; then, at commit, all
// of them against the model they are filed under. Anything it refuses
// fails the publish (fail closed). Implementations are immutable and safe to
// call from many threads.
class LayerValidator {
 public:
  virtual ~LayerValidator() = default;
  virtual Result<LayerFacts> Check(std::string_view header, std::span<const ChunkFacts> chunks,
                                   std::uint64_t boundary_tokens) const = 0;
  // Checks every layer of an entry, each passed by Check already, against
  // the model the entry is filed under: `model_descriptor` is the publish's
  // (PublishRequest::model_descriptor), `headers` the layers' in order. An
  // empty descriptor names no model to check against. `ranks` > 1: the
  // entry of a group publish, its layers in PublishGroup's order, whose
  // shards must agree with one another and gather into the model's layers.
  virtual Status CheckModel(std::string_view model_descriptor, std::span<const std::string_view> headers,
                            std::uint32_t ranks) const = 0;
};

}  // namespace primecache

// Internal entry points of primecache_codecs shared between its files, the
// fuzzers and the tests. Not a public API.
//
// Checksums::kSkip exists for fuzzing only: checksums stop random damage, not
// a crafted input, so the fuzzers turn them off to reach the bounds checks
// behind them. Nothing else may pass it.
#pragma once

#include <cstddef>
#include <span>

#include "primecache/internal/codec.h"
#include "primecache/internal/snapshot_file.h"

namespace primecache {

struct LayerDecoderAccess {
  static void SkipChecksums(LayerDecoder& d) { d.verify_checksums_ = false; }
};

namespace codecs {

enum class Checksums { kVerify, kSkip };

// Parses one serialized layer header at the start of bytes; *consumed gets
// its length. ParseLayerHeader is this plus "nothing after it".
Result<LayerHeader> ParseLayerHeaderPrefix(std::span<const std::byte> bytes, const CodecLimits& limits,
                                           Checksums checksums, std::size_t* consumed);
Result<EncodedLayer> ParseLayer(std::span<const std::byte> bytes, const CodecLimits& limits,
                                Checksums checksums);
Result<LayerSnapshot> DecodeLayer(const EncodedLayer& layer, const CodecLimits& limits, Checksums checksums);
Result<EncodedSnapshot> ParsePcsnap(std::span<const std::byte> bytes, const SnapshotLimits& limits,
                                    Checksums checksums);

// Turns InvalidArgument (what a check of in-memory values returns) into
// Corruption (what the same disagreement is when it was read from bytes).
Status AsCorruption(Status s);

}  // namespace codecs
}  // namespace primecache

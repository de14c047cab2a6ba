// An entry as the remote tier keeps it: the boundary's identity (the fields
// of a local PublishRequest) and, per layer, its header and the content
// addresses of its chunks, which live in the cluster as values of their own.
// docs/cluster.md gives the encoding.
//
// DecodeManifest reads bytes that came from the network: every count and
// length is bounded before use, the trailing checksum must match, and
// anything wrong is kCorruption naming the field. Plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/statestore.h"

namespace primecache::remote {

struct ChunkRef {
  std::uint64_t size = 0;
  Hash128 address;  // Checksum128 of the chunk's bytes
  friend bool operator==(const ChunkRef&, const ChunkRef&) = default;
};

struct ManifestLayer {
  std::string header;  // the layer's serialized header, as the codecs wrote it
  std::vector<ChunkRef> chunks;
};

struct Manifest {
  PublishRequest entry;  // model, name, descriptor, namespace, tokens, cost
  std::vector<ManifestLayer> layers;
};

// Bounds on what a decoded manifest may hold.
inline constexpr std::uint64_t kMaxManifestTokens = 1ull << 22;
inline constexpr std::uint32_t kMaxManifestLayers = 4096;
inline constexpr std::uint32_t kMaxLayerChunks = 1u << 20;
inline constexpr std::uint32_t kMaxLayerHeaderBytes = 1u << 20;
inline constexpr std::uint64_t kMaxChunkBytes = 1ull << 30;

// The manifest of an entry stored locally as `layers`.
Manifest ManifestOf(PublishRequest entry, const std::vector<LayerBytes>& layers);

// What a chunk value read back from the cluster is against its reference.
enum class ChunkCheck { kOk, kMissing, kWrongSize, kWrongAddress };
ChunkCheck CheckChunk(const ChunkRef& ref, const std::optional<std::string>& value);
// The check's result in words, for reports ("missing (evicted)", ...).
std::string ChunkCheckText(ChunkCheck check, const ChunkRef& ref, const std::optional<std::string>& value);
std::string EncodeManifest(const Manifest& m);
Result<Manifest> DecodeManifest(std::string_view bytes);

}  // namespace primecache::remote

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
#include "primecache/internal/manifest.h"
#include "primecache/internal/store.h"

namespace primecache::remote {

// The layers by reference (primecache/internal/manifest.h), with the entry's identity.
struct RemoteManifest : Manifest {
  PublishRequest entry;  // model, name, descriptor, namespace, tokens, cost
};

// Bounds on what a decoded manifest may hold, besides the StoreLimits
// (primecache/internal/store.h) on its names, descriptor, tokens and chunk sizes.
inline constexpr std::uint32_t kMaxManifestLayers = 4096;
inline constexpr std::uint32_t kMaxLayerChunks = 1u << 20;
inline constexpr std::uint32_t kMaxLayerHeaderBytes = 1u << 20;

// The manifest of an entry stored locally as `layers`. A tensor-parallel
// entry (its EntryRanks() above 1: a group part's request, or a whole
// entry's) keeps its rank count and no group: it is brought back as a
// whole entry.
RemoteManifest ManifestOf(PublishRequest entry, const std::vector<LayerBytes>& layers);

// What a chunk value read back from the cluster is against its reference.
enum class ChunkCheck { kOk, kMissing, kWrongSize, kWrongAddress };
ChunkCheck CheckChunk(const ChunkRef& ref, const std::optional<std::string>& value);
// The check's result in words, for reports ("missing (evicted)", ...).
std::string ChunkCheckText(ChunkCheck check, const ChunkRef& ref, const std::optional<std::string>& value);
std::string EncodeManifest(const RemoteManifest& m);
Result<RemoteManifest> DecodeManifest(std::string_view bytes);

}  // namespace primecache::remote

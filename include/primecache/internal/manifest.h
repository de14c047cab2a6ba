// An entry's layers by reference: each layer's serialized header and its
// chunks' content addresses, in the header's chunk order. The local store
// keeps one per entry (statestore/format.h, docs/format-store.md) and the
// remote tier one per remote entry (remote/manifest.h, docs/cluster.md), each
// in an encoding of its own; both decoders bound every count and length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "primecache/checksum.h"

namespace primecache {

struct ChunkRef {
  Hash128 address;  // Checksum128 of the chunk's bytes
  std::uint64_t size = 0;
  friend bool operator==(const ChunkRef&, const ChunkRef&) = default;
};

struct ManifestLayer {
  std::string header;  // the layer's serialized header, as the codecs wrote it
  std::vector<ChunkRef> chunks;
};

struct Manifest {
  std::vector<ManifestLayer> layers;
};

}  // namespace primecache

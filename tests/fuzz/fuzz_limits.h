// Limits the codecs fuzzers decode under: small enough that no input can
// make a target allocate more than a few MiB, large enough for every seed.
#pragma once

#include "primecache/internal/snapshot_file.h"

namespace primecache::fuzz {

inline CodecLimits SmallCodecLimits() {
  CodecLimits l;
  l.max_tokens = 1 << 16;
  l.max_row_values = 1 << 12;
  l.max_layer_bytes = 8 << 20;
  l.max_chunk_bytes = 1 << 20;
  l.max_chunks = 4096;
  return l;
}

inline SnapshotLimits SmallSnapshotLimits() {
  SnapshotLimits l;
  l.codec = SmallCodecLimits();
  l.max_layers = 64;
  l.max_file_bytes = 1 << 20;
  l.max_string_bytes = 256;
  l.max_codec_versions = 32;
  return l;
}

// Aborts the run (a finding) when a property that must hold does not.
#define PC_FUZZ_CHECK(cond)        \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

}  // namespace primecache::fuzz

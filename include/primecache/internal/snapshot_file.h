// The snapshot of one prime boundary, encoded, and its single-file container
// (.pcsnap) for export, import and tests.
//
// A .pcsnap holds the boundary header (model fingerprint, namespace, exact
// tokens, boundary length) and one section per layer, in layer order, each
// section a flat encoded layer (SerializeLayer). Every byte of the file is
// covered by a checksum (preamble, header, section table, each section), and
// nothing may lie between or after the sections, so any flipped bit, cut or
// splice is refused. Byte by byte: docs/format-snapshot.md.
//
// Thread-safety: the functions are pure apart from the Env they are given
// (which is itself thread-safe); the types are plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "primecache/internal/codec.h"
#include "primecache/internal/env.h"
#include "primecache/internal/snapshot.h"
#include "primecache/status.h"

namespace primecache {

// One prime boundary, encoded: the header and one encoded layer per model layer.
struct EncodedSnapshot {
  BoundaryHeader header;
  std::vector<EncodedLayer> layers;
};

struct SnapshotLimits {
  CodecLimits codec;  // per layer; max_tokens also bounds the header's tokens
  std::uint64_t max_layers = 4096;
  std::uint64_t max_file_bytes = 1ull << 40;
  std::uint64_t max_string_bytes = 4096;  // architecture, namespace, each codec version
  std::uint64_t max_codec_versions = 256;
};

// Encodes every layer (EncodeLayer) after checking the boundary: CheckBoundary,
// CheckSnapshot of every layer, and the default SnapshotLimits (strings,
// tokens, layers), so that what is written reads back under the defaults.
Result<EncodedSnapshot> EncodeSnapshot(const BoundarySnapshot& snapshot, const EncodeOptions& options = {});

// Decodes every layer and checks the boundary (CheckBoundary) as above.
// `progress`, when given, is told (layers decoded, layers) after each layer.
Result<BoundarySnapshot> DecodeSnapshot(
    const EncodedSnapshot& snapshot, const CodecLimits& limits = {},
    const std::function<void(std::size_t done, std::size_t total)>& progress = nullptr);

// Before any decoding: CheckBoundary, CheckHeader of every layer, one target
// per layer, and Validate(layer header, target) for each. Valid only when
// every layer is; the message names every failing layer.
Status Validate(const EncodedSnapshot& snapshot, std::span<const LayerGeometry> targets);

// The .pcsnap bytes of a snapshot.
std::string SerializePcsnap(const EncodedSnapshot& snapshot);

// Parses .pcsnap bytes: checks magic, version, every checksum, the section
// table (contiguous, in bounds, no overlap, nothing after the last section),
// the boundary header and every layer (ParseLayer), and CheckBoundary.
Result<EncodedSnapshot> ParsePcsnap(std::span<const std::byte> bytes, const SnapshotLimits& limits = {});

// Writes atomically through env: after a crash `path` holds the old file or
// the whole new one, never a torn mix. Refuses a header past the default
// SnapshotLimits (it would not read back).
Status WritePcsnap(Env* env, const std::string& path, const EncodedSnapshot& snapshot);

// Reads and parses a .pcsnap through env; refuses a file over max_file_bytes
// before reading it.
Result<EncodedSnapshot> ReadPcsnap(Env* env, const std::string& path, const SnapshotLimits& limits = {});

}  // namespace primecache

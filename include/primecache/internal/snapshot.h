// Decoded cache-state snapshots: what an engine captures at a prime boundary
// and what it restores from, one snapshot per model layer.
//
// The reference engine's three layer kinds have snapshots (docs/codecs.md):
//  - LatentSnapshot: an MLA layer's latent rows, plus, for a layer with a
//    DSA k-pool indexer, the incomplete index tail and the final pool keys;
//  - RecurrentSnapshot: a KDA layer's conv ring and recurrent state;
//  - KvSnapshot: a standard attention layer's K and V rows.
// The kinds PyTorch engines need besides (linear-state/v1, kv-indexed/v1)
// have shapes and geometries but no snapshot: their planes are encoded from
// and decoded into the caller's memory.
// Each has a Shape (its metadata without the data) that says how many floats
// every plane holds, and a target Geometry (what a cache's state plan fixes)
// to validate a snapshot against before the first byte is restored.
//
// The types are plain values (no sharing, no synchronisation). The checking
// functions are pure and safe to call from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/internal/layer_shape.h"
#include "primecache/status.h"

namespace primecache {

// ---- Shapes: the metadata of a snapshot, without its planes -----------------
// LatentShape, RecurrentShape, KvFormat, KvShape and LayerShape are declared in
// layer_shape.h (shared with the engine's state plan).

// The storage kind of a format, or "" for a format that names none (bits
// other than 0, 2, 4).
std::string_view KvKindOf(const KvFormat& format);

// Checks a shape's own invariants (above) and that no plane's byte count
// overflows 64 bits. The message names every field that disagrees.
Status CheckShape(const LayerShape& shape);

// ---- Snapshots: shapes with their planes --------------------------------------

// Snapshots hold f32 planes (the reference engine's type): a shape whose
// planes are of another ElementType, or of a kind without a snapshot, has
// none (MakeSnapshot refuses it); such layers are encoded from and decoded
// into the caller's memory (LayerEncoder, LayerDecoder::DecodeInto).
//
// The latent-plane snapshot of one MLA layer: its shape, and the planes,
// row-major f32:
//   latent_rows      [len * width]                 rows [0, len)
//   index_tail_rows  [tail_rows() * index_width]   rows [pools_ready * pool, len), logical token order
//   pool_keys        [pools_ready * index_width/2] key p at p * index_head_dim
struct LatentSnapshot {
  LatentShape shape;
  std::vector<float> latent_rows;
  std::vector<float> index_tail_rows;
  std::vector<float> pool_keys;
};

// The state of one KDA layer:
//   conv_ring [3 * heads * head_dim, kernel - 1]  the last kernel-1 pre-conv inputs of q, k, v
//   state     [heads, head_dim, head_dim]          row i = key dim, column j = value dim
struct RecurrentSnapshot {
  RecurrentShape shape;
  std::vector<float> conv_ring;
  std::vector<float> state;
};

// The K and V rows of an attention layer: k_rows [held_rows() * k_width],
// v_rows [held_rows() * v_width], row-major by token. A rotating layer's
// planes hold its held rows, oldest first.
struct KvSnapshot {
  KvShape shape;
  std::vector<float> k_rows = {};
  std::vector<float> v_rows = {};
};

using LayerSnapshot = std::variant<LatentSnapshot, RecurrentSnapshot, KvSnapshot>;

LayerShape ShapeOf(const LayerSnapshot& layer);

// A snapshot of this shape with every plane allocated (zero-filled).
// Requires CheckShape(shape) to pass, a kind with a snapshot and every plane
// f32; returns the error otherwise.
Result<LayerSnapshot> MakeSnapshot(const LayerShape& shape);

// CheckShape plus: every plane holds exactly the floats the shape says; one
// overload a kind, so a caller holding one kind's snapshot need not copy it
// into a LayerSnapshot.
Status CheckSnapshot(const LatentSnapshot& layer);
Status CheckSnapshot(const RecurrentSnapshot& layer);
Status CheckSnapshot(const KvSnapshot& layer);
Status CheckSnapshot(const LayerSnapshot& layer);

// ---- Target geometry: what a cache's state plan fixes -------------------------

// A latent layer of a fresh cache. index_ring_rows is the effective ring size
// of its index plane (a multiple of pool), 0 for a flat plane. A snapshot's
// tail rows are in logical order, so a ring snapshot restores into a flat
// plane and the other way round; the tail only has to fit the ring.
struct LatentGeometry {
  std::uint32_t width = 0;
  std::uint32_t index_width = 0;
  std::uint32_t pool = 0;
  std::uint64_t index_ring_rows = 0;
  std::uint64_t max_ctx = 0;                    // the cache's capacity in tokens
  ElementType dtype = ElementType::kF32;        // latent rows
  ElementType index_dtype = ElementType::kF32;  // index tail rows and pool keys
  friend bool operator==(const LatentGeometry&, const LatentGeometry&) = default;
};

struct KvGeometry {
  std::uint32_t k_width = 0;
  std::uint32_t v_width = 0;
  std::uint64_t max_ctx = 0;
  KvFormat format = {};  // the kind, window, TurboQuant bits, head_dim, sign digest, index width
  ElementType dtype = ElementType::kF32;
  ElementType index_dtype = ElementType::kF32;  // kv-indexed only
  friend bool operator==(const KvGeometry&, const KvGeometry&) = default;
};

// One alternative per LayerShape alternative, in the same order. A recurrent
// or linear-state layer's state has no length: its shape is all a cache
// fixes, so its geometry is its shape (one type, RecurrentShape or
// LinearStateShape).
using LayerGeometry = std::variant<LatentGeometry, RecurrentShape, KvGeometry, LinearStateShape>;

// Checks that a layer of this shape can be restored into a cache layer of this
// geometry: same kind, same widths and pool, same element types, len within capacity, tail within
// the ring, and the shape's own invariants. Returns InvalidArgument whose
// message lists every disagreement ("width 576 != plan 512; len 9000 > max_ctx 8192").
Status Validate(const LayerShape& shape, const LayerGeometry& target);
// The same, plus CheckSnapshot (the planes hold what the shape says).
Status Validate(const LayerSnapshot& layer, const LayerGeometry& target);

// A stable 128-bit digest of a state plan's per-layer geometries, in layer
// order (for ModelFingerprint::plan_digest). Independent of host and build.
Hash128 GeometryDigest(std::span<const LayerGeometry> layers);

// The plan a layer of this shape belongs to: its geometry without a capacity
// or a ring size (max_ctx 0, index_ring_rows 0), since a snapshot restores
// into caches of any capacity that hold it.
LayerGeometry PlanGeometryOf(const LayerShape& shape);
// GeometryDigest of the shapes' plan geometries, in layer order: what a
// fingerprint's plan_digest is for the model whose layers have these shapes.
Hash128 PlanDigest(std::span<const LayerShape> shapes);

// The storage kinds a model of this plan is stored as, sorted, each once:
// its fingerprint's codec_versions ("kv-plain/v1", "mla-latent/v1", ...).
// Only the kinds it uses, so that a kind added to the registry changes no
// other model's fingerprint; transforms are not in it, since every plane's
// header names its transform exactly.
std::vector<std::string> CodecVersionsOf(std::span<const LayerGeometry> plan);

// ---- The boundary snapshot ------------------------------------------------------

// Which model produced a snapshot. Two snapshots are interchangeable only when
// their fingerprints are equal.
struct ModelFingerprint {
  std::string architecture;                 // e.g. "hrm-tiny"
  Hash128 plan_digest;                      // GeometryDigest of the state plan
  Hash128 weights_digest;                   // of the weights file(s)
  std::vector<std::string> codec_versions;  // the kinds in use (CodecVersionsOf), e.g. "mla-latent/v1"

  // Checksum128 over a canonical, length-prefixed encoding of every field:
  // stable across hosts, builds and runs.
  Hash128 Digest() const;
  friend bool operator==(const ModelFingerprint&, const ModelFingerprint&) = default;
};

// The canonical encoding Digest() hashes: Digest() == Checksum128 of these
// bytes. A store keeps them beside its entries (the "model descriptor"), so
// that an entry can be exported with its whole fingerprint and anyone can
// check the descriptor against the digest it is filed under.
std::string EncodeFingerprint(const ModelFingerprint& fingerprint);
// Parses EncodeFingerprint's bytes, refusing anything else: a wrong tag,
// strings over max_string_bytes, more than max_codec_versions versions,
// truncation, trailing bytes.
Result<ModelFingerprint> DecodeFingerprint(std::string_view bytes, std::uint64_t max_string_bytes = 4096,
                                           std::uint64_t max_codec_versions = 256);

// What identifies one prime boundary. tokens are the exact token ids (BOS
// included) and boundary_len == tokens.size() (checked).
struct BoundaryHeader {
  ModelFingerprint fingerprint;
  std::string ns;  // namespace
  std::vector<std::uint32_t> tokens;
  std::uint64_t boundary_len = 0;
  friend bool operator==(const BoundaryHeader&, const BoundaryHeader&) = default;
};

// One prime boundary, decoded: one layer per model layer, in layer order.
struct BoundarySnapshot {
  BoundaryHeader header;
  std::vector<LayerSnapshot> layers;
};

// Checks that layers of these shapes, in layer order, are the plan of the
// model `fingerprint` names: PlanDigest(shapes) == fingerprint.plan_digest.
// The message names the model and both digests.
Status CheckPlan(const ModelFingerprint& fingerprint, std::span<const LayerShape> shapes);

// Checks boundary_len == tokens.size() and that every layer whose length is
// per token (latent, KV) has len == boundary_len; shapes[i] is layer i's.
Status CheckBoundary(const BoundaryHeader& header, std::span<const LayerShape> shapes);

// A whole snapshot is valid only if every layer is: CheckBoundary, one target
// per layer, and Validate(layer i, target i) for each. The message names every
// failing layer ("layer 3: ...; layer 7: ...").
Status Validate(const BoundarySnapshot& snapshot, std::span<const LayerGeometry> targets);

}  // namespace primecache

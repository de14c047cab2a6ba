// The geometry of one model layer's cache state, declared once for every
// layer that carries it: the codecs (snapshot.h: what a snapshot holds, what
// a cache can take) and the engine (state_plan.h: what a session reserves).
//
//  - LatentShape: an MLA layer's latent rows and its DSA k-pool index state;
//  - RecurrentShape: a KDA layer's conv ring and recurrent state (also the
//    geometry a cache fixes, RecurrentGeometry, and the engine's
//    RecurrentPlan: a recurrent layer's state has no length);
//  - KvFormat and KvShape: an attention layer's K and V rows.
//
// Plain values with inline arithmetic only; library primecache_shape (header
// only, no dependencies). Checking them is the codecs' (CheckShape).
#pragma once

#include <cstdint>
#include <variant>

namespace primecache {

// An MLA latent plane at a boundary. Invariants (CheckShape): len >= 1,
// width >= 1; with an indexer (index_width > 0): index_width even, pool >= 1,
// pools_ready == len / pool, and a ring (index_is_ring) whose effective size
// index_ring_rows is a positive multiple of pool; without one, pool,
// pools_ready, index_is_ring and index_ring_rows are all zero.
struct LatentShape {
  std::uint64_t len = 0;              // tokens; one latent row per token
  std::uint32_t width = 0;            // kv_rank + rope_dim floats per latent row
  std::uint32_t index_width = 0;      // 2 * index_head_dim floats per index row; 0: no indexer
  std::uint32_t pool = 0;             // tokens per k-pool; 0 without an indexer
  std::uint64_t pools_ready = 0;      // pools [0, pools_ready) hold final keys
  bool index_is_ring = false;         // the source index plane was a tail ring
  std::uint64_t index_ring_rows = 0;  // its effective size (multiple of pool); 0 when flat

  std::uint32_t index_head_dim() const { return index_width / 2; }
  // Index rows not yet folded into a pool key: [pools_ready * pool, len);
  // none without an indexer.
  std::uint64_t tail_rows() const { return index_width == 0 ? 0 : len - pools_ready * pool; }
  // Floats per plane; meaningful once CheckShape passed (no overflow then).
  std::uint64_t latent_values() const { return len * width; }
  std::uint64_t tail_values() const { return tail_rows() * index_width; }
  std::uint64_t pool_key_values() const { return pools_ready * index_head_dim(); }
  friend bool operator==(const LatentShape&, const LatentShape&) = default;
};

// A KDA layer's state: a snapshot's shape, the geometry a cache fixes and
// the engine's plan of the layer at once (it has no length). Invariants:
// heads, head_dim >= 1 and kernel >= 2 (a kernel of 1 would have no conv
// ring).
struct RecurrentShape {
  std::uint32_t heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t kernel = 0;  // short-conv kernel; the ring keeps kernel - 1 inputs

  std::uint64_t conv_channels() const { return 3ull * heads * head_dim; }  // q, k and v planes
  std::uint64_t conv_values() const { return conv_channels() * (kernel - 1); }
  std::uint64_t state_values() const { return std::uint64_t{heads} * head_dim * head_dim; }
  friend bool operator==(const RecurrentShape&, const RecurrentShape&) = default;
};

// How an attention layer stores its K and V rows; each combination is its
// own storage kind (KvKindOf):
//  - window 0: plain KV, every position's row, append-only ("kv-plain/v1");
//    window W: a rotating buffer of the last W positions' rows
//    ("kv-rotating/v1");
//  - quant_bits 0: f32 rows; 2 or 4: TurboQuant rows, a wrapper around the
//    plain or rotating kind ("turboquant4/v1(kv-rotating/v1)"). A TurboQuant
//    row is kv_heads entries of 1 + head_dim*bits/32 32-bit words (the norm
//    as f32, then the packed codes); the planes carry those words as they
//    are (the "floats" of such a plane are opaque 4-byte words: they are
//    copied, never decoded, rotated or requantized). head_dim and the digest
//    of the rotation's sign vector (XXH3-64 of its f32 bytes) are part of the
//    kind's geometry: rows encoded with other signs decode to other values.
struct KvFormat {
  std::uint32_t window = 0;
  std::uint32_t quant_bits = 0;
  std::uint32_t head_dim = 0;         // TurboQuant only (0 otherwise)
  std::uint64_t signs_digest = 0;     // TurboQuant only (0 otherwise)
  bool rotating() const { return window != 0; }
  bool quantized() const { return quant_bits != 0; }
  friend bool operator==(const KvFormat&, const KvFormat&) = default;
};

// An attention layer's K and V rows. Invariants: len, k_width, v_width >= 1
// (widths in 4-byte words: floats, or TurboQuant words, a whole number of
// entries); plain: rows 0 (every position [0, len) is held); rotating: the
// held rows are positions [len - rows, len) with rows <= min(len, window)
// and rows >= min(len, window) - 1 (a trim of one row after a wrap; see
// docs/engine.md), rows >= 1.
struct KvShape {
  std::uint64_t len = 0;
  std::uint32_t k_width = 0;
  std::uint32_t v_width = 0;
  KvFormat format = {};
  std::uint64_t rows = 0;  // rotating only: rows held

  std::uint64_t held_rows() const { return format.rotating() ? rows : len; }
  std::uint64_t k_values() const { return held_rows() * k_width; }
  std::uint64_t v_values() const { return held_rows() * v_width; }
  friend bool operator==(const KvShape&, const KvShape&) = default;
};

using LayerShape = std::variant<LatentShape, RecurrentShape, KvShape>;

}  // namespace primecache

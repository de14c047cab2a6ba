// The geometry of one model layer's cache state, declared once for every
// layer that carries it: the codecs (snapshot.h: what a snapshot holds, what
// a cache can take) and the engine (state_plan.h: what a session reserves).
//
//  - LatentShape: an MLA layer's latent rows and its DSA k-pool index state;
//  - RecurrentShape: a KDA layer's conv ring and recurrent state; a
//    recurrent layer's state has no length, so this one type is also the
//    geometry a cache fixes and the engine's plan of the layer;
//  - KvFormat and KvShape: an attention layer's K and V rows (and a DSA
//    layer's indexer keys beside them);
//  - LinearStateShape: a linear-attention layer's state as a PyTorch engine
//    keeps it (any conv width, state heads of their own key and value
//    dims), which the reference engine does not produce;
//  - ElementType: what one value of a plane is (f32 unless the engine keeps
//    its cache in bf16, f16 or fp8).
//
// Plain values with inline arithmetic only; library primecache_shape (header
// only, no dependencies). Checking them is the codecs' (CheckShape).
#pragma once

#include <cstdint>
#include <variant>

namespace primecache {

// The type of one value of a plane, as the engine keeps it. A plane is
// stored as its bytes: nothing is ever widened or narrowed, and a layer
// restores only into a cache whose planes have the same types (Validate).
// f32 is the default everywhere and what the reference engine computes in.
enum class ElementType : std::uint8_t {
  kF32 = 0,
  kBf16 = 1,
  kF16 = 2,
  kF8E4M3 = 3,  // OCP fp8 e4m3 (torch.float8_e4m3fn)
};
inline constexpr ElementType kLastElementType = ElementType::kF8E4M3;

// Whether a code read from outside (a header field, a caller's value) names
// an ElementType.
constexpr bool IsElementType(std::uint64_t code) {
  return code <= static_cast<std::uint64_t>(kLastElementType);
}

constexpr std::uint32_t ElementBytes(ElementType t) {
  switch (t) {
    case ElementType::kF32:
      return 4;
    case ElementType::kBf16:
    case ElementType::kF16:
      return 2;
    case ElementType::kF8E4M3:
      return 1;
  }
  return 4;
}

// "f32", "bf16", "f16", "f8e4m3"; "?" for a value outside the enum.
constexpr const char* ElementTypeName(ElementType t) {
  switch (t) {
    case ElementType::kF32:
      return "f32";
    case ElementType::kBf16:
      return "bf16";
    case ElementType::kF16:
      return "f16";
    case ElementType::kF8E4M3:
      return "f8e4m3";
  }
  return "?";
}

// An MLA latent plane at a boundary. Invariants (CheckShape): len >= 1,
// width >= 1; with an indexer (index_width > 0): index_width even, pool >= 1,
// pools_ready == len / pool, and a ring (index_is_ring) whose effective size
// index_ring_rows is a positive multiple of pool; without one, pool,
// pools_ready, index_is_ring and index_ring_rows are all zero.
struct LatentShape {
  std::uint64_t len = 0;              // tokens; one latent row per token
  std::uint32_t width = 0;            // kv_rank + rope_dim values per latent row
  std::uint32_t index_width = 0;      // 2 * index_head_dim values per index row; 0: no indexer
  std::uint32_t pool = 0;             // tokens per k-pool; 0 without an indexer
  std::uint64_t pools_ready = 0;      // pools [0, pools_ready) hold final keys
  bool index_is_ring = false;         // the source index plane was a tail ring
  std::uint64_t index_ring_rows = 0;  // its effective size (multiple of pool); 0 when flat
  ElementType dtype = ElementType::kF32;        // latent rows
  ElementType index_dtype = ElementType::kF32;  // index tail rows and pool keys

  std::uint32_t index_head_dim() const { return index_width / 2; }
  // Index rows not yet folded into a pool key: [pools_ready * pool, len);
  // none without an indexer.
  std::uint64_t tail_rows() const { return index_width == 0 ? 0 : len - pools_ready * pool; }
  // Values per plane; meaningful once CheckShape passed (no overflow then).
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
  ElementType conv_dtype = ElementType::kF32;
  ElementType state_dtype = ElementType::kF32;

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
//    kind's geometry: rows encoded with other signs decode to other values;
//  - index_width D > 0: a DSA layer's rows ("kv-indexed/v1"), plain and
//    unquantized, with a third append-only plane of D values per token, the
//    indexer's keys (transformers' DynamicIndexedLayer).
struct KvFormat {
  std::uint32_t window = 0;
  std::uint32_t quant_bits = 0;
  std::uint32_t head_dim = 0;         // TurboQuant only (0 otherwise)
  std::uint64_t signs_digest = 0;     // TurboQuant only (0 otherwise)
  std::uint32_t index_width = 0;      // kv-indexed only: values per indexer key row
  bool rotating() const { return window != 0; }
  bool quantized() const { return quant_bits != 0; }
  bool indexed() const { return index_width != 0; }
  friend bool operator==(const KvFormat&, const KvFormat&) = default;
};

// An attention layer's K and V rows. Invariants: len, k_width, v_width >= 1
// (widths in values of dtype, or in TurboQuant's 4-byte words, a whole
// number of entries, with dtype f32); plain: rows 0 (every position [0, len) is held); rotating: the
// held rows are positions [len - rows, len) with rows <= min(len, window)
// and rows >= min(len, window) - 1 (a trim of one row after a wrap; see
// docs/engine.md), rows >= 1.
struct KvShape {
  std::uint64_t len = 0;
  std::uint32_t k_width = 0;
  std::uint32_t v_width = 0;
  KvFormat format = {};
  std::uint64_t rows = 0;                 // rotating only: rows held
  ElementType dtype = ElementType::kF32;  // K and V rows; f32 words when TurboQuant
  ElementType index_dtype = ElementType::kF32;  // indexer keys (kv-indexed only)

  std::uint64_t held_rows() const { return format.rotating() ? rows : len; }
  std::uint64_t k_values() const { return held_rows() * k_width; }
  std::uint64_t v_values() const { return held_rows() * v_width; }
  std::uint64_t index_values() const { return len * format.index_width; }
  friend bool operator==(const KvShape&, const KvShape&) = default;
};

// A linear-attention layer's state as PyTorch engines keep it (transformers'
// LinearAttentionLayer: gated DeltaNet, KDA, Mamba-style layers): the short
// convolution's last inputs, conv_channels rows of conv_width values (one
// row per channel, as torch's [channels, width] conv state lies), and the
// recurrent state, state_heads matrices of state_k_dim rows by state_v_dim
// values. Like RecurrentShape it has no length, and it is its own geometry.
// Invariants: every dimension >= 1.
struct LinearStateShape {
  std::uint32_t conv_channels = 0;
  std::uint32_t conv_width = 0;
  std::uint32_t state_heads = 0;
  std::uint32_t state_k_dim = 0;
  std::uint32_t state_v_dim = 0;
  ElementType conv_dtype = ElementType::kF32;
  ElementType state_dtype = ElementType::kF32;

  std::uint64_t conv_values() const { return std::uint64_t{conv_channels} * conv_width; }
  std::uint64_t state_rows() const { return std::uint64_t{state_heads} * state_k_dim; }
  std::uint64_t state_values() const { return state_rows() * state_v_dim; }
  friend bool operator==(const LinearStateShape&, const LinearStateShape&) = default;
};

// The alternatives' order is part of the stored geometry digest (its index
// is hashed): new kinds are appended.
using LayerShape = std::variant<LatentShape, RecurrentShape, KvShape, LinearStateShape>;

}  // namespace primecache

// Shared helpers of the codecs tests: deterministic synthetic snapshots that
// look like real planes (smooth rows with small noise), bit-exact
// comparison, and byte surgery on serialized forms.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/snapshot.h"
#include "primecache/internal/snapshot_file.h"

namespace primecache::testing_util {

// splitmix64: a tiny deterministic generator.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Uniform() { return static_cast<float>(Next() >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f; }

 private:
  std::uint64_t s_;
};

// Row t, channel c of a smooth plane: a few low-frequency waves plus noise,
// depending on the absolute row only (so a longer plane extends a shorter one).
inline float Smooth(std::uint64_t seed, std::uint64_t t, std::uint64_t c) {
  Rng r(seed * 1000003u + t * 7919u + c);
  const double x = static_cast<double>(t), y = static_cast<double>(c);
  double v =
      std::sin(0.013 * x + 0.37 * y) + 0.5 * std::cos(0.0021 * x * (1 + y / 97.0)) + 0.05 * r.Uniform();
  return static_cast<float>(v);
}

inline std::vector<float> SmoothPlane(std::uint64_t seed, std::uint64_t first_row, std::uint64_t rows,
                                      std::uint64_t width) {
  std::vector<float> out(rows * width);
  for (std::uint64_t t = 0; t < rows; ++t) {
    for (std::uint64_t c = 0; c < width; ++c) out[t * width + c] = Smooth(seed, first_row + t, c);
  }
  return out;
}

// A latent snapshot at boundary `len`, as an engine would capture it.
// index_head_dim 0 means no indexer.
inline LatentSnapshot MakeLatent(std::uint64_t len, std::uint32_t width, std::uint32_t index_head_dim,
                                      std::uint32_t pool, std::uint64_t ring_rows = 0,
                                      std::uint64_t seed = 1) {
  LatentSnapshot s;
  s.shape.len = len;
  s.shape.width = width;
  s.shape.index_width = 2 * index_head_dim;
  s.latent_rows = SmoothPlane(seed, 0, len, width);
  if (index_head_dim > 0) {
    s.shape.pool = pool;
    s.shape.pools_ready = len / pool;
    s.shape.index_is_ring = ring_rows != 0;
    s.shape.index_ring_rows = ring_rows;
    const std::uint64_t first_tail = s.shape.pools_ready * pool;
    s.index_tail_rows = SmoothPlane(seed + 1, first_tail, len - first_tail, s.shape.index_width);
    s.pool_keys = SmoothPlane(seed + 2, 0, s.shape.pools_ready, index_head_dim);
  }
  return s;
}

inline RecurrentSnapshot MakeRecurrent(std::uint32_t heads, std::uint32_t head_dim, std::uint32_t kernel,
                                       std::uint64_t seed = 3) {
  RecurrentSnapshot s{{heads, head_dim, kernel}, {}, {}};
  s.conv_ring = SmoothPlane(seed, 0, 3ull * heads * head_dim, kernel - 1);
  s.state = SmoothPlane(seed + 1, 0, std::uint64_t{heads} * head_dim, head_dim);
  return s;
}

inline KvSnapshot MakeKv(std::uint64_t len, std::uint32_t k_width, std::uint32_t v_width,
                         std::uint64_t seed = 5) {
  return {{len, k_width, v_width}, SmoothPlane(seed, 0, len, k_width), SmoothPlane(seed + 1, 0, len, v_width)};
}

inline ModelFingerprint TestFingerprint() {
  ModelFingerprint f;
  f.architecture = "hrm-tiny";
  f.plan_digest = {0x1111, 0x2222};
  f.weights_digest = {0x3333, 0x4444};
  f.codec_versions = CodecRegistry::Default().Identities();
  return f;
}

// A small hybrid boundary: kda, mla (indexer, ring), kda, mla (dense), kv.
inline BoundarySnapshot MakeBoundary(std::uint64_t len) {
  BoundarySnapshot b;
  b.header.fingerprint = TestFingerprint();
  b.header.ns = "tests";
  for (std::uint64_t i = 0; i < len; ++i)
    b.header.tokens.push_back(i == 0 ? 256u : static_cast<std::uint32_t>(i % 256));
  b.header.boundary_len = len;
  b.layers.push_back(MakeRecurrent(2, 4, 4, 10));
  b.layers.push_back(MakeLatent(len, 10, 4, 4, 8, 11));
  b.layers.push_back(MakeRecurrent(2, 4, 4, 12));
  b.layers.push_back(MakeLatent(len, 10, 0, 0, 0, 13));
  b.layers.push_back(MakeKv(len, 6, 6, 14));
  return b;
}

inline std::vector<LayerGeometry> GeometryOfBoundary(std::uint64_t max_ctx) {
  return {RecurrentShape{2, 4, 4}, LatentGeometry{10, 8, 4, 8, max_ctx}, RecurrentShape{2, 4, 4},
          LatentGeometry{10, 0, 0, 0, max_ctx}, KvGeometry{6, 6, max_ctx}};
}

// True when a and b hold the same bit patterns.
inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline bool BitEqual(const LayerSnapshot& a, const LayerSnapshot& b) {
  if (a.index() != b.index() || !(ShapeOf(a) == ShapeOf(b))) return false;
  if (const auto* l = std::get_if<LatentSnapshot>(&a)) {
    const auto& m = std::get<LatentSnapshot>(b);
    return BitEqual(l->latent_rows, m.latent_rows) && BitEqual(l->index_tail_rows, m.index_tail_rows) &&
           BitEqual(l->pool_keys, m.pool_keys);
  }
  if (const auto* r = std::get_if<RecurrentSnapshot>(&a)) {
    const auto& s = std::get<RecurrentSnapshot>(b);
    return BitEqual(r->conv_ring, s.conv_ring) && BitEqual(r->state, s.state);
  }
  const auto& k = std::get<KvSnapshot>(a);
  const auto& v = std::get<KvSnapshot>(b);
  return BitEqual(k.k_rows, v.k_rows) && BitEqual(k.v_rows, v.v_rows);
}

// ---- Byte surgery ----------------------------------------------------------------

template <typename T>
T Load(const std::string& s, std::size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}
template <typename T>
void Store(std::string& s, std::size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof v);
}

inline std::uint64_t Xxh(const std::string& s, std::size_t at, std::size_t n) {
  return Checksum64(std::as_bytes(std::span(s.data() + at, n)));
}

// Recomputes the checksum of a serialized layer header at the start of s
// (docs/format-snapshot.md: magic, version, body length, body, XXH3).
inline void ResealLayerHeader(std::string& s) {
  const std::size_t body = Load<std::uint32_t>(s, 8);
  Store<std::uint64_t>(s, 12 + body, Xxh(s, 0, 12 + body));
}

// Offsets within a .pcsnap, read from its preamble.
struct PcsnapLayout {
  std::size_t header_at = 32, header_len = 0, table_at = 0, sections = 0, data_at = 0;
};
inline PcsnapLayout LayoutOf(const std::string& f) {
  PcsnapLayout l;
  l.header_len = Load<std::uint32_t>(f, 12);
  l.sections = Load<std::uint32_t>(f, 16);
  l.table_at = 32 + l.header_len + 8;
  l.data_at = l.table_at + 32 * l.sections + 8;
  return l;
}
// Recomputes every checksum of the preamble, the header and the table (not
// the sections'), so that a test reaches the check behind them.
inline void ResealPcsnap(std::string& f) {
  PcsnapLayout l = LayoutOf(f);
  Store<std::uint64_t>(f, 24, Xxh(f, 0, 24));
  Store<std::uint64_t>(f, 32 + l.header_len, Xxh(f, 32, l.header_len));
  Store<std::uint64_t>(f, l.table_at + 32 * l.sections, Xxh(f, l.table_at, 32 * l.sections));
}

// Encodes a layer from planes anywhere in memory (the kind's planes in
// stored order, of its types), every chunk into a string: what a caller
// without a LayerSnapshot (a PyTorch engine's kinds, planes not f32) does.
inline Result<EncodedLayer> EncodeSpans(const LayerShape& shape, std::vector<ElementSpan> planes,
                                        const EncodeOptions& options = {}) {
  PC_ASSIGN_OR_RETURN(LayerEncoder enc, LayerEncoder::Create(shape, std::move(planes), options));
  EncodedLayer out;
  for (std::size_t i = 0; i < enc.chunk_count(); ++i) {
    std::string& c = out.chunks.emplace_back(enc.MaxChunkBytes(i), '\0');
    PC_ASSIGN_OR_RETURN(std::size_t n, enc.EncodeChunk(i, std::as_writable_bytes(std::span(c))));
    c.resize(n);
  }
  PC_ASSIGN_OR_RETURN(out.header, enc.Finish());
  return out;
}

}  // namespace primecache::testing_util

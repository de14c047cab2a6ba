// Writes the seed corpora of the codecs fuzzers (tests/fuzz/corpus/...):
//   make_corpus DIR
// Small, valid inputs of every kind and transform, so that mutation starts
// from inputs that reach deep into the decoders. The committed corpora were
// made with this program; rerun it after a format change.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "primecache/internal/env.h"
#include "primecache/internal/snapshot_file.h"
#include "tests/codecs/codec_test_util.h"

using namespace primecache;
using namespace primecache::testing_util;

namespace {

// A plain or rotating, f32 or TurboQuant layer of `len` positions (the
// widths, in 4-byte words, must be whole TurboQuant entries when quantized);
// the rows are smooth floats, opaque words to a TurboQuant kind.
KvSnapshot MakeKvOf(KvShape shape, std::uint64_t len, std::uint32_t k_width, std::uint32_t v_width) {
  shape.len = len;
  shape.k_width = k_width;
  shape.v_width = v_width;
  if (shape.format.rotating()) shape.rows = std::min<std::uint64_t>(len, shape.format.window);
  KvSnapshot s = MakeKv(shape.held_rows(), k_width, v_width);
  s.shape.len = len;
  s.shape.format = shape.format;
  s.shape.rows = shape.rows;
  return s;
}

// A layer of a kind without a snapshot (linear-state, kv-indexed), encoded
// from planes of its types whose bytes follow a fixed pattern.
Result<EncodedLayer> EncodeShape(const LayerShape& shape, const EncodeOptions& options) {
  PC_ASSIGN_OR_RETURN(const LayerCodec* codec, CodecRegistry::Default().KindFor(shape));
  PC_ASSIGN_OR_RETURN(std::vector<PlaneLayout> layouts, codec->Planes(shape, CodecLimits{}));
  std::vector<std::vector<std::byte>> bytes;
  std::vector<ElementSpan> spans;
  for (const PlaneLayout& lay : layouts) {
    auto& b = bytes.emplace_back(lay.raw_bytes());
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 37 + 11);
  }
  for (std::size_t p = 0; p < layouts.size(); ++p) spans.emplace_back(bytes[p], layouts[p].dtype);
  return EncodeSpans(shape, spans, options);
}

Status Put(const std::string& dir, const std::string& name, const std::string& bytes) {
  PC_RETURN_IF_ERROR(CreateDirs(Env::Default(), dir));
  return WriteFileAtomically(Env::Default(), dir + "/" + name, bytes);
}

std::vector<std::pair<std::string, EncodeOptions>> Options() {
  std::vector<std::pair<std::string, EncodeOptions>> out;
  for (auto [name, spec] : std::vector<std::pair<std::string, TransformSpec>>{
           {"raw", {"raw/v1", 0}}, {"zstd", {"shuffle-zstd/v1", 1}}}) {
    EncodeOptions o;
    o.all_planes = spec;
    o.target_chunk_bytes = 128;
    out.emplace_back(name, o);
  }
  for (auto [name, spec] : std::vector<std::pair<std::string, TransformSpec>>{{"bf16", {"bf16/v1", 0}},
                                                                              {"q8_0", {"q8_0/v1", 0}}}) {
    EncodeOptions o;
    o.plane_transforms = {{PlaneId::kLatentRows, spec}};
    o.target_chunk_bytes = 128;
    out.emplace_back(name, o);
  }
  return out;
}

Status Run(const std::string& root) {
  std::vector<std::pair<std::string, LayerSnapshot>> layers = {
      {"mla_latent-ring", MakeLatent(9, 6, 2, 4, 4)},
      {"mla_latent-flat", MakeLatent(7, 6, 2, 2)},
      {"mla_latent-dense", MakeLatent(5, 8, 0, 0)},
      {"mla_latent-short", MakeLatent(3, 4, 2, 4, 4)},
      {"kda_recurrent-a", MakeRecurrent(1, 3, 4)},
      {"kda_recurrent-b", MakeRecurrent(2, 2, 2)},
      {"kv_plain-a", MakeKv(6, 3, 5)},
      {"kv_plain-b", MakeKv(1, 4, 4)},
      {"kv_rotating-wrapped", MakeKvOf({0, 0, 0, {4, 0, 0, 0}, 0}, 9, 3, 5)},
      {"kv_rotating-short", MakeKvOf({0, 0, 0, {8, 0, 0, 0}, 0}, 3, 2, 2)},
      {"tq4_kv_plain-a", MakeKvOf({0, 0, 0, {0, 4, 16, 0x5eed}, 0}, 5, 3, 6)},
      {"tq2_kv_plain-a", MakeKvOf({0, 0, 0, {0, 2, 16, 0x5eed}, 0}, 5, 2, 4)},
      {"tq4_kv_rotating-a", MakeKvOf({0, 0, 0, {4, 4, 16, 0x5eed}, 0}, 7, 3, 3)},
      {"tq2_kv_rotating-a", MakeKvOf({0, 0, 0, {4, 2, 16, 0x5eed}, 0}, 7, 2, 2)},
  };
  for (const auto& [oname, options] : Options()) {
    for (const auto& [lname, layer] : layers) {
      const std::string kind = lname.substr(0, lname.find('-'));
      const bool lossy = !options.plane_transforms.empty();
      if (lossy && kind != "mla_latent")
        continue;  // would equal the zstd seed: lossy applies to latent rows only
      PC_ASSIGN_OR_RETURN(EncodedLayer enc, EncodeLayer(layer, options));
      PC_RETURN_IF_ERROR(Put(root + "/layer_" + kind, lname + "-" + oname, SerializeLayer(enc)));
    }
    KvShape indexed{7, 4, 6, KvFormat{.index_width = 4}};
    indexed.dtype = indexed.index_dtype = ElementType::kBf16;
    LinearStateShape linear{6, 4, 2, 3, 2};
    linear.conv_dtype = ElementType::kBf16;
    // The element types torch caches arrive in (primecache.torch, .hf): f16
    // and fp8 rows beside bf16, and plain K/V in them.
    KvShape indexed_f16 = indexed, indexed_fp8 = indexed;
    indexed_f16.dtype = indexed_f16.index_dtype = ElementType::kF16;
    indexed_fp8.dtype = ElementType::kF8E4M3;
    LinearStateShape linear_f16 = linear;
    linear_f16.conv_dtype = ElementType::kF16;
    KvShape plain_bf16{5, 3, 3}, plain_fp8{5, 3, 3};
    plain_bf16.dtype = ElementType::kBf16;
    plain_fp8.dtype = ElementType::kF8E4M3;
    const std::vector<std::pair<std::string, LayerShape>> shaped = {
        {"kv_indexed-bf16", indexed},
        {"kv_indexed-f16", indexed_f16},
        {"kv_indexed-fp8", indexed_fp8},
        {"kv_indexed-f32", KvShape{5, 3, 3, KvFormat{.index_width = 2}}},
        {"linear_state-bf16", linear},
        {"linear_state-f16", linear_f16},
        {"linear_state-f32", LinearStateShape{3, 2, 1, 2, 4}},
        {"kv_plain-bf16", plain_bf16},
        {"kv_plain-fp8", plain_fp8},
    };
    for (const auto& [lname, shape] : shaped) {
      if (!options.plane_transforms.empty()) continue;  // lossy: latent rows only
      PC_ASSIGN_OR_RETURN(EncodedLayer enc, EncodeShape(shape, options));
      const std::string kind = lname.substr(0, lname.find('-'));
      PC_RETURN_IF_ERROR(Put(root + "/layer_" + kind, lname + "-" + oname, SerializeLayer(enc)));
    }
    for (std::uint64_t len : {1u, 6u}) {
      BoundarySnapshot b = MakeBoundary(len);
      b.layers = {MakeRecurrent(1, 2, 3), MakeLatent(len, 4, 2, 2, 2), MakeKv(len, 2, 3)};
      PC_ASSIGN_OR_RETURN(EncodedSnapshot e, EncodeSnapshot(b, options));
      PC_RETURN_IF_ERROR(
          Put(root + "/pcsnap", "len" + std::to_string(len) + "-" + oname, SerializePcsnap(e)));
    }
  }
  // Transforms: a u16 value count, then the encoding.
  for (auto id : {kRawTransform, kShuffleZstdTransform, kBf16Transform, kQ8_0Transform}) {
    const Transform* t = *CodecRegistry::Default().FindTransform(id);
    const std::string dir = root + "/transform_" + std::string(id.substr(0, id.find('/')));
    for (std::uint16_t n : {0, 1, 31, 33, 100}) {
      std::vector<float> v = SmoothPlane(n, 0, 1, n);
      std::string enc;
      PC_RETURN_IF_ERROR(t->Encode(v, id == kShuffleZstdTransform ? 1 : 0, &enc));
      std::string input(reinterpret_cast<const char*>(&n), 2);
      PC_RETURN_IF_ERROR(Put(dir, "n" + std::to_string(n), input + enc));
    }
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT\n", argv[0]);
    return 2;
  }
  Status s = Run(argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

// The storage kinds that PyTorch engines' caches need beside the reference
// engine's (layer_shape.h): linear-state/v1 (a linear-attention layer's conv
// state of any width and its recurrent state over heads of their own key and
// value dims) and kv-indexed/v1 (plain K and V rows with a DSA indexer's
// keys). Their header fields, planes, refusals, validation, plan digests,
// and the fingerprint's codec versions, which name only the kinds a model
// uses.
#include <algorithm>

#include "codec_test_util.h"

namespace primecache {
namespace {

const LayerCodec& Kind(std::string_view id) {
  return **CodecRegistry::Default().FindKind(id);
}

std::vector<PlaneLayout> PlanesOf(const LayerShape& shape) {
  auto codec = CodecRegistry::Default().KindFor(shape);
  EXPECT_TRUE(codec.ok()) << codec.status().ToString();
  auto planes = (*codec)->Planes(shape, CodecLimits{});
  EXPECT_TRUE(planes.ok()) << planes.status().ToString();
  return planes.ok() ? *planes : std::vector<PlaneLayout>{};
}

// Encodes a shape's planes; returns the layer and its bytes. Byte i of
// plane p depends on (seed, p, i) only, so an append-only plane's rows are
// the same bytes at every length.
struct Encoded {
  EncodedLayer layer;
  std::vector<std::vector<std::byte>> planes;
};
Encoded EncodeRandom(const LayerShape& shape, std::uint32_t seed, const EncodeOptions& options = {}) {
  Encoded out;
  std::vector<ElementSpan> spans;
  const auto layouts = PlanesOf(shape);
  for (std::size_t p = 0; p < layouts.size(); ++p) {
    auto& b = out.planes.emplace_back(layouts[p].raw_bytes());
    for (std::size_t i = 0; i < b.size(); ++i) {
      b[i] = static_cast<std::byte>(((i + 1) * 2654435761u + p * 40503u + seed * 977u) >> 11);
    }
  }
  for (std::size_t p = 0; p < layouts.size(); ++p) spans.emplace_back(out.planes[p], layouts[p].dtype);
  auto enc = testing_util::EncodeSpans(shape, spans, options);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  if (enc.ok()) out.layer = std::move(enc).value();
  return out;
}

LinearStateShape QwenNextLike() {
  // transformers' qwen3_next: conv_states [128, 4] in the model's type,
  // recurrent_states [4 heads, 16, 16] in f32.
  LinearStateShape s{128, 4, 4, 16, 16};
  s.conv_dtype = ElementType::kBf16;
  return s;
}

KvShape DsaLike(std::uint64_t len) {
  // transformers' DynamicIndexedLayer: keys [4, len, 24], values [4, len, 16],
  // indexer_keys [len, 16].
  KvShape s{len, 4 * 24, 4 * 16, KvFormat{.index_width = 16}};
  s.dtype = s.index_dtype = ElementType::kBf16;
  return s;
}

TEST(PytorchKinds, EachShapeHasItsKindAndItsPlanes) {
  const LinearStateShape ls = QwenNextLike();
  EXPECT_EQ((*CodecRegistry::Default().KindFor(ls))->kind(), kLinearStateKind);
  const auto lp = PlanesOf(ls);
  ASSERT_EQ(lp.size(), 2u);
  EXPECT_EQ(lp[0], (PlaneLayout{PlaneId::kConvRing, 128, 4, false, false, ElementType::kBf16}));
  EXPECT_EQ(lp[1], (PlaneLayout{PlaneId::kRecurrentState, 64, 16, false, false, ElementType::kF32}));

  const KvShape kv = DsaLike(37);
  EXPECT_EQ((*CodecRegistry::Default().KindFor(kv))->kind(), kKvIndexedKind);
  const auto kp = PlanesOf(kv);
  ASSERT_EQ(kp.size(), 3u);
  EXPECT_EQ(kp[2], (PlaneLayout{PlaneId::kIndexKeys, 37, 16, true, false, ElementType::kBf16}));
  EXPECT_EQ(PlaneName(PlaneId::kIndexKeys), "index_keys");
  EXPECT_TRUE(kp[0].append_only && kp[1].append_only);
}

TEST(PytorchKinds, HeaderFieldsRoundTripAndF32WritesNoTypes) {
  LinearStateShape f32{24, 3, 2, 8, 6};
  EXPECT_EQ(Kind(kLinearStateKind).ShapeFields(f32), (std::vector<std::uint64_t>{24, 3, 2, 8, 6}));
  const LinearStateShape typed = QwenNextLike();
  const auto fields = Kind(kLinearStateKind).ShapeFields(typed);
  EXPECT_EQ(fields, (std::vector<std::uint64_t>{128, 4, 4, 16, 16, 1, 0}));
  EXPECT_EQ(*Kind(kLinearStateKind).ShapeFromFields(fields), LayerShape(typed));

  KvShape plain_types{9, 4, 4, KvFormat{.index_width = 2}};
  EXPECT_EQ(Kind(kKvIndexedKind).ShapeFields(plain_types), (std::vector<std::uint64_t>{9, 4, 4, 2}));
  const KvShape dsa = DsaLike(9);
  const auto kf = Kind(kKvIndexedKind).ShapeFields(dsa);
  EXPECT_EQ(kf, (std::vector<std::uint64_t>{9, 96, 64, 16, 1, 1}));
  EXPECT_EQ(*Kind(kKvIndexedKind).ShapeFromFields(kf), LayerShape(dsa));
}

TEST(PytorchKinds, MalformedHeaderFieldsAreCorruption) {
  const LayerCodec& linear = Kind(kLinearStateKind);
  EXPECT_TRUE(linear.ShapeFromFields(std::vector<std::uint64_t>{1, 2, 3, 4}).status().IsCorruption());
  EXPECT_TRUE(linear.ShapeFromFields(std::vector<std::uint64_t>{1, 2, 3, 4, 5, 1}).status().IsCorruption());
  EXPECT_TRUE(linear.ShapeFromFields(std::vector<std::uint64_t>{1, 2, 3, 4, 5, 7, 0}).status().IsCorruption());
  EXPECT_TRUE(linear.ShapeFromFields(std::vector<std::uint64_t>{1ull << 32, 2, 3, 4, 5}).status().IsCorruption());
  const LayerCodec& indexed = Kind(kKvIndexedKind);
  auto zero = indexed.ShapeFromFields(std::vector<std::uint64_t>{9, 4, 4, 0});
  EXPECT_TRUE(zero.status().IsCorruption());
  EXPECT_NE(zero.status().message().find("index_width 0"), std::string::npos) << zero.status().ToString();
  EXPECT_TRUE(indexed.ShapeFromFields(std::vector<std::uint64_t>{9, 4, 4, 2, 1}).status().IsCorruption());
}

TEST(PytorchKinds, ShapesThatBreakTheirInvariantsAreRefusedByName) {
  Status s = CheckShape(LinearStateShape{0, 4, 1, 0, 8});
  EXPECT_NE(s.message().find("conv_channels is 0"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("state_k_dim is 0"), std::string::npos) << s.ToString();
  EXPECT_TRUE(CheckShape(LinearStateShape{8, 0, 1, 1, 1}).IsInvalidArgument());
  // 2^32-1 cubed overflows 64 bits.
  constexpr std::uint32_t kBig = 0xffffffffu;
  EXPECT_NE(CheckShape(LinearStateShape{1, 1, kBig, kBig, kBig}).message().find("overflows"), std::string::npos);

  s = CheckShape(KvShape{9, 4, 4, KvFormat{.window = 4, .index_width = 2}, 4});
  EXPECT_NE(s.message().find("kv-indexed rows are plain and unquantized"), std::string::npos) << s.ToString();
  EXPECT_FALSE(CheckShape(KvShape{9, 6, 6, KvFormat{0, 4, 16, 1, 2}}).ok());
  KvShape stray{9, 4, 4};
  stray.index_dtype = ElementType::kBf16;  // a second spelling of "no indexer keys"
  EXPECT_NE(CheckShape(stray).message().find("index_dtype without indexer keys"), std::string::npos);
}

TEST(PytorchKinds, EveryPlaneRoundTripsAndAppendOnlyIndexKeysShareChunks) {
  for (const LayerShape& shape : {LayerShape(QwenNextLike()), LayerShape(DsaLike(300))}) {
    EncodeOptions o;
    o.target_chunk_bytes = 512;
    Encoded e = EncodeRandom(shape, 11, o);
    auto parsed = ParseLayer(AsBytes(SerializeLayer(e.layer)));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->header.shape, shape);
    auto decoder = LayerDecoder::Create(parsed->header);
    ASSERT_TRUE(decoder.ok()) << decoder.status().ToString();
    std::vector<std::vector<std::byte>> got;
    std::vector<MutableElementSpan> dst;
    for (const PlaneLayout& lay : decoder->planes()) got.emplace_back(lay.raw_bytes());
    for (std::size_t p = 0; p < got.size(); ++p) dst.emplace_back(got[p], decoder->planes()[p].dtype);
    ASSERT_TRUE(decoder->DecodeInto(parsed->chunks, dst).ok());
    EXPECT_EQ(got, e.planes) << parsed->header.kind;
    EXPECT_EQ(*CheckDecodes(*parsed), shape);
  }
  // Two lengths of one DSA sequence: the index keys' chunks before the
  // shorter one's last are the same bytes (what dedup keeps once).
  EncodeOptions o;
  o.target_chunk_bytes = 256;  // 8 rows of 16 bf16 keys a chunk
  o.all_planes = TransformSpec{std::string(kRawTransform), 0};
  const Encoded longer = EncodeRandom(DsaLike(300), 5, o), shorter = EncodeRandom(DsaLike(203), 5, o);
  auto first_chunk = [](const LayerHeader& h, std::size_t plane) {
    std::size_t at = 0;
    for (std::size_t p = 0; p < plane; ++p) at += h.planes[p].chunks.size();
    return at;
  };
  const LayerHeader& lh = longer.layer.header;
  const LayerHeader& sh = shorter.layer.header;
  ASSERT_EQ(lh.planes[2].id, PlaneId::kIndexKeys);
  EXPECT_EQ(lh.planes[2].chunk_rows, 8u);
  ASSERT_EQ(sh.planes[2].chunks.size(), 26u);  // 25 whole chunks and 3 rows
  for (std::size_t k = 0; k < 25; ++k) {
    EXPECT_EQ(lh.planes[2].chunks[k], sh.planes[2].chunks[k]) << "chunk " << k;
    EXPECT_EQ(longer.layer.chunks[first_chunk(lh, 2) + k], shorter.layer.chunks[first_chunk(sh, 2) + k]);
  }
  EXPECT_NE(lh.planes[2].chunks[25], sh.planes[2].chunks[25]) << "the shorter one's last chunk is partial";
}

TEST(PytorchKinds, ValidateNamesWhatDiffers) {
  const LinearStateShape ls = QwenNextLike();
  LinearStateShape g = ls;
  EXPECT_TRUE(Validate(ls, g).ok());
  g.conv_width = 3;
  g.conv_dtype = ElementType::kF32;
  Status s = Validate(ls, g);
  EXPECT_NE(s.message().find("conv_width 4 != plan 3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("conv_ring dtype bf16 != plan f32"), std::string::npos) << s.ToString();
  s = Validate(ls, RecurrentShape{4, 16, 4});
  EXPECT_NE(s.message().find("layer is a linear-state layer; the plan expects a recurrent layer"), std::string::npos)
      << s.ToString();

  const KvShape dsa = DsaLike(20);
  KvGeometry kg{96, 64, 64, dsa.format, ElementType::kBf16, ElementType::kBf16};
  EXPECT_TRUE(Validate(dsa, kg).ok());
  kg.index_dtype = ElementType::kF32;
  EXPECT_NE(Validate(dsa, kg).message().find("index_keys dtype bf16 != plan f32"), std::string::npos);
  kg.format.index_width = 32;
  EXPECT_NE(Validate(dsa, kg).message().find("index_width 16 != plan 32"), std::string::npos);
  kg.format = KvFormat{};
  s = Validate(dsa, kg);
  EXPECT_NE(s.message().find("kind kv-indexed/v1 != plan kv-plain/v1"), std::string::npos) << s.ToString();
}

TEST(PytorchKinds, NeitherHasASnapshot) {
  EXPECT_TRUE(MakeSnapshot(LinearStateShape{8, 4, 1, 2, 2}).status().code() == StatusCode::kNotSupported);
  KvShape f32{9, 4, 4, KvFormat{.index_width = 2}};
  auto s = MakeSnapshot(f32);
  EXPECT_TRUE(s.status().code() == StatusCode::kNotSupported);
  EXPECT_NE(s.status().message().find("kv-indexed/v1 layers have no snapshot"), std::string::npos);
}

TEST(PytorchKinds, ABoundaryCountsLengthsOnlyWhereLayersHaveOne) {
  BoundaryHeader h;
  h.tokens.assign(20, 1);
  h.boundary_len = 20;
  const std::vector<LayerShape> ok = {QwenNextLike(), DsaLike(20)};
  EXPECT_TRUE(CheckBoundary(h, ok).ok());
  const std::vector<LayerShape> bad = {QwenNextLike(), DsaLike(19)};
  EXPECT_NE(CheckBoundary(h, bad).message().find("layer 1: len 19 != boundary_len 20"), std::string::npos);
}

TEST(PytorchKinds, PlanDigestsTellTheKindsApartAndLeaveOldPlansAlone) {
  const KvShape plain{20, 96, 64};
  const KvShape indexed = DsaLike(20);
  KvShape indexed_f32{20, 96, 64, KvFormat{.index_width = 16}};
  const std::vector<LayerShape> a = {plain}, b = {indexed}, c = {indexed_f32};
  EXPECT_NE(PlanDigest(a), PlanDigest(c));
  EXPECT_NE(PlanDigest(b), PlanDigest(c));
  KvShape wider = indexed_f32;
  wider.format.index_width = 32;
  EXPECT_NE(PlanDigest(c), PlanDigest(std::vector<LayerShape>{wider}));
  // A linear-state layer and a KDA layer of the same values are other plans.
  const std::vector<LayerShape> linear = {LinearStateShape{96, 3, 2, 16, 16}};
  const std::vector<LayerShape> kda = {RecurrentShape{2, 16, 4}};
  EXPECT_NE(PlanDigest(linear), PlanDigest(kda));
  // Length does not enter a plan.
  EXPECT_EQ(PlanDigest(b), PlanDigest(std::vector<LayerShape>{DsaLike(7)}));
}

TEST(PytorchKinds, AFingerprintNamesOnlyTheKindsItsModelUses) {
  std::vector<LayerGeometry> plan;
  for (const LayerShape& s : std::vector<LayerShape>{QwenNextLike(), KvShape{5, 8, 8}, QwenNextLike(),
                                                     LatentShape{5, 8}, KvShape{5, 8, 8}}) {
    plan.push_back(PlanGeometryOf(s));
  }
  EXPECT_EQ(CodecVersionsOf(plan), (std::vector<std::string>{"kv-plain/v1", "linear-state/v1", "mla-latent/v1"}));
  // Every kind it names is a registered kind.
  for (const std::string& id : CodecVersionsOf(plan)) EXPECT_TRUE(CodecRegistry::Default().FindKind(id).ok()) << id;
  const std::vector<LayerGeometry> tq = {KvGeometry{12, 12, 0, KvFormat{8, 4, 16, 3}}};
  EXPECT_EQ(CodecVersionsOf(tq), (std::vector<std::string>{std::string(kTurboQuant4RotatingKind)}));
}

}  // namespace
}  // namespace primecache

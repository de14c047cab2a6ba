// Planes of every element type: stored as their bytes and given back bit for
// bit by every lossless transform, with the type in the header and the plan
// digest; every way a type can disagree is refused by name; f32 layers keep
// the header and the digest they had before planes had types.
#include <cstring>
#include <random>

#include "codec_test_util.h"
#include "codecs/shuffle.h"

namespace primecache {
namespace {

constexpr ElementType kAllTypes[] = {ElementType::kF32, ElementType::kBf16, ElementType::kF16,
                                     ElementType::kF8E4M3};

// Shapes of each kind whose planes are of type t (and, where a kind has two
// groups of planes, the second group of type u).
std::vector<LayerShape> ShapesOf(ElementType t, ElementType u) {
  LatentShape latent{203, 24, 8, 4, 50, true, 16};
  latent.dtype = t;
  latent.index_dtype = u;
  RecurrentShape recurrent{3, 8, 4};
  recurrent.conv_dtype = t;
  recurrent.state_dtype = u;
  KvShape kv{203, 12, 20};
  kv.dtype = t;
  KvShape rotating{203, 12, 20, KvFormat{64, 0, 0, 0}, 64};
  rotating.dtype = u;
  KvShape indexed{203, 12, 20, KvFormat{.index_width = 16}};
  indexed.dtype = t;
  indexed.index_dtype = u;
  LinearStateShape linear{24, 4, 2, 8, 6};
  linear.conv_dtype = t;
  linear.state_dtype = u;
  return {latent, recurrent, kv, rotating, indexed, linear};
}

// Random bytes for every plane of a shape (NaN and subnormal patterns among
// them: the bytes are opaque to lossless transforms).
struct Planes {
  std::vector<PlaneLayout> layouts;
  std::vector<std::vector<std::byte>> bytes;
  std::vector<ElementSpan> spans() const {
    std::vector<ElementSpan> out;
    for (std::size_t p = 0; p < bytes.size(); ++p) out.emplace_back(bytes[p], layouts[p].dtype);
    return out;
  }
};

Planes RandomPlanes(const LayerShape& shape, std::uint32_t seed) {
  auto codec = CodecRegistry::Default().KindFor(shape);
  EXPECT_TRUE(codec.ok());
  auto layouts = (*codec)->Planes(shape, CodecLimits{});
  EXPECT_TRUE(layouts.ok()) << layouts.status().ToString();
  Planes out{*layouts, {}};
  std::mt19937 rng(seed);
  for (const PlaneLayout& lay : out.layouts) {
    auto& b = out.bytes.emplace_back(lay.raw_bytes());
    for (std::byte& x : b) x = static_cast<std::byte>(rng() % 7 == 0 ? 0xff : rng() & 0x3f);
  }
  return out;
}

Result<EncodedLayer> Encode(const LayerShape& shape, const Planes& planes, const EncodeOptions& options = {}) {
  return testing_util::EncodeSpans(shape, planes.spans(), options);
}

std::vector<MutableElementSpan> Destinations(std::vector<std::vector<std::byte>>& bytes, const Planes& like) {
  std::vector<MutableElementSpan> out;
  for (std::size_t p = 0; p < like.layouts.size(); ++p) {
    out.emplace_back(bytes.emplace_back(like.layouts[p].raw_bytes()), like.layouts[p].dtype);
  }
  return out;
}

class DtypeRoundTrip : public testing::TestWithParam<std::tuple<ElementType, const char*>> {};

TEST_P(DtypeRoundTrip, EveryKindGivesBackItsBytesThroughTheHeaderAndTheFlatForm) {
  const auto [type, transform] = GetParam();
  EncodeOptions options;
  options.all_planes = TransformSpec{transform, std::string_view(transform) == kShuffleZstdTransform ? 1 : 0};
  options.target_chunk_bytes = 256;  // several chunks per append-only plane
  for (const LayerShape& shape : ShapesOf(type, type == ElementType::kF32 ? ElementType::kBf16 : type)) {
    const Planes planes = RandomPlanes(shape, 7);
    auto enc = Encode(shape, planes, options);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    auto parsed = ParseLayer(AsBytes(SerializeLayer(*enc)));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->header, enc->header) << "the element types travel in the header";
    EXPECT_EQ(parsed->header.shape, shape);
    auto decoder = LayerDecoder::Create(parsed->header);
    ASSERT_TRUE(decoder.ok()) << decoder.status().ToString();
    std::vector<std::vector<std::byte>> got;
    const std::vector<MutableElementSpan> dst = Destinations(got, planes);
    ASSERT_TRUE(decoder->DecodeInto(parsed->chunks, dst).ok());
    EXPECT_EQ(got, planes.bytes) << enc->header.kind;
    auto checked = CheckDecodes(*parsed);
    ASSERT_TRUE(checked.ok()) << checked.status().ToString();
    EXPECT_EQ(*checked, shape);
  }
}

INSTANTIATE_TEST_SUITE_P(TypesAndTransforms, DtypeRoundTrip,
                         testing::Combine(testing::ValuesIn(kAllTypes),
                                          testing::Values(kRawTransform.data(), kShuffleZstdTransform.data())),
                         [](const auto& info) {
                           std::string name = std::string(ElementTypeName(std::get<0>(info.param))) + "_" +
                                              std::get<1>(info.param);
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(DtypeTest, TwoByteShuffleIsATransposeThatUndoes) {
  std::vector<std::byte> in(2 * 37), shuffled(in.size()), back(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::byte>(i * 13 + 1);
  codecs::ShuffleBytes2(in.data(), 37, shuffled.data());
  for (std::size_t i = 0; i < 37; ++i) {
    EXPECT_EQ(shuffled[i], in[2 * i]);
    EXPECT_EQ(shuffled[37 + i], in[2 * i + 1]);
  }
  codecs::UnshuffleBytes2(shuffled.data(), 37, back.data());
  EXPECT_EQ(back, in);
}

TEST(DtypeTest, AnF32HeaderIsTheHeaderOfBeforeTypes) {
  // An f32 layer writes no type fields: 7 for a latent layer, as before.
  const LatentShape f32{203, 24, 8, 4, 50, true, 16};
  EXPECT_EQ((*CodecRegistry::Default().KindFor(f32))->ShapeFields(f32).size(), 7u);
  LatentShape bf16 = f32;
  bf16.dtype = ElementType::kBf16;
  const auto fields = (*CodecRegistry::Default().KindFor(bf16))->ShapeFields(bf16);
  ASSERT_EQ(fields.size(), 9u);
  EXPECT_EQ(fields[7], 1u);
  EXPECT_EQ(fields[8], 0u);
  // Explicit f32 type fields read as the default.
  auto read = (*CodecRegistry::Default().FindKind(kMlaLatentKind))->ShapeFromFields(
      std::vector<std::uint64_t>{203, 24, 8, 4, 50, 1, 16, 0, 0});
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, LayerShape(f32));
}

TEST(DtypeTest, AnUnknownTypeOrFieldCountInAHeaderIsCorruption) {
  const LayerCodec* kv = *CodecRegistry::Default().FindKind(kKvPlainKind);
  auto bad = kv->ShapeFromFields(std::vector<std::uint64_t>{5, 4, 4, 9});
  EXPECT_TRUE(bad.status().IsCorruption());
  EXPECT_NE(bad.status().message().find("element type 9"), std::string::npos) << bad.status().ToString();
  EXPECT_TRUE(kv->ShapeFromFields(std::vector<std::uint64_t>{5, 4, 4, 1, 1}).status().IsCorruption());
  const LayerCodec* kda = *CodecRegistry::Default().FindKind(kKdaRecurrentKind);
  EXPECT_TRUE(kda->ShapeFromFields(std::vector<std::uint64_t>{3, 8, 4, 2}).status().IsCorruption());
  EXPECT_TRUE(kda->ShapeFromFields(std::vector<std::uint64_t>{3, 8, 4, 2, 1}).ok());
}

TEST(DtypeTest, TheTypeIsPartOfThePlanDigestAndF32AddsNothing) {
  const std::vector<LayerShape> f32 = ShapesOf(ElementType::kF32, ElementType::kF32);
  std::vector<LayerGeometry> plan;
  for (const LayerShape& s : f32) plan.push_back(PlanGeometryOf(s));
  // The f32 digest is the one of geometries that never named a type.
  EXPECT_EQ(PlanDigest(f32), GeometryDigest(plan));
  for (ElementType t : {ElementType::kBf16, ElementType::kF16, ElementType::kF8E4M3}) {
    EXPECT_NE(PlanDigest(ShapesOf(t, ElementType::kF32)), PlanDigest(f32)) << ElementTypeName(t);
    EXPECT_NE(PlanDigest(ShapesOf(ElementType::kF32, t)), PlanDigest(f32)) << ElementTypeName(t);
  }
  EXPECT_NE(PlanDigest(ShapesOf(ElementType::kBf16, ElementType::kF32)),
            PlanDigest(ShapesOf(ElementType::kF16, ElementType::kF32)));
}

TEST(DtypeTest, ValidateRefusesAnotherTypeByPlane) {
  KvShape kv{5, 4, 6};
  kv.dtype = ElementType::kBf16;
  KvGeometry plan{4, 6, 64};
  Status s = Validate(kv, plan);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("K and V rows dtype bf16 != plan f32"), std::string::npos) << s.ToString();
  plan.dtype = ElementType::kBf16;
  EXPECT_TRUE(Validate(kv, plan).ok());

  RecurrentShape r{3, 8, 4};
  r.state_dtype = ElementType::kF16;
  RecurrentShape g{3, 8, 4};
  g.state_dtype = ElementType::kF32;
  s = Validate(r, g);
  EXPECT_NE(s.message().find("state dtype f16 != plan f32"), std::string::npos) << s.ToString();

  LatentShape l{10, 8, 0, 0, 0};
  l.dtype = ElementType::kF8E4M3;
  s = Validate(l, LatentGeometry{8, 0, 0, 0, 64});
  EXPECT_NE(s.message().find("latent_rows dtype f8e4m3 != plan f32"), std::string::npos) << s.ToString();
}

TEST(DtypeTest, WhatCannotHoldATypeRefusesIt) {
  // A snapshot holds f32 planes only.
  KvShape kv{5, 4, 6};
  kv.dtype = ElementType::kF16;
  EXPECT_TRUE(MakeSnapshot(kv).status().IsInvalidArgument());
  // TurboQuant rows are f32 words.
  KvShape tq{5, 6, 6, KvFormat{0, 4, 16, 8}, 0};
  tq.dtype = ElementType::kBf16;
  EXPECT_NE(CheckShape(tq).message().find("TurboQuant rows are 4-byte words"), std::string::npos);
  // An index type without an indexer is a second spelling of "none".
  LatentShape dense{10, 8, 0, 0, 0};
  dense.index_dtype = ElementType::kBf16;
  EXPECT_FALSE(CheckShape(dense).ok());
  // A value outside the enum.
  LatentShape odd{10, 8, 0, 0, 0};
  odd.dtype = static_cast<ElementType>(200);
  EXPECT_NE(CheckShape(odd).message().find("dtype 200 is not an element type"), std::string::npos);
}

TEST(DtypeTest, LossyTransformsCodeF32Only) {
  LatentShape l{64, 8, 0, 0, 0};
  l.dtype = ElementType::kBf16;
  const Planes planes = RandomPlanes(l, 3);
  for (std::string_view lossy : {kBf16Transform, kQ8_0Transform}) {
    EncodeOptions o;
    o.plane_transforms = {{PlaneId::kLatentRows, TransformSpec{std::string(lossy), 0}}};
    auto enc = Encode(l, planes, o);
    EXPECT_TRUE(enc.status().IsInvalidArgument()) << lossy;
    EXPECT_NE(enc.status().message().find("codes f32 values; the plane is bf16"), std::string::npos)
        << enc.status().ToString();
  }
  // A header that claims a lossy transform on a bf16 plane does not decode.
  auto enc = Encode(l, planes);
  ASSERT_TRUE(enc.ok());
  enc->header.planes[0].transform = std::string(kBf16Transform);
  EXPECT_TRUE(LayerDecoder::Create(enc->header).status().IsCorruption());
}

TEST(DtypeTest, PlanesOfAnotherTypeOrSizeAreRefusedOnBothSides) {
  KvShape kv{40, 4, 6};
  kv.dtype = ElementType::kBf16;
  Planes planes = RandomPlanes(kv, 5);
  std::vector<ElementSpan> wrong = planes.spans();
  wrong[1].type = ElementType::kF16;
  auto refused = LayerEncoder::Create(kv, wrong);
  EXPECT_NE(refused.status().message().find("is given f16 values; the shape says bf16"), std::string::npos)
      << refused.status().ToString();
  wrong = planes.spans();
  wrong[0].bytes = wrong[0].bytes.first(wrong[0].bytes.size() - 2);
  EXPECT_TRUE(LayerEncoder::Create(kv, wrong).status().IsInvalidArgument());

  auto enc = Encode(kv, planes);
  ASSERT_TRUE(enc.ok());
  auto decoder = LayerDecoder::Create(enc->header);
  ASSERT_TRUE(decoder.ok());
  std::vector<std::vector<std::byte>> got;
  std::vector<MutableElementSpan> dst = Destinations(got, planes);
  dst[0].type = ElementType::kF16;
  Status s = decoder->DecodeInto(enc->chunks, dst);
  EXPECT_NE(s.message().find("destination holds f16 values; the plane is bf16"), std::string::npos) << s.ToString();
  std::vector<float> as_f32(kv.k_values());
  EXPECT_FALSE(decoder->DecodeChunk(0, AsBytes(enc->chunks[0]), as_f32).ok());
}

TEST(DtypeTest, SmallTypesChunkByTheirOwnRowBytes) {
  // 512-byte rows of bf16 values: a 1 MiB chunk holds 2,048 of them, capped
  // at the default 1,024 rows, where f32 rows of the same width hold 512.
  KvShape kv{3000, 256, 256};
  kv.dtype = ElementType::kBf16;
  auto enc = Encode(kv, RandomPlanes(kv, 9));
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(enc->header.planes[0].chunk_rows, 1024u);
  KvShape f32{3000, 256, 256};
  auto enc32 = Encode(f32, RandomPlanes(f32, 9));
  ASSERT_TRUE(enc32.ok());
  EXPECT_EQ(enc32->header.planes[0].chunk_rows, 1024u);
  kv.dtype = ElementType::kF8E4M3;
  kv.k_width = kv.v_width = 4096;
  auto enc8 = Encode(kv, RandomPlanes(kv, 9));
  ASSERT_TRUE(enc8.ok());
  EXPECT_EQ(enc8->header.planes[0].chunk_rows, 256u) << "1 MiB / 4,096-byte rows";
}

}  // namespace
}  // namespace primecache

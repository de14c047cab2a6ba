// The registry fails closed: exact identities only, no defaults, and messages
// that say whether a name is unknown or only its version is.
#include "codec_test_util.h"

namespace primecache {
namespace {

const CodecRegistry& R() {
  return CodecRegistry::Default();
}

TEST(IdentityTest, ParsesStrictly) {
  auto id = ParseIdentity("mla-latent/v1");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->name, "mla-latent");
  EXPECT_EQ(id->version, 1u);
  EXPECT_EQ(id->ToString(), "mla-latent/v1");
  EXPECT_TRUE(ParseIdentity("q8_0/v4294967295").ok());
  for (std::string_view bad :
       {"", "mla-latent", "mla-latent/", "mla-latent/v", "mla-latent/1", "mla-latent/v0", "mla-latent/v01",
        "mla-latent/v1 ", " mla-latent/v1", "MLA-latent/v1", "mla latent/v1", "mla-latent/v4294967296", "/v1",
        "a/b/v1", "mla-latent/v1x"}) {
    auto r = ParseIdentity(bad);
    EXPECT_TRUE(r.status().IsInvalidArgument()) << "'" << bad << "' " << r.status().ToString();
  }
}

TEST(RegistryTest, FindsEveryBuiltInByItsExactIdentity) {
  for (auto k : {kMlaLatentKind, kKdaRecurrentKind, kKvPlainKind, kKvRotatingKind, kTurboQuant4PlainKind, kKvIndexedKind,
                 kLinearStateKind}) {
    auto c = R().FindKind(k);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ((*c)->kind(), k);
  }
  for (auto t : {kRawTransform, kShuffleZstdTransform, kBf16Transform, kQ8_0Transform}) {
    auto c = R().FindTransform(t);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ((*c)->id(), t);
  }
  EXPECT_FALSE((*R().FindTransform(kRawTransform))->lossy());
  EXPECT_FALSE((*R().FindTransform(kShuffleZstdTransform))->lossy());
  EXPECT_TRUE((*R().FindTransform(kBf16Transform))->lossy());
  EXPECT_TRUE((*R().FindTransform(kQ8_0Transform))->lossy());
}

TEST(RegistryTest, RefusesAnUnknownKind) {
  auto r = R().FindKind("gdn-recurrent/v1");
  ASSERT_TRUE(r.status().code() == StatusCode::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find("unknown storage kind 'gdn-recurrent/v1'"), std::string::npos);
  EXPECT_NE(r.status().message().find("mla-latent/v1"), std::string::npos) << "lists the known kinds";
}

TEST(RegistryTest, RefusesAKnownKindAtAnUnknownVersion) {
  auto r = R().FindKind("mla-latent/v2");
  ASSERT_EQ(r.status().code(), StatusCode::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find("knows mla-latent at v1 only"), std::string::npos)
      << r.status().message();
  auto t = R().FindTransform("shuffle-zstd/v2");
  ASSERT_EQ(t.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(t.status().message().find("shuffle-zstd at v1 only"), std::string::npos) << t.status().message();
}

TEST(RegistryTest, KindsAndTransformsAreSeparateNamespaces) {
  EXPECT_FALSE(R().FindKind(kRawTransform).ok());
  EXPECT_FALSE(R().FindTransform(kMlaLatentKind).ok());
  EXPECT_TRUE(R().FindKind("Mla-latent/v1").status().IsInvalidArgument());
}

TEST(RegistryTest, ResolvesWrappedIdentitiesExactly) {
  auto ok = R().ResolveWrapped("shuffle-zstd/v1(mla-latent/v1)");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->first->id(), kShuffleZstdTransform);
  EXPECT_EQ(ok->second->kind(), kMlaLatentKind);
  EXPECT_EQ(R().ResolveWrapped("shuffle-zstd/v1(mla-latent/v2)").status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(R().ResolveWrapped("shuffle-zstd/v3(mla-latent/v1)").status().code(), StatusCode::kNotSupported);
  for (std::string_view bad :
       {"shuffle-zstd/v1", "shuffle-zstd/v1(mla-latent/v1) ", "shuffle-zstd/v1 (mla-latent/v1)",
        "raw/v1(shuffle-zstd/v1(mla-latent/v1))", "(mla-latent/v1)", "raw/v1()"}) {
    EXPECT_FALSE(R().ResolveWrapped(bad).ok()) << bad;
  }
}

TEST(RegistryTest, KindForPicksTheCurrentCodecOfAShape) {
  EXPECT_EQ((*R().KindFor(LatentShape{}))->kind(), kMlaLatentKind);
  EXPECT_EQ((*R().KindFor(RecurrentShape{}))->kind(), kKdaRecurrentKind);
  EXPECT_EQ((*R().KindFor(KvShape{}))->kind(), kKvPlainKind);
}

TEST(RegistryTest, IdentitiesAreSortedAndComplete) {
  auto ids = R().Identities();
  EXPECT_EQ(ids, (std::vector<std::string>{"bf16/v1", "kda-recurrent/v1", "kv-indexed/v1", "kv-plain/v1",
                                           "kv-rotating/v1", "linear-state/v1", "mla-latent/v1", "q8_0/v1", "raw/v1", "shuffle-zstd/v1",
                                           "turboquant2/v1(kv-plain/v1)", "turboquant2/v1(kv-rotating/v1)",
                                           "turboquant4/v1(kv-plain/v1)", "turboquant4/v1(kv-rotating/v1)"}));
}

// Each KV format has its own kind, found only by its exact string; a wrapper
// kind never resolves as its inner kind or as a sibling.
TEST(RegistryTest, KvKindsAreExactStringsAndWrappersNameTheirInnerKind) {
  const std::pair<KvFormat, std::string_view> kinds[] = {
      {KvFormat{}, kKvPlainKind},
      {KvFormat{64, 0, 0, 0}, kKvRotatingKind},
      {KvFormat{0, 2, 16, 5}, kTurboQuant2PlainKind},
      {KvFormat{0, 4, 16, 5}, kTurboQuant4PlainKind},
      {KvFormat{64, 2, 16, 5}, kTurboQuant2RotatingKind},
      {KvFormat{64, 4, 16, 5}, kTurboQuant4RotatingKind},
  };
  for (const auto& [format, kind] : kinds) {
    EXPECT_EQ(KvKindOf(format), kind);
    auto c = R().FindKind(kind);
    ASSERT_TRUE(c.ok()) << kind << ": " << c.status().ToString();
    EXPECT_EQ((*c)->kind(), kind);
    KvShape shape{20, 6, 6, format, format.rotating() ? 20u : 0u};
    EXPECT_EQ((*R().KindFor(shape))->kind(), kind);
    // Another kind's codec does not accept the shape.
    for (const auto& entry : kinds) {
      const std::string_view other = entry.second;
      if (other != kind) {
        EXPECT_FALSE((*R().FindKind(other))->Accepts(shape)) << other << " accepts " << kind;
      }
    }
    // Header fields round-trip, and a field short is corruption.
    auto f = (*c)->ShapeFields(shape);
    auto back = (*c)->ShapeFromFields(f);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(std::get<KvShape>(*back) == shape) << kind;
    f.pop_back();
    EXPECT_TRUE((*c)->ShapeFromFields(f).status().IsCorruption()) << kind;
  }
  EXPECT_EQ(KvKindOf(KvFormat{0, 3, 16, 0}), "");
  EXPECT_EQ(R().FindKind("turboquant3/v1(kv-plain/v1)").status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(R().FindKind("turboquant4/v2(kv-plain/v1)").status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(R().FindKind("turboquant4/v1(kv-plain/v2)").status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(R().FindKind("turboquant4/v1").status().code(), StatusCode::kNotSupported);
  for (std::string_view bad : {"turboquant4/v1(kv-plain/v1", "turboquant4/v1()", "turboquant4/v1(kv-plain)",
                               "turboquant4/v1(turboquant2/v1(kv-plain/v1))", "Turboquant4/v1(kv-plain/v1)"}) {
    EXPECT_TRUE(R().FindKind(bad).status().IsInvalidArgument()) << bad;
  }
  auto plane = R().ResolveWrapped("shuffle-zstd/v1(turboquant4/v1(kv-rotating/v1))");
  ASSERT_TRUE(plane.ok()) << plane.status().ToString();
  EXPECT_EQ(plane->second->kind(), kTurboQuant4RotatingKind);
  EXPECT_FALSE(R().ResolveWrapped("shuffle-zstd/v1(raw/v1(kv-plain/v1))").ok());
}

TEST(RegistryTest, ShapeFieldsRoundTripAndRefuseWrongCounts) {
  LatentShape s{9, 10, 8, 4, 2, true, 8};
  const LayerCodec* c = *R().FindKind(kMlaLatentKind);
  auto f = c->ShapeFields(s);
  auto back = c->ShapeFromFields(f);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(std::get<LatentShape>(*back) == s);
  f.pop_back();
  EXPECT_TRUE(c->ShapeFromFields(f).status().IsCorruption());
  f = c->ShapeFields(s);
  f[1] = 1ull << 32;  // width does not fit 32 bits
  EXPECT_TRUE(c->ShapeFromFields(f).status().IsCorruption());
  f = c->ShapeFields(s);
  f[5] = 2;  // index_is_ring is a flag
  EXPECT_TRUE(c->ShapeFromFields(f).status().IsCorruption());
}

}  // namespace
}  // namespace primecache

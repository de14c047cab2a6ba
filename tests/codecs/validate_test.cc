// Shape invariants, validation against a target geometry (every disagreement
// named), whole-snapshot validation, and the stable digests.
#include <set>

#include "codec_test_util.h"

namespace primecache {
namespace {

using testing_util::GeometryOfBoundary;
using testing_util::MakeBoundary;
using testing_util::MakeKv;
using testing_util::MakeLatent;
using testing_util::MakeRecurrent;

void ExpectSays(const Status& s, std::string_view says) {
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find(says), std::string::npos) << "message: " << s.message() << "\nwanted: " << says;
}

TEST(CheckShapeTest, AcceptsWhatEnginesCapture) {
  EXPECT_TRUE(CheckShape(LatentShape{9, 576, 256, 4, 2, true, 64}).ok());
  EXPECT_TRUE(CheckShape(LatentShape{9, 576, 256, 4, 2, false, 0}).ok());
  EXPECT_TRUE(CheckShape(LatentShape{9, 512, 0, 0, 0, false, 0}).ok());
  EXPECT_TRUE(CheckShape(RecurrentShape{64, 128, 4}).ok());
  EXPECT_TRUE(CheckShape(KvShape{9, 128, 128}).ok());
}

TEST(CheckShapeTest, NamesEveryBrokenLatentInvariant) {
  ExpectSays(CheckShape(LatentShape{0, 8, 0, 0, 0, false, 0}), "len is 0");
  ExpectSays(CheckShape(LatentShape{9, 0, 0, 0, 0, false, 0}), "width is 0");
  ExpectSays(CheckShape(LatentShape{9, 8, 7, 4, 2, false, 0}), "index_width 7 is odd");
  ExpectSays(CheckShape(LatentShape{9, 8, 8, 0, 0, false, 0}), "pool is 0 with an indexer");
  ExpectSays(CheckShape(LatentShape{9, 8, 8, 4, 3, false, 0}), "pools_ready 3 != len / pool = 2");
  ExpectSays(CheckShape(LatentShape{9, 8, 8, 4, 2, true, 6}),
             "index_ring_rows 6 is not a positive multiple of pool 4");
  ExpectSays(CheckShape(LatentShape{9, 8, 8, 4, 2, true, 0}), "not a positive multiple");
  ExpectSays(CheckShape(LatentShape{9, 8, 8, 4, 2, false, 8}), "index_ring_rows 8 on a flat index plane");
  Status s = CheckShape(LatentShape{9, 8, 0, 4, 2, true, 8});
  ExpectSays(s, "pool 4 without an indexer");
  ExpectSays(s, "pools_ready 2 without an indexer");
  ExpectSays(s, "index_is_ring without an indexer");
  ExpectSays(s, "index_ring_rows 8 without an indexer");
}

TEST(CheckShapeTest, NamesBrokenRecurrentAndKvInvariants) {
  ExpectSays(CheckShape(RecurrentShape{0, 4, 4}), "heads is 0");
  ExpectSays(CheckShape(RecurrentShape{2, 0, 4}), "head_dim is 0");
  ExpectSays(CheckShape(RecurrentShape{2, 4, 1}), "kernel 1 < 2");
  ExpectSays(CheckShape(KvShape{0, 4, 4}), "len is 0");
  ExpectSays(CheckShape(KvShape{3, 0, 4}), "k_width is 0");
  ExpectSays(CheckShape(KvShape{3, 4, 0}), "v_width is 0");
}

TEST(CheckSnapshotTest, PlanesMustHoldWhatTheShapeSays) {
  LayerSnapshot l = MakeLatent(9, 8, 4, 4);
  EXPECT_TRUE(CheckSnapshot(l).ok());
  std::get<LatentSnapshot>(l).pool_keys.push_back(0);
  ExpectSays(CheckSnapshot(l), "pool_keys holds 9 floats; pools_ready * index_width / 2 = 8");
  LayerSnapshot r = MakeRecurrent(2, 4, 4);
  std::get<RecurrentSnapshot>(r).conv_ring.pop_back();
  ExpectSays(CheckSnapshot(r), "conv_ring holds 71 floats");
  LayerSnapshot kv = MakeKv(3, 4, 4);
  std::get<KvSnapshot>(kv).v_rows.clear();
  ExpectSays(CheckSnapshot(kv), "v_rows holds 0 floats; len * v_width = 12");
}

TEST(MakeSnapshotTest, AllocatesEveryPlane) {
  auto s = MakeSnapshot(LatentShape{9, 8, 8, 4, 2, true, 8});
  ASSERT_TRUE(s.ok());
  const auto& l = std::get<LatentSnapshot>(*s);
  EXPECT_EQ(l.latent_rows.size(), 72u);
  EXPECT_EQ(l.index_tail_rows.size(), 8u);
  EXPECT_EQ(l.pool_keys.size(), 8u);
  EXPECT_TRUE(CheckSnapshot(*s).ok());
  EXPECT_FALSE(MakeSnapshot(RecurrentShape{1, 1, 1}).ok());
}

TEST(ValidateTest, AcceptsAMatchingPlanAndRingOrFlatTargets) {
  LayerSnapshot l = MakeLatent(203, 24, 8, 4, 16);
  EXPECT_TRUE(Validate(l, LatentGeometry{24, 16, 4, 16, 4096}).ok());
  EXPECT_TRUE(Validate(l, LatentGeometry{24, 16, 4, 0, 4096}).ok())
      << "a ring snapshot restores into a flat plane";
  EXPECT_TRUE(Validate(l, LatentGeometry{24, 16, 4, 4, 203}).ok()) << "a tail of 3 fits a ring of one pool";
  EXPECT_TRUE(Validate(MakeRecurrent(2, 4, 4), RecurrentShape{2, 4, 4}).ok());
  EXPECT_TRUE(Validate(MakeKv(5, 4, 6), KvGeometry{4, 6, 5}).ok());
}

TEST(ValidateTest, ListsEveryDisagreementAtOnce) {
  LayerSnapshot l = MakeLatent(203, 24, 8, 4, 16);
  Status s = Validate(l, LatentGeometry{576, 256, 8, 0, 100});
  ExpectSays(s, "width 24 != plan 576");
  ExpectSays(s, "index_width 16 != plan 256");
  ExpectSays(s, "pool 4 != plan 8");
  ExpectSays(s, "len 203 > max_ctx 100");
  s = Validate(MakeRecurrent(2, 4, 4), RecurrentShape{3, 5, 2});
  ExpectSays(s, "heads 2 != plan 3");
  ExpectSays(s, "head_dim 4 != plan 5");
  ExpectSays(s, "kernel 4 != plan 2");
  s = Validate(MakeKv(5, 4, 6), KvGeometry{6, 4, 4});
  ExpectSays(s, "k_width 4 != plan 6");
  ExpectSays(s, "v_width 6 != plan 4");
  ExpectSays(s, "len 5 > max_ctx 4");
}

TEST(ValidateTest, RefusesAnotherKindAndAnInconsistentSnapshot) {
  ExpectSays(Validate(MakeKv(5, 4, 6), LatentGeometry{4, 0, 0, 0, 9}),
             "layer is a kv layer; the plan expects a latent layer");
  LayerSnapshot l = MakeLatent(9, 8, 4, 4);
  std::get<LatentSnapshot>(l).shape.pools_ready = 1;
  ExpectSays(Validate(l, LatentGeometry{8, 8, 4, 0, 64}), "pools_ready 1 != len / pool = 2");
  LayerSnapshot m = MakeLatent(9, 8, 4, 4);
  std::get<LatentSnapshot>(m).latent_rows.pop_back();
  ExpectSays(Validate(m, LatentGeometry{8, 8, 4, 0, 64}), "latent_rows holds 71 floats");
}

TEST(ValidateTest, KvShapesOfEveryKindCheckTheirOwnRules) {
  const KvFormat rot{8, 0, 0, 0}, tq{0, 4, 16, 7}, tq_rot{8, 2, 16, 7};
  EXPECT_TRUE(CheckShape(KvShape{5, 6, 6, rot, 5}).ok());
  EXPECT_TRUE(CheckShape(KvShape{20, 6, 6, rot, 8}).ok());
  EXPECT_TRUE(CheckShape(KvShape{20, 6, 6, rot, 7}).ok()) << "a trim of one row at the floor";
  ExpectSays(CheckShape(KvShape{20, 6, 6, rot, 6}), "rotating buffer holds 6 rows");
  ExpectSays(CheckShape(KvShape{20, 6, 6, rot, 9}), "rotating buffer holds 9 rows");
  ExpectSays(CheckShape(KvShape{5, 6, 6, rot, 0}), "rotating buffer holds 0 rows");
  ExpectSays(CheckShape(KvShape{5, 6, 6, {}, 3}), "rows 3 on a plain KV layer");
  EXPECT_TRUE(CheckShape(KvShape{5, 6, 6, tq, 0}).ok());                // 2 entries of 3 words
  ExpectSays(CheckShape(KvShape{5, 7, 6, tq, 0}), "not whole TurboQuant entries of 3 words");
  ExpectSays(CheckShape(KvShape{5, 6, 6, KvFormat{0, 4, 24, 7}, 0}), "head_dim 24 is not a power of two");
  ExpectSays(CheckShape(KvShape{5, 6, 6, KvFormat{0, 4, 8, 7}, 0}), "head_dim 8 is not a power of two");
  ExpectSays(CheckShape(KvShape{5, 6, 6, KvFormat{0, 3, 16, 7}, 0}), "bits 3 name no storage kind");
  ExpectSays(CheckShape(KvShape{5, 6, 6, KvFormat{0, 0, 16, 0}, 0}), "head_dim or sign digest on f32 rows");
  EXPECT_TRUE(CheckShape(KvShape{20, 4, 4, tq_rot, 8}).ok());
  // A rotating snapshot's planes hold its rows, not len.
  auto snap = MakeSnapshot(KvShape{20, 6, 6, rot, 8});
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(std::get<KvSnapshot>(*snap).k_rows.size(), 48u);
  std::get<KvSnapshot>(*snap).v_rows.pop_back();
  ExpectSays(CheckSnapshot(*snap), "v_rows holds 47 floats; rows * v_width = 48");
}

TEST(ValidateTest, KvKindsWindowsAndSignVectorsAreComparedByName) {
  const KvFormat rot{8, 0, 0, 0}, tq4{0, 4, 16, 7}, tq2{0, 2, 16, 7};
  ExpectSays(Validate(KvShape{5, 6, 6, rot, 5}, KvGeometry{6, 6, 64, {}}), "kind kv-rotating/v1 != plan kv-plain/v1");
  ExpectSays(Validate(KvShape{5, 6, 6, tq4, 0}, KvGeometry{6, 6, 64, tq2}),
             "kind turboquant4/v1(kv-plain/v1) != plan turboquant2/v1(kv-plain/v1)");
  ExpectSays(Validate(KvShape{5, 6, 6, rot, 5}, KvGeometry{6, 6, 64, KvFormat{16, 0, 0, 0}}), "window 8 != plan 16");
  ExpectSays(Validate(KvShape{5, 6, 6, tq4, 0}, KvGeometry{6, 6, 64, KvFormat{0, 4, 16, 8}}), "sign vector");
  ExpectSays(Validate(KvShape{5, 6, 6, tq4, 0}, KvGeometry{6, 6, 64, KvFormat{0, 4, 32, 7}}),
             "TurboQuant head_dim 16 != plan 32");
  EXPECT_TRUE(Validate(KvShape{5, 6, 6, tq4, 0}, KvGeometry{6, 6, 64, tq4}).ok());
  // The geometry digest tells every format apart (a plain f32 plan's golden
  // value is held by the digest tests below, unchanged).
  std::set<std::pair<std::uint64_t, std::uint64_t>> digests;
  for (KvFormat f : {KvFormat{}, rot, KvFormat{16, 0, 0, 0}, tq4, tq2, KvFormat{0, 4, 16, 8}}) {
    const std::vector<LayerGeometry> g = {KvGeometry{6, 6, 64, f}};
    const Hash128 h = GeometryDigest(g);
    digests.insert({h.lo, h.hi});
  }
  EXPECT_EQ(digests.size(), 6u);
}

TEST(ValidateBoundaryTest, AWholeSnapshotIsValidOnlyIfEveryLayerIs) {
  BoundarySnapshot b = MakeBoundary(30);
  auto plan = GeometryOfBoundary(64);
  EXPECT_TRUE(Validate(b, plan).ok()) << Validate(b, plan).ToString();

  std::get<KvSnapshot>(b.layers[4]).k_rows.pop_back();
  plan[0] = RecurrentShape{2, 4, 3};
  Status s = Validate(b, plan);
  ExpectSays(s, "layer 0: kernel 4 != plan 3");
  ExpectSays(s, "layer 4: k_rows holds 179 floats");
  EXPECT_EQ(s.message().find("layer 1"), std::string::npos) << "layers that pass are not named";

  plan.pop_back();
  ExpectSays(Validate(b, plan), "5 layers; the plan has 4");
}

TEST(ValidateBoundaryTest, BoundaryLengthTokensAndLayerLengthsAgree) {
  BoundarySnapshot b = MakeBoundary(30);
  auto plan = GeometryOfBoundary(64);
  b.header.boundary_len = 31;
  ExpectSays(Validate(b, plan), "boundary_len 31 != 30 tokens");
  b = MakeBoundary(30);
  b.layers[1] = MakeLatent(29, 10, 4, 4, 8);
  ExpectSays(Validate(b, plan), "layer 1: len 29 != boundary_len 30");
  b.layers.clear();
  ExpectSays(CheckBoundary(b.header, {}), "no layers");
}

// Digests feed persistent keys: their value must not move between builds.
TEST(DigestTest, GeometryAndFingerprintDigestsAreStable) {
  auto plan = GeometryOfBoundary(4096);
  Hash128 g = GeometryDigest(plan);
  EXPECT_EQ(g, GeometryDigest(GeometryOfBoundary(4096)));
  EXPECT_NE(g, GeometryDigest(GeometryOfBoundary(4097)));
  auto swapped = plan;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(g, GeometryDigest(swapped));

  ModelFingerprint f = testing_util::TestFingerprint();
  Hash128 d = f.Digest();
  for (int field = 0; field < 4; ++field) {
    ModelFingerprint c = f;
    if (field == 0) c.architecture += "x";
    if (field == 1) c.plan_digest.hi ^= 1;
    if (field == 2) c.weights_digest.lo ^= 1;
    if (field == 3) c.codec_versions.back() = "shuffle-zstd/v2";
    EXPECT_NE(c.Digest(), d) << field;
  }
  // Length prefixes keep field boundaries apart.
  ModelFingerprint a = f, b = f;
  a.codec_versions = {"ab", "c"};
  b.codec_versions = {"a", "bc"};
  EXPECT_NE(a.Digest(), b.Digest());

  // Golden values: a change here changes every stored key; bump the format
  // strings in snapshot.cc instead of editing these.
  EXPECT_EQ(GeometryDigest(std::vector<LayerGeometry>{LatentGeometry{576, 256, 4, 64, 8192}}),
            (Hash128{0x777972110deea1ebull, 0xe6d6fa9591022f0eull}));
  ModelFingerprint golden{"hrm-tiny", {1, 2}, {3, 4}, {"kda-recurrent/v1", "mla-latent/v1"}};
  const Hash128 gd = golden.Digest();
  EXPECT_EQ(gd, (Hash128{0xef2b1125225e78fbull, 0xe98558b3283d182aull})) << std::hex << gd.lo << " " << gd.hi;
}

// The plan read back from layer shapes: the same at any length and ring
// size, another for another width, kind or order; CheckPlan and the store's
// validator hold layers against a fingerprint's plan_digest with it.
TEST(PlanTest, ShapesGiveTheirModelsPlanDigestAndAnotherPlanIsRefused) {
  auto shapes_of = [](const BoundarySnapshot& b) {
    std::vector<LayerShape> out;
    for (const LayerSnapshot& l : b.layers) out.push_back(ShapeOf(l));
    return out;
  };
  const std::vector<LayerShape> shapes = shapes_of(MakeBoundary(40));
  const Hash128 plan = PlanDigest(shapes);
  EXPECT_EQ(plan, PlanDigest(shapes_of(MakeBoundary(97))));
  // The plan is the geometry without capacity or ring: a ring-indexed layer
  // and its flat twin have one plan.
  std::vector<LayerGeometry> flat = GeometryOfBoundary(0);
  std::get<LatentGeometry>(flat[1]).index_ring_rows = 0;
  EXPECT_EQ(plan, GeometryDigest(flat));
  auto wider = shapes;
  std::get<LatentShape>(wider[3]).width += 1;
  EXPECT_NE(PlanDigest(wider), plan);
  auto other_kind = shapes;
  other_kind[4] = LatentShape{40, 12, 0, 0, 0, false, 0};  // 12 floats a row, as the KV layer's 6 + 6
  EXPECT_NE(PlanDigest(other_kind), plan);
  auto swapped = shapes;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(PlanDigest(swapped), plan);
  auto fewer = shapes;
  fewer.pop_back();
  EXPECT_NE(PlanDigest(fewer), plan);

  ModelFingerprint fp = testing_util::TestFingerprint();
  fp.plan_digest = plan;
  EXPECT_TRUE(CheckPlan(fp, shapes).ok());
  ExpectSays(CheckPlan(fp, wider), "these 5 layers are not the plan of model 'hrm-tiny': their plan digest is ");

  // The store's validator: every layer's header, against the descriptor.
  std::vector<std::string> headers;
  for (const LayerSnapshot& l : MakeBoundary(40).layers) {
    auto enc = EncodeLayer(l);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    headers.push_back(SerializeLayerHeader(enc->header));
  }
  std::vector<std::string_view> views(headers.begin(), headers.end());
  const auto& validator = *CodecLayerValidator();
  EXPECT_TRUE(validator.CheckModel(EncodeFingerprint(fp), views, 1).ok());
  EXPECT_TRUE(validator.CheckModel("", views, 1).ok()) << "no descriptor, no model to check against";
  ModelFingerprint other = fp;
  other.plan_digest.lo ^= 1;
  ExpectSays(validator.CheckModel(EncodeFingerprint(other), views, 1), "not the plan of model 'hrm-tiny'");
  std::swap(views[0], views[1]);
  ExpectSays(validator.CheckModel(EncodeFingerprint(fp), views, 1), "not the plan of model");
  EXPECT_FALSE(validator.CheckModel("not a fingerprint", views, 1).ok());
}

// The descriptor is the digest's preimage: it round-trips, hashes to the
// digest, and anything that is not exactly one encoding is refused.
TEST(FingerprintDescriptorTest, RoundTripsHashesToTheDigestAndRefusesDamage) {
  const ModelFingerprint f = testing_util::TestFingerprint();
  const std::string d = EncodeFingerprint(f);
  EXPECT_EQ(Checksum128(std::as_bytes(std::span(d.data(), d.size()))), f.Digest());
  auto back = DecodeFingerprint(d);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, f);

  for (std::size_t cut = 0; cut < d.size(); ++cut) {
    EXPECT_FALSE(DecodeFingerprint(std::string_view(d).substr(0, cut)).ok()) << "cut at " << cut;
  }
  EXPECT_FALSE(DecodeFingerprint(d + "x").ok());
  std::string wrong_tag = d;
  wrong_tag[0] ^= 1;
  EXPECT_FALSE(DecodeFingerprint(wrong_tag).ok());
  // Bounds are applied before anything is allocated.
  ModelFingerprint big = f;
  big.architecture.assign(5000, 'a');
  auto s = DecodeFingerprint(EncodeFingerprint(big));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("architecture"), std::string::npos) << s.status().ToString();
  ModelFingerprint many = f;
  many.codec_versions.assign(300, "raw/v1");
  EXPECT_FALSE(DecodeFingerprint(EncodeFingerprint(many)).ok());
  EXPECT_TRUE(DecodeFingerprint(EncodeFingerprint(many), 4096, 300).ok());
}

}  // namespace
}  // namespace primecache

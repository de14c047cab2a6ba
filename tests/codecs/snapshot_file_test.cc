// The .pcsnap container: round trips through an Env, every flipped bit and
// every cut refused, section-table damage refused by name, atomic writes.
#include <unistd.h>

#include <filesystem>

#include "codec_test_util.h"
#include "primecache/internal/env.h"
#include "tests/support/fault_env.h"

namespace primecache {
namespace {

using testing_util::BitEqual;
using testing_util::GeometryOfBoundary;
using testing_util::LayoutOf;
using testing_util::Load;
using testing_util::MakeBoundary;
using testing_util::ResealPcsnap;
using testing_util::Store;

void ExpectRefused(const Status& s, StatusCode code, std::string_view says) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(says), std::string::npos) << "message: " << s.message() << "\nwanted: " << says;
}

Status Parse(const std::string& f) {
  return ParsePcsnap(AsBytes(f)).status();
}

EncodedSnapshot Encoded(std::uint64_t len, const EncodeOptions& o = {}) {
  auto e = EncodeSnapshot(MakeBoundary(len), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return *e;
}

void ExpectSameBoundary(const BoundarySnapshot& a, const BoundarySnapshot& b) {
  EXPECT_EQ(a.header, b.header);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (std::size_t i = 0; i < a.layers.size(); ++i)
    EXPECT_TRUE(BitEqual(a.layers[i], b.layers[i])) << "layer " << i;
}

TEST(PcsnapTest, RoundTripsThroughAMemEnv) {
  auto env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/s").ok());
  BoundarySnapshot b = MakeBoundary(123);
  auto enc = EncodeSnapshot(b);
  ASSERT_TRUE(enc.ok());
  ASSERT_TRUE(WritePcsnap(env.get(), "/s/a.pcsnap", *enc).ok());
  auto read = ReadPcsnap(env.get(), "/s/a.pcsnap");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->header, b.header);
  EXPECT_TRUE(Validate(*read, GeometryOfBoundary(4096)).ok());
  auto dec = DecodeSnapshot(*read);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  ExpectSameBoundary(b, *dec);
  EXPECT_EQ(SerializePcsnap(*read), SerializePcsnap(*enc)) << "a snapshot leaves and comes back exactly";
}

TEST(PcsnapTest, RoundTripsThroughTheFileSystem) {
  char tmpl[] = "/tmp/primecache-pcsnap-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/b.pcsnap";
  EncodeOptions lossy;
  lossy.plane_transforms = {{PlaneId::kLatentRows, {"q8_0/v1", 0}}};
  auto enc = Encoded(77, lossy);
  ASSERT_TRUE(WritePcsnap(Env::Default(), path, enc).ok());
  auto read = ReadPcsnap(Env::Default(), path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(SerializePcsnap(*read), SerializePcsnap(enc));
  EXPECT_TRUE(DecodeSnapshot(*read).ok());
  std::filesystem::remove_all(tmpl);
}

TEST(PcsnapTest, EveryFlippedBitIsRefused) {
  EncodeOptions raw;
  raw.all_planes = TransformSpec{"raw/v1", 0};
  const std::string f = SerializePcsnap(Encoded(9, raw));
  ASSERT_TRUE(Parse(f).ok());
  ASSERT_LT(f.size(), 8192u) << "keep this small: every bit is tried";
  for (std::size_t bit = 0; bit < f.size() * 8; ++bit) {
    std::string g = f;
    g[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    Status s = Parse(g);
    ASSERT_FALSE(s.ok()) << "bit " << bit << " (byte " << bit / 8 << ") flipped and accepted";
  }
}

TEST(PcsnapTest, EveryCutIsRefused) {
  const std::string f = SerializePcsnap(Encoded(9));
  for (std::size_t n = 0; n < f.size(); ++n) {
    Status s = Parse(f.substr(0, n));
    ASSERT_TRUE(s.IsCorruption()) << n << ": " << s.ToString();
    ASSERT_NE(s.message().find("truncated"), std::string::npos) << n << ": " << s.message();
  }
  ExpectRefused(Parse(f + "!"), StatusCode::kCorruption, "1 bytes after the last section");
}

TEST(PcsnapTest, BadMagic) {
  std::string f = SerializePcsnap(Encoded(9));
  f[1] = 'Q';
  ExpectRefused(Parse(f), StatusCode::kCorruption, "not a .pcsnap file (bad magic)");
  ExpectRefused(Parse(SerializeLayer(Encoded(9).layers[0])), StatusCode::kCorruption, "bad magic");
}

TEST(PcsnapTest, UnsupportedVersionAndFlags) {
  std::string f = SerializePcsnap(Encoded(9));
  Store<std::uint32_t>(f, 8, 2);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kNotSupported, ".pcsnap version 2 is not supported");
  f = SerializePcsnap(Encoded(9));
  Store<std::uint32_t>(f, 20, 1);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kNotSupported, "flags 1");
}

TEST(PcsnapTest, ChecksumsOfEachRegionAreNamed) {
  const std::string f = SerializePcsnap(Encoded(9));
  auto l = LayoutOf(f);
  auto flip = [&](std::size_t at) {
    std::string g = f;
    g[at] ^= 0x20;
    return Parse(g);
  };
  ExpectRefused(flip(13), StatusCode::kCorruption, "preamble checksum mismatch");
  ExpectRefused(flip(l.header_at + 3), StatusCode::kCorruption, "boundary header checksum mismatch");
  ExpectRefused(flip(l.table_at + 20), StatusCode::kCorruption, "section table checksum mismatch");
  ExpectRefused(flip(l.data_at + 5), StatusCode::kCorruption, "section 0 checksum mismatch");
  ExpectRefused(flip(f.size() - 1), StatusCode::kCorruption, "section 4 checksum mismatch");
}

TEST(PcsnapTest, OverlappingSections) {
  std::string f = SerializePcsnap(Encoded(9));
  auto l = LayoutOf(f);
  const std::size_t entry1 = l.table_at + 32;
  Store<std::uint64_t>(f, entry1 + 8,
                       Load<std::uint64_t>(f, entry1 + 8) - 16);  // section 1 starts 16 bytes early
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kCorruption, "section 1 at offset");
  ExpectRefused(Parse(f), StatusCode::kCorruption, "overlaps section 0");

  f = SerializePcsnap(Encoded(9));
  Store<std::uint64_t>(f, l.table_at + 8, l.data_at - 8);  // section 0 over the table checksum
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kCorruption, "overlaps the section table");
}

TEST(PcsnapTest, GapsAndTruncatedOrOverflowingSections) {
  const std::string base = SerializePcsnap(Encoded(9));
  auto l = LayoutOf(base);
  std::string f = base;
  Store<std::uint64_t>(f, l.table_at + 32 + 8, Load<std::uint64_t>(f, l.table_at + 32 + 8) + 4);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kCorruption, "leaves a gap of 4 bytes");

  f = base;
  const std::size_t last = l.table_at + 32 * (l.sections - 1);
  Store<std::uint64_t>(f, last + 16, Load<std::uint64_t>(f, last + 16) + 100);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kCorruption, "truncated: section 4 ends at");

  f = base;
  Store<std::uint64_t>(f, last + 16, ~0ull - 8);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kCorruption, "offset + length overflows 64 bits");

  f = base;
  Store<std::uint32_t>(f, l.table_at, 9);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kNotSupported, "section 0 has unknown type 9");
}

TEST(PcsnapTest, SectionCountAndTokenCountAreBounded) {
  std::string f = SerializePcsnap(Encoded(9));
  Store<std::uint32_t>(f, 16, 0xffffffffu);
  Store<std::uint64_t>(f, 24, testing_util::Xxh(f, 0, 24));  // the preamble only: the table is not that long
  SnapshotLimits limits;
  ExpectRefused(ParsePcsnap(AsBytes(f), limits).status(), StatusCode::kResourceExhausted,
                "4294967295 sections exceed the limit of 4096");
  limits.max_layers = ~0ull;
  ExpectRefused(ParsePcsnap(AsBytes(f), limits).status(), StatusCode::kCorruption,
                "truncated: section table");

  f = SerializePcsnap(Encoded(9));
  auto l = LayoutOf(f);
  const std::size_t token_count_at = l.header_at + l.header_len - 9 * 4 - 8;
  ASSERT_EQ(Load<std::uint64_t>(f, token_count_at), 9u);
  Store<std::uint64_t>(f, token_count_at, 1ull << 62);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kResourceExhausted, "4611686018427387904 tokens exceed the limit");
  Store<std::uint64_t>(f, token_count_at, 10);
  ResealPcsnap(f);
  ExpectRefused(Parse(f), StatusCode::kCorruption, "10 tokens take 40 bytes; the header has 36 left");
}

TEST(PcsnapTest, BoundaryDisagreementsAreRefused) {
  EncodedSnapshot e = Encoded(9);
  e.header.boundary_len = 10;
  ExpectRefused(Parse(SerializePcsnap(e)), StatusCode::kCorruption, "boundary_len 10 != 9 tokens");
  e = Encoded(9);
  e.layers[1] = Encoded(10).layers[1];
  ExpectRefused(Parse(SerializePcsnap(e)), StatusCode::kCorruption, "layer 1: len 10 != boundary_len 9");
  e = Encoded(9);
  e.layers[3].header.kind = "mla-latent/v2";
  ExpectRefused(Parse(SerializePcsnap(e)), StatusCode::kNotSupported, "section 3: ");
  BoundarySnapshot b = MakeBoundary(9);
  b.header.tokens.pop_back();
  ExpectRefused(EncodeSnapshot(b).status(), StatusCode::kInvalidArgument, "boundary_len 9 != 8 tokens");
}

TEST(PcsnapTest, WhatWouldNotReadBackIsNotWritten) {
  BoundarySnapshot b = MakeBoundary(9);
  b.header.ns = std::string(5000, 'n');
  ExpectRefused(EncodeSnapshot(b).status(), StatusCode::kInvalidArgument,
                "namespace of 5000 bytes exceeds 4096");
  EncodedSnapshot e = Encoded(9);
  e.header.fingerprint.architecture = std::string(4097, 'a');
  auto env = NewMemEnv();
  ExpectRefused(WritePcsnap(env.get(), "/x.pcsnap", e), StatusCode::kInvalidArgument,
                "architecture of 4097 bytes exceeds 4096");
  EXPECT_FALSE(env->FileExists("/x.pcsnap"));
}

TEST(PcsnapTest, ValidateBeforeDecodingNamesEveryFailingLayer) {
  EncodedSnapshot e = Encoded(40);
  auto plan = GeometryOfBoundary(4096);
  EXPECT_TRUE(Validate(e, plan).ok());
  plan[1] = LatentGeometry{12, 8, 4, 8, 4096};
  plan[4] = KvGeometry{6, 6, 20};
  Status s = Validate(e, plan);
  ExpectRefused(s, StatusCode::kInvalidArgument, "layer 1: width 10 != plan 12");
  ExpectRefused(s, StatusCode::kInvalidArgument, "layer 4: len 40 > max_ctx 20");
  e.layers[2].chunks.pop_back();
  ExpectRefused(Validate(e, GeometryOfBoundary(4096)), StatusCode::kInvalidArgument,
                "layer 2: 1 chunks; the header records 2");
}

TEST(PcsnapTest, WritesAtomically) {
  auto mem = NewMemEnv();
  ASSERT_TRUE(mem->CreateDir("/s").ok());
  FaultInjectionEnv env(mem.get());
  const EncodedSnapshot old_snap = Encoded(9), new_snap = Encoded(12);
  ASSERT_TRUE(WritePcsnap(&env, "/s/x.pcsnap", old_snap).ok());
  env.FailNth(FaultOp::kRename, 1);
  EXPECT_FALSE(WritePcsnap(&env, "/s/x.pcsnap", new_snap).ok());
  auto read = ReadPcsnap(&env, "/s/x.pcsnap");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->header.boundary_len, 9u) << "the old file is intact";
  EXPECT_EQ(*mem->GetChildren("/s"), std::vector<std::string>{"x.pcsnap"}) << "no temp file left";

  ASSERT_TRUE(WritePcsnap(&env, "/s/x.pcsnap", new_snap).ok());
  ASSERT_TRUE(env.SimulateCrash().ok());
  read = ReadPcsnap(&env, "/s/x.pcsnap");
  ASSERT_TRUE(read.ok()) << "synced and renamed: survives a crash: " << read.status().ToString();
  EXPECT_EQ(read->header.boundary_len, 12u);
}

TEST(PcsnapTest, ReadRefusesFilesOverTheLimitBeforeReading) {
  auto env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/s").ok());
  ASSERT_TRUE(WritePcsnap(env.get(), "/s/x.pcsnap", Encoded(9)).ok());
  SnapshotLimits limits;
  limits.max_file_bytes = 100;
  ExpectRefused(ReadPcsnap(env.get(), "/s/x.pcsnap", limits).status(), StatusCode::kResourceExhausted,
                "exceed the limit of 100");
  EXPECT_TRUE(ReadPcsnap(env.get(), "/s/missing.pcsnap").status().IsNotFound() ||
              !ReadPcsnap(env.get(), "/s/missing.pcsnap").ok());
}

}  // namespace
}  // namespace primecache

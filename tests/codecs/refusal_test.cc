// One test per kind of damage to an encoded layer: each must be refused, with
// a message that says what disagrees. Headers are tampered with in memory and
// re-serialized (so their checksum is right) to reach the check behind it.
#include "codec_test_util.h"

namespace primecache {
namespace {

using testing_util::MakeKv;
using testing_util::MakeLatent;
using testing_util::MakeRecurrent;

class RefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EncodeOptions o;
    o.all_planes = TransformSpec{"raw/v1", 0};
    o.target_chunk_bytes = 1000;
    auto enc = EncodeLayer(MakeLatent(203, 24, 8, 4, 16), o);
    ASSERT_TRUE(enc.ok());
    layer_ = *enc;
  }

  // Serializes (sealing the header checksum) and parses back.
  static Status Reparse(const EncodedLayer& l, const CodecLimits& limits = {}) {
    std::string flat = SerializeLayer(l);
    return ParseLayer(AsBytes(flat), limits).status();
  }
  static Status Redecode(const EncodedLayer& l) { return DecodeLayer(l).status(); }

  static void ExpectRefused(const Status& s, StatusCode code, std::string_view says) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(says), std::string::npos)
        << "message: " << s.message() << "\nwanted: " << says;
  }

  LatentShape& Shape(EncodedLayer& l) { return std::get<LatentShape>(l.header.shape); }

  EncodedLayer layer_;
};

TEST_F(RefusalTest, TheUntouchedLayerPasses) {
  EXPECT_TRUE(Reparse(layer_).ok());
  EXPECT_TRUE(Redecode(layer_).ok());
}

TEST_F(RefusalTest, BadMagic) {
  std::string flat = SerializeLayer(layer_);
  flat[0] = 'X';
  ExpectRefused(ParseLayer(AsBytes(flat)).status(), StatusCode::kCorruption, "bad magic");
}

TEST_F(RefusalTest, UnsupportedHeaderFormatVersion) {
  std::string flat = SerializeLayer(layer_);
  testing_util::Store<std::uint32_t>(flat, 4, 2);
  testing_util::ResealLayerHeader(flat);
  ExpectRefused(ParseLayer(AsBytes(flat)).status(), StatusCode::kNotSupported, "format version 2");
}

TEST_F(RefusalTest, UnknownKind) {
  layer_.header.kind = "gdn-recurrent/v1";
  ExpectRefused(Reparse(layer_), StatusCode::kNotSupported, "unknown storage kind 'gdn-recurrent/v1'");
  ExpectRefused(Redecode(layer_), StatusCode::kNotSupported, "unknown storage kind");
}

TEST_F(RefusalTest, KnownKindAtAnUnknownVersion) {
  layer_.header.kind = "mla-latent/v2";
  ExpectRefused(Reparse(layer_), StatusCode::kNotSupported, "mla-latent at v1 only");
  ExpectRefused(Redecode(layer_), StatusCode::kNotSupported, "mla-latent at v1 only");
}

TEST_F(RefusalTest, MalformedKind) {
  layer_.header.kind = "mla-latent";
  ExpectRefused(Reparse(layer_), StatusCode::kCorruption, "malformed identity");
}

TEST_F(RefusalTest, UnknownTransformOrTransformVersion) {
  layer_.header.planes[0].transform = "lz4/v1";
  ExpectRefused(Reparse(layer_), StatusCode::kNotSupported, "unknown transform 'lz4/v1'");
  layer_.header.planes[0].transform = "raw/v9";
  ExpectRefused(Redecode(layer_), StatusCode::kNotSupported, "raw at v1 only");
}

TEST_F(RefusalTest, LossyPoolKeysOrIndexRows) {
  for (std::size_t p : {1u, 2u}) {
    EncodedLayer l = layer_;
    l.header.planes[p].transform = "bf16/v1";
    ExpectRefused(Reparse(l), StatusCode::kCorruption, "must be lossless");
  }
}

TEST_F(RefusalTest, TruncatedAtEveryLength) {
  const std::string flat = SerializeLayer(layer_);
  for (std::size_t n = 0; n < flat.size(); ++n) {
    Status s = ParseLayer(AsBytes(std::string_view(flat).substr(0, n))).status();
    ASSERT_TRUE(s.IsCorruption()) << n << ": " << s.ToString();
    ASSERT_NE(s.message().find("truncated"), std::string::npos) << n << ": " << s.message();
  }
}

TEST_F(RefusalTest, TrailingBytes) {
  std::string flat = SerializeLayer(layer_) + "zz";
  ExpectRefused(ParseLayer(AsBytes(flat)).status(), StatusCode::kCorruption, "2 bytes after the last chunk");
}

TEST_F(RefusalTest, HeaderChecksumMismatch) {
  std::string flat = SerializeLayer(layer_);
  flat[20] ^= 1;
  ExpectRefused(ParseLayer(AsBytes(flat)).status(), StatusCode::kCorruption,
                "layer header checksum mismatch");
}

TEST_F(RefusalTest, EncodedChecksumMismatch) {
  layer_.chunks[5][7] ^= 0x10;
  ExpectRefused(Redecode(layer_), StatusCode::kCorruption, "checksum mismatch on the encoded bytes");
  ExpectRefused(Reparse(layer_), StatusCode::kCorruption, "checksum mismatch on the encoded bytes");
}

TEST_F(RefusalTest, RawChecksumMismatch) {
  // The encoded bytes agree with their checksum, but decode to other values.
  layer_.chunks[5][7] ^= 0x10;
  layer_.header.planes[0].chunks[5].encoded_checksum = Checksum64(AsBytes(layer_.chunks[5]));
  ExpectRefused(Redecode(layer_), StatusCode::kCorruption, "checksum mismatch on the decoded (raw) bytes");
  ExpectRefused(Redecode(layer_), StatusCode::kCorruption, "latent_rows chunk 5 (rows [40, 48))");
}

TEST_F(RefusalTest, RawChecksumMismatchUnderEveryTransform) {
  for (auto id : {kShuffleZstdTransform, kBf16Transform, kQ8_0Transform}) {
    EncodeOptions o;
    o.plane_transforms = {{PlaneId::kLatentRows, {std::string(id), 0 + (id == kShuffleZstdTransform)}}};
    auto enc = EncodeLayer(MakeLatent(50, 24, 8, 4), o);
    ASSERT_TRUE(enc.ok());
    enc->header.planes[0].chunks[0].raw_checksum ^= 1;
    ExpectRefused(Redecode(*enc), StatusCode::kCorruption, "checksum mismatch on the decoded (raw) bytes");
  }
}

TEST_F(RefusalTest, GeometryMismatchBetweenPlanesAndMetadata) {
  EncodedLayer l = layer_;
  l.header.planes[0].row_width = 23;
  ExpectRefused(Reparse(l), StatusCode::kCorruption,
                "records 203 rows of 23 values; the layer's metadata makes 203 rows of 24");
  l = layer_;
  l.header.planes[0].rows = 202;
  ExpectRefused(Reparse(l), StatusCode::kCorruption, "records 202 rows");
  l = layer_;
  Shape(l).width = 25;
  ExpectRefused(Redecode(l), StatusCode::kCorruption, "the layer's metadata makes 203 rows of 25");
}

TEST_F(RefusalTest, GeometryMismatchAgainstTheTarget) {
  LatentGeometry target{24, 16, 4, 16, 4096};
  EXPECT_TRUE(Validate(layer_.header, target).ok());
  target.width = 576;
  target.max_ctx = 100;
  Status s = Validate(layer_.header, target);
  ExpectRefused(s, StatusCode::kInvalidArgument, "width 24 != plan 576");
  ExpectRefused(s, StatusCode::kInvalidArgument, "len 203 > max_ctx 100");
  ExpectRefused(Validate(layer_.header, RecurrentShape{1, 1, 4}), StatusCode::kInvalidArgument,
                "the plan expects a recurrent layer");
}

TEST_F(RefusalTest, PoolsReadyDisagreesWithLenOverPool) {
  Shape(layer_).pools_ready = 49;
  ExpectRefused(Reparse(layer_), StatusCode::kCorruption,
                "pools_ready 49 != len / pool = 50 (len 203, pool 4)");
  ExpectRefused(Redecode(layer_), StatusCode::kCorruption, "pools_ready 49 != len / pool = 50");
  LayerSnapshot snap = MakeLatent(203, 24, 8, 4, 16);
  std::get<LatentSnapshot>(snap).shape.pools_ready = 51;
  ExpectRefused(EncodeLayer(snap).status(), StatusCode::kInvalidArgument,
                "pools_ready 51 != len / pool = 50");
}

TEST_F(RefusalTest, TailRowCountDisagreesWithLenAndPoolsReady) {
  layer_.header.planes[1].rows = 4;
  ExpectRefused(Reparse(layer_), StatusCode::kCorruption,
                "plane 1 (index_tail_rows) records 4 rows of 16 values; the layer's metadata makes 3 rows");
  LayerSnapshot snap = MakeLatent(203, 24, 8, 4, 16);
  std::get<LatentSnapshot>(snap).index_tail_rows.resize(4 * 16);
  ExpectRefused(EncodeLayer(snap).status(), StatusCode::kInvalidArgument,
                "index_tail_rows holds 64 floats; (len - pools_ready * pool) * index_width = 48");
}

TEST_F(RefusalTest, OverflowingLengths) {
  EncodedLayer l = layer_;
  Shape(l).len = 1ull << 62;
  Shape(l).pools_ready = (1ull << 62) / 4;
  CodecLimits huge{~0ull, ~0ull, ~0ull, ~0ull, ~0ull};
  ExpectRefused(Reparse(l, huge), StatusCode::kCorruption,
                "len * width (4611686018427387904 * 24) overflows 64 bits");

  RecurrentShape r{0xffffffffu, 0xffffffffu, 0xffffffffu};
  ExpectRefused(CheckShape(r), StatusCode::kInvalidArgument, "overflows 64 bits");
  ExpectRefused(CheckShape(KvShape{1ull << 63, 2, 2}), StatusCode::kInvalidArgument,
                "len * k_width overflows");
  LatentShape keys{1ull << 63, 1, 0xfffffffeu, 1, 1ull << 63, false, 0};
  ExpectRefused(CheckShape(keys), StatusCode::kInvalidArgument, "overflows 64 bits");

  l = layer_;
  l.header.planes[0].chunk_rows = 1ull << 56;
  ExpectRefused(Reparse(l, huge), StatusCode::kCorruption,
                "records 26 chunks; 203 rows at 72057594037927936 a chunk make 1");
  l.header.planes[0].chunk_rows = 1ull << 63;
  ExpectRefused(Reparse(l, huge), StatusCode::kCorruption, "chunk_rows 9223372036854775808 outside");
  l = layer_;
  l.header.planes[0].chunks[0].encoded_bytes = ~0ull;
  ExpectRefused(Reparse(l, huge), StatusCode::kCorruption, "encoded bytes");
}

TEST_F(RefusalTest, Limits) {
  CodecLimits l;
  l.max_tokens = 200;
  ExpectRefused(Reparse(layer_, l), StatusCode::kResourceExhausted,
                "len 203 exceeds the limit of 200 tokens");
  l = {};
  l.max_chunks = 20;
  ExpectRefused(Reparse(layer_, l), StatusCode::kResourceExhausted, "more than 20 chunks");
  l = {};
  l.max_layer_bytes = 1000;
  ExpectRefused(Reparse(layer_, l), StatusCode::kResourceExhausted, "the limit is 1000");
  l = {};
  l.max_row_values = 16;
  ExpectRefused(Reparse(layer_, l), StatusCode::kResourceExhausted, "latent_rows rows of 24 values exceed");
  l = {};
  l.max_chunk_bytes = 200;  // rows of 96 bytes: the header's 8-row chunks are too big
  ExpectRefused(Reparse(layer_, l), StatusCode::kCorruption, "chunk_rows 8 outside [1, 2]");
  auto rec = EncodeLayer(MakeRecurrent(2, 8, 4));
  ASSERT_TRUE(rec.ok());
  l = {};
  l.max_chunk_bytes = 256;  // the state (2 * 8 * 8 floats) is one chunk of 512 bytes
  ExpectRefused(Reparse(*rec, l), StatusCode::kResourceExhausted, "state (one chunk) takes 512 bytes");
}

TEST_F(RefusalTest, ChunkTableDisagreements) {
  EncodedLayer l = layer_;
  l.header.planes[0].chunks.pop_back();
  l.chunks.erase(l.chunks.begin() + 25);
  ExpectRefused(Reparse(l), StatusCode::kCorruption, "records 25 chunks; 203 rows at 8 a chunk make 26");
  l = layer_;
  l.header.planes[0].chunks[3].raw_bytes += 4;
  ExpectRefused(Reparse(l), StatusCode::kCorruption, "records 772 raw bytes; its rows make 768");
  l = layer_;
  l.header.planes[0].chunks[3].encoded_bytes -= 4;
  ExpectRefused(Reparse(l), StatusCode::kCorruption, "raw/v1 makes exactly 768");
  l = layer_;
  l.header.planes[1].chunk_rows = 2;
  ExpectRefused(Reparse(l), StatusCode::kCorruption, "one chunk of all 3 rows; chunk_rows is 2");
  l = layer_;
  l.header.planes[0].chunk_rows = 0;
  ExpectRefused(Reparse(l), StatusCode::kCorruption, "chunk_rows 0 outside");
  auto dense = EncodeLayer(MakeLatent(20, 8, 0, 0));
  ASSERT_TRUE(dense.ok());
  dense->header.planes[2].chunk_rows = 4;
  ExpectRefused(Reparse(*dense), StatusCode::kCorruption, "holds no values but records chunk_rows 4");
}

TEST_F(RefusalTest, PlanesMissingOrOutOfOrder) {
  EncodedLayer l = layer_;
  std::swap(l.header.planes[1], l.header.planes[2]);
  ExpectRefused(Reparse(l), StatusCode::kCorruption, "plane 1 (index_tail_rows) is recorded as pool_keys");
  l = layer_;
  l.header.planes.pop_back();
  ExpectRefused(Redecode(l), StatusCode::kCorruption, "has 3 planes; the header records 2");
}

TEST_F(RefusalTest, UnknownPlaneIdInTheBytes) {
  std::string flat = SerializeLayer(layer_);
  // magic(4) version(4) length(4) | kind: len(1) + 13 | 7 fields: 1 + 56 | plane count(1) | plane id
  const std::size_t at = 12 + 1 + layer_.header.kind.size() + 1 + 7 * 8 + 1;
  ASSERT_EQ(flat[at], 1);
  flat[at] = 42;
  testing_util::ResealLayerHeader(flat);
  ExpectRefused(ParseLayer(AsBytes(flat)).status(), StatusCode::kCorruption, "unknown plane id 42");
}

TEST_F(RefusalTest, WrongNumberOfChunksOrChunkSizes) {
  EncodedLayer l = layer_;
  l.chunks.pop_back();
  ExpectRefused(Redecode(l), StatusCode::kCorruption, "30 chunks; the header records 31");
  l = layer_;
  l.chunks[0] += "x";
  ExpectRefused(Redecode(l), StatusCode::kCorruption, "769 encoded bytes; the header records 768");
}

TEST_F(RefusalTest, KindsOfOtherLayersToo) {
  for (auto enc : {EncodeLayer(MakeRecurrent(2, 4, 4)), EncodeLayer(MakeKv(30, 4, 8))}) {
    ASSERT_TRUE(enc.ok());
    EncodedLayer l = *enc;
    l.header.planes[0].chunks[0].raw_checksum ^= 4;
    ExpectRefused(Redecode(l), StatusCode::kCorruption, "checksum mismatch on the decoded (raw) bytes");
    l = *enc;
    l.chunks[1][0] ^= 4;
    ExpectRefused(Redecode(l), StatusCode::kCorruption, "checksum mismatch on the encoded bytes");
    l = *enc;
    l.header.kind = l.header.kind == kKvPlainKind ? "kv-plain/v7" : "kda-recurrent/v0";
    EXPECT_FALSE(Reparse(l).ok());
  }
}

}  // namespace
}  // namespace primecache

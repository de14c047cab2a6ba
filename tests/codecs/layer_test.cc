// Encoding and decoding whole layers: every kind x transform round trip,
// decoding into caller memory and chunk by chunk, the chunking rules, and the
// dedup property the statestore builds on.
#include <atomic>
#include <cmath>
#include <thread>

#include "codec_test_util.h"

namespace primecache {
namespace {

using testing_util::BitEqual;
using testing_util::MakeKv;
using testing_util::MakeLatent;
using testing_util::MakeRecurrent;

struct KindCase {
  const char* name;
  LayerSnapshot layer;
};

std::vector<KindCase> Kinds() {
  return {
      {"latent_ring", MakeLatent(203, 24, 8, 4, 16)},     // indexer, ring, tail of 3
      {"latent_flat", MakeLatent(203, 24, 8, 4, 0)},      // indexer, flat index plane
      {"latent_no_tail", MakeLatent(200, 24, 8, 4, 16)},  // len a multiple of pool: empty tail
      {"latent_short", MakeLatent(3, 24, 8, 4, 8)},       // no pool ready yet: empty key plane
      {"latent_dense", MakeLatent(203, 24, 0, 0)},        // no indexer
      {"latent_nope", MakeLatent(77, 16, 4, 2, 0)},       // NoPE width, pool 2
      {"recurrent", MakeRecurrent(3, 8, 4)},
      {"recurrent_k2", MakeRecurrent(1, 5, 2)},
      {"kv", MakeKv(203, 12, 20)},
  };
}

struct TransformCase {
  const char* name;
  TransformSpec spec;
};

std::vector<TransformCase> Transforms() {
  return {{"raw", {"raw/v1", 0}},
          {"shuffle_zstd_1", {"shuffle-zstd/v1", 1}},
          {"shuffle_zstd_9", {"shuffle-zstd/v1", 9}},
          {"shuffle_zstd_neg", {"shuffle-zstd/v1", -3}},
          {"bf16", {"bf16/v1", 0}},
          {"q8_0", {"q8_0/v1", 0}}};
}

// Lossy transforms apply to latent rows only; every other plane stays lossless.
EncodeOptions OptionsFor(const TransformSpec& spec, std::uint64_t chunk_bytes) {
  EncodeOptions o;
  o.target_chunk_bytes = chunk_bytes;
  auto t = CodecRegistry::Default().FindTransform(spec.id);
  if ((*t)->lossy()) {
    o.plane_transforms = {{PlaneId::kLatentRows, spec}};
  } else {
    o.all_planes = spec;
  }
  return o;
}

// q8_0 blocks start afresh in every chunk (chunks are encoded independently).
void ExpectLatentRowsWithinBound(const std::string& id, const std::vector<float>& in,
                                 const std::vector<float>& out, std::uint64_t chunk_values) {
  ASSERT_EQ(in.size(), out.size());
  for (std::size_t chunk = 0; chunk < in.size(); chunk += chunk_values) {
    const std::size_t chunk_end = std::min<std::size_t>(in.size(), chunk + chunk_values);
    for (std::size_t start = chunk; start < chunk_end; start += 32) {
      const std::size_t end = std::min(chunk_end, start + 32);
      double amax = 0;
      for (std::size_t i = start; i < end; ++i) amax = std::max(amax, std::fabs(double{in[i]}));
      for (std::size_t i = start; i < end; ++i) {
        const double err = std::fabs(double{in[i]} - double{out[i]});
        const double bound = id == "bf16/v1" ? std::ldexp(std::fabs(double{in[i]}), -8)
                                             : amax / 254 + std::ldexp(amax, -20) + std::ldexp(1.0, -140);
        ASSERT_LE(err, bound) << id << " value " << i;
      }
    }
  }
}

class RoundTripTest : public ::testing::TestWithParam<std::tuple<KindCase, TransformCase, std::uint64_t>> {};

TEST_P(RoundTripTest, DecodesWhatWasEncoded) {
  const auto& [kind, transform, chunk_bytes] = GetParam();
  auto t = CodecRegistry::Default().FindTransform(transform.spec.id);
  const bool lossy = (*t)->lossy();
  EncodeOptions options = OptionsFor(transform.spec, chunk_bytes);

  auto enc = EncodeLayer(kind.layer, options);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ(enc->header.kind, (*CodecRegistry::Default().KindFor(ShapeOf(kind.layer)))->kind());
  EXPECT_EQ(enc->chunks.size(), enc->header.chunk_count());
  EXPECT_TRUE(CheckHeader(enc->header).ok()) << CheckHeader(enc->header).ToString();

  // In memory, and through the flat form.
  auto flat = SerializeLayer(*enc);
  auto parsed = ParseLayer(AsBytes(flat));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->header, enc->header);
  EXPECT_EQ(parsed->chunks, enc->chunks);
  auto dec = DecodeLayer(*parsed);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();

  if (!lossy || !std::holds_alternative<LatentSnapshot>(kind.layer)) {
    EXPECT_TRUE(BitEqual(kind.layer, *dec));
    return;
  }
  const auto& in = std::get<LatentSnapshot>(kind.layer);
  const auto& out = std::get<LatentSnapshot>(*dec);
  EXPECT_TRUE(in.shape == out.shape);
  ExpectLatentRowsWithinBound(transform.spec.id, in.latent_rows, out.latent_rows,
                              parsed->header.planes[0].chunk_rows * in.shape.width);
  EXPECT_TRUE(BitEqual(in.index_tail_rows, out.index_tail_rows)) << "index rows are never lossy";
  EXPECT_TRUE(BitEqual(in.pool_keys, out.pool_keys)) << "pool keys are never lossy";
}

INSTANTIATE_TEST_SUITE_P(EveryKindAndTransform, RoundTripTest,
                         ::testing::Combine(::testing::ValuesIn(Kinds()), ::testing::ValuesIn(Transforms()),
                                            ::testing::Values(std::uint64_t{256}, kDefaultChunkBytes)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::get<1>(info.param).name + "_" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(LayerTest, LossyIsRefusedOnEveryPlaneButLatentRows) {
  for (auto lossy : {kBf16Transform, kQ8_0Transform}) {
    for (auto [plane, layer] :
         std::vector<std::pair<PlaneId, LayerSnapshot>>{{PlaneId::kIndexTailRows, MakeLatent(9, 8, 4, 4)},
                                                        {PlaneId::kPoolKeys, MakeLatent(9, 8, 4, 4)},
                                                        {PlaneId::kConvRing, MakeRecurrent(1, 4, 4)},
                                                        {PlaneId::kRecurrentState, MakeRecurrent(1, 4, 4)},
                                                        {PlaneId::kKeyRows, MakeKv(9, 4, 4)},
                                                        {PlaneId::kValueRows, MakeKv(9, 4, 4)}}) {
      EncodeOptions o;
      o.plane_transforms = {{plane, {std::string(lossy), 0}}};
      auto r = EncodeLayer(layer, o);
      ASSERT_TRUE(r.status().IsInvalidArgument()) << PlaneName(plane) << " " << r.status().ToString();
      EXPECT_NE(r.status().message().find("must be lossless"), std::string::npos);
    }
    EncodeOptions all;
    all.all_planes = TransformSpec{std::string(lossy), 0};
    EXPECT_TRUE(EncodeLayer(MakeLatent(9, 8, 4, 4), all).status().IsInvalidArgument())
        << "a lossy default reaches the index planes and is refused";
    EXPECT_TRUE(EncodeLayer(MakeLatent(9, 8, 0, 0), all).status().IsInvalidArgument())
        << "refused even where the index planes are empty: the request itself is wrong";
  }
}

TEST(LayerTest, RefusesUnknownTransformsAndBadLevels) {
  EncodeOptions o;
  o.all_planes = TransformSpec{"lz4/v1", 0};
  EXPECT_EQ(EncodeLayer(MakeKv(4, 4, 4), o).status().code(), StatusCode::kNotSupported);
  o.all_planes = TransformSpec{"raw/v2", 0};
  EXPECT_EQ(EncodeLayer(MakeKv(4, 4, 4), o).status().code(), StatusCode::kNotSupported);
  o.all_planes = TransformSpec{"raw/v1", 3};
  EXPECT_TRUE(EncodeLayer(MakeKv(4, 4, 4), o).status().IsInvalidArgument());
  o = {};
  o.target_chunk_bytes = 0;
  EXPECT_TRUE(EncodeLayer(MakeKv(4, 4, 4), o).status().IsInvalidArgument());
}

// The default is raw/v1 for every plane (DefaultTransform: the hot restore
// goes to the device by DMA only for raw chunks).
TEST(LayerTest, DefaultsAreRaw) {
  auto enc = EncodeLayer(MakeLatent(50, 8, 4, 4));
  ASSERT_TRUE(enc.ok());
  for (const auto& p : enc->header.planes) {
    EXPECT_EQ(p.transform, kRawTransform);
    EXPECT_EQ(p.level, 0);
  }
  EXPECT_EQ(enc->header.PlaneIdentity(0), "raw/v1(mla-latent/v1)");
  EXPECT_EQ(enc->header.PlaneIdentity(7), "");
}

TEST(LayerTest, ChunksAppendOnlyPlanesAtFixedRowsAndEagerPlanesOnce) {
  EncodeOptions o;
  o.target_chunk_bytes = 1000;  // rows of 24 floats (96 bytes): 8 rows a chunk
  auto enc = EncodeLayer(MakeLatent(203, 24, 8, 4, 16), o);
  ASSERT_TRUE(enc.ok());
  const auto& planes = enc->header.planes;
  EXPECT_EQ(planes[0].chunk_rows, 8u);
  EXPECT_EQ(planes[0].chunks.size(), 26u);  // ceil(203 / 8)
  EXPECT_EQ(planes[0].chunks.back().raw_bytes, 3u * 24 * 4);
  EXPECT_EQ(planes[1].chunk_rows, 3u);  // the tail: one chunk
  EXPECT_EQ(planes[1].chunks.size(), 1u);
  EXPECT_EQ(planes[2].chunk_rows, 16u);    // keys of 8 floats: 32 bytes a row
  EXPECT_EQ(planes[2].chunks.size(), 4u);  // 50 pools

  auto rec = EncodeLayer(MakeRecurrent(64, 128, 4));  // realistic KDA: 4 MiB state, one chunk
  ASSERT_TRUE(rec.ok());
  for (const auto& p : rec->header.planes) EXPECT_EQ(p.chunks.size(), 1u);
}

TEST(LayerTest, DefaultChunksHoldAtMostOneMebibyteAndAtMostTheRowCap) {
  for (std::uint64_t row_bytes = 4; row_bytes <= 256 * 1024; row_bytes += row_bytes / 3 + 4) {
    std::uint64_t rows = ChunkRowsFor(row_bytes, kDefaultChunkBytes);
    EXPECT_LE(rows * row_bytes, 1024u * 1024) << row_bytes;
    EXPECT_LE(rows, kDefaultMaxChunkRows) << row_bytes;
    // Either the cap cut it, or the chunk is at least a quarter of the target.
    EXPECT_TRUE(rows == kDefaultMaxChunkRows || rows * row_bytes >= 256u * 1024) << row_bytes;
    EXPECT_EQ(rows & (rows - 1), 0u) << "a power of two";
  }
  EXPECT_EQ(ChunkRowsFor(576 * 4, kDefaultChunkBytes), 256u);   // GLM-5-class latent rows: under the cap
  EXPECT_EQ(ChunkRowsFor(128 * 4, kDefaultChunkBytes), 1024u);  // pool keys of head_dim 128: the cap
  EXPECT_EQ(ChunkRowsFor(128 * 4, kDefaultChunkBytes, 1u << 30), 2048u);  // without it
  EXPECT_EQ(ChunkRowsFor(40 * 4, kDefaultChunkBytes), 1024u);             // the tiny model's latent rows
  EXPECT_EQ(ChunkRowsFor(40 * 4, kDefaultChunkBytes, 300), 256u);  // a cap rounds down to a power of two
  EXPECT_EQ(ChunkRowsFor(4 << 20, kDefaultChunkBytes), 1u);
}

TEST(LayerTest, AMaxChunkRowsOfZeroOrBeyondTheTokenLimitIsRefused) {
  for (std::uint64_t bad : {std::uint64_t{0}, CodecLimits{}.max_tokens + 1}) {
    EncodeOptions o;
    o.max_chunk_rows = bad;
    auto enc = EncodeLayer(MakeLatent(100, 10, 4, 4), o);
    ASSERT_FALSE(enc.ok()) << bad;
    EXPECT_EQ(enc.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(enc.status().message().find("max_chunk_rows"), std::string::npos) << enc.status().ToString();
  }
}

// The quickstart's two boundaries (1,427 and 1,464 tokens of the tiny model,
// latent rows of 40 floats) under the default options: before the row cap
// each small plane was one chunk whose bytes changed with its length, and
// the two shared nothing. Now they share every chunk but each plane's last.
TEST(LayerTest, SmallPlanesOfTwoBoundariesShareEveryChunkButTheLast) {
  auto a = EncodeLayer(MakeLatent(1427, 40, 16, 4));
  auto b = EncodeLayer(MakeLatent(1464, 40, 16, 4));
  ASSERT_TRUE(a.ok() && b.ok());
  std::size_t ca = 0, cb = 0, shared_bytes = 0;
  for (std::size_t p = 0; p < a->header.planes.size(); ++p) {
    const auto& pa = a->header.planes[p];
    const auto& pb = b->header.planes[p];
    if (pa.id == PlaneId::kLatentRows) {
      ASSERT_EQ(pa.chunks.size(), 2u) << "1,024 rows, then the rest";
      EXPECT_EQ(a->chunks[ca], b->chunks[cb]);
      EXPECT_NE(a->chunks[ca + 1], b->chunks[cb + 1]);
      shared_bytes += a->chunks[ca].size();
    }
    ca += pa.chunks.size();
    cb += pb.chunks.size();
  }
  EXPECT_GT(shared_bytes, 0u);
}

// The statestore keeps chunks content-addressed: the leading full chunks of
// a longer boundary of the same conversation must equal a shorter one's.
class DedupTest : public ::testing::TestWithParam<TransformCase> {};

TEST_P(DedupTest, LeadingChunksOfALongerBoundaryAreByteIdentical) {
  EncodeOptions o = OptionsFor(GetParam().spec, 1024);
  for (auto [short_layer, long_layer] : std::vector<std::pair<LayerSnapshot, LayerSnapshot>>{
           {MakeLatent(1001, 10, 4, 4, 8), MakeLatent(2503, 10, 4, 4, 8)},
           {MakeKv(1001, 10, 6), MakeKv(2503, 10, 6)}}) {
    auto a = EncodeLayer(short_layer, o);
    auto b = EncodeLayer(long_layer, o);
    ASSERT_TRUE(a.ok() && b.ok());
    std::size_t shared_chunks = 0, ca = 0, cb = 0;
    for (std::size_t p = 0; p < a->header.planes.size(); ++p) {
      const auto& pa = a->header.planes[p];
      const auto& pb = b->header.planes[p];
      if (LayerDecoder::Create(a->header)->planes()[p].append_only) {
        ASSERT_EQ(pa.chunk_rows, pb.chunk_rows);
        const std::uint64_t full = pa.rows / std::max<std::uint64_t>(pa.chunk_rows, 1);
        for (std::uint64_t k = 0; k < full; ++k) {
          EXPECT_EQ(a->chunks[ca + k], b->chunks[cb + k]) << PlaneName(pa.id) << " chunk " << k;
          EXPECT_EQ(pa.chunks[k], pb.chunks[k]) << "sizes and checksums agree too";
          ++shared_chunks;
        }
        // The first chunk past the short boundary differs (it holds more rows).
        if (full < pa.chunks.size()) {
          EXPECT_NE(a->chunks[ca + full], b->chunks[cb + full]);
        }
      }
      ca += pa.chunks.size();
      cb += pb.chunks.size();
    }
    EXPECT_GE(shared_chunks, 60u);
  }
}

INSTANTIATE_TEST_SUITE_P(Transforms, DedupTest, ::testing::ValuesIn(Transforms()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(DecodeIntoTest, WritesStraightIntoCallerMemory) {
  LatentSnapshot l = MakeLatent(203, 24, 8, 4, 16);
  EncodeOptions o;
  o.target_chunk_bytes = 1000;
  auto enc = EncodeLayer(l, o);
  ASSERT_TRUE(enc.ok());
  auto decoder = LayerDecoder::Create(enc->header);
  ASSERT_TRUE(decoder.ok());
  // One staging buffer with the planes back to back, as a pinned buffer would be.
  std::vector<std::uint64_t> sizes;
  std::uint64_t total = 0;
  for (const auto& p : decoder->planes()) {
    sizes.push_back(p.values());
    total += p.values();
  }
  std::vector<float> staging(total, -1.0f);
  std::vector<std::span<float>> spans;
  std::uint64_t at = 0;
  for (auto n : sizes) {
    spans.emplace_back(staging.data() + at, n);
    at += n;
  }
  // Chunk by chunk, in reverse, as they might arrive from a store.
  for (std::size_t i = decoder->chunk_count(); i-- > 0;) {
    ASSERT_TRUE(decoder->DecodeChunk(i, AsBytes(enc->chunks[i]), spans[decoder->chunk(i).plane]).ok());
  }
  EXPECT_TRUE(BitEqual(l.latent_rows, std::vector<float>(spans[0].begin(), spans[0].end())));
  EXPECT_TRUE(BitEqual(l.index_tail_rows, std::vector<float>(spans[1].begin(), spans[1].end())));
  EXPECT_TRUE(BitEqual(l.pool_keys, std::vector<float>(spans[2].begin(), spans[2].end())));

  std::fill(staging.begin(), staging.end(), 0.0f);
  ASSERT_TRUE(DecodeLayerInto(*enc, spans).ok());
  EXPECT_TRUE(BitEqual(l.latent_rows, std::vector<float>(spans[0].begin(), spans[0].end())));
}

// LayerDecoder is immutable and each chunk writes only its rows: chunks of one
// layer decode from several threads at once into one plane (and encoding runs
// concurrently too: per-thread scratch only).
TEST(DecodeIntoTest, ChunksDecodeConcurrentlyIntoOnePlane) {
  LatentSnapshot l = MakeLatent(4000, 24, 8, 4, 16);
  EncodeOptions o;
  o.target_chunk_bytes = 4096;
  std::vector<Result<EncodedLayer>> encoded(4, Status::Internal("not run"));
  std::vector<std::thread> encoders;
  for (int t = 0; t < 4; ++t) encoders.emplace_back([&, t] { encoded[t] = EncodeLayer(l, o); });
  for (auto& th : encoders) th.join();
  for (const auto& e : encoded) {
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->chunks, encoded[0]->chunks);
  }
  auto decoder = LayerDecoder::Create(encoded[0]->header);
  ASSERT_TRUE(decoder.ok());
  std::vector<std::vector<float>> planes;
  for (const auto& p : decoder->planes()) planes.emplace_back(p.values());
  std::atomic<std::size_t> next{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < decoder->chunk_count();) {
        if (!decoder->DecodeChunk(i, AsBytes(encoded[0]->chunks[i]), planes[decoder->chunk(i).plane]).ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : workers) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(BitEqual(l.latent_rows, planes[0]));
  EXPECT_TRUE(BitEqual(l.index_tail_rows, planes[1]));
  EXPECT_TRUE(BitEqual(l.pool_keys, planes[2]));
}

TEST(DecodeIntoTest, RefusesDestinationsOfTheWrongSize) {
  auto enc = EncodeLayer(MakeKv(10, 4, 4));
  ASSERT_TRUE(enc.ok());
  std::vector<float> k(40), v(39);
  std::vector<std::span<float>> spans = {k, v};
  EXPECT_TRUE(DecodeLayerInto(*enc, spans).IsInvalidArgument());
  spans.pop_back();
  EXPECT_TRUE(DecodeLayerInto(*enc, spans).IsInvalidArgument());
  auto decoder = LayerDecoder::Create(enc->header);
  EXPECT_TRUE(decoder->DecodeChunk(99, AsBytes(enc->chunks[0]), k).IsInvalidArgument());
}

// LayerEncoder over planes lying anywhere (here one block, as a pinned arena
// would be), each chunk written once into a caller's buffer, in any order
// and from several threads: the same header and bytes as EncodeLayer, for
// every transform. Too little room, a wrong plane count or size, and a
// header asked for before every chunk was encoded are refused.
TEST(LayerEncoderTest, EncodesFromViewsIntoCallerBuffersExactlyAsEncodeLayer) {
  const LatentSnapshot l = MakeLatent(203, 24, 8, 4, 16);
  std::vector<float> block;
  for (const auto* p : {&l.latent_rows, &l.index_tail_rows, &l.pool_keys})
    block.insert(block.end(), p->begin(), p->end());
  const std::span<const float> all(block);
  const std::vector<std::span<const float>> planes = {
      all.first(l.latent_rows.size()), all.subspan(l.latent_rows.size(), l.index_tail_rows.size()),
      all.subspan(l.latent_rows.size() + l.index_tail_rows.size())};
  for (const TransformSpec& spec :
       {TransformSpec{"raw/v1", 0}, TransformSpec{"shuffle-zstd/v1", 1}, TransformSpec{"bf16/v1", 0}}) {
    SCOPED_TRACE(spec.id);
    EncodeOptions o;
    o.target_chunk_bytes = 1000;
    o.plane_transforms.push_back({PlaneId::kLatentRows, spec});
    auto want = EncodeLayer(l, o);
    ASSERT_TRUE(want.ok());
    auto enc = LayerEncoder::Create(l.shape, planes, o);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    ASSERT_EQ(enc->chunk_count(), want->chunks.size());
    EXPECT_TRUE(enc->Finish().status().IsFailedPrecondition());
    std::vector<std::vector<std::byte>> bufs(enc->chunk_count());
    std::vector<std::size_t> sizes(enc->chunk_count());
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        for (std::size_t i = enc->chunk_count(); i-- > 0;) {
          if (i % 3 != static_cast<std::size_t>(t)) continue;
          bufs[i].resize(enc->MaxChunkBytes(i));
          auto n = enc->EncodeChunk(i, bufs[i]);
          EXPECT_TRUE(n.ok()) << n.status().ToString();
          if (n.ok()) sizes[i] = *n;
        }
      });
    }
    for (auto& t : threads) t.join();
    auto header = enc->Finish();
    ASSERT_TRUE(header.ok());
    EXPECT_EQ(*header, want->header);
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      ASSERT_EQ(sizes[i], want->chunks[i].size());
      EXPECT_EQ(std::memcmp(bufs[i].data(), want->chunks[i].data(), sizes[i]), 0) << "chunk " << i;
    }
    std::vector<std::byte> tight(enc->MaxChunkBytes(0) - 1);
    EXPECT_TRUE(enc->EncodeChunk(0, tight).status().IsInvalidArgument());
  }
  EXPECT_TRUE(LayerEncoder::Create(l.shape, std::vector<std::span<const float>>{planes[0], planes[1]})
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(LayerEncoder::Create(
                  l.shape, std::vector<std::span<const float>>{planes[0], planes[1], planes[2].first(3)})
                  .status()
                  .IsInvalidArgument());
}

TEST(HeaderTest, SerializesAloneAndRefusesTrailingBytes) {
  auto enc = EncodeLayer(MakeLatent(50, 8, 4, 4));
  ASSERT_TRUE(enc.ok());
  std::string h = SerializeLayerHeader(enc->header);
  auto back = ParseLayerHeader(AsBytes(h));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, enc->header);
  EXPECT_TRUE(ParseLayerHeader(AsBytes(h + "x")).status().IsCorruption());
}

}  // namespace
}  // namespace primecache

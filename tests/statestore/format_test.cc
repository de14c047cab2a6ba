// The record codecs of the store's schema: round trips, and refusal of every
// truncation, extension and bit flip (each value is bounded and checksummed).
#include <gtest/gtest.h>

#include <functional>

#include <map>

#include "statestore/format.h"
#include "statestore/node_filter.h"
#include "core/token_hash.h"

namespace primecache::statestore_internal {
namespace {

// Every cut, one extra byte, and every single-bit flip of `v` must be refused.
void ExpectRefusesDamage(const std::string& v, const std::function<bool(std::string_view)>& decodes,
                         bool checksummed = true) {
  ASSERT_TRUE(decodes(v)) << "the intact value decodes";
  for (std::size_t n = 0; n < v.size(); ++n)
    EXPECT_FALSE(decodes(std::string_view(v).substr(0, n))) << "cut " << n;
  EXPECT_FALSE(decodes(v + "x")) << "trailing byte";
  if (!checksummed) return;
  for (std::size_t i = 0; i < v.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      std::string d = v;
      d[i] = static_cast<char>(d[i] ^ (1 << b));
      EXPECT_FALSE(decodes(d)) << "flip byte " << i << " bit " << b;
    }
  }
}

TEST(Format, SummaryRoundTripsAndRefusesDamage) {
  EntrySummary s{7, 1234, 3, 99999, 123456, 777, 1.5e12, 1700000000000, 0xAB, 0xCD};
  std::string v = EncodeSummary(s);
  EXPECT_EQ(v.size(), 85u);
  auto back = DecodeSummary(v);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, s);
  ExpectRefusesDamage(v, [](std::string_view x) { return DecodeSummary(x).ok(); });
}

TEST(Format, ManifestRoundTripsAndRefusesDamage) {
  Manifest m;
  m.layers.push_back({"header-0", {{Hash128{1, 2}, 100}, {Hash128{3, 4}, 200}}});
  m.layers.push_back({"", {}});
  m.layers.push_back({"h2", {{Hash128{5, 6}, 1}}});
  std::string v = EncodeManifest(m);
  auto back = DecodeManifest(v, 1 << 20);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->layers.size(), 3u);
  EXPECT_EQ(back->layers[0].header, "header-0");
  EXPECT_EQ(back->layers[0].chunks[1].address, (Hash128{3, 4}));
  EXPECT_EQ(back->layers[0].chunks[1].size, 200u);
  EXPECT_EQ(back->layers[2].chunks[0].size, 1u);
  ExpectRefusesDamage(v, [](std::string_view x) { return DecodeManifest(x, 1 << 20).ok(); });
  // A chunk larger than the limit is refused.
  EXPECT_FALSE(DecodeManifest(v, 150).ok());
}

TEST(Format, ManifestCountsAreBoundedBeforeUse) {
  // A layer claiming 2^20 chunks in a short value: refused without allocating.
  std::string v;
  v.push_back(1);
  PutLE32(&v, 1);
  PutLE32(&v, 0);
  PutLE32(&v, 1u << 20);
  AppendChecksum(&v);
  EXPECT_TRUE(DecodeManifest(v, 1 << 20).status().IsCorruption());
  std::string w;
  w.push_back(1);
  PutLE32(&w, 0xFFFFFFFFu);  // layers
  AppendChecksum(&w);
  EXPECT_TRUE(DecodeManifest(w, 1 << 20).status().IsCorruption());
}

TEST(Format, TokensRoundTripAndRefuseDamage) {
  std::vector<std::uint32_t> t = {1, 2, 3, 0xFFFFFFFF, 42};
  std::string v = EncodeTokens(t);
  auto back = DecodeTokens(v);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, t);
  ExpectRefusesDamage(v, [](std::string_view x) { return DecodeTokens(x).ok(); });
}

TEST(Format, MetaRecordsRoundTripAndRefuseDamage) {
  Params p{256, 1, 1, 0, 1700000000000};
  std::string pv = EncodeParams(p);
  EXPECT_EQ(pv.size(), 33u);
  auto pb = DecodeParams(pv);
  ASSERT_TRUE(pb.ok());
  EXPECT_EQ(pb->block_tokens, 256u);
  ExpectRefusesDamage(pv, [](std::string_view x) { return DecodeParams(x).ok(); });
  Params bad = p;
  bad.block_tokens = 0;
  EXPECT_FALSE(DecodeParams(EncodeParams(bad)).ok());
  bad = p;
  bad.chunk_layout = 4;
  EXPECT_FALSE(DecodeParams(EncodeParams(bad)).ok());

  Counters c;
  c.entries = 5;
  c.chunk_bytes = 1 << 30;
  c.next_entry_id = 77;
  std::string cv = EncodeCounters(c);
  auto cb = DecodeCounters(cv);
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(*cb, c);
  ExpectRefusesDamage(cv, [](std::string_view x) { return DecodeCounters(x).ok(); });

  ScopeRecord sc{3, Hash128{9, 8}, "model", "tenant", "descriptor bytes"};
  std::string sv = EncodeScope(sc);
  auto sb = DecodeScope(3, sv);
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->model_name, "model");
  EXPECT_EQ(sb->ns, "tenant");
  EXPECT_EQ(sb->digest, (Hash128{9, 8}));
  EXPECT_EQ(sb->descriptor, "descriptor bytes");
  ExpectRefusesDamage(sv, [](std::string_view x) { return DecodeScope(1, x).ok(); });

  // A version-1 record (schema 1 stores) has no descriptor and still reads.
  std::string v1(1, '\x01');
  v1 += HashKey(Hash128{9, 8});
  PutLE32(&v1, 5);
  v1 += "model";
  PutLE32(&v1, 6);
  v1 += "tenant";
  AppendChecksum(&v1);
  auto old = DecodeScope(4, v1);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->model_name, "model");
  EXPECT_EQ(old->ns, "tenant");
  EXPECT_TRUE(old->descriptor.empty());

  EXPECT_EQ(*DecodeSchema(EncodeSchema(kSchemaVersion)), kSchemaVersion);
  EXPECT_FALSE(DecodeSchema("abc").ok());
}

TEST(Format, QuarantineRoundTripsAndRefusesDamage) {
  QuarantineRecord q{EntrySummary{1, 2, 3, 4, 5, 6, 7.0, 8, 9, 10}, 1234, "chunk x: content does not match"};
  std::string v = EncodeQuarantine(q);
  auto back = DecodeQuarantine(v);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->summary, q.summary);
  EXPECT_EQ(back->reason, q.reason);
  ExpectRefusesDamage(v, [](std::string_view x) { return DecodeQuarantine(x).ok(); });
}

TEST(Format, IndexValuesAreValidated) {
  std::vector<NodeSlot> slots = {{1, 2}, {7, 1}, {16, 3}};
  auto back = DecodeNode(EncodeNode(slots), 16);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, slots);
  EXPECT_FALSE(DecodeNode(EncodeNode(slots), 15).ok()) << "r beyond the block";
  EXPECT_FALSE(DecodeNode(EncodeNode({{7, 1}, {1, 2}}), 16).ok()) << "out of order";
  EXPECT_FALSE(DecodeNode(EncodeNode({{1, 0}}), 16).ok()) << "zero count";
  EXPECT_FALSE(DecodeNode("abc", 16).ok());
  EXPECT_EQ(*DecodeIds(EncodeIds({5, 6})), (std::vector<std::uint64_t>{5, 6}));
  EXPECT_FALSE(DecodeIds("").ok());
  EXPECT_FALSE(DecodeIds("1234567").ok());
  ChunkRefRecord r{3, 100, 1};
  EXPECT_EQ(*DecodeChunkRef(EncodeChunkRef(r)), r);
  EXPECT_FALSE(DecodeChunkRef(EncodeChunkRef({1, 0, 0})).ok()) << "zero size";
  AccessRecord a{5, 6};
  EXPECT_EQ(*DecodeAccess(EncodeAccess(a)), a);
}

TEST(Format, KeysSortNumerically) {
  EXPECT_LT(IdKey(255), IdKey(256));
  EXPECT_LT(AgeKey(1, 99), AgeKey(2, 0));
  EXPECT_LT(MemberKey(1, 1000), MemberKey(2, 0));
  EXPECT_EQ(HashFromKey(HashKey(Hash128{0x1122, 0x3344})), (Hash128{0x1122, 0x3344}));
}

TEST(TokenHash, ChainAndPlacesAgree) {
  const auto& h = DefaultTokenHasher();
  std::vector<std::uint32_t> t(1000);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint32_t>(i * 7919);
  auto chain = ChainHashes(h, t, 64, 15);
  ASSERT_EQ(chain.size(), 16u);
  EXPECT_EQ(chain[0], kChainSeed);
  // A boundary on a block multiple: its exact hash is the next chain hash.
  auto p = PlaceOf(h, std::span(t).first(640), 64);
  EXPECT_EQ(p.level, 9u);
  EXPECT_EQ(p.node_hash, chain[9]);
  EXPECT_EQ(p.exact_hash, chain[10]);
  auto q = PlaceOf(h, std::span(t).first(641), 64);
  EXPECT_EQ(q.level, 10u);
  EXPECT_EQ(q.node_hash, chain[10]);
  EXPECT_NE(q.exact_hash, p.exact_hash);
  auto one = PlaceOf(h, std::span(t).first(1), 64);
  EXPECT_EQ(one.level, 0u);
  EXPECT_EQ(one.node_hash, kChainSeed);
}

}  // namespace
}  // namespace primecache::statestore_internal

namespace primecache::statestore_internal {
namespace {

// The node filter against a plain map, through growth and removals that
// shift probe runs.
TEST(NodeFilter, AgreesWithAMap) {
  NodeFilter f;
  MutexLock lock(&f.mu);  // as the store holds it (the filter's methods require it)
  std::map<std::uint32_t, std::int64_t> want;
  std::uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 20;
  };
  for (int step = 0; step < 200000; ++step) {
    // Few distinct keys at first, then many (forces growth), all colliding in
    // their low bits now and then.
    std::uint32_t key = NodeFilter::Fingerprint(1, next() % (step < 100000 ? 300 : 30000), 7);
    std::int64_t delta = static_cast<std::int64_t>(next() % 5) - 2;
    f.Adjust(key, delta);
    std::int64_t& w = want[key];
    w = std::max<std::int64_t>(0, w + delta);
    if (w == 0) want.erase(key);
    if (step % 997 == 0) {
      for (auto& [k, v] : want) ASSERT_TRUE(f.MayContain(k));
      EXPECT_EQ(f.size(), want.size());
    }
  }
  for (auto& [k, v] : want) EXPECT_TRUE(f.MayContain(k));
  int absent_hits = 0;
  for (int i = 0; i < 10000; ++i) absent_hits += f.MayContain(NodeFilter::Fingerprint(2, i, 9)) ? 1 : 0;
  EXPECT_LE(absent_hits, 3)
      << "32-bit fingerprints: a rare false positive is allowed, absence is what is exact";
}

}  // namespace
}  // namespace primecache::statestore_internal

namespace primecache::statestore_internal {
namespace {

TEST(TokenHash, PrefixHashesEqualOneShotHashes) {
  const auto& h = DefaultTokenHasher();
  std::vector<std::uint32_t> t(700);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint32_t>(i * 2654435761u);
  // Short inputs, the 240-byte boundary of XXH3's short path, and long ones.
  std::vector<std::uint32_t> lengths = {0, 1, 3, 16, 59, 60, 61, 64, 100, 255, 256, 257, 512, 700};
  std::vector<std::uint64_t> out(lengths.size());
  h.HashPrefixes(t, 77, lengths, out);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(out[i], h.Hash(std::span(t).first(lengths[i]), 77)) << "length " << lengths[i];
  }
}

}  // namespace
}  // namespace primecache::statestore_internal

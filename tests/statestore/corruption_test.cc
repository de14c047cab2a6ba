// Corruption planted in stored bytes, behind the store's back: chunk bytes
// replaced or flipped in their segment files, manifests, tokens and entry
// records overwritten. Each is detected, reported, never served, and
// the entry is quarantined; references stay exact.
#include <rocksdb/db.h>

#include <map>
#include <set>

#include "statestore/format.h"
#include "statestore/rocks_env.h"
#include "statestore/test_hooks.h"
#include "raw_db.h"
#include "segment_util.h"
#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)
namespace si = statestore_internal;

const TestModel kModel = [] {
  TestModel m;
  m.chunk_bytes = 1024;
  return m;
}();

Hash128 AddressOf(const std::string& chunk) {
  return Checksum128(AsBytes(chunk));
}

void ExpectQuarantined(LocalStore& s, EntryId id, const std::string& reason_part) {
  auto info = s.Describe(id);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->info.state, EntryState::kQuarantined);
  EXPECT_NE(info->info.reason.find(reason_part), std::string::npos) << info->info.reason;
  EXPECT_TRUE(s.FetchAll(id).status().IsNotFound()) << "a quarantined entry is never served";
}

TEST(Corruption, AReplacedChunkIsDetectedAndItsEntriesQuarantined) {
  MemStore m;
  auto conv = Conversation(600, 1);
  auto la = MakeLayers(Prefix(conv, 300), kModel);
  auto lb = MakeLayers(Prefix(conv, 500), kModel);
  EntryId a = MustPublish(*m.store, Prefix(conv, 300), 1, "", kModel);
  EntryId b = MustPublish(*m.store, Prefix(conv, 500), 1, "", kModel);
  // The first latent chunk is shared by both boundaries.
  const std::string& shared = la[0].chunks[0];
  ASSERT_EQ(shared, lb[0].chunks[0]);
  m.store.reset();
  {
    std::string bad = shared;
    bad[bad.size() / 2] ^= 0x01;
    OverwriteChunk(m.env.get(), m.options.path, AddressOf(shared), bad);
  }
  m.Reopen();
  auto r = m.store->FetchAll(a);
  ASSERT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("address"), std::string::npos) << r.status().ToString();
  ExpectQuarantined(*m.store, a, "does not match its address");
  // Lookups no longer find it.
  auto hit = m.store->Lookup(ModelDigest(1), "", Prefix(conv, 400));
  ASSERT_TRUE(hit.ok());
  EXPECT_FALSE(hit->has_value());
  auto st = m.store->Stat();
  EXPECT_EQ(st->entries, 1u);
  EXPECT_EQ(st->quarantined, 1u);
  ListOptions q;
  q.state = EntryState::kQuarantined;
  auto page = m.store->List(q);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->entries.size(), 1u);
  EXPECT_EQ(page->entries[0].id, a);

  // A publish that carries the same chunk rewrites it: b heals.
  auto lc = MakeLayers(Prefix(conv, 550), kModel);
  auto rc = m.store->Publish(Request(Prefix(conv, 550)), lc);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  auto back = m.store->FetchAll(b);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, lb);
  ExpectConsistent(*m.store);
  // The quarantine record goes with Delete.
  ASSERT_TRUE(m.store->Delete(a).ok());
  EXPECT_TRUE(m.store->Describe(a).status().IsNotFound());
  EXPECT_EQ(m.store->Stat()->quarantined, 0u);
  ExpectConsistent(*m.store);
}

TEST(Corruption, WithoutAHealingPublishEveryEntryOfTheBadChunkIsQuarantined) {
  MemStore m;
  auto conv = Conversation(600, 2);
  auto la = MakeLayers(Prefix(conv, 300), kModel);
  EntryId a = MustPublish(*m.store, Prefix(conv, 300), 1, "", kModel);
  EntryId b = MustPublish(*m.store, Prefix(conv, 500), 1, "", kModel);
  EntryId other = MustPublish(*m.store, Conversation(200, 3), 1, "", kModel);
  m.store.reset();
  OverwriteChunk(m.env.get(), m.options.path, AddressOf(la[0].chunks[0]), std::string(la[0].chunks[0].size(), 'z'));
  m.Reopen();
  EXPECT_TRUE(m.store->FetchAll(b).status().IsCorruption());
  EXPECT_TRUE(m.store->FetchAll(a).status().IsCorruption());
  ExpectQuarantined(*m.store, a, "chunk");
  ExpectQuarantined(*m.store, b, "chunk");
  EXPECT_TRUE(m.store->FetchAll(other).ok());
  // The bad chunk lost its last reference: its bytes are gone, counts exact.
  ExpectConsistent(*m.store);
  EXPECT_EQ(m.store->Stat()->entries, 1u);
}

// One byte flipped in a segment file, inside a chunk: the address check
// catches it, the entry is quarantined, the other entries are served.
TEST(Corruption, ABitFlippedInASegmentIsNeverServed) {
  MemStore m;
  TestModel model = kModel;
  model.chunk_bytes = 8192;
  std::map<EntryId, std::vector<LayerBytes>> want;
  for (int i = 0; i < 4; ++i) {
    auto t = Conversation(800, 10 + i);
    want[MustPublish(*m.store, t, 1, "", model)] = MakeLayers(t, model);
  }
  const EntryId victim = want.begin()->first;
  const std::string& chunk = want.begin()->second[1].chunks[0];
  m.store.reset();
  ChunkPlace p = PlaceOfChunk(m.env.get(), m.options.path, AddressOf(chunk));
  std::string flipped(1, static_cast<char>(chunk[chunk.size() / 2] ^ 0x40));
  OverwriteAt(m.env.get(), p.file, p.offset + chunk.size() / 2, flipped);
  m.Reopen();
  for (auto& [id, layers] : want) {
    auto back = m.store->FetchAll(id);
    if (id != victim) {
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      ExpectSameLayers(*back, layers);
      continue;
    }
    ASSERT_TRUE(back.status().IsCorruption()) << back.status().ToString();
    EXPECT_NE(back.status().message().find("segment " + si::SegmentHex(p.segment)), std::string::npos)
        << back.status().ToString();
    ExpectQuarantined(*m.store, id, "address");
  }
  EXPECT_EQ(m.store->Stat()->quarantined, 1u);
  ExpectConsistent(*m.store);
}

TEST(Corruption, ACorruptManifestIsQuarantinedAndReferencesRebuilt) {
  MemStore m;
  auto conv = Conversation(600, 4);
  EntryId a = MustPublish(*m.store, Prefix(conv, 300), 1, "", kModel);
  EntryId b = MustPublish(*m.store, Prefix(conv, 500), 1, "", kModel);
  m.store.reset();
  {
    RawDb raw(m.env.get(), m.options.path);
    std::string v = raw.Get(si::kCfManifests, si::IdKey(b));
    v[v.size() / 2] ^= 0x10;
    raw.Put(si::kCfManifests, si::IdKey(b), v);
  }
  m.Reopen();
  auto r = m.store->FetchAll(b);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  ExpectQuarantined(*m.store, b, "manifest");
  // b's chunks were released although its manifest could not say which.
  ExpectConsistent(*m.store);
  auto back = m.store->FetchAll(a);
  ASSERT_TRUE(back.ok());
  ExpectSameLayers(*back, MakeLayers(Prefix(conv, 300), kModel));
  EXPECT_EQ(m.store->Stat()->entries, 1u);
  // The rebuilt index still finds what is left, and only that.
  auto hit = m.store->Lookup(ModelDigest(1), "", conv);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->id, a);
  EntryId c = MustPublish(*m.store, Prefix(conv, 550), 1, "", kModel);
  hit = m.store->Lookup(ModelDigest(1), "", conv);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->id, c);
}

TEST(Corruption, CorruptStoredTokensAreNeverMatched) {
  MemStore m;
  auto conv = Conversation(600, 5);
  EntryId a = MustPublish(*m.store, Prefix(conv, 300), 1, "", kModel);
  EntryId b = MustPublish(*m.store, Prefix(conv, 500), 1, "", kModel);
  m.store.reset();
  {
    RawDb raw(m.env.get(), m.options.path);
    std::string v = raw.Get(si::kCfTokens, si::IdKey(b));
    v[20] ^= 0x01;  // a token, under the record's checksum
    raw.Put(si::kCfTokens, si::IdKey(b), v);
  }
  m.Reopen();
  auto hit = m.store->Lookup(ModelDigest(1), "", conv);
  ASSERT_TRUE(hit.ok());
  ASSERT_TRUE(hit->has_value());
  EXPECT_EQ((*hit)->id, a) << "the corrupt longer boundary is skipped, the shorter one served";
  ExpectQuarantined(*m.store, b, "tokens");
  ExpectConsistent(*m.store);
}

TEST(Corruption, AnUnreadableEntryRecordCanStillBeDeleted) {
  MemStore m;
  auto conv = Conversation(600, 6);
  EntryId a = MustPublish(*m.store, Prefix(conv, 300), 1, "", kModel);
  EntryId b = MustPublish(*m.store, Prefix(conv, 500), 1, "", kModel);
  m.store.reset();
  {
    RawDb raw(m.env.get(), m.options.path);
    raw.Put(si::kCfEntries, si::IdKey(b), "garbage");
  }
  m.Reopen();
  EXPECT_TRUE(m.store->Describe(b).status().IsCorruption());
  auto v = m.store->CheckStore({});
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->problems.empty()) << "verify reports the damage";
  ASSERT_TRUE(m.store->Delete(b).ok());
  ExpectConsistent(*m.store);
  EXPECT_TRUE(m.store->FetchAll(a).ok());
  auto hit = m.store->Lookup(ModelDigest(1), "", conv);
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->id, a);
}

}  // namespace
}  // namespace primecache

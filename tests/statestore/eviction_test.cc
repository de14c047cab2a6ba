// Capacity: LRU order and the byte budget, the utility and marginal
// policies and their option names, leases (explicit and during a fetch),
// and admission after N sightings.
#include <thread>

#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

const TestModel kModel = [] {
  TestModel m;
  m.chunk_bytes = 1024;
  return m;
}();

// Stored bytes of one entry of `len` tokens (every conversation of one
// length encodes to the same sizes with the raw transform).
std::uint64_t EntryBytes(std::size_t len) {
  MemStore m;
  MustPublish(*m.store, Conversation(len, 424242), 1, "", kModel);
  return m.store->Stat()->stored_bytes;
}

bool Present(LocalStore& s, EntryId id) {
  return s.Describe(id).ok();
}

TEST(Eviction, LeastRecentlyUsedGoesFirstAndTheBudgetHolds) {
  const std::uint64_t one = EntryBytes(300);
  StoreOptions o = CodecStoreOptions();
  o.byte_budget = one * 3 + one / 2;
  MemStore m(o);
  std::vector<std::vector<std::uint32_t>> c;
  for (int i = 0; i < 5; ++i) c.push_back(Conversation(300, 10 + i));
  EntryId a = MustPublish(*m.store, c[0], 1, "", kModel);
  EntryId b = MustPublish(*m.store, c[1], 1, "", kModel);
  EntryId cc = MustPublish(*m.store, c[2], 1, "", kModel);
  ASSERT_TRUE(m.store->Lookup(ModelDigest(1), "", c[0])->has_value());  // a is now more recent than b
  auto r = m.store->Publish(Request(c[3]), MakeLayers(c[3], kModel));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->evicted, 1u);
  EntryId d = r->id;
  EXPECT_TRUE(Present(*m.store, a));
  EXPECT_FALSE(Present(*m.store, b)) << "b was the least recently used";
  EXPECT_TRUE(Present(*m.store, cc));
  ASSERT_TRUE(m.store->FetchAll(cc).ok());  // a fetch refreshes too: now a is the oldest
  EntryId e = MustPublish(*m.store, c[4], 1, "", kModel);
  EXPECT_FALSE(Present(*m.store, a));
  EXPECT_TRUE(Present(*m.store, cc));
  EXPECT_TRUE(Present(*m.store, d));
  EXPECT_TRUE(Present(*m.store, e));
  auto st = m.store->Stat();
  EXPECT_EQ(st->evictions, 2u);
  EXPECT_EQ(st->entries, 3u);
  EXPECT_LE(st->stored_bytes, o.byte_budget);
  ExpectConsistent(*m.store);

  // Recency survives a reopen: d is now the oldest.
  m.Reopen();
  ASSERT_TRUE(m.store->SetByteBudget(one * 2 + one / 2).ok());
  EXPECT_FALSE(Present(*m.store, d));
  EXPECT_TRUE(Present(*m.store, cc));
  EXPECT_TRUE(Present(*m.store, e));
  EXPECT_EQ(m.store->Stat()->evictions, 3u);
  ExpectConsistent(*m.store);
}

TEST(Eviction, AnEntryLargerThanTheBudgetIsRefusedAndChangesNothing) {
  const std::uint64_t one = EntryBytes(300);
  StoreOptions o = CodecStoreOptions();
  o.byte_budget = one * 2;
  MemStore m(o);
  EntryId a = MustPublish(*m.store, Conversation(300, 1), 1, "", kModel);
  auto big = Conversation(2000, 2);
  auto r = m.store->Publish(Request(big), MakeLayers(big, kModel));
  EXPECT_TRUE(r.status().IsResourceExhausted()) << r.status().ToString();
  EXPECT_TRUE(Present(*m.store, a)) << "a failed publish evicts nothing";
  auto st = m.store->Stat();
  EXPECT_EQ(st->entries, 1u);
  EXPECT_EQ(st->evictions, 0u);
  ExpectConsistent(*m.store);
}

TEST(Eviction, UtilityKeepsWhatSavesTheMostComputePerByte) {
  // An old long boundary (attention makes its prefill quadratic) against
  // newer short ones: LRU drops the long one, the utility a short one.
  for (auto policy : {EvictionPolicy::kLru, EvictionPolicy::kUtility}) {
    const std::uint64_t long_bytes = EntryBytes(2000), short_bytes = EntryBytes(100);
    StoreOptions o = CodecStoreOptions();
    o.eviction.policy = policy;
    o.byte_budget = long_bytes + short_bytes * 2 + short_bytes / 2;
    MemStore m(o);
    EntryId big = MustPublish(*m.store, Conversation(2000, 1), 1, "", kModel);
    EntryId s1 = MustPublish(*m.store, Conversation(100, 2), 1, "", kModel);
    EntryId s2 = MustPublish(*m.store, Conversation(100, 3), 1, "", kModel);
    EntryId s3 = MustPublish(*m.store, Conversation(100, 4), 1, "", kModel);
    if (policy == EvictionPolicy::kLru) {
      EXPECT_FALSE(Present(*m.store, big));
      EXPECT_TRUE(Present(*m.store, s1));
    } else {
      EXPECT_TRUE(Present(*m.store, big)) << "the long boundary saves the most compute per byte";
      EXPECT_FALSE(Present(*m.store, s1)) << "the oldest of the cheap ones goes";
    }
    EXPECT_TRUE(Present(*m.store, s2));
    EXPECT_TRUE(Present(*m.store, s3));
    EXPECT_LE(m.store->Stat()->stored_bytes, o.byte_budget);
    ExpectConsistent(*m.store);
  }
}

TEST(Eviction, UtilityCountsOnlyTheBytesAnEvictionWouldFree) {
  // Two boundaries of one conversation share almost everything: evicting
  // the shorter frees only its own chunks, so per byte freed it is worth
  // more than an unrelated entry of the same length, though it is older
  // (LRU, or a utility over whole entry sizes, would drop it).
  StoreOptions o = CodecStoreOptions();
  o.eviction.policy = EvictionPolicy::kUtility;
  o.eviction.utility_alpha = 10;  // let compute per byte decide
  MemStore m(o);
  auto conv = Conversation(1500, 1);
  EntryId shorter = MustPublish(*m.store, Prefix(conv, 1000), 1, "", kModel);
  EntryId unrelated = MustPublish(*m.store, Conversation(1000, 2), 1, "", kModel);
  EntryId longer = MustPublish(*m.store, conv, 1, "", kModel);
  auto st = m.store->Stat();
  ASSERT_TRUE(m.store->SetByteBudget(st->stored_bytes - 1).ok());
  EXPECT_FALSE(Present(*m.store, unrelated));
  EXPECT_TRUE(Present(*m.store, shorter));
  EXPECT_TRUE(Present(*m.store, longer));
  ExpectConsistent(*m.store);
}

TEST(Eviction, MarginalCreditsABoundaryOnlyBeyondItsStoredParent) {
  // b (oldest) stands alone; a2 extends a1 by one token. The utility credits
  // a2 with the whole prefill of its 1001 tokens, so the old, unrelated b
  // goes. Marginal credits a2 only with its last token beyond a1 (a hit on
  // a1 would prefill just that one), so a2 goes and b, the only state of
  // its conversation, stays. With model cost {1000, 2, 64}, one more token
  // past 1000 saves 1000 + 2 * 64 * 1001 = 129128 FLOPs against b's
  // 1000 * 1000 + 64 * 1000 * 1001 = 65064000.
  for (auto policy : {EvictionPolicy::kUtility, EvictionPolicy::kMarginal}) {
    StoreOptions o = CodecStoreOptions();
    o.eviction.policy = policy;
    o.eviction.utility_alpha = 100;  // compute per byte decides; recency breaks near-ties
    MemStore m(o);
    auto conv = Conversation(1001, 7);
    EntryId b = MustPublish(*m.store, Conversation(1000, 8), 1, "", kModel);
    EntryId a1 = MustPublish(*m.store, Prefix(conv, 1000), 1, "", kModel);
    EntryId a2 = MustPublish(*m.store, conv, 1, "", kModel);
    ASSERT_TRUE(m.store->SetByteBudget(m.store->Stat()->stored_bytes - 1).ok());
    EXPECT_EQ(m.store->Stat()->evictions, 1u);
    EXPECT_TRUE(Present(*m.store, a1));
    if (policy == EvictionPolicy::kUtility) {
      EXPECT_FALSE(Present(*m.store, b)) << "utility: the old whole conversation is worth least per byte";
      EXPECT_TRUE(Present(*m.store, a2));
    } else {
      EXPECT_TRUE(Present(*m.store, b)) << "marginal: b is the only stored state of its tokens";
      EXPECT_FALSE(Present(*m.store, a2)) << "marginal: a2 adds one token's prefill over a1";
    }
    ExpectConsistent(*m.store);
  }
}

TEST(Eviction, MarginalCreditsAChildWhollyOnceItsParentIsEvicted) {
  // a1 < a2 < a3 of one conversation, each one token longer, and two
  // unrelated entries u1, u2. Evicting three: marginal drops a3, then a2
  // (whose parent a1 is still there); a1, now the only boundary of its
  // conversation, is credited whole and stays while u1 goes.
  StoreOptions o = CodecStoreOptions();
  o.eviction.policy = EvictionPolicy::kMarginal;
  o.eviction.utility_alpha = 100;
  MemStore m(o);
  auto conv = Conversation(1002, 11);
  EntryId u1 = MustPublish(*m.store, Conversation(1000, 12), 1, "", kModel);
  EntryId a1 = MustPublish(*m.store, Prefix(conv, 1000), 1, "", kModel);
  EntryId a2 = MustPublish(*m.store, Prefix(conv, 1001), 1, "", kModel);
  EntryId a3 = MustPublish(*m.store, conv, 1, "", kModel);
  EntryId u2 = MustPublish(*m.store, Conversation(1000, 13), 1, "", kModel);
  const std::uint64_t all = m.store->Stat()->stored_bytes;
  const std::uint64_t whole = EntryBytes(1000);
  ASSERT_TRUE(m.store->SetByteBudget(all - whole - 1).ok());
  EXPECT_FALSE(Present(*m.store, a3));
  EXPECT_FALSE(Present(*m.store, a2));
  EXPECT_FALSE(Present(*m.store, u1)) << "the older of the two whole conversations";
  EXPECT_TRUE(Present(*m.store, a1)) << "a1 lost its children and is now credited whole";
  EXPECT_TRUE(Present(*m.store, u2));
  ExpectConsistent(*m.store);
}

TEST(EvictionOptions, NamesParseBothWaysAndABadOneChangesNothing) {
  for (auto policy : {EvictionPolicy::kLru, EvictionPolicy::kUtility, EvictionPolicy::kMarginal}) {
    EvictionOptions o;
    ASSERT_TRUE(ParseEvictionPolicy(EvictionPolicyName(policy), &o).ok());
    EXPECT_EQ(o.policy, policy);
  }
  for (const char* name : {"all", "seen-twice", "reuse", "all"}) {
    EvictionOptions o;
    ASSERT_TRUE(ParseAdmission(name, &o).ok());
    EXPECT_EQ(AdmissionName(o), name);
  }
  EvictionOptions o;
  ASSERT_TRUE(ParseAdmission("seen-twice", &o).ok());
  ASSERT_TRUE(ParseAdmission("reuse", &o).ok());
  EXPECT_EQ(o.admit_after_sightings, 1u) << "reuse does not also wait for sightings";
  const EvictionOptions before = o;
  Status s = ParseEvictionPolicy("lfu", &o);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("lru, utility or marginal"), std::string::npos) << s.message();
  EXPECT_TRUE(ParseAdmission("sometimes", &o).IsInvalidArgument());
  EXPECT_EQ(o, before);
}

TEST(Eviction, LeasesProtectEntries) {
  const std::uint64_t one = EntryBytes(300);
  StoreOptions o = CodecStoreOptions();
  o.byte_budget = one * 2 + one / 2;
  MemStore m(o);
  EntryId a = MustPublish(*m.store, Conversation(300, 1), 1, "", kModel);
  EntryId b = MustPublish(*m.store, Conversation(300, 2), 1, "", kModel);
  auto lease = m.store->AcquireLease(a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(m.store->Delete(a).code(), StatusCode::kUnavailable);
  EntryId c = MustPublish(*m.store, Conversation(300, 3), 1, "", kModel);
  EXPECT_TRUE(Present(*m.store, a)) << "leased: skipped although the oldest";
  EXPECT_FALSE(Present(*m.store, b));
  auto lease_c = m.store->AcquireLease(c);
  ASSERT_TRUE(lease_c.ok());
  // Everything evictable is leased: the publish is refused and nothing changes.
  auto d = Conversation(300, 4);
  auto r = m.store->Publish(Request(d), MakeLayers(d, kModel));
  EXPECT_TRUE(r.status().IsResourceExhausted()) << r.status().ToString();
  EXPECT_TRUE(Present(*m.store, a));
  EXPECT_TRUE(Present(*m.store, c));
  ExpectConsistent(*m.store);
  // Leases may move and outlive the store; released, the entry is evictable.
  Lease moved = std::move(lease).value();
  EXPECT_TRUE(moved.held());
  EXPECT_EQ(moved.id(), a);
  moved.Release();
  EXPECT_TRUE(m.store->Publish(Request(d), MakeLayers(d, kModel)).ok());
  EXPECT_FALSE(Present(*m.store, a));
  EXPECT_TRUE(m.store->AcquireLease(a).status().IsNotFound());
  m.store.reset();
  lease_c->Release();  // after the store is gone: harmless
}

TEST(Eviction, AFetchLeasesItsEntryWhileItRuns) {
  const std::uint64_t one = EntryBytes(300);
  MemStore m;
  EntryId a = MustPublish(*m.store, Conversation(300, 1), 1, "", kModel);
  EntryId b = MustPublish(*m.store, Conversation(300, 2), 1, "", kModel);
  auto want = MakeLayers(Conversation(300, 1), kModel);
  // Midway through fetching a (the oldest), the budget drops to one entry.
  struct Squeeze : FetchSink {
    LocalStore* s;
    std::uint64_t budget;
    Status squeezed;
    std::vector<LayerBytes> got;
    bool done = false;
    Status OnLayer(std::uint32_t, std::string_view h, std::uint32_t) override {
      got.push_back({std::string(h), {}});
      return Status::Ok();
    }
    Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
      got.back().chunks.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
      if (!done) {
        done = true;
        // From another thread, as the daemon's eviction would run.
        std::thread t([&] { squeezed = s->SetByteBudget(budget); });
        t.join();
      }
      return Status::Ok();
    }
  } sink;
  sink.s = m.store.get();
  sink.budget = one + one / 2;
  ASSERT_TRUE(m.store->Fetch(a, {}, sink).ok());
  EXPECT_TRUE(sink.squeezed.ok()) << sink.squeezed.ToString();
  ExpectSameLayers(sink.got, want);
  EXPECT_TRUE(Present(*m.store, a)) << "being fetched: kept";
  EXPECT_FALSE(Present(*m.store, b));
  ExpectConsistent(*m.store);
}

TEST(Admission, ABoundaryMustBeSeenNTimesFirst) {
  StoreOptions o = CodecStoreOptions();
  o.eviction.admit_after_sightings = 2;
  MemStore m(o);
  auto t = Conversation(200, 1);
  auto layers = MakeLayers(t, kModel);
  auto r = m.store->Publish(Request(t), layers);
  EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("seen 0 of 2"), std::string::npos) << r.status().ToString();
  ASSERT_FALSE(m.store->Lookup(ModelDigest(1), "", t)->has_value());  // sighting 1
  EXPECT_EQ(m.store->Publish(Request(t), layers).status().code(), StatusCode::kAborted);
  // Another namespace's or model's misses are other boundaries.
  ASSERT_FALSE(m.store->Lookup(ModelDigest(1), "other", t)->has_value());
  ASSERT_FALSE(m.store->Lookup(ModelDigest(2), "", t)->has_value());
  EXPECT_EQ(m.store->Publish(Request(t), layers).status().code(), StatusCode::kAborted);
  ASSERT_FALSE(m.store->Lookup(ModelDigest(1), "", t)->has_value());  // sighting 2
  auto ok = m.store->Publish(Request(t), layers);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(m.store->Stat()->admission_refusals, 3u);

  // A hit on a shorter boundary still counts as a sighting of the whole query.
  auto longer = Conversation(300, 1);
  ASSERT_EQ(Prefix(longer, 200), t);
  ASSERT_EQ((*m.store->Lookup(ModelDigest(1), "", longer))->length, 200u);
  m.store->RecordSighting(ModelDigest(1), "", longer);
  EXPECT_TRUE(m.store->Publish(Request(longer), MakeLayers(longer, kModel)).ok());
  ExpectConsistent(*m.store);
}

TEST(Admission, SightingsAreBoundedInMemory) {
  StoreOptions o = CodecStoreOptions();
  o.eviction.admit_after_sightings = 2;
  o.eviction.sighting_capacity = 4;
  MemStore m(o);
  auto t = Conversation(50, 1);
  m.store->RecordSighting(ModelDigest(1), "", t);
  m.store->RecordSighting(ModelDigest(1), "", t);
  for (int i = 0; i < 10; ++i) m.store->RecordSighting(ModelDigest(1), "", Conversation(50, 100 + i));
  EXPECT_EQ(m.store->Publish(Request(t), MakeLayers(t, kModel)).status().code(), StatusCode::kAborted)
      << "the oldest sightings were forgotten";
}

}  // namespace
}  // namespace primecache

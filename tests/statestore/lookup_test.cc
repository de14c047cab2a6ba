// Longest-prefix lookup: boundaries of one conversation, branches, exact
// length, no match, namespaces and fingerprints kept apart, collisions forced
// with test hashers, and a randomized comparison with a brute-force answer.
#include <algorithm>
#include <map>
#include <random>

#include "statestore/test_hooks.h"
#include "core/token_hash.h"
#include "lookup_util.h"
#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)
using statestore_internal::TestHooks;


StoreOptions WithBlock(std::uint32_t block) {
  StoreOptions o = CodecStoreOptions();
  o.block_tokens = block;
  return o;
}

// Test knobs that replace the index's token hasher (none for nullptr).
std::shared_ptr<const TestHooks> WithHasher(const TokenHasher* h) {
  if (h == nullptr) return nullptr;
  auto hooks = std::make_shared<TestHooks>();
  hooks->hasher = h;
  return hooks;
}

std::optional<std::pair<EntryId, std::uint64_t>> Find(LocalStore& s, const std::vector<std::uint32_t>& q,
                                                      std::uint64_t model = 1, const std::string& ns = "") {
  auto r = s.Lookup(ModelDigest(model), ns, q);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok() || !r->has_value()) return std::nullopt;
  return std::make_pair((*r)->id, (*r)->length);
}

class LookupByBlock : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(LookupByBlock, EveryQueryLengthFindsTheLongestStoredBoundary) {
  MemStore m(WithBlock(GetParam()), WithHasher(nullptr));
  auto conv = Conversation(1100, 1);
  const std::vector<std::size_t> lengths = {5, 16, 17, 100, 255, 256, 257, 511, 512, 600, 1000};
  std::map<std::size_t, EntryId> ids;
  for (auto l : lengths) ids[l] = MustPublish(*m.store, Prefix(conv, l), 1, "", kTiny);
  for (std::size_t q = 1; q <= conv.size(); ++q) {
    auto hit = Find(*m.store, Prefix(conv, q));
    auto want = ids.upper_bound(q);
    if (want == ids.begin()) {
      EXPECT_FALSE(hit.has_value()) << "q=" << q;
      continue;
    }
    --want;
    ASSERT_TRUE(hit.has_value()) << "q=" << q;
    EXPECT_EQ(hit->second, want->first) << "q=" << q;
    EXPECT_EQ(hit->first, want->second) << "q=" << q;
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, LookupByBlock, ::testing::Values(1u, 7u, 16u, 256u));

TEST(Lookup, BranchingConversations) {
  MemStore m(WithBlock(64), WithHasher(nullptr));
  auto a = Conversation(600, 10);
  auto b = Prefix(a, 300);
  auto tail = Conversation(300, 11);
  b.insert(b.end(), tail.begin(), tail.end());  // b shares a's first 300 tokens
  EntryId common = MustPublish(*m.store, Prefix(a, 200), 1, "", kTiny);
  EntryId a400 = MustPublish(*m.store, Prefix(a, 400), 1, "", kTiny);
  EntryId b500 = MustPublish(*m.store, Prefix(b, 500), 1, "", kTiny);
  EXPECT_EQ(Find(*m.store, Prefix(a, 450))->first, a400);
  EXPECT_EQ(Find(*m.store, Prefix(b, 450))->first, common) << "a's 400 diverged; b's 500 is longer";
  EXPECT_EQ(Find(*m.store, Prefix(b, 600))->first, b500);
  auto c = Prefix(a, 350);
  c.push_back(7);
  EXPECT_EQ(Find(*m.store, c)->first, common);
  EXPECT_EQ(Find(*m.store, Prefix(a, 300))->first, common);
}

TEST(Lookup, ExactLengthAndNoMatch) {
  MemStore m(WithBlock(32), WithHasher(nullptr));
  auto a = Conversation(100, 12);
  EntryId id = MustPublish(*m.store, a, 1, "", kTiny);
  auto hit = Find(*m.store, a);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->first, id);
  EXPECT_EQ(hit->second, 100u);
  EXPECT_FALSE(Find(*m.store, Prefix(a, 99))) << "a shorter query cannot use a longer boundary";
  auto other = a;
  other[0] ^= 1;
  EXPECT_FALSE(Find(*m.store, other)) << "differs in the first token";
  auto late = a;
  late[99] ^= 1;
  EXPECT_FALSE(Find(*m.store, late)) << "differs in the last token";
}

TEST(Lookup, NamespacesAndFingerprintsAreKeptApart) {
  MemStore m(WithBlock(16), WithHasher(nullptr));
  auto t = Conversation(80, 13);
  EntryId m1a = MustPublish(*m.store, t, 1, "a", kTiny);
  EntryId m1b = MustPublish(*m.store, t, 1, "b", kTiny);
  EntryId m2a = MustPublish(*m.store, t, 2, "a", kTiny);
  EXPECT_EQ(Find(*m.store, t, 1, "a")->first, m1a);
  EXPECT_EQ(Find(*m.store, t, 1, "b")->first, m1b);
  EXPECT_EQ(Find(*m.store, t, 2, "a")->first, m2a);
  EXPECT_FALSE(Find(*m.store, t, 2, "b"));
  EXPECT_FALSE(Find(*m.store, t, 3, "a"));
  EXPECT_FALSE(Find(*m.store, t, 1, ""));
  ASSERT_TRUE(m.store->Delete(m1a).ok());
  EXPECT_FALSE(Find(*m.store, t, 1, "a"));
  EXPECT_EQ(Find(*m.store, t, 1, "b")->first, m1b);
}

TEST(Lookup, CollisionsNeverServeTheWrongState) {
  CollidingHasher colliding;
  MemStore m(WithBlock(8), WithHasher(&colliding));
  // Same lengths, different tokens: every index record collides.
  std::vector<std::vector<std::uint32_t>> convs;
  std::vector<EntryId> ids;
  for (int i = 0; i < 6; ++i) {
    convs.push_back(Conversation(40, 200 + i));
    ids.push_back(MustPublish(*m.store, convs.back(), 1, "", kTiny));
  }
  for (int i = 0; i < 6; ++i) {
    auto hit = Find(*m.store, convs[i]);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->first, ids[i]);
    auto longer = convs[i];
    longer.push_back(1);
    EXPECT_EQ(Find(*m.store, longer)->first, ids[i]);
    auto back = m.store->FetchAll(hit->first);
    ASSERT_TRUE(back.ok());
    ExpectSameLayers(*back, MakeLayers(convs[i], kTiny));
  }
  EXPECT_FALSE(Find(*m.store, Conversation(40, 999))) << "a colliding stranger is no hit";
  EXPECT_FALSE(Find(*m.store, Conversation(45, 999)));
  // The same collisions survive deletion bookkeeping.
  ASSERT_TRUE(m.store->Delete(ids[2]).ok());
  EXPECT_FALSE(Find(*m.store, convs[2]));
  EXPECT_EQ(Find(*m.store, convs[3])->first, ids[3]);
  ExpectConsistent(*m.store);
}

TEST(Lookup, OpeningWithAnotherHasherIsRefused) {
  CollidingHasher colliding;
  MemStore m(WithBlock(8), WithHasher(&colliding));
  MustPublish(*m.store, Conversation(20, 1), 1, "", kTiny);
  m.store.reset();
  auto s = LocalStore::Open(m.options);  // the default hasher
  EXPECT_TRUE(s.status().IsFailedPrecondition()) << s.status().ToString();
}

TEST(Lookup, CountsHitsMissesAndCanTakeALease) {
  MemStore m(WithBlock(16), WithHasher(nullptr));
  auto t = Conversation(50, 14);
  EntryId id = MustPublish(*m.store, t, 1, "", kTiny);
  ASSERT_TRUE(Find(*m.store, t));
  ASSERT_FALSE(Find(*m.store, Conversation(50, 15)));
  LookupOptions quiet;
  quiet.record = false;
  ASSERT_TRUE(m.store->Lookup(ModelDigest(1), "", t, quiet).ok());
  auto st = m.store->Stat();
  EXPECT_EQ(st->hits, 1u);
  EXPECT_EQ(st->misses, 1u);

  Lease lease;
  LookupOptions leased;
  leased.lease = &lease;
  auto r = m.store->Lookup(ModelDigest(1), "", t, leased);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_TRUE(lease.held());
  EXPECT_EQ(lease.id(), id);
  EXPECT_EQ(m.store->Stat()->active_leases, 1u);
  EXPECT_EQ(m.store->Delete(id).code(), StatusCode::kUnavailable);
  lease.Release();
  EXPECT_EQ(m.store->Stat()->active_leases, 0u);
  EXPECT_TRUE(m.store->Delete(id).ok());
}

// A random forest of conversations: prefixes shared at random points, entries
// at random lengths, some deleted; every query's answer must be the brute
// force longest stored prefix.
struct DiffCase {
  const char* name;
  int hasher;  // 0 default, 1 colliding, 2 weak
  std::uint32_t block;
};

class LookupDifferential : public ::testing::TestWithParam<DiffCase> {};

TEST_P(LookupDifferential, MatchesBruteForce) {
  CollidingHasher colliding;
  WeakHasher weak;
  const TokenHasher* h = GetParam().hasher == 1   ? static_cast<const TokenHasher*>(&colliding)
                         : GetParam().hasher == 2 ? static_cast<const TokenHasher*>(&weak)
                                                  : nullptr;
  MemStore m(WithBlock(GetParam().block), WithHasher(h));
  std::mt19937_64 rng(1234 + GetParam().block);
  // Tokens from a tiny alphabet so that sequences share prefixes often.
  std::vector<std::vector<std::uint32_t>> bases;
  for (int i = 0; i < 12; ++i) {
    std::vector<std::uint32_t> t;
    if (!bases.empty() && rng() % 3 != 0) {
      const auto& parent = bases[rng() % bases.size()];
      t = Prefix(parent, rng() % parent.size());
    }
    std::size_t target = 20 + rng() % 300;
    while (t.size() < target) t.push_back(static_cast<std::uint32_t>(rng() % 3));
    bases.push_back(t);
  }
  std::map<std::vector<std::uint32_t>, EntryId> stored;
  for (int i = 0; i < 40; ++i) {
    const auto& b = bases[rng() % bases.size()];
    std::size_t len = 1 + rng() % b.size();
    if (rng() % 4 == 0) len = std::max<std::size_t>(1, len / GetParam().block * GetParam().block);
    auto t = Prefix(b, len);
    if (stored.count(t) != 0) continue;
    stored[t] = MustPublish(*m.store, t, 1, "", kTiny);
  }
  for (int i = 0; i < 8; ++i) {  // deletions
    auto it = stored.begin();
    std::advance(it, static_cast<long>(rng() % stored.size()));
    ASSERT_TRUE(m.store->Delete(it->second).ok());
    stored.erase(it);
  }
  int hits = 0, partial = 0;
  for (int i = 0; i < 300; ++i) {
    auto q = bases[rng() % bases.size()];
    q.resize(1 + rng() % q.size());
    if (rng() % 3 == 0) q[rng() % q.size()] = static_cast<std::uint32_t>(rng() % 3);
    if (rng() % 3 == 0) q.push_back(static_cast<std::uint32_t>(rng() % 3));
    std::optional<std::pair<EntryId, std::size_t>> want;
    for (const auto& [t, id] : stored) {
      if (t.size() <= q.size() && std::equal(t.begin(), t.end(), q.begin()) &&
          (!want || t.size() > want->second)) {
        want = std::make_pair(id, t.size());
      }
    }
    auto got = Find(*m.store, q);
    ASSERT_EQ(got.has_value(), want.has_value()) << "query " << i << " of length " << q.size();
    if (want) {
      EXPECT_EQ(got->first, want->first) << "query " << i;
      EXPECT_EQ(got->second, want->second) << "query " << i;
      ++hits;
      if (want->second < q.size()) ++partial;
    }
  }
  // The workload must exercise both outcomes and the longer-query case.
  EXPECT_GT(hits, 60);
  EXPECT_LT(hits, 290);
  EXPECT_GT(partial, 30);
  ExpectConsistent(*m.store);
}

INSTANTIATE_TEST_SUITE_P(Hashers, LookupDifferential,
                         ::testing::Values(DiffCase{"default_b1", 0, 1}, DiffCase{"default_b7", 0, 7},
                                           DiffCase{"default_b64", 0, 64}, DiffCase{"colliding_b7", 1, 7},
                                           DiffCase{"colliding_b64", 1, 64}, DiffCase{"weak_b5", 2, 5}),
                         [](const auto& info) { return std::string(info.param.name); });

// A hit carries what a restore sizes itself by, the same figures Describe
// gives, without a Describe of its own.
TEST(Lookup, HitCarriesTheEntrysSizes) {
  MemStore m(WithBlock(16), WithHasher(nullptr));
  auto t = Conversation(70, 21);
  EntryId id = MustPublish(*m.store, t, 1, "", kTiny);
  auto r = m.store->Lookup(ModelDigest(1), "", t);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  auto info = m.store->Describe(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ((*r)->id, id);
  EXPECT_EQ((*r)->length, t.size());
  EXPECT_EQ((*r)->layers, info->info.layers);
  EXPECT_GT((*r)->layers, 0u);
  EXPECT_EQ((*r)->chunk_bytes, info->info.chunk_bytes);
  EXPECT_GT((*r)->chunk_bytes, 0u);
  EXPECT_EQ((*r)->raw_bytes, info->info.raw_bytes);
  EXPECT_GT((*r)->raw_bytes, 0u);
}

}  // namespace
}  // namespace primecache

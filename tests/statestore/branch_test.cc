// The lookup's branch point (LookupOptions::shared_tokens): the longest
// prefix of the query that a live entry shares token for token, boundary
// there or not. Hand-made stores (no entry, a stored prefix, a divergence
// inside a 64-token block and at its edge, a query inside an entry, other
// scopes, removal), collisions forced with a test hasher, the records kept
// by verify and given to an older store's entries at open, and a randomized
// comparison with a brute-force answer.
#include <algorithm>
#include <random>

#include "raw_db.h"
#include "statestore/format.h"
#include "statestore/test_hooks.h"
#include "core/token_hash.h"
#include "lookup_util.h"
#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)
using statestore_internal::TestHooks;

struct Answer {
  std::uint64_t hit = 0;  // the hit's length, 0 on a miss
  std::uint64_t shared = 0;
};

Answer Ask(LocalStore& s, const std::vector<std::uint32_t>& q, std::uint64_t model = 1, const std::string& ns = "") {
  Answer a;
  LookupOptions o;
  o.shared_tokens = &a.shared;
  auto r = s.Lookup(ModelDigest(model), ns, q, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok() && r->has_value()) a.hit = (*r)->length;
  return a;
}

void ExpectHandMadeCases(LocalStore& s) {
  const auto conv = Conversation(1000, 1);
  // No entry.
  EXPECT_EQ(Ask(s, conv).shared, 0u);
  EntryId e = MustPublish(s, conv, 1, "", kTiny);
  // A query inside the entry: all of it is shared, and no boundary is its prefix.
  Answer a = Ask(s, Prefix(conv, 500));
  EXPECT_EQ(a.hit, 0u);
  EXPECT_EQ(a.shared, 500u);
  // Diverging inside a 64-token block (700 = 10 * 64 + 60) and at a block edge (640).
  for (std::size_t at : {700u, 640u, 64u, 65u, 999u}) {
    a = Ask(s, DivergeAt(conv, at, 1200, 2 + at));
    EXPECT_EQ(a.hit, 0u) << at;
    EXPECT_EQ(a.shared, at) << at;
  }
  // Sharing less than one whole block: no pass record leads there (a
  // colliding hasher's may), and no answer claims more than is shared.
  EXPECT_LE(Ask(s, DivergeAt(conv, 63, 300, 3)).shared, 63u);
  // The query extends the entry: the hit is the boundary, and so is the branch point.
  std::vector<std::uint32_t> longer = conv;
  for (std::uint32_t x : Conversation(200, 4)) longer.push_back(x);
  a = Ask(s, longer);
  EXPECT_EQ(a.hit, 1000u);
  EXPECT_EQ(a.shared, 1000u);
  // A stored boundary that is a prefix and another entry that goes further.
  MustPublish(s, Prefix(conv, 300), 1, "", kTiny);
  a = Ask(s, DivergeAt(conv, 777, 900, 5));
  EXPECT_EQ(a.hit, 300u);
  EXPECT_EQ(a.shared, 777u);
  // Another model or namespace shares nothing.
  EXPECT_EQ(Ask(s, DivergeAt(conv, 700, 900, 6), 2).shared, 0u);
  EXPECT_EQ(Ask(s, DivergeAt(conv, 700, 900, 6), 1, "other").shared, 0u);
  // Removing the entry takes its branch points with it.
  ASSERT_TRUE(s.Delete(e).ok());
  a = Ask(s, DivergeAt(conv, 700, 900, 7));
  EXPECT_EQ(a.hit, 300u);
  EXPECT_EQ(a.shared, 300u);
  ExpectConsistent(s);
}

TEST(BranchPoint, HandMadeStores) {
  MemStore m;
  ExpectHandMadeCases(*m.store);
}

// With every hash colliding, the pass records say every level is shared:
// the stored tokens still give the exact answer.
TEST(BranchPoint, CollisionsAreSettledByTheStoredTokens) {
  static const CollidingHasher colliding;
  auto hooks = std::make_shared<TestHooks>();
  hooks->hasher = &colliding;
  MemStore m(CodecStoreOptions(), hooks);
  ExpectHandMadeCases(*m.store);
  // Two unrelated entries: a query that shares 130 tokens with one of them.
  const auto a = Conversation(600, 11), b = Conversation(600, 12);
  MustPublish(*m.store, a, 1, "", kTiny);
  MustPublish(*m.store, b, 1, "", kTiny);
  EXPECT_EQ(Ask(*m.store, DivergeAt(b, 130, 400, 13)).shared, 130u);
  EXPECT_EQ(Ask(*m.store, Conversation(400, 14)).shared, 0u);
}

// A lookup that does not ask does not get (or pay for) a branch point; the
// records survive a reopen and are what verify expects.
TEST(BranchPoint, RecordsSurviveAReopenAndVerify) {
  MemStore m;
  const auto conv = Conversation(900, 21);
  MustPublish(*m.store, conv, 1, "", kTiny);
  auto plain = m.store->Lookup(ModelDigest(1), "", DivergeAt(conv, 500, 800, 22));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->has_value());
  m.Reopen();
  EXPECT_EQ(Ask(*m.store, DivergeAt(conv, 500, 800, 22)).shared, 500u);
  ExpectConsistent(*m.store);
}

// A store whose entries have no pass records (written before them) gets
// them at its next writable open; read-only, it answers without them.
TEST(BranchPoint, AnOlderStoresEntriesGetTheirRecordsAtOpen) {
  MemStore m;
  const auto conv = Conversation(900, 31);
  MustPublish(*m.store, conv, 1, "", kTiny);
  m.store.reset();
  {
    RawDb raw(m.env.get(), m.options.path);
    std::size_t removed = raw.DeletePrefix(statestore_internal::kCfIndex, std::string(1, statestore_internal::kPassTag));
    EXPECT_GT(removed, 0u);
    raw.Delete(statestore_internal::kCfMeta, std::string(statestore_internal::kMetaPassIndexKey));
  }
  StoreOptions ro = m.options;
  ro.read_only = true;
  {
    auto s = LocalStore::Open(ro);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(Ask(**s, DivergeAt(conv, 500, 800, 32)).shared, 0u);
  }
  m.Reopen();
  EXPECT_EQ(Ask(*m.store, DivergeAt(conv, 500, 800, 32)).shared, 500u);
  ExpectConsistent(*m.store);
}

// An entry removed between its pass records and its tokens (as a racing
// eviction leaves a lookup that read the records first): the branch point
// skips it, never an error, and never claims its tokens.
TEST(BranchPoint, AnEntryGoneUnderItsPassRecordsIsNoBranch) {
  MemStore m;
  const auto conv = Conversation(900, 41);
  const EntryId e = MustPublish(*m.store, conv, 1, "", kTiny);
  m.store.reset();
  {
    RawDb raw(m.env.get(), m.options.path);
    raw.Delete(statestore_internal::kCfTokens, statestore_internal::IdKey(e));
  }
  m.Reopen();
  Answer a = Ask(*m.store, DivergeAt(conv, 500, 800, 42));
  EXPECT_EQ(a.hit, 0u);
  EXPECT_EQ(a.shared, 0u);
}

// Random trees of conversations against a brute force: the answer never
// claims more than some entry shares; it reaches the deepest shared whole
// block; and it is exact whenever at most four entries pass that block
// (the entries whose tokens it reads).
TEST(BranchPoint, RandomTreesAgreeWithABruteForce) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3; ++round) {
    MemStore m;
    std::vector<std::vector<std::uint32_t>> stored;
    const auto root = Conversation(2000, 100 + round);
    for (int i = 0; i < 12; ++i) {
      const auto& base = stored.empty() || rng() % 3 == 0 ? root : stored[rng() % stored.size()];
      const std::size_t at = 1 + rng() % (base.size() - 1);
      const std::size_t len = at + 1 + rng() % 600;
      auto t = DivergeAt(base, at, len, 1000 + round * 100 + i);
      MustPublish(*m.store, t, 1, "", kTiny);
      stored.push_back(std::move(t));
    }
    for (int qn = 0; qn < 60; ++qn) {
      const auto& base = stored[rng() % stored.size()];
      const std::size_t at = 1 + rng() % (base.size() - 1);
      const auto q = DivergeAt(base, at, at + 1 + rng() % 300, 5000 + qn);
      const std::uint64_t brute = LongestSharedPrefix(q, stored);
      const std::uint64_t block = brute / statestore_internal::kPassBlockTokens * statestore_internal::kPassBlockTokens;
      std::size_t passing = 0;
      for (const auto& s : stored) {
        if (block > 0 && s.size() >= block && std::equal(q.begin(), q.begin() + block, s.begin())) ++passing;
      }
      const Answer a = Ask(*m.store, q);
      EXPECT_LE(a.shared, brute) << "round " << round << " query " << qn;
      if (block > 0) {
        EXPECT_GE(a.shared, block) << "round " << round << " query " << qn;
        if (passing <= 4) {
          EXPECT_EQ(a.shared, brute) << "round " << round << " query " << qn;
        }
      }
    }
    ExpectConsistent(*m.store);
  }
}

}  // namespace
}  // namespace primecache

// Group publishes (PublishGroup): one tensor-parallel entry from every
// rank's part, visible only once every part committed; a part that ends
// uncommitted, or a group past its deadline, leaves no entry and gives every
// staged byte back; what the parts send is checked as one entry.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "store_test_util.h"

namespace primecache::store_test {
namespace {

TestModel TpModel() {
  TestModel m;
  m.heads = 4;
  m.recurrent_layers = 2;
  return m;
}

PublishRequest PartRequest(const std::vector<std::uint32_t>& tokens, std::uint64_t token, std::uint32_t ranks,
                           std::uint32_t rank, std::string descriptor = "") {
  PublishRequest r = Request(tokens);
  r.group = PublishGroup{token, ranks, rank};
  if (!descriptor.empty()) {
    r.model_descriptor = std::move(descriptor);
    r.model = Checksum128(std::as_bytes(std::span(r.model_descriptor.data(), r.model_descriptor.size())));
  }
  return r;
}

// Begins rank `rank`'s part and streams its layers (no commit).
std::unique_ptr<Publisher> Stream(LocalStore& s, PublishRequest req, const std::vector<LayerBytes>& layers) {
  auto start = s.BeginPublish(std::move(req));
  EXPECT_TRUE(start.ok()) << start.status().ToString();
  if (!start.ok() || start->publisher == nullptr) return nullptr;
  for (const LayerBytes& l : layers) EXPECT_TRUE(start->publisher->AddLayer(l).ok());
  return std::move(start->publisher);
}

std::optional<LookupHit> Find(LocalStore& s, const std::vector<std::uint32_t>& tokens, Hash128 model) {
  auto hit = s.Lookup(model, "", tokens, {.record = false});
  EXPECT_TRUE(hit.ok()) << hit.status().ToString();
  return hit.ok() ? *hit : std::nullopt;
}

std::uint64_t Staged(LocalStore& s) {
  return s.Stat().value().staged_bytes;
}

class GroupPublish : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(GroupPublish, TheEntryIsVisibleOnlyOnceEveryRankCommitted) {
  const std::uint32_t ranks = GetParam();
  MemStore m;
  const auto tokens = Conversation(300, 7);
  const auto parts = MakeGroupParts(tokens, ranks, TpModel());
  const std::string descriptor = DescriptorFor(MakeLayers(tokens, TpModel()));
  std::vector<std::unique_ptr<Publisher>> pubs;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    pubs.push_back(Stream(*m.store, PartRequest(tokens, 42, ranks, r, descriptor), parts[r]));
    ASSERT_NE(pubs.back(), nullptr);
  }
  const Hash128 model = PartRequest(tokens, 42, ranks, 0, descriptor).model;
  // Every rank but rank 0 first: each part is durable and waits.
  for (std::uint32_t r = 1; r < ranks; ++r) {
    auto pending = pubs[r]->Commit();
    ASSERT_TRUE(pending.ok()) << pending.status().ToString();
    EXPECT_TRUE(pending->group_pending);
    EXPECT_EQ(pending->id, 0u);
    EXPECT_FALSE(Find(*m.store, tokens, model)) << "visible before rank 0 committed";
  }
  EXPECT_GT(Staged(*m.store), 0u);
  auto done = pubs[0]->Commit();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_FALSE(done->group_pending);
  EXPECT_GT(done->id, 0u);
  auto hit = Find(*m.store, tokens, model);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->id, done->id);
  EXPECT_EQ(hit->ranks, ranks);
  EXPECT_EQ(hit->layers, 2u + 2u * ranks);  // two latent layers once, two recurrent layers a shard a rank
  auto detail = m.store->Describe(done->id);
  ASSERT_TRUE(detail.ok());
  EXPECT_EQ(detail->info.ranks, ranks);
  ExpectSameLayers(m.store->FetchAll(done->id).value(), Concat(parts));
  EXPECT_EQ(Staged(*m.store), 0u);
  ExpectConsistent(*m.store);
  m.Reopen();  // and durable
  ExpectSameLayers(m.store->FetchAll(done->id).value(), Concat(parts));
  EXPECT_EQ(m.store->Describe(done->id)->info.ranks, ranks);
  ExpectConsistent(*m.store);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GroupPublish, ::testing::Values(2u, 4u));

// A whole TP entry from one publisher (PublishRequest::ranks: what the
// remote tier brings back) is the entry the group writes, checked the same way.
TEST(GroupPublishTest, AWholeTensorParallelEntryFromOnePublisherIsTheGroupsEntry) {
  MemStore m;
  const auto tokens = Conversation(300, 17);
  const auto parts = MakeGroupParts(tokens, 4, TpModel());
  const std::string descriptor = DescriptorFor(MakeLayers(tokens, TpModel()));
  PublishRequest whole = PartRequest(tokens, 1, 4, 0, descriptor);
  whole.group.reset();
  whole.ranks = 4;
  auto done = m.store->Publish(whole, Concat(parts));
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_FALSE(done->group_pending);
  auto hit = Find(*m.store, tokens, whole.model);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->ranks, 4u);
  ExpectSameLayers(m.store->FetchAll(done->id).value(), Concat(parts));
  m.Reopen();
  EXPECT_EQ(m.store->Describe(done->id)->info.ranks, 4u);
  ExpectConsistent(*m.store);

  // Refused, and nothing stored: parts that are not 4 ranks' (the rank count
  // does not fit the layers), a rank count out of range, and a group part
  // that also names a whole entry's ranks.
  const auto other = Conversation(301, 18);
  PublishRequest three = PartRequest(other, 1, 4, 0, descriptor);
  three.group.reset();
  three.ranks = 3;
  EXPECT_EQ(m.store->Publish(three, Concat(MakeGroupParts(other, 4, TpModel()))).status().code(),
            StatusCode::kInvalidArgument);
  three.ranks = 0;
  EXPECT_FALSE(m.store->Publish(three, Concat(MakeGroupParts(other, 4, TpModel()))).ok());
  PublishRequest both = PartRequest(other, 1, 4, 0, descriptor);
  both.ranks = 4;
  EXPECT_EQ(m.store->BeginPublish(both).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Find(*m.store, other, whole.model));
  EXPECT_EQ(Staged(*m.store), 0u);
  ExpectConsistent(*m.store);
}

TEST(GroupPublishTest, PartsMayCommitInAnyOrder) {
  MemStore m;
  const auto tokens = Conversation(200, 8);
  const auto parts = MakeGroupParts(tokens, 4, TpModel());
  std::vector<std::unique_ptr<Publisher>> pubs;
  for (std::uint32_t r = 0; r < 4; ++r)
    pubs.push_back(Stream(*m.store, PartRequest(tokens, 9, 4, r), parts[r]));
  for (std::uint32_t r : {2u, 0u, 3u}) EXPECT_TRUE(pubs[r]->Commit()->group_pending) << r;
  auto done = pubs[1]->Commit();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ExpectSameLayers(m.store->FetchAll(done->id).value(), Concat(parts));  // rank order, not commit order
  ExpectConsistent(*m.store);
}

TEST(GroupPublishTest, APartEndedWithoutACommitAbortsTheGroupAndGivesEveryByteBack) {
  MemStore m;
  const auto tokens = Conversation(300, 9);
  TestModel six = TpModel();
  six.heads = 6;
  const auto parts = MakeGroupParts(tokens, 3, six);
  auto p0 = Stream(*m.store, PartRequest(tokens, 5, 3, 0), parts[0]);
  auto p1 = Stream(*m.store, PartRequest(tokens, 5, 3, 1), parts[1]);
  ASSERT_TRUE(p1->Commit()->group_pending);
  p0.reset();  // rank 0 dies mid-publish
  EXPECT_EQ(Staged(*m.store), 0u);
  EXPECT_FALSE(Find(*m.store, tokens, ModelDigest(1)));
  // A late rank of that group is told why.
  auto late = m.store->BeginPublish(PartRequest(tokens, 5, 3, 2));
  EXPECT_EQ(late.status().code(), StatusCode::kAborted);
  EXPECT_NE(late.status().message().find("rank 0 ended its part without a commit"), std::string::npos)
      << late.status().ToString();
  ExpectConsistent(*m.store);
  // Another group publishes the boundary.
  std::vector<std::unique_ptr<Publisher>> again;
  for (std::uint32_t r = 0; r < 3; ++r)
    again.push_back(Stream(*m.store, PartRequest(tokens, 6, 3, r), parts[r]));
  for (std::uint32_t r = 1; r < 3; ++r) ASSERT_TRUE(again[r]->Commit().ok());
  ASSERT_TRUE(again[0]->Commit().ok());
  EXPECT_TRUE(Find(*m.store, tokens, ModelDigest(1)));
  ExpectConsistent(*m.store);
}

TEST(GroupPublishTest, AGroupNotCompleteByItsDeadlineIsAbortedAndItsPartsGivenBack) {
  StoreOptions o = CodecStoreOptions();
  o.group_timeout_ms = 100;
  MemStore m(o);
  const auto tokens = Conversation(250, 10);
  const auto parts = MakeGroupParts(tokens, 2, TpModel());
  auto p0 = Stream(*m.store, PartRequest(tokens, 11, 2, 0), parts[0]);
  auto p1 = Stream(*m.store, PartRequest(tokens, 11, 2, 1), parts[1]);
  ASSERT_TRUE(p1->Commit()->group_pending);
  ASSERT_GT(Staged(*m.store), 0u);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  // p0 still holds its own staged bytes; the parked part's go back.
  const std::uint64_t mine = Staged(*m.store);
  while (Staged(*m.store) == mine && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(Staged(*m.store), mine) << "the parked part was not given back";
  auto late = p0->Commit();
  EXPECT_EQ(late.status().code(), StatusCode::kAborted);
  EXPECT_NE(late.status().message().find("not every rank committed in time"), std::string::npos)
      << late.status().ToString();
  EXPECT_EQ(Staged(*m.store), 0u);
  EXPECT_FALSE(Find(*m.store, tokens, ModelDigest(1)));
  ExpectConsistent(*m.store);
}

TEST(GroupPublishTest, MalformedGroupsAreRefusedByName) {
  MemStore m;
  const auto tokens = Conversation(100, 11);
  auto with = [&](PublishGroup g) {
    PublishRequest r = Request(tokens);
    r.group = g;
    return m.store->BeginPublish(std::move(r)).status();
  };
  EXPECT_EQ(with({0, 2, 0}).message(), "a group publish needs a token other than 0");
  EXPECT_EQ(with({1, 1, 0}).message(), "a group publish has 2..1024 ranks, not 1");
  EXPECT_EQ(with({1, 2, 2}).message(), "rank 2 of a group of 2");
  auto first = m.store->BeginPublish(PartRequest(tokens, 3, 2, 0));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(m.store->BeginPublish(PartRequest(tokens, 3, 2, 0)).status().message(),
            "rank 0 of group publish 3 began already");
  EXPECT_EQ(m.store->BeginPublish(PartRequest(tokens, 3, 4, 1)).status().message(),
            "group publish 3 has 2 ranks; this part says 4");
}

TEST(GroupPublishTest, PartsThatDoNotGatherIntoOneEntryAreRefusedAtTheLastCommit) {
  MemStore m;
  const auto tokens = Conversation(200, 12);
  auto parts = MakeGroupParts(tokens, 2, TpModel());
  TestModel wider = TpModel();
  wider.heads = 8;
  parts[1] = MakeGroupParts(tokens, 2, wider)[1];  // rank 1's shards hold 4 heads, rank 0's 2
  auto p0 = Stream(*m.store, PartRequest(tokens, 4, 2, 0), parts[0]);
  auto p1 = Stream(*m.store, PartRequest(tokens, 4, 2, 1), parts[1]);
  ASSERT_TRUE(p1->Commit()->group_pending);
  auto refused = p0->Commit();
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("rank 1's shard of layer 2 is not shaped as rank 0's"),
            std::string::npos)
      << refused.status().ToString();
  EXPECT_FALSE(Find(*m.store, tokens, ModelDigest(1)));
  EXPECT_EQ(Staged(*m.store), 0u);
  // One part missing: not one rank's layers and another's shards.
  auto q0 = Stream(*m.store, PartRequest(tokens, 5, 2, 0), parts[0]);
  auto q1 = Stream(*m.store, PartRequest(tokens, 5, 2, 1), {parts[1][0]});
  ASSERT_TRUE(q1->Commit()->group_pending);
  EXPECT_EQ(q0->Commit().status().code(), StatusCode::kInvalidArgument);
  ExpectConsistent(*m.store);
}

TEST(GroupPublishTest, TheGatheredShapesAreCheckedAgainstTheModelsPlan) {
  MemStore m;
  const auto tokens = Conversation(200, 13);
  const auto parts = MakeGroupParts(tokens, 2, TpModel());
  TestModel other = TpModel();
  other.recurrent_layers = 3;
  const std::string wrong = DescriptorFor(MakeLayers(tokens, other));
  auto p0 = Stream(*m.store, PartRequest(tokens, 6, 2, 0, wrong), parts[0]);
  auto p1 = Stream(*m.store, PartRequest(tokens, 6, 2, 1, wrong), parts[1]);
  ASSERT_TRUE(p1->Commit()->group_pending);
  auto refused = p0->Commit();
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not the plan of model"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(Staged(*m.store), 0u);
}

TEST(GroupPublishTest, AStoredIdentityIsNotPublishedAgainByAnyRank) {
  MemStore m;
  const auto tokens = Conversation(200, 14);
  const auto parts = MakeGroupParts(tokens, 2, TpModel());
  auto p0 = Stream(*m.store, PartRequest(tokens, 7, 2, 0), parts[0]);
  auto p1 = Stream(*m.store, PartRequest(tokens, 7, 2, 1), parts[1]);
  ASSERT_TRUE(p1->Commit().ok());
  const EntryId id = p0->Commit().value().id;
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto again = m.store->BeginPublish(PartRequest(tokens, 8, 2, r));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->publisher, nullptr);
    EXPECT_EQ(again->existing, id);
  }
}

TEST(GroupPublishTest, ClosingTheStoreGivesParkedPartsBack) {
  MemStore m;
  const auto tokens = Conversation(200, 15);
  const auto parts = MakeGroupParts(tokens, 2, TpModel());
  auto p1 = Stream(*m.store, PartRequest(tokens, 9, 2, 1), parts[1]);
  ASSERT_TRUE(p1->Commit()->group_pending);
  m.Reopen();
  EXPECT_EQ(Staged(*m.store), 0u);
  EXPECT_FALSE(Find(*m.store, tokens, ModelDigest(1)));
  ExpectConsistent(*m.store);
}

TEST(GroupPublishTest, ManyGroupsAtOnceFromManyThreads) {
  MemStore m;
  constexpr std::uint32_t kRanks = 4, kGroups = 6;
  std::vector<std::vector<std::uint32_t>> tokens;
  std::vector<std::vector<std::vector<LayerBytes>>> parts;
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    tokens.push_back(Conversation(150 + 10 * g, 100 + g));
    parts.push_back(MakeGroupParts(tokens.back(), kRanks, TpModel()));
  }
  std::vector<Status> errors(kRanks);
  {
    std::vector<std::jthread> ranks;
    for (std::uint32_t r = 0; r < kRanks; ++r) {
      ranks.emplace_back([&, r] {
        for (std::uint32_t g = 0; g < kGroups; ++g) {
          auto p = Stream(*m.store, PartRequest(tokens[g], 1000 + g, kRanks, r), parts[g][r]);
          auto done = p->Commit();
          if (!done.ok() && errors[r].ok()) errors[r] = done.status();
        }
      });
    }
  }
  for (const Status& e : errors) EXPECT_TRUE(e.ok()) << e.ToString();
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    auto hit = Find(*m.store, tokens[g], ModelDigest(1));
    ASSERT_TRUE(hit) << "group " << g;
    ExpectSameLayers(m.store->FetchAll(hit->id).value(), Concat(parts[g]));
  }
  EXPECT_EQ(Staged(*m.store), 0u);
  ExpectConsistent(*m.store);
}

}  // namespace
}  // namespace primecache::store_test

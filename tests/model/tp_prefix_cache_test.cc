// The TP model through a real daemon (TpPrefixCache): at TP 1, 2 and 4 a
// restored continuation is bit-identical to the same TP going on without a
// restore; an entry of TP a restores at TP b bit-identical to the boundary
// resharded in memory, and within the spec's tolerance of TP b uncached;
// the replicated planes are stored once.
#include <gtest/gtest.h>

#include <cmath>

#include "primecache/internal/shard.h"
#include "serving/prefix_cache.h"
#include "serving/tp_prefix_cache.h"
#include "tests/model/tp_case.h"
#include "tests/model/step_compare.h"

namespace primecache::model {
namespace {

using namespace tp_case;
using testing::RelErr;

TEST(TpPrefixCacheTest, ARestoreAtEachTpContinuesBitForBit) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  for (std::uint32_t tp : {1u, 2u, 4u}) {
    SCOPED_TRACE("TP " + std::to_string(tp));
    const std::string ns = "tp" + std::to_string(tp);
    PublishAt(k, d, tp, ns);
    EXPECT_EQ(RestoreAt(k, d, tp, ns, StoredParts(tp)), Straight(k, tp));
  }
}

TEST(TpPrefixCacheTest, AnEntryOfOneTpRestoresAtAnother) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  for (auto [from, to] : {std::pair{2u, 4u}, {2u, 1u}, {4u, 2u}, {1u, 2u}}) {
    SCOPED_TRACE("TP " + std::to_string(from) + " to " + std::to_string(to));
    const std::string ns = "from" + std::to_string(from) + "to" + std::to_string(to);
    PublishAt(k, d, from, ns);
    const std::vector<float> got = RestoreAt(k, d, to, ns, StoredParts(from));
    EXPECT_EQ(got, ReshardedInMemory(k, from, to));
    EXPECT_LE(RelErr(got, Straight(k, to)), 1e-4);
  }
}

TEST(TpPrefixCacheTest, TheReplicatedPlanesAreStoredOnce) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  PublishAt(k, d, 1, "one");
  PublishAt(k, d, 4, "four");
  auto one = Connect(d, "one"), four = Connect(d, "four");
  auto hit1 = one->Lookup(k.id(), k.prompt).value(), hit4 = four->Lookup(k.id(), k.prompt).value();
  ASSERT_TRUE(hit1 && hit4);
  EXPECT_EQ(hit1->ranks, 1u);
  EXPECT_EQ(hit4->ranks, 4u);
  // 5 layers at TP 1; at TP 4 the 3 sharded layers (2 KDA, 1 attn) in each of its 4 parts, the 2 MLA
  // layers once.
  EXPECT_EQ(hit1->layers, 5u);
  EXPECT_EQ(hit4->layers, 5u + 3u * 3u);
  // The same decoded bytes: every plane once, the latent and indexer planes not four times.
  EXPECT_EQ(hit4->raw_bytes, hit1->raw_bytes);
}

}  // namespace
}  // namespace primecache::model

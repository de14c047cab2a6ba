// Ranks of their own (PrefixCacheOptions::tp): every rank of a TP engine
// runs its own PrefixCache over its rank's model, with its own connection,
// the ranks meeting only in their collective (here the in-process group, a
// thread per rank, as a TP engine's processes meet in NCCL). Through a real
// daemon:
//  - the ranks' group publish is one entry, which a later engine of the
//    same TP size restores bit for bit, each rank fetching only its parts;
//  - an entry of another TP size (a rank engine's or TpPrefixCache's, TP 1
//    included) restores bit-identical to the boundary resharded in memory
//    and within 1e-4 of the restoring TP uncached;
//  - a damaged shard on one rank, or a rank that cannot read the entry,
//    makes every rank prime in full, with no rank left waiting.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "primecache/internal/codec.h"
#include "primecache/internal/rank_parts.h"
#include "tests/ipc/http_scrape.h"
#include "tests/model/step_compare.h"
#include "tests/model/tp_case.h"

namespace primecache::model {
namespace {

using namespace tp_case;
using testing::RelErr;

constexpr std::uint64_t kGroupToken = 0x5eed;
constexpr std::uint32_t kParts = 4;  // StoredParts of every TP above 1

// The ranks of one TP engine, each with its PrefixCache.
struct RankEngines {
  std::unique_ptr<TensorParallelModel> model;
  std::vector<std::unique_ptr<PrefixCache>> caches;

  // Runs fn(r) on every rank at once, a thread each.
  void OnRanks(const std::function<void(std::uint32_t)>& fn) {
    std::vector<std::jthread> threads;
    for (std::uint32_t r = 0; r < caches.size(); ++r) threads.emplace_back([&fn, r] { fn(r); });
  }

  std::vector<Result<Request>> Prime(std::span<const std::uint32_t> prompt, bool all_logits) {
    std::vector<Result<Request>> out;
    for (std::size_t r = 0; r < caches.size(); ++r) out.emplace_back(Status::Internal("not run"));
    OnRanks([&](std::uint32_t r) { out[r] = caches[r]->Prime(prompt, all_logits); });
    return out;
  }
};

// TP `tp`'s ranks, rank r connected under ns[r] (one name: every rank's).
RankEngines MakeRanks(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp,
                      std::vector<std::string> ns) {
  RankEngines e;
  e.model = MakeTp(k.config, k.weights, tp);
  for (std::uint32_t r = 0; r < tp; ++r) {
    PrefixCacheOptions o;
    o.encode.all_planes =
        TransformSpec{"raw/v1", 0};  // the damage test finds a shard's bytes in the segments
    o.decode_threads = 2;
    o.tp = {tp, r, kGroupToken};
    client::ClientOptions co = d.Options(ns[ns.size() == 1 ? 0 : r]);
    co.tp_rank = r;  // the daemon's metrics count each rank's fetched bytes
    auto c = client::Client::Connect(co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    e.caches.push_back(
        std::make_unique<PrefixCache>(&e.model->rank(r), c.ok() ? std::move(c).value() : nullptr, k.id(), o));
  }
  return e;
}

// The ranks prime the prompt and publish its boundary as one group.
void PublishByRanks(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp,
                    const std::string& ns) {
  RankEngines e = MakeRanks(k, d, tp, {ns});
  auto reqs = e.Prime(k.prompt, false);
  for (std::uint32_t r = 0; r < tp; ++r) {
    ASSERT_TRUE(reqs[r].ok()) << reqs[r].status().ToString();
    e.caches[r]->Finish(*reqs[r]);
  }
  for (std::uint32_t r = 0; r < tp; ++r) EXPECT_EQ(e.caches[r]->Drain(), 0u) << "rank " << r;
  auto hit = Connect(d, ns)->Lookup(k.id(), k.prompt).value();
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->length, k.prompt.size());
  EXPECT_EQ(hit->ranks, kParts);
  EXPECT_EQ(hit->layers, 5u + 3u * (kParts - 1));  // 2 MLA layers once, 3 sharded layers a part each
}

// Every rank restores the prompt and primes the rest; rank 0's suffix logits
// (every rank's are the same bits).
std::vector<float> RestoreByRanks(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp,
                                  const std::string& ns) {
  RankEngines e = MakeRanks(k, d, tp, {ns});
  auto reqs = e.Prime(k.full, true);
  for (std::uint32_t r = 0; r < tp; ++r) {
    EXPECT_TRUE(reqs[r].ok()) << reqs[r].status().ToString();
    if (!reqs[r].ok()) return {};
    EXPECT_EQ(reqs[r]->restored_tokens, k.prompt.size()) << "rank " << r;
    EXPECT_EQ(reqs[r]->prefilled_tokens, k.suffix().size()) << "rank " << r;
    EXPECT_EQ(reqs[r]->all_logits, reqs[0]->all_logits) << "rank " << r;
  }
  return reqs[0]->all_logits;
}

// Each rank's fetched bytes, as the daemon's metrics count them.
std::vector<double> RankFetchBytes(std::uint16_t port, std::uint32_t ranks) {
  const std::string text = primecache::testing::HttpRequest(port, "GET /metrics HTTP/1.0\r\n\r\n");
  std::vector<double> out;
  for (std::uint32_t r = 0; r < ranks; ++r) {
    const std::string series = "primecache_rank_fetch_bytes_total{rank=\"" + std::to_string(r) + "\"}";
    out.push_back(primecache::testing::SampleValue(text, series).value_or(0));
  }
  return out;
}

// The prompt's stored entry: its hit and every layer's header.
std::pair<LookupHit, std::vector<LayerHeader>> StoredLayers(const Case& k,
                                                            const primecache::testing::Daemon& d,
                                                            const std::string& ns) {
  auto c = Connect(d, ns);
  const LookupHit hit = c->Lookup(k.id(), k.prompt).value().value();
  DescribeOptions with_headers;
  with_headers.layer_headers = true;
  const auto detail = c->Describe(hit.id, with_headers).value();
  std::vector<LayerHeader> headers;
  for (const std::string& header : detail.layer_headers)
    headers.push_back(ParseLayerHeader(AsBytes(header)).value());
  return {hit, std::move(headers)};
}

// A stored layer's chunk bytes.
double ChunkBytes(const LayerHeader& h) {
  double bytes = 0;
  for (const auto& p : h.planes) {
    for (const auto& chunk : p.chunks) bytes += static_cast<double>(chunk.encoded_bytes);
  }
  return bytes;
}

// The chunk bytes of the entry layers rank `rank` of TP `tp` plans to read.
double PlannedBytes(const Case& k, const primecache::testing::Daemon& d, const std::string& ns,
                    std::uint32_t tp, std::uint32_t rank) {
  const auto [hit, headers] = StoredLayers(k, d, ns);
  const ModelConfig rc = RankConfig(k.config, tp).value();
  const Weights rw = RankWeights(k.config, k.weights, tp, rank).value();
  const RankPartsPlan plan =
      PlanRankParts(ShardedLayers(HybridModel::PlanFor(rc, rw)), hit.layers, hit.ranks, tp, rank).value();
  double bytes = 0;
  for (std::uint32_t e : plan.fetch) bytes += ChunkBytes(headers.at(e));
  return bytes;
}

TEST(TpRankCacheTest, TheRanksGroupPublishRestoresAtTheSameTpBitForBit) {
  const std::uint16_t port = primecache::testing::FreeLoopbackPort();
  ASSERT_NE(port, 0);
  primecache::testing::Daemon d({"--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(d.Start());
  const Case k;
  for (std::uint32_t tp : {2u, 4u}) {
    SCOPED_TRACE("TP " + std::to_string(tp));
    const std::string ns = "ranks" + std::to_string(tp);
    PublishByRanks(k, d, tp, ns);
    const std::vector<double> before = RankFetchBytes(port, tp);
    EXPECT_EQ(RestoreByRanks(k, d, tp, ns), Straight(k, tp));
    // Each rank fetched its own part and the replicated layers, nothing more.
    const std::vector<double> after = RankFetchBytes(port, tp);
    for (std::uint32_t r = 0; r < tp; ++r) {
      EXPECT_GT(after[r] - before[r], 0) << "rank " << r;
      EXPECT_EQ(after[r] - before[r], PlannedBytes(k, d, ns, tp, r)) << "rank " << r;
    }
  }
}

// The stored entry's chunk bytes: of its sharded layers' parts, and of its
// replicated layers.
std::pair<double, double> EntryBytes(const Case& k, const primecache::testing::Daemon& d,
                                     const std::string& ns) {
  double sharded = 0, replicated = 0;
  for (const LayerHeader& h : StoredLayers(k, d, ns).second)
    (IsSharded(h.shape) ? sharded : replicated) += ChunkBytes(h);
  return {sharded, replicated};
}

// The point of head-group parts: whatever TP published the entry, a rank of
// any TP size that divides its parts reads exactly its own heads of every
// sharded layer, so the ranks together read the sharded bytes once and the
// replicated ones once each. With one part per publishing rank, TP 4 from a
// TP-2 entry would read every sharded byte twice.
TEST(TpRankCacheTest, EveryRankReadsOnlyItsOwnHeadsWhateverTpPublished) {
  const std::uint16_t port = primecache::testing::FreeLoopbackPort();
  ASSERT_NE(port, 0);
  primecache::testing::Daemon d({"--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(d.Start());
  const Case k;
  for (std::uint32_t from : {2u, 4u}) {
    const std::string ns = "parts" + std::to_string(from);
    PublishByRanks(k, d, from, ns);
    const auto [sharded, replicated] = EntryBytes(k, d, ns);
    ASSERT_GT(sharded, 0);
    ASSERT_GT(replicated, 0);
    for (std::uint32_t to : {1u, 2u, 4u}) {
      SCOPED_TRACE("TP " + std::to_string(from) + " to " + std::to_string(to));
      const std::vector<double> before = RankFetchBytes(port, to);
      const std::vector<float> got = RestoreByRanks(k, d, to, ns);
      EXPECT_EQ(got, from == to ? Straight(k, to) : ReshardedInMemory(k, from, to));
      const std::vector<double> after = RankFetchBytes(port, to);
      double all = 0;
      // TP 1 is the single-rank PrefixCache: its one-round-trip lookup and
      // fetch skips a TP entry's stream (skip_parted_hits) and then fetches
      // the parts, so it too reads exactly its planned bytes.
      for (std::uint32_t r = 0; r < to; ++r) {
        EXPECT_EQ(after[r] - before[r], PlannedBytes(k, d, ns, to, r)) << "rank " << r;
        all += after[r] - before[r];
      }
      EXPECT_EQ(all, sharded + to * replicated);
    }
  }
}

TEST(TpRankCacheTest, AnEntryOfAnotherTpSizeIsReshardedOnEachRank) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  // TpPrefixCache's entries (TP 1: an entry of one publisher) read by rank
  // engines; at TP 1 the rank engine is the plain single-rank PrefixCache.
  for (auto [from, to] : {std::pair{2u, 4u}, {4u, 2u}, {1u, 2u}, {2u, 1u}, {4u, 1u}}) {
    SCOPED_TRACE("TP " + std::to_string(from) + " to " + std::to_string(to));
    const std::string ns = "from" + std::to_string(from) + "to" + std::to_string(to);
    PublishAt(k, d, from, ns);
    const std::vector<float> got = RestoreByRanks(k, d, to, ns);
    EXPECT_EQ(got, ReshardedInMemory(k, from, to));
    EXPECT_LE(RelErr(got, Straight(k, to)), 1e-4);
  }
}

TEST(TpRankCacheTest, TheRanksEntryServesTpPrefixCacheAtAnyTpSize) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  PublishByRanks(k, d, 2, "ranks");
  EXPECT_EQ(RestoreAt(k, d, 2, "ranks", kParts), Straight(k, 2));
  EXPECT_EQ(RestoreAt(k, d, 4, "ranks", kParts), ReshardedInMemory(k, 2, 4));
  EXPECT_EQ(RestoreAt(k, d, 1, "ranks", kParts), ReshardedInMemory(k, 2, 1));
}

// Flips the first occurrence of `bytes` in the segment files; whether it was found.
bool DamageWhere(const std::string& data_dir, std::span<const std::byte> bytes) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(data_dir)) {
    if (!e.is_regular_file() || e.path().parent_path().filename() != "segments") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto at = all.find(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    if (at == std::string::npos) continue;
    all[at] = static_cast<char>(all[at] ^ 0x5a);
    f.clear();
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&all[at], 1);
    return f.good();
  }
  return false;
}

// The uncached TP run of the whole prompt: its last logits.
std::vector<float> UncachedLast(const Case& k, std::uint32_t tp) {
  auto m = MakeTp(k.config, k.weights, tp);
  TpSession s = m->NewSession().value();
  std::vector<float> logits;
  EXPECT_TRUE(m->Prime(s, k.full, LogitsWanted::kLast, &logits).ok());
  return logits;
}

void ExpectEveryRankPrimedInFull(const Case& k, std::vector<Result<Request>>& reqs, std::uint32_t tp) {
  const std::vector<float> want = UncachedLast(k, tp);
  for (std::uint32_t r = 0; r < reqs.size(); ++r) {
    ASSERT_TRUE(reqs[r].ok()) << reqs[r].status().ToString();
    EXPECT_EQ(reqs[r]->restored_tokens, 0u) << "rank " << r;
    EXPECT_EQ(reqs[r]->prefilled_tokens, k.full.size()) << "rank " << r;
    EXPECT_EQ(reqs[r]->last_logits, want) << "rank " << r;
  }
}

TEST(TpRankCacheTest, ADamagedShardOnOneRankMakesEveryRankPrimeInFull) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  PublishByRanks(k, d, 2, "ns");
  // Rank 1's shard of the first KDA layer's state, as it lies in a segment
  // (raw): rank 0 fetches none of it.
  auto m = MakeTp(k.config, k.weights, 2);
  TpSession s = m->NewSession().value();
  std::vector<float> ignored;
  ASSERT_TRUE(m->Prime(s, k.prompt, LogitsWanted::kLast, &ignored).ok());
  const auto ranks = m->CaptureFull(s).value();
  const auto& state = std::get<RecurrentSnapshot>(ranks[1][0]).state;
  ASSERT_TRUE(DamageWhere(d.data_dir(), std::as_bytes(std::span(state).first(16))));

  RankEngines e = MakeRanks(k, d, 2, {"ns"});
  auto reqs = e.Prime(k.full, false);
  ExpectEveryRankPrimedInFull(k, reqs, 2);
}

TEST(TpRankCacheTest, ARankThatCannotReadTheEntryMakesEveryRankPrimeInFull) {
  primecache::testing::Daemon d;
  ASSERT_TRUE(d.Start());
  const Case k;
  PublishByRanks(k, d, 4, "ns");
  // Rank 2 is connected to another tenant, which does not see the entry.
  RankEngines e = MakeRanks(k, d, 4, {"ns", "ns", "other", "ns"});
  auto reqs = e.Prime(k.full, false);
  ExpectEveryRankPrimedInFull(k, reqs, 4);
}

}  // namespace
}  // namespace primecache::model

// TP ranks of their own on CUDA (PrefixCacheOptions::tp), through a real
// daemon that makes device copies: each rank's PrefixCache over its rank's
// model on the device fetches only its parts of a TP entry, the raw chunks
// copied by the daemon into its device window (the fetch's layers remapped
// to the rank's own), and continues as its CPU twin does within the spec's
// tolerance. The entry is in head-group parts (4 for this case), so a rank
// of TP 2 gathers its two parts of each sharded layer on the device
// (StagedFetch::GatherParts) and a rank of TP 4 restores its one part, by
// device copy too. The ranks share one device and no collective
// (NCCL needs a device per rank), so each looks up by itself and the
// continuation is each rank's partial arithmetic, the same on both backends.
#include <gtest/gtest.h>

#include "engine/model/tensor_parallel.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/gpu_daemon_path.h"  // before the daemon harness (tp_case.h)
#include "tests/model/step_compare.h"
#include "tests/model/tp_case.h"

namespace primecache::model {
namespace {

using namespace tp_case;
using testing::RelErr;

// Rank `rank` of TP `tp`'s share of the case's model on its own engine.
struct RankModel {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<HybridModel> model;
};

RankModel MakeRank(const Case& k, std::uint32_t tp, std::uint32_t rank, bool cuda) {
  RankModel m;
  const ModelConfig c = RankConfig(k.config, tp).value();
  const Weights w = RankWeights(k.config, k.weights, tp, rank).value();
  auto device = cuda ? engine::NewCudaDevice().value() : engine::NewCpuDevice();
  engine::ReserveRequest req;
  req.plan = HybridModel::PlanFor(c, w);
  req.max_ctx = 128;
  req.sessions = 2;
  req.snapshot_slots = 1;
  m.engine = engine::Engine::Create(device, req).value();
  m.model = HybridModel::Create(c, w, m.engine.get(), {16}).value();
  return m;
}

// The prompt's boundary published raw at TP `tp` (so that the daemon can copy its chunks to a device).
void PublishRaw(const Case& k, const primecache::testing::Daemon& d, std::uint32_t tp,
                const std::string& ns) {
  auto m = MakeTp(k.config, k.weights, tp);
  TpPrefixCacheOptions o;
  o.encode.all_planes = TransformSpec{"raw/v1", 0};
  TpPrefixCache cache(m.get(), Connect(d, ns), k.id(), o);
  auto r = cache.Prime(k.prompt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(cache.Publish(r->session, k.prompt).ok());
}

// Rank `rank` of TP `tp` restoring from `ns` and priming the rest.
Request RestoreRank(const Case& k, const primecache::testing::Daemon& d, const std::string& ns,
                    std::uint32_t tp, std::uint32_t rank, bool cuda) {
  RankModel m = MakeRank(k, tp, rank, cuda);
  auto cl = client::Client::Connect(d.Options(ns, /*shm=*/true));
  EXPECT_TRUE(cl.ok()) << cl.status().ToString();
  PrefixCacheOptions o;
  o.publish = false;
  o.device_window_bytes = 1 << 20;
  o.tp = {tp, rank, 0};
  PrefixCache cache(m.model.get(), std::move(cl).value(), k.id(), o);
  if (cuda) {
    EXPECT_TRUE(cache.device_window()) << "the device window was not attached";
  }
  auto r = cache.Prime(k.full);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : Request{};
}

TEST(TpRankGpuTest, EachRankRestoresItsOwnPartsByDeviceCopyAsItsCpuTwinDoes) {
  PC_SKIP_WITHOUT_CUDA();
  primecache::testing::Daemon d({"--device-copies", "auto"});
  ASSERT_TRUE(d.Start());
  const Case k;
  PublishRaw(k, d, 2, "tp2");
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const Request gpu = RestoreRank(k, d, "tp2", 2, rank, true);
    const Request cpu = RestoreRank(k, d, "tp2", 2, rank, false);
    EXPECT_EQ(gpu.restored_tokens, k.prompt.size());
    EXPECT_EQ(cpu.restored_tokens, k.prompt.size());
    EXPECT_EQ(gpu.restored_bytes, cpu.restored_bytes);
    EXPECT_GT(gpu.device_chunks, 0u) << "no chunk came by device copy";
    EXPECT_LE(RelErr(gpu.last_logits, cpu.last_logits), 1e-4);
  }
}

TEST(TpRankGpuTest, AnEntryOfAnotherTpSizeIsRestoredByDeviceCopyToo) {
  PC_SKIP_WITHOUT_CUDA();
  primecache::testing::Daemon d({"--device-copies", "auto"});
  ASSERT_TRUE(d.Start());
  const Case k;
  PublishRaw(k, d, 2, "tp2");
  for (std::uint32_t rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " of TP 4");
    const Request gpu = RestoreRank(k, d, "tp2", 4, rank, true);
    const Request cpu = RestoreRank(k, d, "tp2", 4, rank, false);
    EXPECT_EQ(gpu.restored_tokens, k.prompt.size());
    EXPECT_EQ(cpu.restored_tokens, k.prompt.size());
    EXPECT_EQ(gpu.restored_bytes, cpu.restored_bytes);
    EXPECT_GT(gpu.device_chunks, 0u) << "no chunk came by device copy";
    EXPECT_LE(RelErr(gpu.last_logits, cpu.last_logits), 1e-4);
  }
}

}  // namespace
}  // namespace primecache::model

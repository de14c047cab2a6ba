// Faults injected into RocksDB's own I/O through the Env seam: a failed
// write or sync at every operation of a publish, a full disk, a power loss
// at every mutating operation of a publish, a delete, an eviction and a
// segment gc, and a sync that fails after it took effect, then a power loss.
// Each gives a clear error, changes nothing that was not acknowledged, and
// loses nothing that was.
#include <cstdio>
#include <limits>

#include "statestore/test_hooks.h"
#include "store_test_util.h"
#include "tests/support/fault_env.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)
using statestore_internal::TestHooks;

const TestModel kModel = [] {
  TestModel m;
  m.chunk_bytes = 1024;
  return m;
}();

const std::vector<std::uint32_t>& Conv() {
  static const auto conv = Conversation(700, 77);
  return conv;
}

// The operations to break, out of 1..ops: every one of the first and last
// ten, and evenly spaced ones between, at most `budget` in all (each costs
// two store opens; the suite must stay fast).
std::vector<std::int64_t> Sample(std::int64_t ops, std::int64_t budget = 48) {
  std::vector<std::int64_t> out;
  for (std::int64_t n = 1; n <= ops; ++n) {
    bool edge = n <= 10 || n > ops - 10;
    std::int64_t middle = ops - 20;
    std::int64_t stride = middle > budget - 20 ? (middle + budget - 21) / (budget - 20) : 1;
    if (edge || (n - 10) % stride == 0) out.push_back(n);
  }
  return out;
}

struct FaultStore {
  std::unique_ptr<Env> base = NewMemEnv();
  std::unique_ptr<FaultInjectionEnv> fenv = std::make_unique<FaultInjectionEnv>(base.get());
  std::shared_ptr<TestHooks> hooks = std::make_shared<TestHooks>();
  StoreOptions options = CodecStoreOptions();
  std::unique_ptr<LocalStore> store;
  std::vector<EntryId> baseline;

  explicit FaultStore(StoreOptions o = CodecStoreOptions()) : options(std::move(o)) {
    hooks->freeze_io = std::make_shared<std::atomic<bool>>(false);
    hooks->short_sleeps = true;
    hooks->freeze_countdown =
        std::make_shared<std::atomic<std::int64_t>>(std::numeric_limits<std::int64_t>::max());
    options.env = fenv.get();
    options.path = "/s";
    Open();
  }
  void Open() {
    store.reset();
    auto s = statestore_internal::OpenWithHooks(options, hooks);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store = std::move(s).value();
  }
  // Two boundaries of one conversation, and one of another.
  void Baseline() {
    baseline.push_back(MustPublish(*store, Prefix(Conv(), 200), 1, "", kModel));
    baseline.push_back(MustPublish(*store, Prefix(Conv(), 400), 1, "", kModel));
    baseline.push_back(MustPublish(*store, Conversation(300, 5), 1, "", kModel));
  }
  // A power loss now: the disk freezes, the process goes, unsynced data is lost.
  void PowerLoss() {
    hooks->freeze_io->store(true);
    store.reset();
    ASSERT_TRUE(fenv->SimulateCrash().ok());
    hooks->freeze_io->store(false);
    hooks->freeze_countdown->store(std::numeric_limits<std::int64_t>::max());
    fenv->ClearFaults();
    Open();
  }
  void ExpectBaselineIntact(std::optional<EntryId> deleted = std::nullopt) {
    const std::vector<std::vector<std::uint32_t>> tokens = {Prefix(Conv(), 200), Prefix(Conv(), 400),
                                                            Conversation(300, 5)};
    for (std::size_t i = 0; i < baseline.size(); ++i) {
      if (deleted && baseline[i] == *deleted) continue;
      auto back = store->FetchAll(baseline[i]);
      ASSERT_TRUE(back.ok()) << "baseline " << i << ": " << back.status().ToString();
      ExpectSameLayers(*back, MakeLayers(tokens[i], kModel));
    }
  }
};

Result<PublishResult> PublishTarget(LocalStore& s) {
  const auto& t = Conv();
  return s.Publish(Request(t), MakeLayers(t, kModel));
}

// A store's content, to compare before and after a failure.
std::vector<EntryId> Ids(LocalStore& s) {
  ListOptions o;
  o.limit = 1000;
  auto page = s.List(o);
  EXPECT_TRUE(page.ok());
  std::vector<EntryId> ids;
  for (auto& e : page->entries) ids.push_back(e.id);
  return ids;
}

void FailEveryOp(FaultOp op, const char* what, StoreOptions o = CodecStoreOptions()) {
  std::uint64_t ops = 0;
  {
    FaultStore f(o);
    f.Baseline();
    std::uint64_t before = f.fenv->OpCount(op);
    ASSERT_TRUE(PublishTarget(*f.store).ok());
    ops = f.fenv->OpCount(op) - before;
  }
  ASSERT_GT(ops, 0u);
  std::printf("[ info     ] %llu %s operations\n", static_cast<unsigned long long>(ops), what);
  int failed = 0;
  for (std::int64_t n : Sample(static_cast<std::int64_t>(ops))) {
    SCOPED_TRACE(std::string(what) + " #" + std::to_string(n) + " of " + std::to_string(ops));
    FaultStore f(o);
    f.Baseline();
    auto ids = Ids(*f.store);
    auto stats = *f.store->Stat();
    f.fenv->FailNth(op, n);
    auto r = PublishTarget(*f.store);
    f.fenv->ClearFaults();
    if (!r.ok()) {
      ++failed;
      EXPECT_NE(r.status().message().find("injected"), std::string::npos) << r.status().ToString();
      EXPECT_EQ(Ids(*f.store), ids) << "a failed publish adds nothing";
      auto now = *f.store->Stat();
      EXPECT_EQ(now.entries, stats.entries);
      EXPECT_EQ(now.chunks, stats.chunks);
      EXPECT_EQ(now.stored_bytes, stats.stored_bytes);
      // RocksDB may keep the handle in its error state (a failed WAL write
      // is fatal to it): then writes are refused, clearly, until a reopen.
      auto again = PublishTarget(*f.store);
      if (!again.ok()) {
        EXPECT_EQ(again.status().code(), StatusCode::kUnavailable) << again.status().ToString();
        EXPECT_NE(again.status().message().find("reopened"), std::string::npos) << again.status().ToString();
      } else {
        ExpectConsistent(*f.store);
      }
    } else {
      EXPECT_TRUE(f.store->Describe(r->id).ok());
      ExpectConsistent(*f.store);
    }
    f.Open();
    ExpectConsistent(*f.store);
    f.ExpectBaselineIntact();
    auto after = PublishTarget(*f.store);
    EXPECT_TRUE(after.ok()) << after.status().ToString();
  }
  EXPECT_GT(failed, 0) << "some injected fault must reach the publish";
}

TEST(Faults, AFailedWriteAtAnyPointChangesNothing) {
  FailEveryOp(FaultOp::kWrite, "write");
}
TEST(Faults, AFailedSyncAtAnyPointChangesNothing) {
  FailEveryOp(FaultOp::kSync, "sync");
}
// A segment of 1 MiB is sealed at almost every commit: failures while a new
// segment is created and its directory synced change nothing either.
TEST(Faults, FailedWritesWithSmallSegmentsChangeNothing) {
  StoreOptions o = CodecStoreOptions();
  o.segment_bytes = 1u << 20;
  FailEveryOp(FaultOp::kWrite, "write (small segments)", o);
}
TEST(Faults, FailedSyncsWithSmallSegmentsChangeNothing) {
  StoreOptions o = CodecStoreOptions();
  o.segment_bytes = 1u << 20;
  FailEveryOp(FaultOp::kSync, "sync (small segments)", o);
}

// A chunk whose stored bytes are not the bytes its address was computed over
// (the disk stored others, or a client changed its shared region while the
// daemon wrote from it) fails the publish before anything points at it, so
// no later publish deduplicates onto it.
TEST(Faults, AChunkStoredWithOtherBytesThanItsAddressFailsThePublish) {
  FaultStore f;
  f.Baseline();
  auto ids = Ids(*f.store);
  auto stats = *f.store->Stat();
  f.fenv->CorruptNextWrite("/segments/");
  auto r = PublishTarget(*f.store);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("changed while they were written"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(Ids(*f.store), ids);
  EXPECT_EQ(f.store->Stat()->chunks, stats.chunks);
  auto again = PublishTarget(*f.store);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto back = f.store->FetchAll(again->id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, MakeLayers(Conv(), kModel));
  ExpectConsistent(*f.store);
  f.Open();
  ExpectConsistent(*f.store);
  f.ExpectBaselineIntact();
}

// A read whose bytes fail their address while the stored bytes are intact
// (a transient fault; for the daemon, also a client writing into its shared
// window while the chunk is checked there) fails that fetch and quarantines
// nothing: a second read in the store's own memory tells the two apart.
TEST(Faults, ATransientBadReadFailsTheFetchButQuarantinesNothing) {
  FaultStore f;
  f.Baseline();
  f.fenv->CorruptNextRead("/segments/");
  auto back = f.store->FetchAll(f.baseline[0]);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), StatusCode::kAborted) << back.status().ToString();
  EXPECT_NE(back.status().message().find("nothing quarantined"), std::string::npos)
      << back.status().ToString();
  EXPECT_EQ(f.store->Describe(f.baseline[0])->info.state, EntryState::kLive);
  f.ExpectBaselineIntact();
  ExpectConsistent(*f.store);
}

TEST(Faults, AFullDiskFailsClearlyAndChangesNothing) {
  for (std::uint64_t room : {0ull, 64ull, 1000ull, 8000ull, 40000ull}) {
    SCOPED_TRACE("room " + std::to_string(room));
    FaultStore f;
    f.Baseline();
    auto ids = Ids(*f.store);
    auto stats = *f.store->Stat();
    f.fenv->SetSpaceLimit(f.fenv->BytesWritten() + room);
    auto r = PublishTarget(*f.store);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
    EXPECT_NE(r.status().message().find("space"), std::string::npos) << r.status().ToString();
    EXPECT_EQ(Ids(*f.store), ids);
    EXPECT_EQ(f.store->Stat()->stored_bytes, stats.stored_bytes);
    f.fenv->ClearSpaceLimit();
    // Space is back: the running store takes writes again, no reopen needed.
    auto again = PublishTarget(*f.store);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(f.store->Stat()->write_error.empty());
    ExpectConsistent(*f.store);
    f.ExpectBaselineIntact();
    ASSERT_TRUE(f.store->Delete(again->id).ok());
    f.Open();
    ExpectConsistent(*f.store);
    f.ExpectBaselineIntact();
    EXPECT_TRUE(PublishTarget(*f.store).ok());
  }
}

// A disk that fills up: publishes fail clearly while reads go on; once files
// are removed, the same store (no reopen) publishes again, and everything
// committed before and after survives a reopen.
TEST(Faults, AFullDiskRecoversOnceSpaceIsFreed) {
  FaultStore f;
  f.Baseline();
  // Ballast that fills all but a little of the disk; removing it frees space.
  const std::string ballast = "/ballast";
  {
    auto b = f.fenv->NewWritableFile(ballast);
    ASSERT_TRUE(b.ok());
    const std::string mib(1 << 20, 'b');
    ASSERT_TRUE((*b)->Append(std::as_bytes(std::span(mib.data(), mib.size()))).ok());
    ASSERT_TRUE((*b)->Close().ok());
  }
  f.fenv->SetDiskSize(f.fenv->LiveBytes() + 20000);
  const auto big = Conversation(900, 31);
  Status failed;
  for (int i = 0; i < 20 && failed.ok(); ++i) {
    auto r =
        f.store->Publish(Request(Conversation(900, 100 + i)), MakeLayers(Conversation(900, 100 + i), kModel));
    failed = r.status();
  }
  ASSERT_EQ(failed.code(), StatusCode::kResourceExhausted) << failed.ToString();
  // Still full: refused clearly (not "reopen"), and reads are served.
  auto refused = f.store->Publish(Request(big), MakeLayers(big, kModel));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("space"), std::string::npos) << refused.status().ToString();
  f.ExpectBaselineIntact();
  EXPECT_FALSE(f.store->Stat()->write_error.empty());
  auto hit = f.store->Lookup(ModelDigest(1), "", Prefix(Conv(), 400));
  ASSERT_TRUE(hit.ok() && hit->has_value()) << hit.status().ToString();

  ASSERT_TRUE(f.fenv->RemoveFile(ballast).ok());
  auto again = f.store->Publish(Request(big), MakeLayers(big, kModel));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(f.store->Stat()->write_error.empty());
  auto back = f.store->FetchAll(again->id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, MakeLayers(big, kModel));
  f.ExpectBaselineIntact();
  ExpectConsistent(*f.store);
  ASSERT_TRUE(f.store->Compact().ok());

  f.fenv->ClearDiskSize();
  f.Open();
  ExpectConsistent(*f.store);
  f.ExpectBaselineIntact();
  auto durable = f.store->FetchAll(again->id);
  ASSERT_TRUE(durable.ok()) << durable.status().ToString();
  ExpectSameLayers(*durable, MakeLayers(big, kModel));
}

// ---- power loss --------------------------------------------------------------------

enum class Work { kPublish, kDelete, kEvict, kGc };

struct PowerCase {
  const char* name;
  Work work;
  bool small_segments;  // sealed at (nearly) every commit: new segment files
};

// What the work needs beyond the baseline, before its operations are counted.
void PrepareWork(Work work, FaultStore& f) {
  // Dead space in the baseline's segment, for gc to rewrite it.
  if (work == Work::kGc) {
    ASSERT_TRUE(f.store->Delete(f.baseline[1]).ok());
  }
}

// Runs the work; true when it was acknowledged.
bool RunWork(Work work, FaultStore& f) {
  switch (work) {
    case Work::kPublish:
      return PublishTarget(*f.store).ok();
    case Work::kDelete:
      return f.store->Delete(f.baseline[1]).ok();
    case Work::kEvict: {
      auto st = f.store->Stat();
      return f.store->SetByteBudget(st->stored_bytes - 1).ok();
    }
    case Work::kGc:
      return f.store->Compact().ok();
  }
  return false;
}

// After the store was reopened: what was acknowledged is there, what is there
// is whole. Returns whether the work was lost (allowed only unacknowledged).
bool CheckWorkAfterReopen(Work work, FaultStore& f, bool acked) {
  bool lost = false;
  switch (work) {
    case Work::kPublish: {
      auto found = f.store->FindExact(ModelDigest(1), "", Conv());
      EXPECT_TRUE(found.ok());
      if (!found.ok()) return false;
      if (acked) {
        EXPECT_TRUE(found->has_value()) << "an acknowledged publish is durable";
      }
      if (found->has_value()) {
        auto back = f.store->FetchAll(**found);
        EXPECT_TRUE(back.ok()) << back.status().ToString();
        if (back.ok()) ExpectSameLayers(*back, MakeLayers(Conv(), kModel));
      } else {
        lost = true;
      }
      f.ExpectBaselineIntact();
      break;
    }
    case Work::kDelete: {
      bool present = f.store->Describe(f.baseline[1]).ok();
      if (acked) {
        EXPECT_FALSE(present) << "an acknowledged delete is durable";
      }
      lost = present;
      f.ExpectBaselineIntact(present ? std::nullopt : std::optional<EntryId>(f.baseline[1]));
      break;
    }
    case Work::kEvict: {
      auto st = f.store->Stat();
      if (acked) {
        EXPECT_EQ(st->entries, 2u) << "an acknowledged eviction is durable";
      }
      lost = st->entries == 3;
      EXPECT_GE(st->entries, 2u);
      for (EntryId id : f.baseline) {
        auto d = f.store->Describe(id);
        if (d.ok()) {
          EXPECT_TRUE(f.store->FetchAll(id).ok());
        }
      }
      break;
    }
    case Work::kGc:
      // Rewritten or not, the live entries read back whole (a lost rewrite
      // only leaves the dead space for the next gc).
      f.ExpectBaselineIntact(f.baseline[1]);
      break;
  }
  return lost;
}

StoreOptions CaseOptions(const PowerCase& pc) {
  StoreOptions o = CodecStoreOptions();
  if (pc.small_segments) o.segment_bytes = 1u << 20;
  return o;
}

// The power goes after the work: the reopened store is consistent, holds
// what the work was acknowledged for, and takes a publish. Returns whether
// the work was lost (CheckWorkAfterReopen).
bool PowerLossAfterWork(Work work, FaultStore& f, bool acked) {
  f.PowerLoss();
  ExpectConsistent(*f.store);
  const bool lost = CheckWorkAfterReopen(work, f, acked);
  // The store goes on working after the crash.
  auto more = f.store->Publish(Request(Conversation(90, 1234)), MakeLayers(Conversation(90, 1234), kModel));
  EXPECT_TRUE(more.ok()) << more.status().ToString();
  return lost;
}

class PowerLoss : public ::testing::TestWithParam<PowerCase> {};

TEST_P(PowerLoss, AtEveryMutatingOperation) {
  const PowerCase& pc = GetParam();
  const StoreOptions o = CaseOptions(pc);
  std::int64_t ops = 0;
  {
    FaultStore f(o);
    f.Baseline();
    PrepareWork(pc.work, f);
    std::int64_t before = f.hooks->freeze_countdown->load();
    ASSERT_TRUE(RunWork(pc.work, f));
    ops = before - f.hooks->freeze_countdown->load();
  }
  ASSERT_GT(ops, 0);
  std::printf("[ info     ] %lld mutating operations\n", static_cast<long long>(ops));
  int lost = 0;
  for (std::int64_t n : Sample(ops + 1)) {
    SCOPED_TRACE("power lost at mutating operation " + std::to_string(n) + " of " + std::to_string(ops));
    FaultStore f(o);
    f.Baseline();
    PrepareWork(pc.work, f);
    f.hooks->freeze_countdown->store(n);
    bool acked = RunWork(pc.work, f);
    if (PowerLossAfterWork(pc.work, f, acked)) ++lost;
  }
  if (pc.work != Work::kGc) {
    EXPECT_GT(lost, 0) << "early crashes must lose the unacknowledged work";
  }
}

INSTANTIATE_TEST_SUITE_P(Workloads, PowerLoss,
                         ::testing::Values(PowerCase{"publish", Work::kPublish, false},
                                           PowerCase{"publish_small_segments", Work::kPublish, true},
                                           PowerCase{"delete", Work::kDelete, false},
                                           PowerCase{"evict", Work::kEvict, false},
                                           PowerCase{"gc", Work::kGc, false}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- syncs that fail after they took effect --------------------------------------

// A sync that reached the disk and still reported an error (an fsync's EIO
// after the data went out, or a WAL sync followed by a failed directory
// sync) leaves the store unable to tell a lost batch from a durable one:
// whatever it then removes or keeps, a power loss after it must leave every
// entry whole or absent and no record naming a file that is gone.
class LateSyncFailure : public ::testing::TestWithParam<PowerCase> {};

TEST_P(LateSyncFailure, AtEverySyncThenAPowerLoss) {
  const PowerCase& pc = GetParam();
  const StoreOptions o = CaseOptions(pc);
  std::uint64_t syncs = 0;
  {
    FaultStore f(o);
    f.Baseline();
    PrepareWork(pc.work, f);
    const std::uint64_t before = f.fenv->OpCount(FaultOp::kSync);
    ASSERT_TRUE(RunWork(pc.work, f));
    syncs = f.fenv->OpCount(FaultOp::kSync) - before;
  }
  ASSERT_GT(syncs, 0u);
  std::printf("[ info     ] %llu syncs\n", static_cast<unsigned long long>(syncs));
  int refused = 0;
  for (std::int64_t n : Sample(static_cast<std::int64_t>(syncs))) {
    SCOPED_TRACE("sync " + std::to_string(n) + " of " + std::to_string(syncs) +
                 " failed after it took effect");
    FaultStore f(o);
    f.Baseline();
    PrepareWork(pc.work, f);
    f.fenv->FailNthSyncAfterIt(static_cast<std::uint64_t>(n));
    const bool acked = RunWork(pc.work, f);
    if (!acked) ++refused;
    (void)PowerLossAfterWork(pc.work, f, acked);
  }
  EXPECT_GT(refused, 0) << "some late sync failure must reach the work";
}

INSTANTIATE_TEST_SUITE_P(Workloads, LateSyncFailure,
                         ::testing::Values(PowerCase{"publish", Work::kPublish, false},
                                           PowerCase{"publish_small_segments", Work::kPublish, true},
                                           PowerCase{"delete", Work::kDelete, false},
                                           PowerCase{"gc", Work::kGc, false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace primecache

namespace primecache {
namespace {

// A power loss while a store is being created leaves either no store or one
// that opens (empty and consistent).
TEST(PowerLossAtCreation, TheStoreOpensAfterwards) {
  std::int64_t ops = 0;
  {
    FaultStore f;  // counts its own creation
    ops = std::numeric_limits<std::int64_t>::max() - f.hooks->freeze_countdown->load();
  }
  ASSERT_GT(ops, 0);
  for (std::int64_t n : Sample(ops)) {
    SCOPED_TRACE("power lost at creation operation " + std::to_string(n) + " of " + std::to_string(ops));
    auto base = NewMemEnv();
    FaultInjectionEnv fenv(base.get());
    auto hooks = std::make_shared<TestHooks>();
    hooks->freeze_io = std::make_shared<std::atomic<bool>>(false);
    hooks->freeze_countdown = std::make_shared<std::atomic<std::int64_t>>(n);
    hooks->short_sleeps = true;
    StoreOptions o = CodecStoreOptions();
    o.env = &fenv;
    o.path = "/s";
    {
      auto s = statestore_internal::OpenWithHooks(o, hooks);  // fails or not: the power goes either way
      hooks->freeze_io->store(true);
    }
    ASSERT_TRUE(fenv.SimulateCrash().ok());
    hooks->freeze_io->store(false);
    hooks->freeze_countdown->store(std::numeric_limits<std::int64_t>::max());
    auto s = statestore_internal::OpenWithHooks(o, hooks);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->Stat()->entries, 0u);
    ExpectConsistent(**s);
    EXPECT_TRUE(PublishTarget(**s).ok());
  }
}

}  // namespace
}  // namespace primecache

// Migration of schema-2 stores written by the build before segment files
// (tests/statestore/fixtures, both chunk layouts; see make_fixture.cc): a
// read-only open is refused naming `primecachectl migrate`; an open for
// writing migrates, after which every entry fetches bit-identically; a
// migration cut short by a power loss at any step resumes at the next open.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "raw_db.h"
#include "statestore/format.h"
#include "statestore/test_hooks.h"
#include "tests/support/fault_env.h"
#include "store_test_util.h"

#ifndef STATESTORE_FIXTURES
#error "STATESTORE_FIXTURES must name tests/statestore/fixtures"
#endif

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)
namespace si = statestore_internal;

struct Expected {
  EntryId id = 0;
  std::string digest;
};

std::vector<Expected> ReadExpected(const std::string& fixture) {
  std::ifstream in(fixture + "/expected.txt");
  std::vector<Expected> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    Expected e;
    std::uint64_t model = 0, n = 0, seed = 0;
    f >> e.id >> model >> n >> seed >> e.digest;
    out.push_back(e);
  }
  EXPECT_FALSE(out.empty()) << fixture;
  return out;
}

std::string DigestOf(const std::vector<LayerBytes>& layers) {
  std::string all;
  for (const auto& l : layers) {
    all += l.header;
    for (const auto& c : l.chunks) all += c;
  }
  Hash128 h = Checksum128(std::as_bytes(std::span(all.data(), all.size())));
  return HexDigits(h);
}

// A private copy of a fixture store.
std::string CopyFixture(const std::string& name, const TempDir& dir) {
  const std::string to = dir.path + "/store";
  std::filesystem::copy(std::string(STATESTORE_FIXTURES) + "/" + name + "/store", to,
                        std::filesystem::copy_options::recursive);
  return to;
}

std::uint32_t SchemaOf(const std::string& path) {
  auto v = si::DecodeSchema(RawDb(Env::Default(), path).Get(si::kCfMeta, "schema"));
  EXPECT_TRUE(v.ok());
  return v.ok() ? *v : 0;
}

void ExpectAllEntries(LocalStore& s, const std::string& fixture) {
  for (const auto& e : ReadExpected(std::string(STATESTORE_FIXTURES) + "/" + fixture)) {
    auto back = s.FetchAll(e.id);
    ASSERT_TRUE(back.ok()) << "entry " << e.id << ": " << back.status().ToString();
    EXPECT_EQ(DigestOf(*back), e.digest) << "entry " << e.id << " is not bit-identical";
  }
  ExpectConsistent(s);
}

class Migrate : public ::testing::TestWithParam<const char*> {};

TEST_P(Migrate, ReadOnlyIsRefusedAndWritingMigrates) {
  TempDir dir;
  const std::string path = CopyFixture(GetParam(), dir);
  ASSERT_EQ(SchemaOf(path), 2u);
  StoreOptions o = CodecStoreOptions();
  o.path = path;
  StoreOptions ro = o;
  ro.read_only = true;
  auto refused = LocalStore::Open(ro);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("primecachectl migrate"), std::string::npos)
      << refused.status().ToString();
  {
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ExpectAllEntries(**s, GetParam());
    // The store goes on: a publish and a delete after the migration.
    const EntryId more = MustPublish(**s, Conversation(200, 9));
    ASSERT_TRUE((*s)->Delete(more).ok());
    ASSERT_TRUE((*s)->Compact().ok());
    ExpectAllEntries(**s, GetParam());
  }
  EXPECT_EQ(SchemaOf(path), si::kSchemaVersion);
  auto s = LocalStore::Open(ro);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectAllEntries(**s, GetParam());
}

// Power lost at the n-th sync of the migration (segment syncs, the WAL
// syncs of its batches, directory syncs): the next open resumes it and
// every entry comes back whole.
TEST_P(Migrate, APowerLossMidMigrationResumes) {
  int interrupted = 0;
  for (int n = 1; n <= 70; n += 3) {
    SCOPED_TRACE("sync #" + std::to_string(n));
    TempDir dir;
    const std::string path = CopyFixture(GetParam(), dir);
    FaultInjectionEnv fenv(Env::Default());
    auto hooks = std::make_shared<si::TestHooks>();
    hooks->migrate_step_bytes = 8 << 10;  // many steps
    hooks->short_sleeps = true;
    StoreOptions o = CodecStoreOptions();
    o.path = path;
    o.env = &fenv;
    fenv.FailNth(FaultOp::kSync, static_cast<std::uint64_t>(n));
    auto failed = si::OpenWithHooks(o, hooks);
    fenv.ClearFaults();
    if (failed.ok()) {  // a sync RocksDB can do without, or past the last one
      ExpectAllEntries(**failed, GetParam());
      continue;
    }
    ++interrupted;
    failed = Status::Ok();
    ASSERT_TRUE(fenv.SimulateCrash().ok());
    auto s = si::OpenWithHooks(o, hooks);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ExpectAllEntries(**s, GetParam());
  }
  EXPECT_GT(interrupted, 5) << "the migration must be cut at several steps";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Migrate, ::testing::Values("schema2-blob", "schema2-pieces"));

}  // namespace
}  // namespace primecache

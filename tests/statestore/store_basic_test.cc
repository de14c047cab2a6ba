// Round trips, refusals, persistence across reopen, schema versioning,
// listing, deletion and statistics.
#include <rocksdb/db.h>

#include <cstdlib>
#include <map>
#include <set>

#include "statestore/format.h"
#include "raw_db.h"
#include "store_test_util.h"

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

TEST(StoreBasic, PublishFetchRoundTrip) {
  MemStore m;
  auto tokens = Conversation(300, 1);
  auto layers = MakeLayers(tokens);
  ASSERT_EQ(layers.size(), 3u);
  auto r = m.store->Publish(Request(tokens), layers);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->existed);
  EXPECT_GT(r->new_chunk_bytes, 0u);

  auto back = m.store->FetchAll(r->id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameLayers(*back, layers);
  // The bytes decode to exactly what was encoded.
  for (const auto& l : *back) {
    auto h = ParseLayerHeader(AsBytes(l.header));
    ASSERT_TRUE(h.ok());
    EXPECT_TRUE(DecodeLayer(EncodedLayer{*h, l.chunks}).ok());
  }
  auto stored = StoredTokens(*m.store, r->id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(*stored, tokens);

  auto info = m.store->Describe(r->id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info.length, 300u);
  EXPECT_EQ(info->info.layers, 3u);
  EXPECT_EQ(info->info.model, ModelDigest(1));
  EXPECT_EQ(info->info.model_name, "test-model-1");
  EXPECT_EQ(info->info.chunk_bytes, LayerBytesSize(layers));
  EXPECT_GT(info->info.raw_bytes, 0u);
  EXPECT_EQ(info->info.state, EntryState::kLive);
  EXPECT_DOUBLE_EQ(info->info.flops, EstimatePrefillFlops({1000, 2, 64}, 300));
  ExpectConsistent(*m.store);
}

TEST(StoreBasic, FetchChosenLayersInChosenOrder) {
  MemStore m;
  auto tokens = Conversation(100, 2);
  auto layers = MakeLayers(tokens);
  EntryId id = MustPublish(*m.store, tokens);
  struct Sink : FetchSink {
    std::vector<std::uint32_t> seen;
    std::vector<std::string> bytes;
    Status OnLayer(std::uint32_t l, std::string_view, std::uint32_t) override {
      seen.push_back(l);
      bytes.emplace_back();
      return Status::Ok();
    }
    Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
      bytes.back().append(reinterpret_cast<const char*>(b.data()), b.size());
      return Status::Ok();
    }
  } sink;
  std::vector<std::uint32_t> want = {2, 0};
  ASSERT_TRUE(m.store->Fetch(id, want, sink).ok());
  EXPECT_EQ(sink.seen, want);
  std::string l2, l0;
  for (auto& c : layers[2].chunks) l2 += c;
  for (auto& c : layers[0].chunks) l0 += c;
  EXPECT_EQ(sink.bytes[0], l2);
  EXPECT_EQ(sink.bytes[1], l0);
  std::vector<std::uint32_t> bad = {3};
  EXPECT_TRUE(m.store->Fetch(id, bad, sink).IsInvalidArgument());
  EXPECT_TRUE(m.store->Fetch(9999, {}, sink).IsNotFound());
}

TEST(StoreBasic, SinkErrorStopsFetch) {
  MemStore m;
  EntryId id = MustPublish(*m.store, Conversation(50, 3));
  struct Failing : FetchSink {
    int chunks = 0;
    Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
    Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte>) override {
      return ++chunks == 2 ? Status::Aborted("enough") : Status::Ok();
    }
  } sink;
  Status s = m.store->Fetch(id, {}, sink);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(sink.chunks, 2);
  auto info = m.store->Describe(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info.state, EntryState::kLive) << "a sink error is not corruption";
}

// A fetch scoped to a namespace serves that namespace's entries only; another
// tenant's is absent (kNotFound), and nothing of it reaches the sink.
TEST(StoreBasic, FetchScopedToANamespace) {
  MemStore m;
  const auto tokens = Conversation(50, 4);
  EntryId id = MustPublish(*m.store, tokens, 1, "tenant-a");
  struct Counting : FetchSink {
    int calls = 0;
    Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return ++calls, Status::Ok(); }
    Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte>) override {
      return ++calls, Status::Ok();
    }
  } other, own;
  FetchOptions o;
  o.ns = "tenant-b";
  EXPECT_TRUE(m.store->Fetch(id, {}, other, o).IsNotFound());
  EXPECT_EQ(other.calls, 0);
  o.ns = "tenant-a";
  EXPECT_TRUE(m.store->Fetch(id, {}, own, o).ok());
  EXPECT_GT(own.calls, 0);
  EXPECT_EQ(m.store->Stat()->active_leases, 0u);
}

// A sink that gives its own buffers gets every chunk read into them, in
// order; one that has no room yet (nullopt) is asked again later, and the
// fetch neither stalls nor skips a chunk.
TEST(StoreBasic, FetchReadsIntoTheSinksBuffers) {
  MemStore m;
  auto tokens = Conversation(300, 5);
  auto layers = MakeLayers(tokens);
  EntryId id = MustPublish(*m.store, tokens);
  struct Sink : FetchSink {
    std::vector<std::string> buffers;  // one per chunk, in the order asked for
    std::vector<std::string> got;
    std::size_t handed = 0, refusals = 0;
    Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
    Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
      const std::string& mine = buffers.at(handed++);
      if (static_cast<const void*>(b.data()) != mine.data()) return Status::Internal("not read into my buffer");
      got.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
      return Status::Ok();
    }
    Result<std::optional<std::span<std::byte>>> ChunkBuffer(std::uint32_t, std::uint32_t, std::uint64_t size,
                                                            bool may_wait) override {
      // Room for one chunk ahead of those handed out.
      if (!may_wait && buffers.size() > handed + 1) {
        ++refusals;
        return std::optional<std::span<std::byte>>();
      }
      buffers.reserve(64);  // stable addresses for this test's sizes
      auto& b = buffers.emplace_back(size, '\0');
      return std::optional(std::as_writable_bytes(std::span(b.data(), b.size())));
    }
  } sink;
  ASSERT_TRUE(m.store->Fetch(id, {}, sink).ok());
  std::vector<std::string> want;
  for (const auto& l : layers) want.insert(want.end(), l.chunks.begin(), l.chunks.end());
  ASSERT_LE(want.size(), 64u);
  EXPECT_EQ(sink.got, want);
  EXPECT_GT(sink.refusals, 0u);
}

// Every refused publish leaves the store as it was: no entry, no chunk.
void ExpectEmpty(LocalStore& s) {
  auto st = s.Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries, 0u);
  EXPECT_EQ(st->chunks, 0u);
  ExpectConsistent(s);
}

TEST(StoreBasic, RefusesMalformedRequests) {
  MemStore m;
  EXPECT_TRUE(m.store->BeginPublish(Request({})).status().IsInvalidArgument());
  auto req = Request(Conversation(10, 4));
  req.ns = std::string(2000, 'x');
  EXPECT_TRUE(m.store->BeginPublish(req).status().IsInvalidArgument());
  req = Request(Conversation(10, 4));
  req.model_name = std::string(2000, 'x');
  EXPECT_TRUE(m.store->BeginPublish(req).status().IsInvalidArgument());
  EXPECT_TRUE(m.store->Lookup(ModelDigest(1), "", {}).status().IsInvalidArgument());
  ExpectEmpty(*m.store);
}

// Runs a publish of `layers` for `tokens` and returns the first error.
Status TryPublish(LocalStore& s, const std::vector<std::uint32_t>& tokens, const std::vector<LayerBytes>& layers) {
  auto p = s.BeginPublish(Request(tokens));
  if (!p.ok()) return p.status();
  for (const auto& l : layers) {
    Status st = p->publisher->AddLayer(l);
    if (!st.ok()) {
      // The publisher stays failed: Commit reports the same error.
      auto c = p->publisher->Commit();
      EXPECT_FALSE(c.ok());
      EXPECT_EQ(c.status(), st);
      return st;
    }
  }
  return p->publisher->Commit().status();
}

TEST(StoreBasic, ValidatorRefusesLayersThatDisagree) {
  MemStore m;
  auto tokens = Conversation(120, 5);
  const auto good = MakeLayers(tokens);

  auto garbage = good;
  garbage[0].header = "not a layer header";
  EXPECT_FALSE(TryPublish(*m.store, tokens, garbage).ok());
  ExpectEmpty(*m.store);

  auto missing = good;
  missing[0].chunks.pop_back();
  Status s = TryPublish(*m.store, tokens, missing);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("chunks"), std::string::npos) << s.ToString();
  ExpectEmpty(*m.store);

  auto extra = good;
  extra[1].chunks.push_back("one more");
  EXPECT_TRUE(TryPublish(*m.store, tokens, extra).IsInvalidArgument());
  ExpectEmpty(*m.store);

  auto flipped = good;
  flipped[0].chunks[1][3] ^= 0x20;
  s = TryPublish(*m.store, tokens, flipped);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
  ExpectEmpty(*m.store);

  auto swapped = good;
  std::swap(swapped[0].chunks[0], swapped[0].chunks[1]);
  EXPECT_TRUE(TryPublish(*m.store, tokens, swapped).IsInvalidArgument());
  ExpectEmpty(*m.store);

  // Layers of another boundary length are not this boundary's.
  auto other = MakeLayers(Prefix(tokens, 119));
  s = TryPublish(*m.store, tokens, other);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("boundary"), std::string::npos) << s.ToString();
  ExpectEmpty(*m.store);

  EXPECT_TRUE(TryPublish(*m.store, tokens, good).ok());
}

TEST(StoreBasic, PublisherStateMachine) {
  MemStore m;
  auto tokens = Conversation(40, 6);
  auto layers = MakeLayers(tokens);
  {
    auto p = m.store->BeginPublish(Request(tokens));
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(p->publisher->AddChunk(std::string_view("x")).IsFailedPrecondition());
  }
  {
    auto p = m.store->BeginPublish(Request(tokens));
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(p->publisher->Commit().status().IsFailedPrecondition()) << "no layers";
  }
  {
    auto p = m.store->BeginPublish(Request(tokens));
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p->publisher->BeginLayer(layers[0].header, static_cast<std::uint32_t>(layers[0].chunks.size())).ok());
    EXPECT_TRUE(p->publisher->AddChunk(std::string_view("")).IsInvalidArgument());
  }
  {
    StoreOptions o = CodecStoreOptions();
    o.max_chunk_bytes = 16;
    MemStore small(o);
    auto p = small.store->BeginPublish(Request(tokens));
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p->publisher->BeginLayer(layers[0].header, static_cast<std::uint32_t>(layers[0].chunks.size())).ok());
    EXPECT_TRUE(p->publisher->AddChunk(std::string_view(std::string(17, 'x'))).IsInvalidArgument());
  }
  {
    auto p = m.store->BeginPublish(Request(tokens));
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p->publisher->BeginLayer(layers[0].header, static_cast<std::uint32_t>(layers[0].chunks.size())).ok());
    EXPECT_TRUE(p->publisher->Commit().status().IsFailedPrecondition()) << "inside a layer";
  }
  ExpectEmpty(*m.store);
  {
    auto p = m.store->BeginPublish(Request(tokens));
    ASSERT_TRUE(p.ok());
    for (auto& l : layers) ASSERT_TRUE(p->publisher->AddLayer(l).ok());
    ASSERT_TRUE(p->publisher->Commit().ok());
    EXPECT_TRUE(p->publisher->Commit().status().IsFailedPrecondition()) << "commits at most once";
  }
  // An abandoned publish (destroyed without commit) leaves nothing behind.
  {
    auto t2 = Conversation(70, 7);
    auto l2 = MakeLayers(t2);
    auto p = m.store->BeginPublish(Request(t2));
    ASSERT_TRUE(p.ok());
    for (auto& l : l2) ASSERT_TRUE(p->publisher->AddLayer(l).ok());
  }
  auto st = m.store->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries, 1u);
  ExpectConsistent(*m.store);
}

TEST(StoreBasic, SameIdentityIsStoredOnce) {
  MemStore m;
  auto tokens = Conversation(90, 8);
  EntryId id = MustPublish(*m.store, tokens);
  auto stored = m.store->BeginPublish(Request(tokens));
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->publisher, nullptr) << "nothing to send";
  EXPECT_EQ(stored->existing, std::optional<EntryId>(id));
  auto again = m.store->Publish(Request(tokens), MakeLayers(tokens));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->existed);
  EXPECT_EQ(again->id, id);
  auto found = m.store->FindExact(ModelDigest(1), "", tokens);
  ASSERT_TRUE(found.ok());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ(**found, id);

  // Two publishes of one boundary racing: the second to commit finds the first.
  auto t2 = Conversation(91, 9);
  auto layers = MakeLayers(t2);
  auto p1 = m.store->BeginPublish(Request(t2));
  auto p2 = m.store->BeginPublish(Request(t2));
  ASSERT_TRUE(p1.ok() && p2.ok());
  for (auto& l : layers) {
    ASSERT_TRUE(p1->publisher->AddLayer(l).ok());
    ASSERT_TRUE(p2->publisher->AddLayer(l).ok());
  }
  auto r1 = p1->publisher->Commit();
  auto r2 = p2->publisher->Commit();
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_FALSE(r1->existed);
  EXPECT_TRUE(r2->existed);
  EXPECT_EQ(r1->id, r2->id);
  auto st = m.store->Stat();
  EXPECT_EQ(st->entries, 2u);
  ExpectConsistent(*m.store);
}

TEST(StoreBasic, PersistsAcrossReopen) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/store";
  std::vector<std::vector<std::uint32_t>> convs;
  std::vector<EntryId> ids;
  std::vector<std::vector<LayerBytes>> layers;
  {
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < 5; ++i) {
      convs.push_back(Conversation(100 + 37 * i, 20 + i));
      layers.push_back(MakeLayers(convs.back()));
      auto r = (*s)->Publish(Request(convs.back(), 1, i % 2 ? "a" : "b"), layers.back());
      ASSERT_TRUE(r.ok());
      ids.push_back(r->id);
    }
    auto hit = (*s)->Lookup(ModelDigest(1), "a", convs[1]);
    ASSERT_TRUE(hit.ok() && hit->has_value());
    auto miss = (*s)->Lookup(ModelDigest(1), "a", Conversation(50, 99));
    ASSERT_TRUE(miss.ok() && !miss->has_value());
  }
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto st = (*s)->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries, 5u);
  EXPECT_EQ(st->hits, 1u);
  EXPECT_EQ(st->misses, 1u);
  for (int i = 0; i < 5; ++i) {
    auto hit = (*s)->Lookup(ModelDigest(1), i % 2 ? "a" : "b", convs[i]);
    ASSERT_TRUE(hit.ok());
    ASSERT_TRUE(hit->has_value()) << i;
    EXPECT_EQ((*hit)->id, ids[i]);
    auto back = (*s)->FetchAll(ids[i]);
    ASSERT_TRUE(back.ok());
    ExpectSameLayers(*back, layers[i]);
  }
  auto info = (*s)->Describe(ids[1]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info.hits, 2u) << "hits persist across the reopen";
  // New ids and ticks continue after the old ones.
  EntryId next = MustPublish(**s, Conversation(33, 77));
  EXPECT_GT(next, ids.back());
  auto ni = (*s)->Describe(next);
  EXPECT_GT(ni->info.last_access, info->info.last_access);
  ExpectConsistent(**s);
}

TEST(StoreBasic, SecondOpenOfOneStoreIsRefused) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path;
  auto a = LocalStore::Open(o);
  ASSERT_TRUE(a.ok());
  auto b = LocalStore::Open(o);
  EXPECT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("lock"), std::string::npos) << b.status().ToString();
}

TEST(StoreBasic, MissingStoreWithoutCreateIsNotFound) {
  MemStore m;
  StoreOptions o = m.options;
  o.path = "/elsewhere";
  o.create_if_missing = false;
  EXPECT_TRUE(LocalStore::Open(o).status().IsNotFound());
}

TEST(StoreBasic, AStoreWithoutALayerValidatorIsRefused) {
  MemStore m;
  StoreOptions o = m.options;
  o.path = "/unchecked";
  o.validator = nullptr;
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.status().IsInvalidArgument());
  EXPECT_NE(s.status().ToString().find("validator"), std::string::npos) << s.status().ToString();
}

// Writes a value into a store's meta column family with RocksDB directly.
void PutMeta(const std::string& path, const std::string& key, const std::string& value) {
  RawDb(Env::Default(), path).Put(statestore_internal::kCfMeta, key, value);
}

// Creates a store at `path` holding one entry, closes it, and returns the
// entry's id (0 on failure, reported).
EntryId OneEntryOnDisk(const std::string& path, std::uint64_t seed) {
  StoreOptions o = CodecStoreOptions();
  o.path = path;
  auto s = LocalStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? MustPublish(**s, Conversation(64, seed)) : 0;
}

TEST(StoreBasic, NewerSchemaIsRefusedUntouched) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path;
  const EntryId id = OneEntryOnDisk(dir.path, 1);
  ASSERT_NE(id, 0u);
  PutMeta(dir.path, "schema", statestore_internal::EncodeSchema(statestore_internal::kSchemaVersion + 1));
  auto s = LocalStore::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotSupported) << s.status().ToString();
  EXPECT_NE(s.status().message().find("newer"), std::string::npos);
  // Back to this version, the store opens with its entry intact.
  PutMeta(dir.path, "schema", statestore_internal::EncodeSchema(statestore_internal::kSchemaVersion));
  auto again = LocalStore::Open(o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE((*again)->Describe(id).ok());
}

TEST(StoreBasic, ForeignDatabaseIsRefused) {
  TempDir dir;
  {
    rocksdb::Options ro;
    ro.create_if_missing = true;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(ro, dir.path, &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "k", "v").ok());
    delete db;
  }
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path;
  auto s = LocalStore::Open(o);
  EXPECT_TRUE(s.status().IsFailedPrecondition()) << s.status().ToString();
}

TEST(StoreBasic, DefaultDataDirFollowsXdgThenHome) {
  const char* old_xdg = std::getenv("XDG_DATA_HOME");
  const char* old_home = std::getenv("HOME");
  std::string saved_xdg = old_xdg ? old_xdg : "", saved_home = old_home ? old_home : "";
  ::setenv("XDG_DATA_HOME", "/x/data", 1);
  EXPECT_EQ(*DefaultDataDir(), "/x/data/primecache");
  ::unsetenv("XDG_DATA_HOME");
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(*DefaultDataDir(), "/home/u/.local/share/primecache");
  ::unsetenv("HOME");
  EXPECT_TRUE(DefaultDataDir().status().IsFailedPrecondition());
  if (old_home) ::setenv("HOME", saved_home.c_str(), 1);
  if (old_xdg) ::setenv("XDG_DATA_HOME", saved_xdg.c_str(), 1);

  // An empty path opens the default store under the data directory.
  TempDir dir;
  ::setenv("XDG_DATA_HOME", dir.path.c_str(), 1);
  {
    MemStore m;
    StoreOptions o = CodecStoreOptions();
    o.env = m.env.get();
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->path(), dir.path + "/primecache/store");
    EXPECT_TRUE(m.env->FileExists(dir.path + "/primecache/store/CURRENT"));
  }
  if (old_xdg) {
    ::setenv("XDG_DATA_HOME", saved_xdg.c_str(), 1);
  } else {
    ::unsetenv("XDG_DATA_HOME");
  }
}

TEST(StoreBasic, ListPagesAndFilters) {
  MemStore m;
  std::map<std::pair<std::uint64_t, std::string>, std::set<EntryId>> by_scope;
  for (int i = 0; i < 23; ++i) {
    std::uint64_t model = 1 + i % 2;
    std::string ns = i % 3 == 0 ? "t0" : "t1";
    EntryId id = MustPublish(*m.store, Conversation(20 + i, 100 + i), model, ns);
    by_scope[{model, ns}].insert(id);
  }
  auto collect = [&](ListOptions o) {
    std::vector<EntryId> ids;
    for (int pages = 0; pages < 100; ++pages) {
      auto page = m.store->List(o);
      EXPECT_TRUE(page.ok()) << page.status().ToString();
      if (!page.ok()) break;
      EXPECT_LE(page->entries.size(), o.limit);
      for (auto& e : page->entries) ids.push_back(e.id);
      if (page->next_page_token.empty()) break;
      o.page_token = page->next_page_token;
    }
    return ids;
  };
  ListOptions all;
  all.limit = 5;
  auto ids = collect(all);
  EXPECT_EQ(ids.size(), 23u);
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));

  ListOptions one_model;
  one_model.model = ModelDigest(2);
  one_model.limit = 3;
  auto m2 = collect(one_model);
  std::set<EntryId> want;
  for (auto& [k, v] : by_scope) {
    if (k.first == 2) want.insert(v.begin(), v.end());
  }
  EXPECT_EQ(std::set<EntryId>(m2.begin(), m2.end()), want);
  EXPECT_EQ(m2.size(), want.size());

  ListOptions scoped;
  scoped.model = ModelDigest(1);
  scoped.ns = "t0";
  scoped.limit = 2;
  auto s10 = collect(scoped);
  EXPECT_EQ(std::set<EntryId>(s10.begin(), s10.end()), (by_scope[{1, "t0"}]));
  auto page = m.store->List(scoped);
  ASSERT_TRUE(page.ok());
  for (auto& e : page->entries) {
    EXPECT_EQ(e.ns, "t0");
    EXPECT_EQ(e.model, ModelDigest(1));
  }

  ListOptions bad;
  bad.limit = 0;
  EXPECT_TRUE(m.store->List(bad).status().IsInvalidArgument());
  bad.limit = 10;
  bad.page_token = "xyz";
  EXPECT_TRUE(m.store->List(bad).status().IsInvalidArgument());
}

TEST(StoreBasic, DeleteRemovesEverything) {
  MemStore m;
  auto a = Conversation(200, 1);
  auto b = Conversation(150, 2);
  EntryId ia = MustPublish(*m.store, a);
  EntryId ib = MustPublish(*m.store, b);
  ASSERT_TRUE(m.store->Delete(ia).ok());
  EXPECT_TRUE(m.store->Delete(ia).IsNotFound());
  EXPECT_TRUE(m.store->Describe(ia).status().IsNotFound());
  EXPECT_TRUE(m.store->FetchAll(ia).status().IsNotFound());
  auto hit = m.store->Lookup(ModelDigest(1), "", a);
  ASSERT_TRUE(hit.ok());
  EXPECT_FALSE(hit->has_value());
  auto st = m.store->Stat();
  EXPECT_EQ(st->entries, 1u);
  EXPECT_EQ(st->logical_bytes, m.store->Describe(ib)->info.chunk_bytes + m.store->Describe(ib)->info.meta_bytes);
  ExpectConsistent(*m.store);
  ASSERT_TRUE(m.store->Delete(ib).ok());
  st = m.store->Stat();
  EXPECT_EQ(st->entries, 0u);
  EXPECT_EQ(st->chunks, 0u);
  EXPECT_EQ(st->stored_bytes, 0u);
  ExpectConsistent(*m.store);
}

TEST(StoreBasic, RunsOnThePosixEnvToo) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path + "/a/b";  // parents are created
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto t = Conversation(500, 5);
  auto layers = MakeLayers(t);
  auto r = (*s)->Publish(Request(t), layers);
  ASSERT_TRUE(r.ok());
  auto back = (*s)->FetchAll(r->id);
  ASSERT_TRUE(back.ok());
  ExpectSameLayers(*back, layers);
  ExpectConsistent(**s);
}

// Chunks larger than a read part (1 MiB) are read in parts on several pool
// threads; with and without a pool, they come back whole.
TEST(StoreBasic, LargeChunksRoundTripInParts) {
  for (std::size_t threads : {std::size_t{0}, std::size_t{3}}) {
    StoreOptions o = CodecStoreOptions();
    o.fetch_read_threads = threads;
    MemStore m(o);
    TestModel big;
    big.width = 512;
    big.chunk_bytes = 3u << 20;  // several parts per chunk
    auto t = Conversation(2500, 6);
    auto layers = MakeLayers(t, big);
    ASSERT_GT(layers[0].chunks[0].size(), 1u << 20);
    auto r = m.store->Publish(Request(t), layers);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto back = m.store->FetchAll(r->id);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameLayers(*back, layers);
    ExpectConsistent(*m.store);
  }
}

}  // namespace
}  // namespace primecache

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

TEST(StoreBasic, CompactReclaimsTheSpaceOfDeletedEntries) {
  MemStore m;
  TestModel big;
  big.chunk_bytes = 8192;
  std::vector<EntryId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(MustPublish(*m.store, Conversation(1500, 40 + i), 1, "", big));
  ASSERT_TRUE(m.store->Compact().ok());
  std::uint64_t before = m.store->Stat()->disk_bytes;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(m.store->Delete(ids[i]).ok());
  ASSERT_TRUE(m.store->Compact().ok());
  std::uint64_t after = m.store->Stat()->disk_bytes;
  // The disk reserve (a fixed file kept for a full disk) is no stored data.
  before -= m.options.disk_reserve_bytes;
  after -= m.options.disk_reserve_bytes;
  EXPECT_LT(after * 2, before) << "before " << before << ", after " << after << " (without the disk reserve)";
  auto back = m.store->FetchAll(ids[5]);
  ASSERT_TRUE(back.ok());
  ExpectSameLayers(*back, MakeLayers(Conversation(1500, 45), big));
  ExpectConsistent(*m.store);
}

}  // namespace
}  // namespace primecache

namespace primecache {
namespace {

using namespace store_test;  // NOLINT(google-build-using-namespace)

// A descriptor is kept per (model, namespace), checked against the digest,
// and comes back with every entry of that scope.
TEST(StoreDescriptor, KeptCheckedAndReturned) {
  MemStore m;
  auto tokens = Conversation(64, 7);
  auto layers = MakeLayers(tokens);
  const std::string descriptor = DescriptorFor(layers);
  const Hash128 digest = Checksum128(std::as_bytes(std::span(descriptor.data(), descriptor.size())));

  PublishRequest wrong = Request(tokens);
  wrong.model = digest;
  wrong.model_descriptor = descriptor + "x";
  auto refused = m.store->Publish(wrong, layers);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();

  // First publish without a descriptor, then one with: the scope gains it.
  PublishRequest plain = Request(Prefix(tokens, 32));
  plain.model = digest;
  auto first = m.store->Publish(plain, MakeLayers(Prefix(tokens, 32)));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(m.store->Describe(first->id)->info.model_descriptor.empty());
  PublishRequest full = Request(tokens);
  full.model = digest;
  full.model_descriptor = descriptor;
  auto second = m.store->Publish(full, layers);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(m.store->Describe(second->id)->info.model_descriptor, descriptor);
  EXPECT_EQ(m.store->Describe(first->id)->info.model_descriptor, descriptor);
  m.Reopen();
  EXPECT_EQ(m.store->Describe(first->id)->info.model_descriptor, descriptor);
  ExpectConsistent(*m.store);

  // Republishing a stored boundary with a descriptor gives its scope one.
  PublishRequest other = Request(Prefix(tokens, 16), 1, "tenant");
  other.model = digest;
  auto bare = m.store->Publish(other, MakeLayers(Prefix(tokens, 16)));
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(m.store->Describe(bare->id)->info.model_descriptor.empty());
  other.model_descriptor = descriptor;
  auto again = m.store->Publish(other, MakeLayers(Prefix(tokens, 16)));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->existed);
  EXPECT_EQ(again->id, bare->id);
  EXPECT_EQ(m.store->Describe(bare->id)->info.model_descriptor, descriptor);
  m.Reopen();
  EXPECT_EQ(m.store->Describe(bare->id)->info.model_descriptor, descriptor);
  ExpectConsistent(*m.store);
}

// An entry is filed under a model only with that model's layers: a publish
// whose descriptor names another plan is refused at commit, stores nothing
// and gives its staged bytes back; without a descriptor nothing is checked.
TEST(StoreDescriptor, LayersThatAreNotTheModelsPlanAreRefused) {
  MemStore m;
  auto tokens = Conversation(64, 9);
  auto layers = MakeLayers(tokens);
  TestModel wider;
  wider.width += 8;
  const std::string descriptor = DescriptorFor(MakeLayers(tokens, wider), "wider-model");
  PublishRequest r = Request(tokens);
  r.model = Checksum128(std::as_bytes(std::span(descriptor.data(), descriptor.size())));
  r.model_descriptor = descriptor;
  auto refused = m.store->Publish(r, layers);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("not the plan of model 'wider-model'"), std::string::npos)
      << refused.status().ToString();
  auto st = m.store->Stat();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->entries, 0u);
  EXPECT_EQ(st->staged_bytes, 0u);
  ExpectConsistent(*m.store);
  // The same layers under their own model's descriptor are taken.
  r.model_descriptor = DescriptorFor(layers, "wider-model");
  r.model = Checksum128(std::as_bytes(std::span(r.model_descriptor.data(), r.model_descriptor.size())));
  EXPECT_TRUE(m.store->Publish(r, layers).ok());
}

// Admission applies to new boundaries only: one already stored is reported
// as stored, never refused.
TEST(StoreAdmission, AStoredBoundaryIsNeverRefused) {
  StoreOptions o = CodecStoreOptions();
  o.eviction.admit_after_sightings = 2;
  MemStore m(o);
  auto tokens = Conversation(64, 8);
  EXPECT_EQ(m.store->BeginPublish(Request(tokens)).status().code(), StatusCode::kAborted);
  m.store->RecordSighting(ModelDigest(1), "", tokens);
  m.store->RecordSighting(ModelDigest(1), "", tokens);
  EntryId id = MustPublish(*m.store, tokens);
  m.Reopen();  // sightings are forgotten; the entry is not
  auto r = m.store->Publish(Request(tokens), MakeLayers(tokens));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->existed);
  EXPECT_EQ(r->id, id);
}

TEST(StoreLayerHeaders, AreTheManifestsHeadersInOrder) {
  MemStore m;
  auto tokens = Conversation(200, 3);
  auto layers = MakeLayers(tokens);
  EntryId id = MustPublish(*m.store, tokens);
  DescribeOptions with_headers;
  with_headers.layer_headers = true;
  auto detail = m.store->Describe(id, with_headers);
  ASSERT_TRUE(detail.ok()) << detail.status().ToString();
  const std::vector<std::string>& headers = detail->layer_headers;
  ASSERT_EQ(headers.size(), layers.size());
  for (std::size_t i = 0; i < layers.size(); ++i) EXPECT_EQ(headers[i], layers[i].header) << i;
  EXPECT_TRUE(m.store->Describe(id + 100, with_headers).status().IsNotFound());
}

// Read-only: everything reads, nothing writes, and the store on disk is the
// same afterwards (a damaged entry is reported, not quarantined).
TEST(StoreReadOnly, ReadsEverythingWritesNothing) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path;
  auto tokens = Conversation(300, 11);
  auto layers = MakeLayers(tokens);
  EntryId id = 0;
  {
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    id = MustPublish(**s, tokens);
  }
  StoreOptions ro = o;
  ro.read_only = true;
  {
    auto s = LocalStore::Open(ro);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    LocalStore& st = **s;
    auto hit = st.Lookup(ModelDigest(1), "", tokens);
    ASSERT_TRUE(hit.ok() && hit->has_value());
    EXPECT_EQ((*hit)->id, id);
    auto back = st.FetchAll(id);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameLayers(*back, layers);
    EXPECT_TRUE(st.CheckStore({.read_chunks = true}).ok());
    EXPECT_TRUE(st.CheckStore({.read_chunks = true})->problems.empty());
    EXPECT_TRUE(st.Stat().ok());
    auto list = st.List({});
    ASSERT_TRUE(list.ok());
    EXPECT_EQ(list->entries.size(), 1u);
    EXPECT_TRUE(st.Delete(id).IsFailedPrecondition());
    EXPECT_TRUE(st.Compact().IsFailedPrecondition());
    EXPECT_TRUE(st.SetByteBudget(1).IsFailedPrecondition());
    EXPECT_TRUE(st.BeginPublish(Request(Conversation(10, 99))).status().IsFailedPrecondition());
  }
  // Nothing changed: the entry is there, and no hit was recorded.
  auto s = LocalStore::Open(o);
  ASSERT_TRUE(s.ok());
  auto info = (*s)->Describe(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info.hits, 0u);
  // No store there: refused, nothing created.
  StoreOptions none = ro;
  none.path = dir.path + "/absent";
  EXPECT_TRUE(LocalStore::Open(none).status().IsNotFound());
  EXPECT_FALSE(std::filesystem::exists(none.path));
}

// A store marked with an older schema is refused read-only (naming the
// command that migrates it), and opened for writing is migrated and marked
// with this build's version, every entry intact. (The migration of real
// schema-2 stores: migrate_test.cc.)
TEST(StoreSchema, AnOlderSchemaIsRefusedReadOnlyAndMigratedForWriting) {
  TempDir dir;
  StoreOptions o = CodecStoreOptions();
  o.path = dir.path;
  const EntryId id = OneEntryOnDisk(dir.path, 5);
  ASSERT_NE(id, 0u);
  PutMeta(dir.path, "schema", statestore_internal::EncodeSchema(1));
  StoreOptions ro = o;
  ro.read_only = true;
  {
    auto s = LocalStore::Open(ro);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition) << s.status().ToString();
    EXPECT_NE(s.status().message().find("primecachectl migrate"), std::string::npos) << s.status().ToString();
  }
  {
    auto s = LocalStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE((*s)->Describe(id).ok());
    EXPECT_TRUE((*s)->FetchAll(id).ok());
  }
  // Now marked with this build's version, so an older build refuses it.
  const std::string schema = RawDb(Env::Default(), dir.path).Get(statestore_internal::kCfMeta, "schema");
  auto version = statestore_internal::DecodeSchema(schema);
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, statestore_internal::kSchemaVersion);
}

}  // namespace
}  // namespace primecache

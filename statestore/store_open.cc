// Opening and closing a store: the RocksDB database (created, adopted or
// refused before anything in it is touched), the state loaded from it, and
// the close that saves the counters. The segment files' recovery is in
// segment_store.cc, the migration of older schemas in migrate.cc.
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_buffer_manager.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "statestore/rocks_env.h"
#include "statestore/group.h"
#include "statestore/store_impl.h"
#include "statestore/test_hooks.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

const std::vector<std::string>& OurColumnFamilies() {
  static const std::vector<std::string> names = {
      kCfMeta,  kCfEntries, kCfManifests,  kCfTokens,  kCfChunks, kCfChunkRefs,
      kCfIndex, kCfLru,     kCfQuarantine, kCfSegments};
  return names;
}

rocksdb::BlockBasedTableOptions TableOptions(const std::shared_ptr<rocksdb::Cache>& cache, bool bloom,
                                             std::size_t block_size) {
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = cache;
  t.block_size = block_size;
  t.checksum = rocksdb::kXXH3;
  t.format_version = 5;
  // Indexes and filters live in the cache, so that the cache bounds them
  // too; the newest tables' stay there, so a lookup never waits on them.
  t.cache_index_and_filter_blocks = true;
  t.pin_l0_filter_and_index_blocks_in_cache = true;
  if (bloom) {
    t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    t.whole_key_filtering = true;
  }
  return t;
}

rocksdb::ColumnFamilyOptions CfOptions(const std::string& name, const Params& params, const StoreOptions& o,
                                       const std::shared_ptr<rocksdb::Cache>& cache) {
  rocksdb::ColumnFamilyOptions cf;
  cf.compression = rocksdb::kNoCompression;  // codecs compressed the chunks; the rest is small or random
  cf.level_compaction_dynamic_level_bytes = true;
  cf.write_buffer_size = 8 << 20;
  std::size_t block = 16 << 10;
  bool bloom = true;
  if (name == kCfChunks && params.chunk_layout == kLayoutSegments) {
    cf.write_buffer_size = 1 << 20;  // empty: chunk bytes are in segment files
    bloom = false;
  } else if (name == kCfChunks) {
    // A store of schema 1 or 2 being migrated: read as it was written.
    cf.write_buffer_size = 64 << 20;
    // A big publish hands flushes over every 16 MiB (publish.cc): let them
    // queue rather than stall the writer.
    cf.max_write_buffer_number = 8;
    cf.level0_slowdown_writes_trigger = 40;
    cf.level0_stop_writes_trigger = 64;
    cf.target_file_size_base = 64 << 20;
    if (params.chunk_layout == kLayoutBlobFiles) {
      cf.enable_blob_files = true;
      cf.min_blob_size = 1024;
      cf.blob_file_size = 256ull << 20;
      cf.enable_blob_garbage_collection = true;
      cf.blob_garbage_collection_age_cutoff = 0.5;
      cf.blob_compression_type = rocksdb::kNoCompression;
    } else {
      block = params.piece_bytes;
    }
  } else if (name == kCfIndex) {
    cf.memtable_prefix_bloom_size_ratio = 0.1;
    cf.memtable_whole_key_filtering = true;
    block = 4 << 10;
  } else if (name == kCfTokens || name == kCfManifests) {
    cf.write_buffer_size = 16 << 20;
  } else if (name == kCfMeta || name == kCfQuarantine || name == kCfSegments) {
    cf.write_buffer_size = 1 << 20;
    bloom = false;
  }
  (void)o;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(TableOptions(cache, bloom, block)));
  return cf;
}

Status Invalid(std::string msg) {
  return Status::InvalidArgument(std::move(msg));
}

}  // namespace

// ---- open / close --------------------------------------------------------------------

LocalStore::LocalStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalStore::~LocalStore() = default;
const std::string& LocalStore::path() const {
  return impl_->path;
}

LocalStore::Impl::~Impl() {
  if (groups) groups->Close();  // parked parts give their bytes back while the pool is there
  StopReclaimer();
  CloseIdleWriters();
  Status s = CloseDb();
  if (!s.ok()) spdlog::warn("statestore {}: close: {}", path, s.ToString());
}

Result<std::unique_ptr<LocalStore>> LocalStore::Open(StoreOptions options) {
  return Impl::Open(std::move(options), nullptr);
}

namespace statestore_internal {
Result<std::unique_ptr<LocalStore>> OpenWithHooks(StoreOptions options, std::shared_ptr<const TestHooks> hooks) {
  return LocalStore::Impl::Open(std::move(options), std::move(hooks));
}
}  // namespace statestore_internal

Result<std::unique_ptr<LocalStore>> LocalStore::Impl::Open(StoreOptions options, std::shared_ptr<const TestHooks> hooks) {
  auto impl = std::make_unique<Impl>();
  impl->env = options.env != nullptr ? options.env : Env::Default();
  if (options.path.empty()) {
    PC_ASSIGN_OR_RETURN(std::string dir, DefaultDataDir());
    options.path = dir + "/store";
  }
  if (options.block_tokens == 0 || options.block_tokens > kMaxBlockTokens) {
    return Invalid("block_tokens must be in [1, 65536]");
  }
  if (options.segment_bytes < (1u << 20)) return Invalid("segment_bytes must be at least 1 MiB");
  if (options.block_cache_bytes < (1u << 20)) return Invalid("block_cache_bytes must be at least 1 MiB");
  if (options.memtable_bytes < (1u << 20) || options.memtable_bytes > options.block_cache_bytes) {
    return Invalid(
        "memtable_bytes must be at least 1 MiB and at most block_cache_bytes (the cache it is charged to)");
  }
  if (options.max_chunk_bytes == 0 || options.max_chunk_bytes > StoreLimits::kMaxChunkBytes) {
    return Invalid("max_chunk_bytes must be in [1, 1 GiB]");
  }
  if (options.validator == nullptr) return Invalid("a store needs a layer validator (StoreOptions::validator)");
  if (options.eviction.utility_window == 0) options.eviction.utility_window = 1;
  impl->path = options.path;
  impl->validator = options.validator;
  impl->hasher = &DefaultTokenHasher();
  if (hooks != nullptr) {
    if (hooks->hasher != nullptr) impl->hasher = hooks->hasher;
    impl->frozen = hooks->freeze_io;
    impl->freeze = {hooks->freeze_io, hooks->freeze_countdown};
  }
  impl->hooks = std::move(hooks);
  impl->byte_budget = options.byte_budget;
  impl->opts = std::move(options);
  if (impl->opts.group_timeout_ms == 0) return Invalid("group_timeout_ms must be at least 1");
  impl->groups = std::make_unique<GroupTable>(std::chrono::milliseconds(impl->opts.group_timeout_ms),
                                              [raw = impl.get()](StagedPart& part) { raw->AbortPart(part); });
  if (impl->opts.fetch_read_threads > 0) {
    impl->opts.fetch_read_ahead = std::max<std::size_t>(impl->opts.fetch_read_ahead, 1);
    impl->read_pool = std::make_unique<WorkerPool>(impl->opts.fetch_read_threads);
  }
  impl->seg_dir = impl->path + "/" + kSegmentDir;
  Status opened = impl->OpenDb();
  // A full disk: RocksDB writes a few new files to open; the reserve's space
  // lets it (only when nothing was opened yet, so the retry starts afresh).
  if (opened.code() == StatusCode::kResourceExhausted && impl->db == nullptr && impl->GiveBackReserve()) {
    opened = impl->OpenDb();
  }
  PC_RETURN_IF_ERROR(opened.WithContext("open store " + impl->path));
  {
    MutexLock wl(&impl->write_mu);  // no other thread has the store yet; the loaders require it
    PC_RETURN_IF_ERROR(impl->LoadState().WithContext("open store " + impl->path));
    PC_RETURN_IF_ERROR(impl->LoadSegments().WithContext("open store " + impl->path));
    PC_RETURN_IF_ERROR(impl->RecoverSegments().WithContext("open store " + impl->path));
  }
  if (impl->stored_schema < kFirstSegmentSchema) {
    PC_RETURN_IF_ERROR(impl->MigrateChunks().WithContext("migrate store " + impl->path));
  }
  if (Status s = impl->BuildPassIndex(); !s.ok()) {
    // Only branch points suffer: they reach no entry stored before this
    // build until an open that can write the records.
    spdlog::warn("statestore {}: entries stored before branch points were indexed are not reached by them: {}",
                 impl->path, s.ToString());
  }
  impl->EnsureReserve();
  {
    MutexLock wl(&impl->write_mu);
    spdlog::debug("statestore {}: open, {} entries, {} chunks", impl->path, impl->counters.entries,
                  impl->counters.chunks);
  }
  return std::unique_ptr<LocalStore>(new LocalStore(std::move(impl)));
}

namespace {

// Creates the store's directories and makes a directory left open to other
// users private (an older primecache made it 0755 with 0644 files) before
// anything in it is read.
Status PrepareDir(Env* env, const std::string& path) {
  PC_RETURN_IF_ERROR(CreateDirs(env, path + "/" + kSegmentDir));
  PC_RETURN_IF_ERROR(env->SyncDir(path));
  PC_ASSIGN_OR_RETURN(std::vector<TightenedPath> tightened, RestrictToOwner(env, path));
  if (!tightened.empty()) {
    spdlog::warn("statestore {}: other users could read the store; made private: {}", path,
                 DescribeTightened(tightened));
  }
  return Status::Ok();
}

// What a read-only look into an existing database found.
struct StoredMeta {
  bool has_meta = false;  // it has the meta column family
  bool empty = true;      // no key in any column family
  rocksdb::Status schema_status = rocksdb::Status::NotFound();
  std::string schema;
  rocksdb::Status params_status = rocksdb::Status::NotFound();
  std::string params;
};

// Opens the database read-only just long enough to read its schema and
// parameter records, so that a store this build cannot handle is refused
// before anything in it is touched.
Result<StoredMeta> PeekStoredMeta(const rocksdb::DBOptions& dbo, const std::string& path,
                                  const std::vector<std::string>& existing) {
  std::vector<rocksdb::ColumnFamilyDescriptor> ro;
  for (const auto& n : existing) ro.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> ro_handles;
  rocksdb::DB* ro_db = nullptr;
  rocksdb::DBOptions rdo = dbo;
  rdo.create_if_missing = false;
  PC_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::OpenForReadOnly(rdo, path, ro, &ro_handles, &ro_db), "open read-only"));
  StoredMeta m;
  rocksdb::ColumnFamilyHandle* meta = nullptr;
  for (auto* h : ro_handles) {
    if (h->GetName() == kCfMeta) meta = h;
    std::unique_ptr<rocksdb::Iterator> it(ro_db->NewIterator(rocksdb::ReadOptions(), h));
    it->SeekToFirst();
    if (it->Valid() || !it->status().ok()) m.empty = false;
  }
  if (meta != nullptr) {
    m.has_meta = true;
    m.schema_status = ro_db->Get(rocksdb::ReadOptions(), meta, std::string(kMetaSchemaKey), &m.schema);
    m.params_status = ro_db->Get(rocksdb::ReadOptions(), meta, std::string(kMetaParamsKey), &m.params);
  }
  for (auto* h : ro_handles) ro_db->DestroyColumnFamilyHandle(h);
  delete ro_db;
  return m;
}

// The schema version a store records, refused when this build cannot open
// it (as asked: read-only, an older schema needs a migration first).
Result<std::uint32_t> CheckSchema(const StoredMeta& m, const std::string& path, bool read_only) {
  if (!m.has_meta) {
    return Status::FailedPrecondition(path + " holds a RocksDB database that is not a primecache store");
  }
  if (m.schema_status.IsNotFound()) return Status::Corruption(path + ": the store has no schema version record");
  PC_RETURN_IF_ERROR(FromRocks(m.schema_status, "read schema version"));
  PC_ASSIGN_OR_RETURN(std::uint32_t version, DecodeSchema(m.schema));
  if (version > kSchemaVersion) {
    return Status::NotSupported("store schema version " + std::to_string(version) +
                                " is newer than this build supports (" + std::to_string(kSchemaVersion) +
                                "); open it with a newer primecache");
  }
  if (version < 1) return Status::Corruption("store schema version 0 is not valid");
  if (version < kFirstSegmentSchema && read_only) {
    return Status::FailedPrecondition(
        "the store at " + path + " has schema version " + std::to_string(version) +
        ", which keeps chunk bytes in RocksDB; this build reads schema " + std::to_string(kSchemaVersion) +
        " only: migrate it first with `primecachectl migrate --store " + path + "` (or open it for writing)");
  }
  return version;
}

}  // namespace

Status LocalStore::Impl::OpenDb() {
  if (opts.read_only && !env->FileExists(path + "/CURRENT")) return Status::NotFound("no store at " + path);
  if (!opts.read_only) PC_RETURN_IF_ERROR(PrepareDir(env, path));
  const rocksdb::DBOptions dbo = SetUpRocks();

  // What is there already: a new directory, a primecache store, or not ours.
  std::vector<std::string> existing;
  rocksdb::Status ls = rocksdb::DB::ListColumnFamilies(dbo, path, &existing);
  const bool fresh = !ls.ok();
  if (fresh && !env->FileExists(path + "/CURRENT")) {
    if (!opts.create_if_missing) return Status::NotFound("no store at " + path);
  } else if (fresh) {
    return FromRocks(ls, "list column families");
  }

  // The parameters of a new store; an existing one's replace them.
  params.block_tokens = opts.block_tokens;
  params.hasher_id = hasher->id();
  params.chunk_layout = kLayoutSegments;
  params.piece_bytes = 0;
  params.created_unix_ms = NowUnixMs();
  std::optional<std::uint32_t> stored_version;  // none: a store to be initialised
  if (!fresh) {
    PC_ASSIGN_OR_RETURN(stored_version, AdoptStored(dbo, existing));
  }
  PC_RETURN_IF_ERROR(OpenColumnFamilies(dbo, stored_version.has_value()));
  if (!stored_version) PC_RETURN_IF_ERROR(InitialiseRecords());
  stored_schema = stored_version.value_or(kSchemaVersion);
  return Status::Ok();
}

rocksdb::DBOptions LocalStore::Impl::SetUpRocks() {
  EnvFileSystemOptions fso;
  fso.posix_locks = opts.env == nullptr || opts.env == Env::Default();
  fso.frozen = frozen;
  if (hooks != nullptr) fso.freeze_countdown = hooks->freeze_countdown;
  fs = NewEnvFileSystem(env, fso);
  rocks_env = NewRocksEnv(fs, hooks != nullptr && hooks->short_sleeps);
  block_cache = rocksdb::NewLRUCache(opts.block_cache_bytes);

  rocksdb::DBOptions dbo;
  dbo.env = rocks_env.get();
  dbo.info_log = NewSpdlogRocksLogger();
  dbo.create_if_missing = opts.create_if_missing && !opts.read_only;
  dbo.create_missing_column_families = true;
  dbo.max_background_jobs = 4;
  dbo.delayed_write_rate = 1ull << 30;  // when RocksDB must slow writers, not to its 16 MiB/s default
  dbo.paranoid_checks = true;
  // The memtables are flushed past memtable_bytes, and their memory is
  // charged to the block cache, which bounds both together.
  dbo.write_buffer_manager = std::make_shared<rocksdb::WriteBufferManager>(opts.memtable_bytes, block_cache);
  dbo.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  dbo.avoid_flush_during_shutdown = true;
  // Replayed WAL records stay in the memtable instead of being flushed at
  // open: an open then needs only a few small new files (the disk reserve
  // covers them on a full disk), not an SST per column family.
  dbo.avoid_flush_during_recovery = true;
  dbo.bgerror_resume_retry_interval = 20000;  // 20 ms between automatic recovery attempts
  return dbo;
}

Result<std::optional<std::uint32_t>> LocalStore::Impl::AdoptStored(const rocksdb::DBOptions& dbo,
                                                              const std::vector<std::string>& existing) {
  PC_ASSIGN_OR_RETURN(StoredMeta m, PeekStoredMeta(dbo, path, existing));
  if (m.schema_status.IsNotFound() && m.empty) {
    // A creation that crashed before its first batch: nothing is in it, so
    // it is created again.
    spdlog::info("statestore {}: finishing the creation of an empty store", path);
    return std::optional<std::uint32_t>();
  }
  PC_ASSIGN_OR_RETURN(std::uint32_t version, CheckSchema(m, path, opts.read_only));
  PC_RETURN_IF_ERROR(FromRocks(m.params_status, "read store parameters"));
  PC_ASSIGN_OR_RETURN(params, DecodeParams(m.params));
  if (params.hasher_id != hasher->id()) {
    return Status::FailedPrecondition("the store's index was built with token hasher " +
                                      std::to_string(params.hasher_id) + ", not " + std::to_string(hasher->id()));
  }
  for (const auto& n : existing) {
    if (n != rocksdb::kDefaultColumnFamilyName &&
        std::find(OurColumnFamilies().begin(), OurColumnFamilies().end(), n) == OurColumnFamilies().end()) {
      return Status::FailedPrecondition("store has an unknown column family '" + n + "'");
    }
  }
  return std::optional<std::uint32_t>(version);
}

Status LocalStore::Impl::OpenColumnFamilies(const rocksdb::DBOptions& dbo, bool has_schema) {
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  cfs.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
  for (const auto& n : OurColumnFamilies()) {
    cfs.emplace_back(n, CfOptions(n, params, opts, block_cache));
    if (hooks != nullptr && hooks->no_compactions)
      cfs.back().options.disable_auto_compactions = true;
  }
  if (opts.read_only) {
    if (!has_schema) return Status::NotFound(path + " holds no primecache store yet");
    PC_RETURN_IF_ERROR(
        FromRocks(rocksdb::DB::OpenForReadOnly(dbo, path, cfs, &handles, &db), "open RocksDB read-only"));
  } else {
    PC_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(dbo, path, cfs, &handles, &db), "open RocksDB"));
  }
  rocksdb::ColumnFamilyHandle** slots[] = {&cf_meta,  &cf_entries, &cf_manifests,  &cf_tokens,
                                           &cf_chunks, &cf_chunk_refs, &cf_index, &cf_lru,
                                           &cf_quarantine, &cf_segments};
  for (std::size_t i = 0; i < OurColumnFamilies().size(); ++i) *slots[i] = handles[i + 1];
  return Status::Ok();
}

Status LocalStore::Impl::InitialiseRecords() {
  rocksdb::WriteBatch b;
  b.Put(cf_meta, std::string(kMetaSchemaKey), EncodeSchema(kSchemaVersion));
  b.Put(cf_meta, std::string(kMetaParamsKey), EncodeParams(params));
  b.Put(cf_meta, std::string(kMetaCountersKey), EncodeCounters(Counters()));
  std::string pass_version;
  PutLE32(&pass_version, kPassIndexVersion);
  b.Put(cf_meta, std::string(kMetaPassIndexKey), pass_version);
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db->Write(wo, &b), "initialise store");
}

Status LocalStore::Impl::LoadState() {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(GetValue(cf_meta, std::string(kMetaCountersKey), &v, &found));
  if (!found) return Status::Corruption("the store has no counters record");
  PC_ASSIGN_OR_RETURN(counters, DecodeCounters(v));
  hits = counters.hits;
  misses = counters.misses;
  refusals = counters.admission_refusals;
  PublishCounters(counters);

  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_meta));
  std::string prefix(1, kScopeByIdTag);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (it->key().size() != 9) return Status::Corruption("malformed scope key");
    std::uint64_t id = GetBE64(it->key().data() + 1);
    PC_ASSIGN_OR_RETURN(ScopeRecord rec, DecodeScope(id, it->value().ToStringView()));
    MutexLock g(&scope_mu);
    scope_by_name[ScopeByNameKey(rec.digest, rec.ns)] = id;
    scopes[id] = std::move(rec);
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "load scopes"));

  PC_RETURN_IF_ERROR(LoadFilters());

  // The clock continues after the most recent access recorded.
  std::unique_ptr<rocksdb::Iterator> lit(db->NewIterator(rocksdb::ReadOptions(), cf_lru));
  lit->SeekForPrev(std::string(1, kAgeTag) + std::string(16, '\xff'));
  if (lit->Valid() && lit->key().size() == 17 && lit->key()[0] == kAgeTag) {
    clock = GetBE64(lit->key().data() + 1) + 1;
  }
  return FromRocks(lit->status(), "load recency clock");
}

Status LocalStore::Impl::LoadFilters() {
  MutexLock gn(&node_filter.mu);
  MutexLock gx(&exact_filter.mu);
  node_filter.Reset();
  exact_filter.Reset();
  for (char tag : {kNodeTag, kExactTag}) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_index));
    std::string prefix(1, tag);
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      auto k = it->key();
      if (k.size() != 25) return Status::Corruption("malformed index key");
      std::optional<std::string> v(std::string(it->value().ToStringView()));
      std::uint64_t n = tag == kNodeTag ? SlotTotal(v, params.block_tokens) : IdCount(v);
      NodeFilter& filter = tag == kNodeTag ? node_filter : exact_filter;
      filter.mu.AssertHeld();  // both are held (above)
      filter.Adjust(
          NodeFilter::Fingerprint(GetBE64(k.data() + 1), GetBE64(k.data() + 9), GetBE64(k.data() + 17)),
          static_cast<std::int64_t>(n));
    }
    PC_RETURN_IF_ERROR(FromRocks(it->status(), "load index"));
  }
  return Status::Ok();
}

Status LocalStore::Impl::CloseDb() {
  if (db == nullptr) return Status::Ok();
  Status result;
  if (!(frozen && frozen->load()) && !opts.read_only && Recover().ok()) {
    MutexLock wl(&write_mu);
    result = FlushTouches();
    if (result.ok()) {
      Counters c = counters;
      c.hits = hits;
      c.misses = misses;
      c.admission_refusals = refusals;
      if (!(c == counters)) {
        rocksdb::WriteOptions wo;
        wo.sync = true;
        rocksdb::WriteBatch b;
        b.Put(cf_meta, std::string(kMetaCountersKey), EncodeCounters(c));
        result = Write(wo, &b, "save counters");
      }
    }
  }
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  handles.clear();
  rocksdb::Status cs = db->Close();
  if (result.ok() && !cs.ok() && !(frozen && frozen->load())) result = FromRocks(cs, "close RocksDB");
  delete db;
  db = nullptr;
  return result;
}

}  // namespace primecache

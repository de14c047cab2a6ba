// Opening and closing a store, its metadata, scopes, statistics, listing,
// deletion, budgets and leases.
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"
#include "statestore/test_hooks.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace statestore_internal {
std::uint64_t NowUnixMs() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}
}  // namespace statestore_internal

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

// ---- misc public helpers -----------------------------------------------------------

double EstimatePrefillFlops(const ModelCost& cost, std::uint64_t tokens) {
  double l = static_cast<double>(tokens);
  if (cost.flops_per_token == 0 && cost.attention_layers == 0) return l;
  return l * static_cast<double>(cost.flops_per_token) +
         static_cast<double>(cost.attention_layers) * static_cast<double>(cost.attention_flops_per_pair) * l *
             (l + 1) / 2;
}

Status Publisher::AddLayer(const LayerBytes& layer) {
  PC_RETURN_IF_ERROR(BeginLayer(layer.header));
  for (const auto& c : layer.chunks) PC_RETURN_IF_ERROR(AddChunk(std::string_view(c)));
  return EndLayer();
}

// ---- leases -------------------------------------------------------------------------

bool Lease::Table::TryAcquire(EntryId id) {
  std::lock_guard g(mu);
  auto& slot = slots[id];
  if (slot.dying) return false;
  ++slot.count;
  ++active;
  return true;
}
void Lease::Table::Release(EntryId id) {
  std::lock_guard g(mu);
  auto it = slots.find(id);
  if (it == slots.end() || it->second.count == 0) return;
  --active;
  if (--it->second.count == 0 && !it->second.dying) slots.erase(it);
}
bool Lease::Table::MarkDying(EntryId id) {
  std::lock_guard g(mu);
  auto& slot = slots[id];
  if (slot.count > 0 || slot.dying) return false;
  slot.dying = true;
  return true;
}
void Lease::Table::ClearDying(EntryId id) {
  std::lock_guard g(mu);
  auto it = slots.find(id);
  if (it == slots.end()) return;
  it->second.dying = false;
  if (it->second.count == 0) slots.erase(it);
}
bool Lease::Table::Leased(EntryId id) {
  std::lock_guard g(mu);
  auto it = slots.find(id);
  return it != slots.end() && it->second.count > 0;
}

Lease::~Lease() {
  Release();
}
Lease::Lease(Lease&& other) noexcept : table_(std::move(other.table_)), id_(other.id_) {
  other.table_.reset();
}
Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::move(other.table_);
    id_ = other.id_;
    other.table_.reset();
  }
  return *this;
}
void Lease::Release() {
  if (table_ != nullptr) table_->Release(id_);
  table_.reset();
}

// ---- open / close --------------------------------------------------------------------

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;
const std::string& Store::path() const {
  return impl_->path;
}

Store::Impl::~Impl() {
  StopReclaimer();
  CloseIdleWriters();
  Status s = CloseDb();
  if (!s.ok()) spdlog::warn("statestore {}: close: {}", path, s.ToString());
}

rocksdb::WriteOptions Store::Impl::CommitWriteOptions() const {
  rocksdb::WriteOptions wo;
  wo.sync = opts.sync_commits;
  return wo;
}

Status Store::Impl::Write(const rocksdb::WriteOptions& wo, rocksdb::WriteBatch* batch,
                          std::string_view what) {
  PC_RETURN_IF_ERROR(Writable());
  PC_RETURN_IF_ERROR(Recover());
  return AfterWriteError(FromRocks(db->Write(wo, batch), what));
}

Status Store::Impl::Writable() const {
  if (opts.read_only) return Status::FailedPrecondition("the store at " + path + " is open read-only");
  return Status::Ok();
}

Status Store::Impl::AfterWriteError(const Status& s) {
  if (s.ok() || (frozen && frozen->load())) return s;
  if (s.code() != StatusCode::kIOError && s.code() != StatusCode::kResourceExhausted &&
      s.code() != StatusCode::kCorruption) {
    return s;
  }
  {
    std::lock_guard g(recover_mu);
    if (!stopped.load()) stop_cause = s;
    stopped.store(true);
  }
  // Often RocksDB can go on at once (the failure left nothing to redo).
  const bool still_stopped = !Recover().ok();
  if (s.code() != StatusCode::kResourceExhausted) return s;
  return Status::ResourceExhausted(
      "no space left on the disk of the store at " + path + " (" + s.message() +
      (still_stopped ? "); writes are refused until space is freed, reads go on" : ")"));
}

Status Store::Impl::Recover() {
  if (!stopped.load()) return Status::Ok();
  std::unique_lock g(recover_mu);
  if (!fatal.ok()) return fatal;
  if (!stopped.load()) return Status::Ok();
  rocksdb::Status r = db->Resume();
  if (r.ok()) {
    stopped.store(false);
    spdlog::info("statestore {}: writes resumed after: {}", path, stop_cause.ToString());
    return Status::Ok();
  }
  if (r.severity() >= rocksdb::Status::Severity::kFatalError) {
    spdlog::error(
        "statestore {}: RocksDB cannot resume after {} ({}); writes are refused until the store is "
        "reopened",
        path, stop_cause.ToString(), r.ToString());
    fatal = Status::Unavailable("the store must be reopened after a failed write (" + stop_cause.ToString() +
                                ")");
    return fatal;
  }
  Status why = FromRocks(r, "resume writes");
  if (why.code() == StatusCode::kResourceExhausted || stop_cause.code() == StatusCode::kResourceExhausted) {
    return Status::ResourceExhausted(
        "the disk of the store at " + path +
        " is full: writes are refused until space is freed (reads go on): " + why.message());
  }
  return Status::Unavailable("writes to the store at " + path +
                             " are refused until a failed write is redone: " + why.message());
}

Result<std::unique_ptr<Store>> Store::Open(StoreOptions options) {
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
  if (options.max_chunk_bytes == 0 || options.max_chunk_bytes > kMaxChunkBytesLimit) {
    return Invalid("max_chunk_bytes must be in [1, 1 GiB]");
  }
  if (options.utility_window == 0) options.utility_window = 1;
  impl->path = options.path;
  impl->validator = options.validator != nullptr ? options.validator : CodecLayerValidator();
  impl->hasher = &DefaultTokenHasher();
  if (options.test_hooks != nullptr) {
    if (options.test_hooks->hasher != nullptr) impl->hasher = options.test_hooks->hasher;
    impl->frozen = options.test_hooks->freeze_io;
    impl->freeze = {options.test_hooks->freeze_io, options.test_hooks->freeze_countdown};
  }
  impl->byte_budget = options.byte_budget;
  impl->opts = std::move(options);
  if (impl->opts.fetch_read_threads > 0) {
    impl->opts.fetch_read_ahead = std::max<std::size_t>(impl->opts.fetch_read_ahead, 1);
    impl->read_pool = std::make_unique<WorkerPool>(impl->opts.fetch_read_threads);
  }
  impl->seg_dir = impl->path + "/" + kSegmentDir;
  PC_RETURN_IF_ERROR(impl->OpenDb().WithContext("open store " + impl->path));
  PC_RETURN_IF_ERROR(impl->LoadState().WithContext("open store " + impl->path));
  PC_RETURN_IF_ERROR(impl->LoadSegments().WithContext("open store " + impl->path));
  PC_RETURN_IF_ERROR(impl->RecoverSegments().WithContext("open store " + impl->path));
  if (impl->stored_schema < kFirstSegmentSchema) {
    PC_RETURN_IF_ERROR(impl->MigrateChunks().WithContext("migrate store " + impl->path));
  }
  spdlog::debug("statestore {}: open, {} entries, {} chunks", impl->path, impl->counters.entries,
                impl->counters.chunks);
  return std::unique_ptr<Store>(new Store(std::move(impl)));
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

Status Store::Impl::OpenDb() {
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

rocksdb::DBOptions Store::Impl::SetUpRocks() {
  EnvFileSystemOptions fso;
  fso.posix_locks = opts.env == nullptr || opts.env == Env::Default();
  fso.frozen = frozen;
  if (opts.test_hooks != nullptr) fso.freeze_countdown = opts.test_hooks->freeze_countdown;
  fs = NewEnvFileSystem(env, fso);
  rocks_env = NewRocksEnv(fs, opts.test_hooks != nullptr && opts.test_hooks->short_sleeps);
  block_cache = rocksdb::NewLRUCache(opts.block_cache_bytes);

  rocksdb::DBOptions dbo;
  dbo.env = rocks_env.get();
  dbo.info_log = NewSpdlogRocksLogger();
  dbo.create_if_missing = opts.create_if_missing && !opts.read_only;
  dbo.create_missing_column_families = true;
  dbo.max_background_jobs = 4;
  dbo.delayed_write_rate = 1ull << 30;  // when RocksDB must slow writers, not to its 16 MiB/s default
  dbo.paranoid_checks = true;
  dbo.db_write_buffer_size = 512ull << 20;
  dbo.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  dbo.avoid_flush_during_shutdown = true;
  dbo.bgerror_resume_retry_interval = 20000;  // 20 ms between automatic recovery attempts
  return dbo;
}

Result<std::optional<std::uint32_t>> Store::Impl::AdoptStored(const rocksdb::DBOptions& dbo,
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

Status Store::Impl::OpenColumnFamilies(const rocksdb::DBOptions& dbo, bool has_schema) {
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  cfs.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
  for (const auto& n : OurColumnFamilies()) {
    cfs.emplace_back(n, CfOptions(n, params, opts, block_cache));
    if (opts.test_hooks != nullptr && opts.test_hooks->no_compactions)
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

Status Store::Impl::InitialiseRecords() {
  rocksdb::WriteBatch b;
  b.Put(cf_meta, std::string(kMetaSchemaKey), EncodeSchema(kSchemaVersion));
  b.Put(cf_meta, std::string(kMetaParamsKey), EncodeParams(params));
  b.Put(cf_meta, std::string(kMetaCountersKey), EncodeCounters(Counters()));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db->Write(wo, &b), "initialise store");
}

Status Store::Impl::LoadState() {
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

Status Store::Impl::LoadFilters() {
  std::unique_lock gn(node_filter.mu);
  std::unique_lock gx(exact_filter.mu);
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
      (tag == kNodeTag ? node_filter : exact_filter)
          .Adjust(
              NodeFilter::Fingerprint(GetBE64(k.data() + 1), GetBE64(k.data() + 9), GetBE64(k.data() + 17)),
              static_cast<std::int64_t>(n));
    }
    PC_RETURN_IF_ERROR(FromRocks(it->status(), "load index"));
  }
  return Status::Ok();
}

Status Store::Impl::CloseDb() {
  if (db == nullptr) return Status::Ok();
  Status result;
  if (!(frozen && frozen->load()) && !opts.read_only && Recover().ok()) {
    std::lock_guard wl(write_mu);
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

// ---- scopes --------------------------------------------------------------------------

std::optional<std::uint64_t> Store::Impl::FindScope(const Hash128& digest, std::string_view ns) const {
  std::shared_lock g(scope_mu);
  auto it = scope_by_name.find(ScopeByNameKey(digest, ns));
  if (it == scope_by_name.end()) return std::nullopt;
  return it->second;
}

std::optional<ScopeRecord> Store::Impl::ScopeById(std::uint64_t id) const {
  std::shared_lock g(scope_mu);
  auto it = scopes.find(id);
  if (it == scopes.end()) return std::nullopt;
  return it->second;
}

// ---- counters and stats --------------------------------------------------------------

void Store::Impl::PublishCounters(const Counters& c) {
  std::lock_guard g(stats_mu);
  stats_copy = c;
}

Store::Impl::Counters Store::Impl::WithLiveStats(Counters c) const {
  c.hits = hits;
  c.misses = misses;
  c.admission_refusals = refusals;
  return c;
}

Result<StoreStats> Store::Stat() {
  Impl::Counters c;
  {
    std::lock_guard g(impl_->stats_mu);
    c = impl_->stats_copy;
  }
  StoreStats st;
  st.entries = c.entries;
  st.quarantined = c.quarantined;
  st.chunks = c.chunks;
  st.stored_bytes = impl_->StoredBytes(c);
  st.logical_bytes = c.logical_chunk_bytes + c.meta_bytes;
  st.raw_bytes = c.raw_bytes;
  st.dedup_saved_bytes = c.logical_chunk_bytes >= c.chunk_bytes ? c.logical_chunk_bytes - c.chunk_bytes : 0;
  st.hits = impl_->hits;
  st.misses = impl_->misses;
  st.evictions = c.evictions;
  st.admission_refusals = impl_->refusals;
  {
    std::lock_guard g(impl_->leases->mu);
    st.active_leases = impl_->leases->active;
  }
  st.byte_budget = impl_->byte_budget;
  st.staged_bytes = impl_->staged_bytes.load();
  if (impl_->stopped.load()) {
    std::lock_guard g(impl_->recover_mu);
    st.write_error = impl_->fatal.ok() ? impl_->stop_cause.ToString() : impl_->fatal.ToString();
  } else if (impl_->segment_full.load()) {
    std::lock_guard g(impl_->recover_mu);
    st.write_error = impl_->segment_error.ToString();
  }
  // Every file of the directory: segment files, tables, the write-ahead
  // log and RocksDB's own records (files vanishing meanwhile are skipped).
  if (auto files = impl_->env->GetChildren(impl_->path); files.ok()) {
    for (const std::string& f : *files) {
      if (auto size = impl_->env->GetFileSize(impl_->path + "/" + f); size.ok()) st.disk_bytes += *size;
    }
  }
  if (auto seg = impl_->SegmentDiskBytes(); seg.ok()) st.disk_bytes += *seg;
  return st;
}

// ---- sightings (admission) -------------------------------------------------------------

std::string Store::Impl::SightingKey(const Hash128& model, std::string_view ns, std::uint64_t length,
                                     std::uint64_t exact_hash) {
  std::string k = HashKey(model);
  PutBE64(&k, length);
  PutBE64(&k, exact_hash);
  k += ns;
  return k;
}

void Store::Impl::NoteSighting(const std::string& key) {
  if (opts.admit_after_sightings <= 1) return;
  std::lock_guard g(sight_mu);
  auto [it, inserted] = sightings.try_emplace(key, 0);
  if (it->second < UINT32_MAX) ++it->second;
  if (inserted) {
    sighting_order.push_back(key);
    while (sighting_order.size() > std::max<std::size_t>(opts.sighting_capacity, 1)) {
      sightings.erase(sighting_order.front());
      sighting_order.pop_front();
    }
  }
}

std::uint32_t Store::Impl::Sightings(const std::string& key) {
  std::lock_guard g(sight_mu);
  auto it = sightings.find(key);
  return it == sightings.end() ? 0 : it->second;
}

void Store::RecordSighting(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> tokens) {
  if (tokens.empty()) return;
  BoundaryPlace place = PlaceOf(*impl_->hasher, tokens, impl_->params.block_tokens);
  impl_->NoteSighting(Impl::SightingKey(model, ns, tokens.size(), place.exact_hash));
}

// ---- recency ---------------------------------------------------------------------------

void Store::Impl::Touch(EntryId id, bool hit) {
  if (opts.read_only) return;
  bool flush = false;
  {
    std::lock_guard g(touch_mu);
    auto& t = pending_touches[id];
    t.tick = clock.fetch_add(1);
    if (hit) ++t.hits;
    flush = pending_touches.size() >= 4096;
  }
  if (flush) {
    std::lock_guard wl(write_mu);
    Status s = FlushTouches();
    if (!s.ok()) spdlog::warn("statestore {}: recording recency: {}", path, s.ToString());
  }
}

Status Store::Impl::FlushTouches() {
  std::unordered_map<EntryId, PendingTouch> pending;
  {
    std::lock_guard g(touch_mu);
    pending.swap(pending_touches);
  }
  if (pending.empty()) return Status::Ok();
  rocksdb::WriteBatch b;
  for (auto& [id, t] : pending) {
    std::string v;
    bool found = false;
    PC_RETURN_IF_ERROR(GetValue(cf_lru, AccessKey(id), &v, &found));
    if (!found) continue;  // removed meanwhile
    PC_ASSIGN_OR_RETURN(AccessRecord a, DecodeAccess(v));
    if (t.tick <= a.tick) t.tick = a.tick;
    b.Delete(cf_lru, AgeKey(a.tick, id));
    a.tick = t.tick;
    a.hits += t.hits;
    b.Put(cf_lru, AgeKey(a.tick, id), "");
    b.Put(cf_lru, AccessKey(id), EncodeAccess(a));
  }
  if (b.Count() == 0) return Status::Ok();
  return Write(rocksdb::WriteOptions(), &b, "record recency");
}

// ---- describe / list ---------------------------------------------------------------------

Result<EntryInfo> Store::Impl::MakeInfo(EntryId id, const EntrySummary& s, EntryState state) {
  EntryInfo info;
  info.id = id;
  info.state = state;
  if (auto scope = ScopeById(s.scope)) {
    info.model = scope->digest;
    info.model_name = scope->model_name;
    info.ns = scope->ns;
    info.model_descriptor = scope->descriptor;
  } else {
    return Status::Corruption("entry " + std::to_string(id) + " names unknown scope " +
                              std::to_string(s.scope));
  }
  info.length = s.length;
  info.layers = s.layers;
  info.chunk_bytes = s.chunk_bytes;
  info.raw_bytes = s.raw_bytes;
  info.meta_bytes = s.meta_bytes;
  info.flops = s.flops;
  info.created_unix_ms = s.created_unix_ms;
  if (state == EntryState::kLive) {
    std::string v;
    bool found = false;
    PC_RETURN_IF_ERROR(GetValue(cf_lru, AccessKey(id), &v, &found));
    if (found) {
      PC_ASSIGN_OR_RETURN(AccessRecord a, DecodeAccess(v));
      info.last_access = a.tick;
      info.hits = a.hits;
    }
    std::lock_guard g(touch_mu);
    auto it = pending_touches.find(id);
    if (it != pending_touches.end()) {
      info.last_access = std::max(info.last_access, it->second.tick);
      info.hits += it->second.hits;
    }
  }
  return info;
}

Result<EntryInfo> Store::Describe(EntryId id) {
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_entries, IdKey(id), &v, &found));
  if (found) {
    PC_ASSIGN_OR_RETURN(EntrySummary s, DecodeSummary(v));
    return impl_->MakeInfo(id, s, EntryState::kLive);
  }
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_quarantine, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no entry " + std::to_string(id));
  PC_ASSIGN_OR_RETURN(QuarantineRecord q, DecodeQuarantine(v));
  PC_ASSIGN_OR_RETURN(EntryInfo info, impl_->MakeInfo(id, q.summary, EntryState::kQuarantined));
  info.reason = q.reason;
  return info;
}

namespace {

// The scopes of fingerprint `model` (and namespace `ns`, when given), in id order.
std::vector<std::uint64_t> ScopesOf(const Store::Impl& s, const Hash128& model,
                                    const std::optional<std::string>& ns) {
  std::vector<std::uint64_t> ids;
  std::shared_lock g(s.scope_mu);
  for (const auto& [id, sc] : s.scopes) {
    if (sc.digest == model && (!ns || sc.ns == *ns)) ids.push_back(id);
  }
  return ids;
}

// Appends the entry whose record (live or quarantined, as `state` says) is `value`.
Status AppendInfo(Store::Impl& s, EntryState state, EntryId id, std::string_view value, ListPage* page) {
  if (state == EntryState::kLive) {
    PC_ASSIGN_OR_RETURN(EntrySummary sum, DecodeSummary(value));
    PC_ASSIGN_OR_RETURN(EntryInfo info, s.MakeInfo(id, sum, EntryState::kLive));
    page->entries.push_back(std::move(info));
  } else {
    PC_ASSIGN_OR_RETURN(QuarantineRecord q, DecodeQuarantine(value));
    PC_ASSIGN_OR_RETURN(EntryInfo info, s.MakeInfo(id, q.summary, EntryState::kQuarantined));
    info.reason = q.reason;
    page->entries.push_back(std::move(info));
  }
  return Status::Ok();
}

rocksdb::ColumnFamilyHandle* RecordsOf(const Store::Impl& s, EntryState state) {
  return state == EntryState::kLive ? s.cf_entries : s.cf_quarantine;
}

// Walks the records by id (filtering quarantined ones by scope). The page
// token is the last id returned (8 bytes).
Result<ListPage> ListById(Store::Impl& s, const ListOptions& o) {
  std::uint64_t after = 0;
  if (!o.page_token.empty()) {
    if (o.page_token.size() != 8) return Invalid("malformed page token");
    after = GetBE64(o.page_token.data());
  }
  std::optional<std::set<std::uint64_t>> wanted;
  if (o.model) {
    std::vector<std::uint64_t> ids = ScopesOf(s, *o.model, o.ns);
    wanted.emplace(ids.begin(), ids.end());
  }
  ListPage page;
  std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(rocksdb::ReadOptions(), RecordsOf(s, o.state)));
  for (it->Seek(IdKey(after + 1)); it->Valid(); it->Next()) {
    PC_ASSIGN_OR_RETURN(std::uint64_t id, IdFromKey(it->key().ToStringView()));
    if (wanted) {
      PC_ASSIGN_OR_RETURN(QuarantineRecord q, DecodeQuarantine(it->value().ToStringView()));
      if (wanted->count(q.summary.scope) == 0) continue;
    }
    if (page.entries.size() == o.limit) {
      page.next_page_token = IdKey(page.entries.back().id);
      break;
    }
    PC_RETURN_IF_ERROR(AppendInfo(s, o.state, id, it->value().ToStringView(), &page));
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "list entries"));
  return page;
}

// Live entries of one fingerprint (and maybe one namespace): walks the
// membership keys of each matching scope, in scope order. The page token is
// the scope (8 bytes) and id (8) of the last entry returned.
Result<ListPage> ListByScope(Store::Impl& s, const ListOptions& o) {
  std::uint64_t from_scope = 0, after_id = 0;
  if (!o.page_token.empty()) {
    if (o.page_token.size() != 16) return Invalid("malformed page token");
    from_scope = GetBE64(o.page_token.data());
    after_id = GetBE64(o.page_token.data() + 8);
  }
  ListPage page;
  std::uint64_t last_scope = 0;
  for (std::uint64_t scope : ScopesOf(s, *o.model, o.ns)) {
    if (scope < from_scope) continue;
    std::string prefix = MemberPrefix(scope);
    std::unique_ptr<rocksdb::Iterator> it(s.db->NewIterator(rocksdb::ReadOptions(), s.cf_index));
    it->Seek(scope == from_scope ? MemberKey(scope, after_id + 1) : prefix);
    for (; it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (it->key().size() != 17) return Status::Corruption("malformed membership key");
      EntryId id = GetBE64(it->key().data() + 9);
      if (page.entries.size() == o.limit) {
        page.next_page_token = IdKey(last_scope) + IdKey(page.entries.back().id);
        return page;
      }
      std::string v;
      bool found = false;
      PC_RETURN_IF_ERROR(s.GetValue(RecordsOf(s, o.state), IdKey(id), &v, &found));
      if (!found) continue;  // removed meanwhile
      PC_RETURN_IF_ERROR(AppendInfo(s, o.state, id, v, &page));
      last_scope = scope;
    }
    PC_RETURN_IF_ERROR(FromRocks(it->status(), "list entries"));
  }
  return page;
}

}  // namespace

Result<ListPage> Store::List(const ListOptions& o) {
  if (o.limit == 0 || o.limit > 1000) return Invalid("list limit must be in [1, 1000]");
  if (o.ns && !o.model) return Invalid("a namespace filter needs a model filter");
  if (!o.model || o.state == EntryState::kQuarantined) return ListById(*impl_, o);
  return ListByScope(*impl_, o);
}

// ---- delete, budget ----------------------------------------------------------------------

Status Store::Delete(EntryId id) {
  PC_RETURN_IF_ERROR(impl_->Writable());
  std::lock_guard wl(impl_->write_mu);
  Txn t(*impl_);
  // A quarantined entry holds no references: only its record goes.
  std::string v;
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_quarantine, IdKey(id), &v, &found));
  if (found) {
    t.batch().Delete(impl_->cf_quarantine, IdKey(id));
    if (t.counters().quarantined > 0) --t.counters().quarantined;
    return t.Commit(impl_->CommitWriteOptions(), "delete.before_write", "delete.after_write");
  }
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_entries, IdKey(id), &v, &found));
  if (!found) return Status::NotFound("no entry " + std::to_string(id));
  if (!t.MarkDying(id)) return Status::Unavailable("entry " + std::to_string(id) + " is leased; retry later");
  auto removed = t.RemoveEntry(id, std::nullopt);
  if (!removed.ok() && removed.status().IsCorruption()) {
    // Its records cannot be read: remove what is keyed by its id and rebuild
    // what the remaining entries imply.
    spdlog::error("statestore {}: deleting entry {}: {}", impl_->path, id, removed.status().ToString());
    return impl_->ForceRemove(id);
  }
  PC_RETURN_IF_ERROR(removed.status());
  if (!*removed) return Status::NotFound("no entry " + std::to_string(id));
  return t.Commit(impl_->CommitWriteOptions(), "delete.before_write", "delete.after_write");
}

Status Store::Impl::ForceRemove(EntryId id) {
  Txn t(*this);
  PC_RETURN_IF_ERROR(t.DeleteEntryRecords(id, /*tolerate_bad_access=*/true));
  PC_RETURN_IF_ERROR(t.Commit(CommitWriteOptions(), "delete.before_write", "delete.after_write"));
  return RebuildDerived();
}

Status Store::SetByteBudget(std::uint64_t bytes) {
  PC_RETURN_IF_ERROR(impl_->Writable());
  impl_->byte_budget = bytes;
  if (bytes == 0) return Status::Ok();
  std::lock_guard wl(impl_->write_mu);
  PC_RETURN_IF_ERROR(impl_->FlushTouches());
  Txn t(*impl_);
  std::uint64_t evicted = 0;
  PC_RETURN_IF_ERROR(t.EvictToBudget(bytes, std::nullopt, &evicted));
  if (evicted == 0) return Status::Ok();
  return t.Commit(impl_->CommitWriteOptions(), "evict.before_write", "evict.after_write");
}

Result<Store::VerifyReport> Store::Verify(bool read_chunks) {
  return impl_->Verify(read_chunks);
}

}  // namespace primecache

// statestore_bench: the store's figures against what the machine gives, side
// by side in one run (docs/BENCHMARKS.md records them).
//
//  throughput  publish and fetch of one entry (real encoded layers) against
//              writing the same bytes to a plain file with fsync and reading
//              them back, against plain RocksDB Put/Get of the same chunks,
//              and fetch against memcpy; for each chunk layout.
//  lookup      p50/p99 lookup latency with 32K-token queries as the store
//              grows to 10^3 .. 10^6 entries (small synthetic entries).
//  dedup       K boundaries of one growing conversation: stored bytes against
//              the final planes plus K recurrent states.
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "primecache/internal/codec.h"
#include "primecache/internal/env.h"
#include "primecache/internal/logging.h"
#include "primecache/internal/snapshot.h"
#include "primecache/internal/statestore.h"
#include "tools/common/csv.h"

namespace {

using namespace primecache;  // NOLINT(google-build-using-namespace)
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double GBs(std::uint64_t bytes, double s) {
  return static_cast<double>(bytes) / s / 1e9;
}

void Die(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "statestore_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A smooth plane with noise, as latent rows look; rows depend on the absolute
// row only, so a longer boundary extends a shorter one.
void Fill(std::vector<float>* v, std::uint64_t rows, std::uint32_t width, std::uint64_t seed,
          std::uint64_t first = 0) {
  v->resize(rows * width);
  for (std::uint64_t t = 0; t < rows; ++t) {
    for (std::uint32_t c = 0; c < width; ++c) {
      double x = static_cast<double>(first + t), y = c;
      double noise =
          static_cast<double>(Mix(seed * 1000003 + (first + t) * 7919 + c) >> 40) / (1 << 24) - 0.5;
      (*v)[t * width + c] = static_cast<float>(std::sin(0.013 * x + 0.37 * y) +
                                               0.5 * std::cos(0.0021 * x * (1 + y / 97.0)) + 0.05 * noise);
    }
  }
}

struct Geometry {
  std::uint32_t latent_layers = 4;
  std::uint32_t recurrent_layers = 4;
  std::uint32_t width = 576;          // kv_rank 512 + rope 64
  std::uint32_t index_head_dim = 64;  // DSA indexer
  std::uint32_t pool = 4;
  std::uint32_t heads = 32, head_dim = 128, kernel = 4;
};

std::vector<LayerBytes> Encode(const Geometry& g, std::uint64_t tokens, std::uint64_t seed,
                               const EncodeOptions& eo) {
  std::vector<LayerBytes> out;
  auto push = [&](const LayerSnapshot& s) {
    auto enc = EncodeLayer(s, eo);
    Die(enc.status(), "encode");
    out.push_back({SerializeLayerHeader(enc->header), std::move(enc->chunks)});
  };
  for (std::uint32_t l = 0; l < g.latent_layers; ++l) {
    LatentSnapshot s;
    s.shape.len = tokens;
    s.shape.width = g.width;
    Fill(&s.latent_rows, tokens, g.width, seed * 100 + l);
    if (g.index_head_dim > 0) {
      s.shape.index_width = 2 * g.index_head_dim;
      s.shape.pool = g.pool;
      s.shape.pools_ready = tokens / g.pool;
      std::uint64_t first_tail = s.shape.pools_ready * g.pool;
      Fill(&s.index_tail_rows, tokens - first_tail, s.shape.index_width, seed * 100 + 50 + l, first_tail);
      Fill(&s.pool_keys, s.shape.pools_ready, g.index_head_dim, seed * 100 + 70 + l);
    }
    push(s);
  }
  for (std::uint32_t l = 0; l < g.recurrent_layers; ++l) {
    RecurrentSnapshot s{{g.heads, g.head_dim, g.kernel}, {}, {}};
    // The state depends on the boundary: seed it with the length.
    Fill(&s.conv_ring, 3ull * g.heads * g.head_dim, g.kernel - 1, seed * 1000 + tokens * 7 + l);
    Fill(&s.state, std::uint64_t{g.heads} * g.head_dim, g.head_dim, seed * 1000 + tokens * 7 + 500 + l);
    push(s);
  }
  return out;
}

std::uint64_t ChunkBytes(const std::vector<LayerBytes>& layers) {
  std::uint64_t n = 0;
  for (auto& l : layers) {
    for (auto& c : l.chunks) n += c.size();
  }
  return n;
}

std::vector<std::uint32_t> Tokens(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint32_t>(Mix(seed * 1000003 + i) % 150000);
  return t;
}

PublishRequest Request(std::vector<std::uint32_t> tokens, std::string ns = "bench") {
  PublishRequest r;
  r.model = Hash128{0x1234, 0x5678};
  r.model_name = "bench-model";
  r.ns = std::move(ns);
  r.tokens = std::move(tokens);
  r.cost = {2'000'000'000ull, 4, 2 * (576 + 512) * 16};
  return r;
}

// ---- throughput -------------------------------------------------------------------------

// Copies every fetched chunk into one destination buffer (as a restore into
// a staging buffer would).
class CopySink final : public FetchSink {
 public:
  explicit CopySink(std::vector<char>* dst) : dst_(dst) {}
  Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
    std::memcpy(dst_->data() + off_, b.data(), b.size());
    off_ += b.size();
    return Status::Ok();
  }
  std::size_t off_ = 0;

 private:
  std::vector<char>* dst_;
};

// Gives the store the caller's memory to read each chunk into
// (FetchSink::ChunkBuffer): the fetch copies nothing itself.
class BufferSink final : public FetchSink {
 public:
  explicit BufferSink(std::vector<char>* dst) : dst_(dst) {}
  Status OnLayer(std::uint32_t, std::string_view, std::uint32_t) override { return Status::Ok(); }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte>) override { return Status::Ok(); }
  Result<std::optional<std::span<std::byte>>> ChunkBuffer(std::uint32_t, std::uint32_t, std::uint64_t size,
                                                          bool) override {
    if (off_ + size > dst_->size()) return Status::Internal("bench: destination too small");
    std::span<std::byte> out(reinterpret_cast<std::byte*>(dst_->data()) + off_, size);
    off_ += size;
    return std::optional<std::span<std::byte>>(out);
  }

 private:
  std::vector<char>* dst_;
  std::size_t off_ = 0;
};

struct Median {
  std::vector<double> v;
  void Add(double x) { v.push_back(x); }
  double Get() {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }
};

// Each timed write starts with nothing dirty in the page cache, so that one
// measurement's writeback does not land on the next.
void Quiesce() {
  ::sync();
}

double TimeMemcpy(const std::vector<LayerBytes>& layers, std::vector<char>* dst) {
  auto t0 = Clock::now();
  std::size_t off = 0;
  for (auto& l : layers) {
    for (auto& c : l.chunks) {
      std::memcpy(dst->data() + off, c.data(), c.size());
      off += c.size();
    }
  }
  return Seconds(t0);
}

// write + fsync of a new file (and its directory), then a read of it back.
std::pair<double, double> TimePlainFile(const std::string& dir, const std::vector<LayerBytes>& layers,
                                        std::vector<char>* dst) {
  Env* env = Env::Default();
  std::string path = dir + "/plain-file";
  Quiesce();
  auto t0 = Clock::now();
  auto f = env->NewWritableFile(path);
  Die(f.status(), "plain file");
  for (auto& l : layers) {
    for (auto& c : l.chunks) Die((*f)->Append(AsBytes(c)), "append");
  }
  Die((*f)->Sync(), "fsync");
  Die((*f)->Close(), "close");
  Die(env->SyncDir(dir), "sync dir");
  double w = Seconds(t0);
  auto t1 = Clock::now();
  auto rf = env->NewRandomAccessFile(path);
  Die(rf.status(), "open");
  std::size_t got = 0;
  Die((*rf)->Read(0, std::as_writable_bytes(std::span(*dst)), &got), "read");
  double r = Seconds(t1);
  Die(env->RemoveFile(path), "remove");
  return {w, r};
}

// Plain RocksDB (default options): Put every chunk, then a synced write; Get
// every chunk, copied into the buffer.
std::pair<double, double> TimePlainRocks(rocksdb::DB* db, int rep, const std::vector<LayerBytes>& layers,
                                         std::vector<char>* dst) {
  Quiesce();
  auto t0 = Clock::now();
  std::size_t i = 0;
  for (auto& l : layers) {
    for (auto& c : l.chunks) {
      std::string key = std::to_string(rep) + "/" + std::to_string(i++);
      if (!db->Put(rocksdb::WriteOptions(), key, c).ok()) Die(Status::IOError("put"), "rocksdb");
    }
  }
  rocksdb::WriteOptions sync;
  sync.sync = true;
  if (!db->Put(sync, "done/" + std::to_string(rep), "").ok()) Die(Status::IOError("put"), "rocksdb");
  double w = Seconds(t0);
  auto t1 = Clock::now();
  std::size_t off = 0;
  rocksdb::PinnableSlice v;
  for (std::size_t k = 0; k < i; ++k) {
    v.Reset();
    if (!db->Get(rocksdb::ReadOptions(), db->DefaultColumnFamily(),
                 std::to_string(rep) + "/" + std::to_string(k), &v)
             .ok()) {
      Die(Status::IOError("get"), "rocksdb");
    }
    std::memcpy(dst->data() + off, v.data(), v.size());
    off += v.size();
  }
  return {w, Seconds(t1)};
}

// One store variant of the throughput table.
struct StoreVariant {
  const char* name;
  std::size_t read_threads;
  bool direct = false;
};

// What every run of the throughput table shares: the encoded entries (one
// per run), their size, and a destination buffer as large.
struct ThroughputCase {
  std::string dir;
  std::uint64_t tokens = 0;
  std::uint64_t bytes = 0;
  std::vector<std::vector<LayerBytes>> entries;
  std::vector<char> dst;
};

// The medians of one row of the throughput table.
struct ThroughputRow {
  Median pub, file_w, pub_ratio, put, fetch, copy, fetch_ratio, file_r, get, into, into_ratio;
};

// Run `r`: the plain file and plain RocksDB next to the store's publish, then
// the store's fetches (the entry just written is in the page cache) next to
// memcpy.
void ThroughputRun(ThroughputCase& c, const StoreVariant& v, LocalStore& store, rocksdb::DB* plain, int r,
                   ThroughputRow& row) {
  const std::uint64_t bytes = c.bytes;
  auto [fw, fr] = TimePlainFile(c.dir, c.entries[r], &c.dst);
  auto [pw, pg] = TimePlainRocks(plain, r, c.entries[r], &c.dst);
  rocksdb::FlushOptions flush;
  flush.wait = true;
  if (!plain->Flush(flush).ok()) Die(Status::IOError("flush plain RocksDB"), "rocksdb");
  Quiesce();
  auto t0 = Clock::now();
  auto p = store.BeginPublish(Request(Tokens(c.tokens, 77 + r)));
  Die(p.status(), "begin");
  for (auto& l : c.entries[r]) Die(p->publisher->AddLayer(l), "layer");
  auto res = p->publisher->Commit();
  Die(res.status(), "commit");
  double sp = Seconds(t0);
  row.file_w.Add(GBs(bytes, fw));
  row.file_r.Add(GBs(bytes, fr));
  row.put.Add(GBs(bytes, pw));
  row.get.Add(GBs(bytes, pg));
  row.pub.Add(GBs(bytes, sp));
  row.pub_ratio.Add(fw / sp);
  std::fprintf(stderr, "%s, run %d: publish %.2f GB/s, file write+fsync %.2f GB/s\n", v.name, r,
               GBs(bytes, sp), GBs(bytes, fw));
  double mc = TimeMemcpy(c.entries[r], &c.dst);
  CopySink sink(&c.dst);
  auto t1 = Clock::now();
  Die(store.Fetch(res->id, {}, sink), "fetch");
  double sf = Seconds(t1);
  row.copy.Add(GBs(bytes, mc));
  row.fetch.Add(GBs(bytes, sf));
  row.fetch_ratio.Add(mc / sf);
  BufferSink into_sink(&c.dst);
  auto t2 = Clock::now();
  Die(store.Fetch(res->id, {}, into_sink), "fetch");
  const double si = Seconds(t2);
  row.into.Add(GBs(bytes, si));
  row.into_ratio.Add(mc / si);
}

// One row: a fresh store of variant `v` and a fresh plain RocksDB, every run.
void ThroughputVariant(ThroughputCase& c, const StoreVariant& v, int reps) {
  std::string path = c.dir + "/store";
  std::string rpath = c.dir + "/plain-rocksdb";
  std::filesystem::remove_all(path);
  std::filesystem::remove_all(rpath);
  StoreOptions so;
  so.path = path;
  so.validator = CodecLayerValidator();
  so.fetch_read_threads = v.read_threads;
  so.direct_reads = v.direct;
  auto store = LocalStore::Open(so);
  Die(store.status(), "open store");
  rocksdb::Options ro;
  ro.create_if_missing = true;
  // Its background work must not land on the store's timings: no
  // compactions, and each run's memtables flushed before the store runs.
  ro.disable_auto_compactions = true;
  rocksdb::DB* plain = nullptr;
  if (!rocksdb::DB::Open(ro, rpath, &plain).ok()) Die(Status::IOError("open plain RocksDB"), "rocksdb");
  ThroughputRow row;
  for (int r = 0; r < reps; ++r) ThroughputRun(c, v, **store, plain, r, row);
  auto st = (*store)->Stat();
  std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f |\n",
              v.name, row.pub.Get(), row.file_w.Get(), row.pub_ratio.Get(), row.put.Get(), row.fetch.Get(),
              row.copy.Get(), row.fetch_ratio.Get(), row.file_r.Get(), row.get.Get(), row.into.Get(),
              row.into_ratio.Get(), static_cast<double>(st->disk_bytes) / (1 << 20));
  std::fflush(stdout);
  delete plain;
  store->reset();
  std::filesystem::remove_all(path);
  std::filesystem::remove_all(rpath);
}

void Throughput(const std::string& dir, int mib, int reps) {
  Geometry g;
  g.index_head_dim = 0;
  g.recurrent_layers = 2;
  EncodeOptions eo;
  eo.all_planes = TransformSpec{"raw/v1", 0};
  ThroughputCase c;
  c.dir = dir;
  // Tokens so that the latent planes come to about `mib`.
  c.tokens = (static_cast<std::uint64_t>(mib) << 20) / (g.latent_layers * g.width * 4ull);
  for (int r = 0; r < reps; ++r) c.entries.push_back(Encode(g, c.tokens, 1000 + r, eo));
  c.bytes = ChunkBytes(c.entries[0]);
  std::size_t chunks = 0;
  for (auto& l : c.entries[0]) chunks += l.chunks.size();
  std::printf(
      "\n## throughput: one entry of %llu tokens, %zu layers, %zu chunks, %.1f MiB; medians of %d runs, each "
      "store run next to a plain run\n\n",
      static_cast<unsigned long long>(c.tokens), c.entries[0].size(), chunks,
      static_cast<double>(c.bytes) / (1 << 20), reps);
  c.dst.resize(c.bytes);

  const StoreVariant variants[] = {{"segment files, read pool of 4 (default)", 4},
                                   {"segment files, read pool of 2", 2},
                                   {"segment files, reads on the caller's thread", 0},
                                   {"segment files, read pool of 4, O_DIRECT reads", 4, true}};
  std::printf(
      "| store variant | publish GB/s | file write+fsync GB/s | publish / file | RocksDB Put GB/s | fetch "
      "GB/s | "
      "memcpy GB/s | fetch / memcpy | file read GB/s | RocksDB Get GB/s | fetch into caller's buffer GB/s | "
      "into buffer / memcpy | disk MiB "
      "|\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const StoreVariant& v : variants) ThroughputVariant(c, v, reps);
}

// ---- lookup ------------------------------------------------------------------------------

// Accepts any layer: the lookup scale test stores millions of tiny entries
// whose layers are one placeholder chunk (lookups never read layers).
class AcceptAll final : public LayerValidator {
 public:
  Result<LayerFacts> Check(std::string_view, std::span<const ChunkFacts>, std::uint64_t) const override {
    return LayerFacts{};
  }
  Status CheckModel(std::string_view, std::span<const std::string_view>, std::uint32_t) const override {
    return Status::Ok();
  }
};

// Latencies in microseconds of one store size's queries.
struct LookupFigures {
  double hit_p50 = 0, hit_p99 = 0, miss_p50 = 0, miss_p99 = 0;
  std::uint64_t hit_len = 0;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

// `queries` queries of `q` tokens each way: the conversation extended
// differently each time (hits its 30000 boundary), and fresh random tokens
// (misses).
LookupFigures TimeLookups(LocalStore& store, const std::vector<std::uint32_t>& conv, std::size_t q, int queries) {
  std::vector<double> hit, miss;
  LookupFigures f;
  for (int i = 0; i < queries; ++i) {
    std::vector<std::uint32_t> qh(conv.begin(), conv.begin() + static_cast<long>(q));
    qh[q - 1 - static_cast<std::size_t>(i % 100)] ^= static_cast<std::uint32_t>(i + 1);
    auto h0 = Clock::now();
    auto r = store.Lookup(Hash128{0x1234, 0x5678}, "bench", qh);
    hit.push_back(std::chrono::duration<double, std::micro>(Clock::now() - h0).count());
    if (!r.ok() || !r->has_value()) Die(Status::Internal("expected a hit"), "lookup");
    f.hit_len = (*r)->length;
    auto qm = Tokens(q, 1'000'000'000ull + static_cast<std::uint64_t>(i));
    auto m0 = Clock::now();
    auto rm = store.Lookup(Hash128{0x1234, 0x5678}, "bench", qm);
    miss.push_back(std::chrono::duration<double, std::micro>(Clock::now() - m0).count());
    if (!rm.ok() || rm->has_value()) Die(Status::Internal("expected a miss"), "lookup");
  }
  f.hit_p50 = Percentile(hit, 0.5);
  f.hit_p99 = Percentile(hit, 0.99);
  f.miss_p50 = Percentile(miss, 0.5);
  f.miss_p99 = Percentile(miss, 0.99);
  return f;
}

// Filler entries up to `target`: other conversations, 16..271 tokens, one
// in 16 sharing the first 1024 tokens of the queried conversation.
void GrowTo(LocalStore& store, const std::vector<std::uint32_t>& conv, std::uint64_t target, std::mt19937_64& rng,
            std::uint64_t* entries) {
  LayerBytes layer{"placeholder", {"x"}};
  std::vector<std::uint32_t> t;
  while (*entries < target) {
    std::size_t len = 16 + rng() % 256;
    if (rng() % 16 == 0) {
      t.assign(conv.begin(), conv.begin() + 1024);
      for (std::size_t i = 0; i < len; ++i) t.push_back(static_cast<std::uint32_t>(rng() % 150000));
    } else {
      t = Tokens(len, rng());
    }
    Die(store.Publish(Request(t), {&layer, 1}).status(), "publish");
    ++*entries;
  }
}

// Lookup latency as the store grows from 10^3 to `max_entries` entries by
// factors of ten; the rows also go into `csv` (columns as its header says).
void Lookup(const std::string& dir, std::uint64_t max_entries, int queries, bench::CsvTable* csv) {
  std::printf("\n## lookup: 32768-token queries, in process, latency in microseconds\n\n");
  std::printf(
      "| entries | hit p50 | hit p99 | miss p50 | miss p99 | hit length |\n| --- | --- | --- | --- | --- | "
      "--- |\n");
  std::string path = dir + "/lookup-store";
  std::filesystem::remove_all(path);
  StoreOptions so;
  so.path = path;
  so.validator = std::make_shared<AcceptAll>();
  so.sync_commits = false;  // a throwaway store, built fast
  auto store = LocalStore::Open(so);
  Die(store.status(), "open store");
  LayerBytes layer{"placeholder", {"x"}};
  const std::size_t q = 32768;
  // The queried conversation: boundaries stored at a few depths.
  auto conv = Tokens(q + 4096, 4242);
  for (std::size_t len : {4096u, 12000u, 24000u, 30000u}) {
    auto r = (*store)->Publish(Request({conv.begin(), conv.begin() + static_cast<long>(len)}), {&layer, 1});
    Die(r.status(), "publish");
  }
  std::mt19937_64 rng(99);
  std::uint64_t entries = 4;
  for (std::uint64_t target = 1000; target <= max_entries; target *= 10) {
    auto t0 = Clock::now();
    GrowTo(**store, conv, target, rng, &entries);
    double build = Seconds(t0);
    Die((*store)->Compact(), "compact");  // measure a settled store, not one busy compacting
    const LookupFigures f = TimeLookups(**store, conv, q, queries);
    std::printf("| %llu | %.1f | %.1f | %.1f | %.1f | %llu |\n", static_cast<unsigned long long>(entries), f.hit_p50,
                f.hit_p99, f.miss_p50, f.miss_p99, static_cast<unsigned long long>(f.hit_len));
    Die(csv->Add({entries, q, f.hit_len, f.hit_p50, f.hit_p99, f.miss_p50, f.miss_p99}), "csv");
    std::fprintf(stderr, "lookup: %llu entries built in %.1f s\n", static_cast<unsigned long long>(entries),
                 build);
    std::fflush(stdout);
  }
  store->reset();
  std::filesystem::remove_all(path);
}

// ---- dedup -------------------------------------------------------------------------------

void Dedup(const std::string& dir, std::uint64_t tokens, int k) {
  Geometry g;
  EncodeOptions eo;  // the default transform (shuffle-zstd level 1), 1 MiB chunks
  std::string path = dir + "/dedup-store";
  std::filesystem::remove_all(path);
  StoreOptions so;
  so.path = path;
  so.validator = CodecLayerValidator();
  auto store = LocalStore::Open(so);
  Die(store.status(), "open store");
  auto conv = Tokens(tokens, 31337);
  std::uint64_t sum = 0, recurrent = 0, final_planes = 0;
  for (int i = 1; i <= k; ++i) {
    std::uint64_t len = tokens * static_cast<std::uint64_t>(i) / static_cast<std::uint64_t>(k);
    auto layers = Encode(g, len, 7, eo);
    sum += ChunkBytes(layers);
    std::uint64_t rec = 0;
    for (std::size_t l = g.latent_layers; l < layers.size(); ++l) {
      for (auto& c : layers[l].chunks) rec += c.size();
    }
    recurrent += rec;
    if (i == k) final_planes = ChunkBytes(layers) - rec;
    auto r = (*store)->Publish(Request({conv.begin(), conv.begin() + static_cast<long>(len)}), layers);
    Die(r.status(), "publish");
  }
  auto st = (*store)->Stat();
  Die(st.status(), "stat");
  const std::uint64_t stored_chunks = st->stored_bytes - (st->logical_bytes - sum);
  const double target = static_cast<double>(final_planes + recurrent);
  std::printf("\n## dedup: %d boundaries of one conversation up to %llu tokens\n\n", k,
              static_cast<unsigned long long>(tokens));
  std::printf("| figure | MiB |\n| --- | --- |\n");
  std::printf("| sum of the %d snapshots | %.1f |\n", k, static_cast<double>(sum) / (1 << 20));
  std::printf("| final planes (last boundary without its recurrent layers) | %.1f |\n",
              static_cast<double>(final_planes) / (1 << 20));
  std::printf("| %d recurrent states | %.1f |\n", k, static_cast<double>(recurrent) / (1 << 20));
  std::printf("| stored chunk bytes | %.1f |\n", static_cast<double>(stored_chunks) / (1 << 20));
  std::printf("| stored bytes with metadata | %.1f |\n", static_cast<double>(st->stored_bytes) / (1 << 20));
  std::printf("| ratio stored / (final planes + K states) | %.3f |\n",
              static_cast<double>(st->stored_bytes) / target);
  std::printf("| ratio stored / sum of snapshots | %.3f |\n",
              static_cast<double>(st->stored_bytes) / static_cast<double>(sum));
  store->reset();
  std::filesystem::remove_all(path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"statestore benchmark: throughput, lookup latency, dedup"};
  std::string dir = "/tmp/statestore-bench";
  int mib = 256, reps = 3, queries = 200, boundaries = 8;
  std::uint64_t max_entries = 1'000'000, dedup_tokens = 32768;
  bool no_throughput = false, no_lookup = false, no_dedup = false;
  std::string csv_dir;
  app.add_option("--dir", dir, "scratch directory (on the disk to measure)");
  app.add_option("--mib", mib, "throughput: MiB per entry")->check(CLI::Range(1, 8192));
  app.add_option("--reps", reps, "throughput: entries timed per case")->check(CLI::Range(1, 100));
  app.add_option("--max-entries", max_entries, "lookup: grow the store up to this many entries");
  app.add_option("--queries", queries, "lookup: queries per size and kind")->check(CLI::Range(10, 100000));
  app.add_option("--dedup-tokens", dedup_tokens, "dedup: tokens of the last boundary");
  app.add_option("--boundaries", boundaries, "dedup: boundaries K")->check(CLI::Range(1, 1000));
  app.add_flag("--no-throughput", no_throughput);
  app.add_flag("--no-lookup", no_lookup);
  app.add_flag("--no-dedup", no_dedup);
  app.add_option("--csv-dir", csv_dir, "also write the lookup figures as DIR/lookup-latency.csv (tools/bench/plot.py)");
  CLI11_PARSE(app, argc, argv);
  Die(InitLogging("warn"), "logging");
  std::filesystem::create_directories(dir);
  if (!no_throughput) Throughput(dir, mib, reps);
  if (!no_dedup) Dedup(dir, dedup_tokens, boundaries);
  bench::CsvTable lookups(
      {"entries", "query_tokens", "hit_tokens", "hit_p50_us", "hit_p99_us", "miss_p50_us", "miss_p99_us"});
  if (!no_lookup) Lookup(dir, max_entries, queries, &lookups);
  if (!no_lookup) Die(lookups.WriteToDir(csv_dir, "lookup-latency"), "csv");
  return 0;
}

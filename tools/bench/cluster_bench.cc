// primecache-cluster-bench: the remote tier's put and fetch rates and lookup
// latency on a Redis Cluster, by chunk size, next to redis-benchmark SETs
// and GETs of values of the same size on the same cluster in the same run.
//
// Without --remote it starts a loopback cluster of 3 primaries and 3
// replicas with tools/redis-cluster (--io-threads sets redis-server's
// io-threads on every node) and stops it at the end. Each repetition puts
// one entry of --mib MiB (4 layers of chunks, a boundary of --tokens
// tokens) through one client, looks its boundary up --lookups times from a
// second client (a second host), fetches it whole there and flushes the
// cluster; then redis-benchmark --cluster SETs and GETs values of the chunk
// size (at least --bench-gib GiB of them, and 64 per connection), with as
// many connections as the tier's client uses (-c), once with -P 1 and once
// with the tier's pipeline depth (the better of the two is the baseline),
// and the cluster is flushed again; then redis-benchmark SETs one entry's
// bytes to new random keys (-r), so that the server allocates as it must for
// the tier's chunks, the same two ways; then it writes one entry's bytes of
// values of the chunk size to the keys redis-benchmark -r draws from
// (key:000000000000 on), and redis-benchmark SETs and GETs over that
// keyspace (-r: every GET a hit on one of the distinct values, checked by
// the primaries' keyspace_misses), the same two ways. The fetch is
// measured twice: through the tier as configured (its receive pool keeps
// the buffers of the last fetch, given back when the fetched entry is
// dropped, as the daemon does after its local publish), and through a
// third client whose tier keeps none (every fetch in fresh memory). Rows
// are medians over the repetitions; the lookup percentiles pool every
// lookup of the row. --csv also writes every row to a file (tools/bench/plot.py).
//
// --data planes makes the chunks plane-like (f32 activations: normal values
// with a scale per row, which shuffle-zstd compresses about 1.1-1.2x), and
// --zstd also puts and fetches each entry with every chunk encoded by the
// codecs' shuffle-zstd/v1 at level 1 (on as many threads as the machine has),
// timing the encode in the put and the decode in the fetch: whether
// compressing on the wire pays (docs/cluster.md). --reuse-memory keeps freed
// memory in the process (mallopt), so that fetched entries land in pages
// already faulted in, as redis-benchmark's replies do in its reused buffer.
#include <CLI/CLI.hpp>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/errno_text.h"
#include "primecache/internal/codec.h"
#include "remote/redis_conn.h"
#include "remote/tier.h"

using namespace primecache;
using namespace primecache::remote;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Args {
  std::string remote;
  std::uint64_t mib = 256;
  std::vector<double> chunk_mib{0.25, 1, 4};
  int reps = 3;
  int lookups = 200;
  std::uint32_t tokens = 32768;
  int io_threads = 0;
  std::size_t threads = 12;
  std::size_t depth = 2;
  std::size_t verify_threads = 2;
  std::string data = "random";
  bool zstd = false;
  bool reuse_memory = false;
  std::string redis_benchmark = "redis-benchmark";
  double bench_gib = 2;
  double pool_mib = static_cast<double>(RemoteTierOptions{}.receive_pool_bytes >> 20);
  std::string csv;
};

std::string Script() { return std::string(PRIMECACHE_SOURCE_DIR) + "/tools/redis-cluster"; }

// The directory of the cluster this bench started (stopped by Die too).
std::string& OwnCluster() {
  static std::string dir;
  return dir;
}

void StopOwnCluster() {
  if (OwnCluster().empty()) return;
  (void)std::system((Script() + " stop " + OwnCluster()).c_str());
  OwnCluster().clear();
}

[[noreturn]] void Die(const Status& s, const char* what) {
  std::fprintf(stderr, "cluster-bench: %s: %s\n", what, s.ToString().c_str());
  StopOwnCluster();
  std::exit(1);
}

// The whole output of a shell command; dies when it fails.
std::string Output(const std::string& cmd, const char* what) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) Die(Status::IOError(ErrnoText("popen")), what);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (pclose(p) != 0) Die(Status::Unavailable("`" + cmd + "` failed"), what);
  return out;
}

// Starts a loopback cluster in `dir`; its seed list.
std::string StartCluster(const std::string& dir, int io_threads) {
  std::string cmd = Script() + " start " + dir;
  if (io_threads > 0) cmd = "PRIMECACHE_REDIS_CONF='io-threads " + std::to_string(io_threads) + "' " + cmd;
  std::string url = Output(cmd, "cluster");
  OwnCluster() = dir;
  while (!url.empty() && url.back() == '\n') url.pop_back();
  return url;
}

// Incompressible bytes, or f32 "activations": normal values, a scale per
// 1024-value row.
void Fill(std::string& c, std::mt19937_64& rng, bool planes) {
  if (!planes) {
    for (std::size_t i = 0; i + 8 <= c.size(); i += 8) {
      const std::uint64_t v = rng();
      std::memcpy(&c[i], &v, 8);
    }
    return;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.05f, 4.0f);
  float s = 1;
  for (std::size_t i = 0; i + 4 <= c.size(); i += 4) {
    if (i % 4096 == 0) s = scale(rng);
    const float v = normal(rng) * s;
    std::memcpy(&c[i], &v, 4);
  }
}

std::vector<LayerBytes> MakeLayers(std::uint64_t bytes, std::uint64_t chunk, std::uint64_t seed, bool planes) {
  std::mt19937_64 rng(seed);
  std::vector<LayerBytes> layers(4);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    layers[l].header = "layer " + std::to_string(l);
    for (std::uint64_t left = bytes / layers.size(); left > 0;) {
      std::string c(std::min(left, chunk) & ~std::uint64_t{3}, '\0');
      Fill(c, rng, planes);
      left -= std::min(left, chunk);
      layers[l].chunks.push_back(std::move(c));
    }
  }
  return layers;
}

void Flush(ClusterClient& c) {
  for (const Endpoint& at : c.Primaries()) {
    auto conn = RedisConn::Open(at, std::chrono::milliseconds(500), std::chrono::seconds(30));
    if (!conn.ok()) Die(conn.status(), "flush");
    if (auto r = (*conn)->Call({"FLUSHALL"}); !r.ok()) Die(r.status(), "flush");
  }
}

// Runs job(i) for i < n on every core.
template <typename F>
void OnEveryCore(std::size_t n, F job) {
  const std::size_t t = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < t; ++k) {
    threads.emplace_back([&, k] {
      for (std::size_t i = k; i < n; i += t) job(i);
    });
  }
  for (auto& th : threads) th.join();
}

// Every chunk through shuffle-zstd/v1 level 1 (f32), or back.
std::vector<LayerBytes> Encode(const std::vector<LayerBytes>& raw, const Transform& t) {
  std::vector<LayerBytes> out = raw;
  std::vector<std::pair<const std::string*, std::string*>> jobs;
  for (std::size_t l = 0; l < raw.size(); ++l)
    for (std::size_t c = 0; c < raw[l].chunks.size(); ++c) jobs.emplace_back(&raw[l].chunks[c], &out[l].chunks[c]);
  OnEveryCore(jobs.size(), [&](std::size_t i) {
    const ElementSpan values(AsBytes(*jobs[i].first), ElementType::kF32);
    if (Status s = t.Encode(values, 1, jobs[i].second); !s.ok()) Die(s, "encode");
  });
  return out;
}

void Decode(const RemoteEntry& got, const std::vector<LayerBytes>& raw, const Transform& t) {
  std::vector<std::pair<const std::string*, std::string>> jobs;
  for (std::size_t l = 0; l < raw.size(); ++l)
    for (std::size_t c = 0; c < raw[l].chunks.size(); ++c)
      jobs.emplace_back(&got.layers[l].chunks[c], std::string(raw[l].chunks[c].size(), '\0'));
  OnEveryCore(jobs.size(), [&](std::size_t i) {
    const MutableElementSpan out(std::as_writable_bytes(std::span(jobs[i].second)), ElementType::kF32);
    if (Status s = t.Decode(AsBytes(*jobs[i].first), out); !s.ok()) Die(s, "decode");
  });
}

struct Figures {
  double put = 0, fetch = 0, set = 0, get = 0, set_new = 0;  // GB/s
  double fetch_fresh = 0;           // through a tier without a receive pool
  double set_keys = 0, get_keys = 0;  // redis-benchmark over a keyspace of distinct values
  double zput = 0, zfetch = 0, zratio = 0;        // --zstd: GB/s of the raw bytes, and raw / wire bytes
  std::vector<double> lookup_ms;
};

struct Timed {
  double put_s = 0, fetch_s = 0, fetch_fresh_s = 0;
  RemoteEntry got;
};

// Fetches `hit` whole through `t`: the entry and its seconds.
std::pair<RemoteEntry, double> TimedFetch(RemoteTier& t, const PublishRequest& e, const RemoteHit& hit) {
  const auto t0 = Clock::now();
  auto got = t.Fetch(e.model, e.ns, e.tokens, hit);
  if (!got.ok() || !*got) Die(got.ok() ? Status::NotFound("fetch missed") : got.status(), "fetch");
  return {std::move(**got), Seconds(t0)};
}

// Puts `layers` through `a`, looks the boundary up through `b` (each
// lookup's time into lookup_ms when given), fetches it whole through `b`
// (and, when given, through `fresh`, its entry dropped at once).
Timed PutAndFetch(RemoteTier& a, RemoteTier& b, const PublishRequest& e, const std::vector<LayerBytes>& layers,
                  int lookups, std::vector<double>* lookup_ms, RemoteTier* fresh = nullptr) {
  Timed t;
  auto t0 = Clock::now();
  if (Status s = a.Put(e, layers); !s.ok()) Die(s, "put");
  t.put_s = Seconds(t0);
  std::optional<RemoteHit> hit;
  for (int i = 0; i < lookups; ++i) {
    t0 = Clock::now();
    auto h = b.Lookup(e.model, e.ns, e.tokens);
    if (!h.ok() || !*h) Die(h.ok() ? Status::NotFound("no hit") : h.status(), "lookup");
    if (lookup_ms) lookup_ms->push_back(Seconds(t0) * 1e3);
    hit = *h;
  }
  if (fresh != nullptr) t.fetch_fresh_s = TimedFetch(*fresh, e, *hit).second;
  std::tie(t.got, t.fetch_s) = TimedFetch(b, e, *hit);
  return t;
}

// redis-benchmark --cluster SET then GET of `size`-byte values with -P
// `pipeline`: GB/s of each. One key per primary, overwritten (its default):
// at least --bench-gib GiB and 64 requests a connection each, so that its
// start does not weigh on its rate. With `new_keys`, only SETs, each of a
// random key (-r 10^9), as many bytes as one entry: the server allocates for
// every one, as it does for the tier's chunks (GET is then 0).
// With `keyspace` keys (written before), SETs and GETs each of a random one
// of them (-r), as many bytes as the overwritten key's.
std::pair<double, double> RedisBenchmark(const Args& args, const Endpoint& at, std::uint64_t size,
                                         std::size_t pipeline, bool new_keys, std::uint64_t keyspace = 0) {
  const auto bytes = static_cast<std::uint64_t>(args.bench_gib * static_cast<double>(1ull << 30));
  const std::uint64_t n = std::max<std::uint64_t>(
      new_keys ? (args.mib << 20) / size : std::max(args.mib << 20, bytes) / size, 64 * args.threads);
  const std::string tests = new_keys       ? " -t set -r 1000000000"
                            : keyspace > 0 ? " -t set,get -r " + std::to_string(keyspace)
                                           : " -t set,get";
  const std::string cmd = args.redis_benchmark + " --cluster -h " + at.host + " -p " + std::to_string(at.port) +
                          tests + " -d " + std::to_string(size) +
                          " -n " + std::to_string(n) + " -c " + std::to_string(args.threads) + " -P " +
                          std::to_string(pipeline) + " --csv 2>/dev/null";
  const std::string out = Output(cmd, "redis-benchmark");
  auto gbs = [&](const std::string& test) {
    const std::size_t at_line = out.find("\"" + test + "\",\"");
    if (at_line == std::string::npos) return 0.0;
    return std::atof(out.c_str() + at_line + test.size() + 4) * static_cast<double>(size) / 1e9;
  };
  if (gbs("SET") <= 0 || (!new_keys && gbs("GET") <= 0)) {
    Die(Status::Corruption("no SET/GET rate in:\n" + out), "redis-benchmark");
  }
  return {gbs("SET"), gbs("GET")};
}

// The primaries' keyspace_misses summed (INFO stats).
std::uint64_t KeyspaceMisses(ClusterClient& c) {
  std::uint64_t misses = 0;
  for (const Endpoint& at : c.Primaries()) {
    auto conn = RedisConn::Open(at, std::chrono::milliseconds(500), std::chrono::seconds(30));
    if (!conn.ok()) Die(conn.status(), "info");
    auto r = (*conn)->Call({"INFO", "stats"});
    if (!r.ok()) Die(r.status(), "info");
    if ((*r)->type != REDIS_REPLY_STRING) Die(Status::IOError("INFO answered no text"), "info");
    const std::string text((*r)->str, (*r)->len);
    const std::size_t at_field = text.find("keyspace_misses:");
    if (at_field == std::string::npos) Die(Status::Corruption("no keyspace_misses in INFO"), "info");
    misses += std::strtoull(text.c_str() + at_field + 16, nullptr, 10);
  }
  return misses;
}

// The hash tags redis-benchmark --cluster puts in its keys, one per primary
// (key:{tag}:__rand_int__), found by a short run of its SETs with -r 1.
std::vector<std::string> BenchmarkTags(const Args& args, ClusterClient& c) {
  const Endpoint at = c.Primaries().at(0);
  (void)Output(args.redis_benchmark + " --cluster -h " + at.host + " -p " + std::to_string(at.port) +
                   " -t set -r 1 -d 1 -n " + std::to_string(64 * args.threads) + " -c " + std::to_string(args.threads) +
                   " --csv 2>/dev/null",
               "redis-benchmark tags");
  auto keys = c.Keys("key:{*}:*", 1000);
  if (!keys.ok()) Die(keys.status(), "redis-benchmark tags");
  std::vector<std::string> tags;
  // "key:{" tag "}:000000000000" (a tag may hold a '}' itself, e.g. "8M}").
  constexpr std::size_t kTail = 14;
  for (const std::string& k : *keys) {
    if (k.rfind("key:{", 0) == 0 && k.size() > 5 + kTail && k.compare(k.size() - kTail, 2, "}:") == 0) {
      tags.push_back(k.substr(5, k.size() - 5 - kTail));
    }
  }
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  if (tags.size() != c.Primaries().size()) Die(Status::Corruption("no tag per primary"), "redis-benchmark tags");
  return tags;
}

// Writes at least one entry's bytes of `size`-byte values, each under its own
// key, to the keys redis-benchmark -r K draws from on every primary
// (key:{tag}:000000000000 to K - 1); K.
std::uint64_t WriteKeyspace(const Args& args, ClusterClient& c, std::uint64_t size) {
  const std::vector<std::string> tags = BenchmarkTags(args, c);
  const std::uint64_t total = std::max<std::uint64_t>(1, ((args.mib << 20) + size - 1) / size);
  const std::uint64_t per_tag = (total + tags.size() - 1) / tags.size();
  std::string value(size, '\0');
  std::mt19937_64 rng(size);
  Fill(value, rng, false);
  std::vector<std::string> keys;
  char key[64];
  for (const std::string& tag : tags) {
    for (std::uint64_t i = 0; i < per_tag; ++i) {
      std::snprintf(key, sizeof key, "key:{%s}:%012llu", tag.c_str(), static_cast<unsigned long long>(i));
      keys.emplace_back(key);
    }
  }
  const std::vector<std::span<const std::byte>> values(keys.size(), AsBytes(value));
  if (Status s = c.SetFrom(keys, values); !s.ok()) Die(s, "keyspace");
  return per_tag;
}

// redis-benchmark SET and GET over one entry's bytes of distinct keys, the
// better of -P 1 and -P depth each; every GET must have hit.
void KeyspaceBaselines(const Args& args, ClusterClient& c, std::uint64_t size, Figures& f) {
  const std::uint64_t keys = WriteKeyspace(args, c, size);
  const Endpoint at = c.Primaries().at(0);
  for (const std::size_t pipeline : {std::size_t{1}, args.depth}) {
    const std::uint64_t misses = KeyspaceMisses(c);
    const auto [set, get] = RedisBenchmark(args, at, size, pipeline, false, keys);
    if (const std::uint64_t now = KeyspaceMisses(c); now != misses) {
      Die(Status::Corruption(std::to_string(now - misses) + " keyspace GETs missed of " + std::to_string(keys) +
                             " keys a tag"),
          "redis-benchmark -r");
    }
    f.set_keys = std::max(f.set_keys, set);
    f.get_keys = std::max(f.get_keys, get);
    if (args.depth == 1) break;
  }
  Flush(c);
}

PublishRequest EntryOf(const Args& args, std::uint64_t id) {
  PublishRequest e;
  e.model = Hash128{7, id};
  e.ns = "bench";
  e.tokens.resize(args.tokens);
  for (std::uint32_t i = 0; i < args.tokens; ++i) e.tokens[i] = (i * 2654435761u) % 100000;
  return e;
}

Figures OneRep(RemoteTier& a, RemoteTier& b, RemoteTier& fresh, const Args& args, std::uint64_t chunk, int rep) {
  const auto layers = MakeLayers(args.mib << 20, chunk, 1000 + rep, args.data == "planes");
  const double gb = static_cast<double>(args.mib << 20) / 1e9;
  Figures f;
  {
    const Timed raw = PutAndFetch(a, b, EntryOf(args, 2 * rep), layers, args.lookups, &f.lookup_ms, &fresh);
    f.put = gb / raw.put_s;
    f.fetch = gb / raw.fetch_s;
    f.fetch_fresh = gb / raw.fetch_fresh_s;
  }  // the fetched entry dropped: its buffers back to b's receive pool
  Flush(a.client());
  if (args.zstd) {
    const Transform& t = *CodecRegistry::Default().FindTransform(kShuffleZstdTransform).value();
    auto t0 = Clock::now();
    const auto encoded = Encode(layers, t);
    const double encode_s = Seconds(t0);
    double wire = 0;
    for (const auto& l : encoded)
      for (const auto& c : l.chunks) wire += static_cast<double>(c.size());
    const Timed z = PutAndFetch(a, b, EntryOf(args, 2 * rep + 1), encoded, 1, nullptr);
    t0 = Clock::now();
    Decode(z.got, layers, t);
    f.zput = gb / (encode_s + z.put_s);
    f.zfetch = gb / (z.fetch_s + Seconds(t0));
    f.zratio = gb * 1e9 / wire;
    Flush(a.client());
  }
  // The better of -P 1 and -P depth, for SETs and GETs each.
  for (const std::size_t pipeline : {std::size_t{1}, args.depth}) {
    const Endpoint at = a.client().Primaries().at(0);
    const auto [set, get] = RedisBenchmark(args, at, chunk, pipeline, false);
    f.set = std::max(f.set, set);
    f.get = std::max(f.get, get);
    Flush(a.client());
    f.set_new = std::max(f.set_new, RedisBenchmark(args, at, chunk, pipeline, true).first);
    Flush(a.client());
    if (args.depth == 1) break;
  }
  KeyspaceBaselines(args, a.client(), chunk, f);
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1)];
}

void PrintHeader(const Args& args) {
  std::printf("remote tier on %s (io-threads %d), %u cores; %llu MiB entries of %s chunks, %u-token boundary, "
              "%d reps (medians; each ratio the median of the repetitions' ratios)\n",
              args.remote.c_str(), args.io_threads, std::thread::hardware_concurrency(),
              static_cast<unsigned long long>(args.mib), args.data.c_str(), args.tokens, args.reps);
  std::printf("tier client: %zu connections a batch (spread over the primaries), pipeline depth %zu, "
              "%zu verify threads, receive pool %g MiB, %s malloc; redis-benchmark --cluster -c %zu, the better of "
              "-P 1 and -P %zu, -n (at least %g GiB; over a keyspace: -r, %llu MiB of distinct values)\n",
              args.threads, args.depth, args.verify_threads, args.pool_mib, args.reuse_memory ? "reused" : "default",
              args.threads, args.depth, args.bench_gib, static_cast<unsigned long long>(args.mib));
  std::printf("| chunk | put GB/s | SET 1 key | put / SET 1 key | SET keyspace | put / SET keyspace | SET new keys "
              "| put / SET new keys | fetch GB/s | fetch, no pool | GET 1 key | fetch / GET 1 key | GET keyspace "
              "| fetch / GET keyspace | lookup p50 ms | lookup p99 ms |%s\n",
              args.zstd ? " zstd ratio | put GB/s zstd | fetch GB/s zstd |" : "");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |%s\n",
              args.zstd ? " --- | --- | --- |" : "");
}

// The row's medians and ratios (each the median of the repetitions' own).
struct Row {
  double chunk_mib = 0;
  double put = 0, set = 0, set_keys = 0, set_new = 0, fetch = 0, fetch_fresh = 0, get = 0, get_keys = 0;
  double put_set = 0, put_set_keys = 0, put_set_new = 0, fetch_get = 0, fetch_get_keys = 0;
  double p50 = 0, p99 = 0;
};

Row RowOf(double cm, const std::vector<Figures>& runs) {
  auto med = [&](auto of) {
    std::vector<double> v;
    for (const auto& f : runs) v.push_back(of(f));
    return Median(v);
  };
  std::vector<double> ms;
  for (const auto& f : runs) ms.insert(ms.end(), f.lookup_ms.begin(), f.lookup_ms.end());
  Row r;
  r.chunk_mib = cm;
  r.put = med([](const Figures& f) { return f.put; });
  r.set = med([](const Figures& f) { return f.set; });
  r.set_keys = med([](const Figures& f) { return f.set_keys; });
  r.set_new = med([](const Figures& f) { return f.set_new; });
  r.fetch = med([](const Figures& f) { return f.fetch; });
  r.fetch_fresh = med([](const Figures& f) { return f.fetch_fresh; });
  r.get = med([](const Figures& f) { return f.get; });
  r.get_keys = med([](const Figures& f) { return f.get_keys; });
  r.put_set = med([](const Figures& f) { return f.put / f.set; });
  r.put_set_keys = med([](const Figures& f) { return f.put / f.set_keys; });
  r.put_set_new = med([](const Figures& f) { return f.put / f.set_new; });
  r.fetch_get = med([](const Figures& f) { return f.fetch / f.get; });
  r.fetch_get_keys = med([](const Figures& f) { return f.fetch / f.get_keys; });
  r.p50 = Percentile(ms, 0.5);
  r.p99 = Percentile(ms, 0.99);
  return r;
}

void PrintRow(const Row& r, const std::vector<Figures>& runs, bool zstd) {
  std::printf("| %g MiB | %.2f | %.2f | %.2fx | %.2f | %.2fx | %.2f | %.2fx | %.2f | %.2f | %.2f | %.2fx | %.2f | %.2fx "
              "| %.2f | %.2f |",
              r.chunk_mib, r.put, r.set, r.put_set, r.set_keys, r.put_set_keys, r.set_new, r.put_set_new, r.fetch,
              r.fetch_fresh, r.get, r.fetch_get, r.get_keys, r.fetch_get_keys, r.p50, r.p99);
  if (zstd) {
    auto med = [&](double Figures::*field) {
      std::vector<double> v;
      for (const auto& f : runs) v.push_back(f.*field);
      return Median(v);
    };
    std::printf(" %.3fx | %.2f | %.2f |", med(&Figures::zratio), med(&Figures::zput), med(&Figures::zfetch));
  }
  std::printf("\n");
  std::fflush(stdout);
}

// --csv: one line per row (tools/bench/plot.py knows it by this header).
void WriteCsv(const std::string& path, const std::vector<Row>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) Die(Status::IOError(ErrnoText("open " + path)), "--csv");
  std::fprintf(f, "chunk_mib,put_gbps,set_1key_gbps,set_keyspace_gbps,set_new_keys_gbps,fetch_gbps,"
                  "fetch_no_pool_gbps,get_1key_gbps,get_keyspace_gbps,put_over_set_1key,put_over_set_keyspace,"
                  "put_over_set_new_keys,fetch_over_get_1key,fetch_over_get_keyspace,lookup_p50_ms,lookup_p99_ms\n");
  for (const Row& r : rows) {
    std::fprintf(f, "%g,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", r.chunk_mib,
                 r.put, r.set, r.set_keys, r.set_new, r.fetch, r.fetch_fresh, r.get, r.get_keys, r.put_set,
                 r.put_set_keys, r.put_set_new, r.fetch_get, r.fetch_get_keys, r.p50, r.p99);
  }
  if (std::fclose(f) != 0) Die(Status::IOError(ErrnoText("write " + path)), "--csv");
}

void AddOptions(CLI::App& app, Args& args) {
  app.add_option("--remote", args.remote, "redis://host:port[,...] (default: start a loopback cluster)");
  app.add_option("--mib", args.mib, "MiB per entry")->check(CLI::Range(1, 4096));
  app.add_option("--chunk-mib", args.chunk_mib, "chunk sizes to measure, in MiB (comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(0.004, 64.0));
  app.add_option("--reps", args.reps, "repetitions per chunk size (the median is reported)")->check(CLI::Range(1, 50));
  app.add_option("--lookups", args.lookups, "lookups per repetition")->check(CLI::Range(1, 100000));
  app.add_option("--tokens", args.tokens, "boundary length in tokens")->check(CLI::Range(1, 1 << 22));
  app.add_option("--io-threads", args.io_threads, "redis-server io-threads of the loopback cluster")
      ->check(CLI::Range(0, 64));
  app.add_option("--threads", args.threads,
                 "connections a batch uses at once (ClusterOptions::threads; redis-benchmark -c)")
      ->check(CLI::Range(1, 256));
  app.add_option("--depth", args.depth, "commands in flight per connection (ClusterOptions::pipeline_depth; "
                                        "redis-benchmark -P)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--verify-threads", args.verify_threads, "threads checking fetched chunks (RemoteTierOptions)")
      ->check(CLI::Range(1, 256));
  app.add_option("--data", args.data, "chunk contents: random (incompressible) or planes (f32 activations)")
      ->check(CLI::IsMember({"random", "planes"}));
  app.add_flag("--zstd", args.zstd, "also put and fetch every entry with shuffle-zstd/v1 level 1 chunks");
  app.add_flag("--reuse-memory", args.reuse_memory,
               "keep freed memory in the process (mallopt: no mmap'd chunks, no trimming), so that a fetch "
               "lands in pages already faulted in instead of fresh ones the kernel must zero");
  app.add_option("--receive-pool-mib", args.pool_mib,
                 "chunk buffers the fetching tier keeps for its next fetch (RemoteTierOptions::receive_pool_bytes)")
      ->check(CLI::Range(0.0, 65536.0));
  app.add_option("--csv", args.csv, "also write the rows to this CSV file (tools/bench/plot.py)");
  app.add_option("--redis-benchmark", args.redis_benchmark, "the redis-benchmark to run");
  app.add_option("--bench-gib", args.bench_gib, "GiB each redis-benchmark test moves at least")
      ->check(CLI::Range(0.01, 64.0));
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"primecache-cluster-bench: the remote tier on Redis Cluster against redis-benchmark"};
  AddOptions(app, args);
  CLI11_PARSE(app, argc, argv);
  if (args.reuse_memory) {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);  // glibc's largest
    mallopt(M_TRIM_THRESHOLD, INT32_MAX);
  }
  std::string dir = (std::filesystem::temp_directory_path() / "pcclbench-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) Die(Status::IOError(ErrnoText("mkdtemp")), "temporary directory");
  const bool own = args.remote.empty();
  if (own) args.remote = StartCluster(dir + "/cluster", args.io_threads);
  auto seeds = ParseRedisUrl(args.remote);
  if (!seeds.ok()) Die(seeds.status(), "--remote");
  ClusterOptions o;
  o.seeds = *seeds;
  o.io_timeout = std::chrono::seconds(10);
  o.threads = args.threads;
  o.pipeline_depth = args.depth;
  auto ca = ClusterClient::Connect(o), cb = ClusterClient::Connect(o);
  if (!ca.ok() || !cb.ok()) Die(ca.ok() ? cb.status() : ca.status(), "connect");
  auto cc = ClusterClient::Connect(o);
  if (!cc.ok()) Die(cc.status(), "connect");
  RemoteTierOptions to;
  to.verify_threads = args.verify_threads;
  to.receive_pool_bytes = static_cast<std::size_t>(args.pool_mib * (1 << 20));
  RemoteTier a(std::shared_ptr<ClusterClient>(std::move(ca).value()), to);
  RemoteTier b(std::shared_ptr<ClusterClient>(std::move(cb).value()), to);
  to.receive_pool_bytes = 0;
  RemoteTier fresh(std::shared_ptr<ClusterClient>(std::move(cc).value()), to);
  PrintHeader(args);
  std::vector<Row> rows;
  for (double cm : args.chunk_mib) {
    std::vector<Figures> runs;
    for (int r = 0; r < args.reps; ++r) {
      runs.push_back(OneRep(a, b, fresh, args, static_cast<std::uint64_t>(cm * (1 << 20)), r));
    }
    rows.push_back(RowOf(cm, runs));
    PrintRow(rows.back(), runs, args.zstd);
  }
  if (!args.csv.empty()) WriteCsv(args.csv, rows);
  StopOwnCluster();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

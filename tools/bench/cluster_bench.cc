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
// the tier's chunks, the same two ways. Rows are medians over the
// repetitions; the lookup percentiles pool every lookup of the row.
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
};

[[noreturn]] void Die(const Status& s, const char* what) {
  std::fprintf(stderr, "cluster-bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

std::string Script() { return std::string(PRIMECACHE_SOURCE_DIR) + "/tools/redis-cluster"; }

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
  double zput = 0, zfetch = 0, zratio = 0;        // --zstd: GB/s of the raw bytes, and raw / wire bytes
  std::vector<double> lookup_ms;
};

struct Timed {
  double put_s = 0, fetch_s = 0;
  RemoteEntry got;
};

// Puts `layers` through `a`, looks the boundary up through `b` (each
// lookup's time into lookup_ms when given), fetches it whole through `b`.
Timed PutAndFetch(RemoteTier& a, RemoteTier& b, const PublishRequest& e, const std::vector<LayerBytes>& layers,
                  int lookups, std::vector<double>* lookup_ms) {
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
  t0 = Clock::now();
  auto got = b.Fetch(e.model, e.ns, e.tokens, *hit);
  if (!got.ok() || !*got) Die(got.ok() ? Status::NotFound("fetch missed") : got.status(), "fetch");
  t.fetch_s = Seconds(t0);
  t.got = std::move(**got);
  return t;
}

// redis-benchmark --cluster SET then GET of `size`-byte values with -P
// `pipeline`: GB/s of each. One key per primary, overwritten (its default):
// at least --bench-gib GiB and 64 requests a connection each, so that its
// start does not weigh on its rate. With `new_keys`, only SETs, each of a
// random key (-r 10^9), as many bytes as one entry: the server allocates for
// every one, as it does for the tier's chunks (GET is then 0).
std::pair<double, double> RedisBenchmark(const Args& args, const Endpoint& at, std::uint64_t size,
                                         std::size_t pipeline, bool new_keys) {
  const auto bytes = static_cast<std::uint64_t>(args.bench_gib * static_cast<double>(1ull << 30));
  const std::uint64_t n = std::max<std::uint64_t>(
      new_keys ? (args.mib << 20) / size : std::max(args.mib << 20, bytes) / size, 64 * args.threads);
  const std::string cmd = args.redis_benchmark + " --cluster -h " + at.host + " -p " + std::to_string(at.port) +
                          (new_keys ? " -t set -r 1000000000" : " -t set,get") + " -d " + std::to_string(size) +
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

PublishRequest EntryOf(const Args& args, std::uint64_t id) {
  PublishRequest e;
  e.model = Hash128{7, id};
  e.ns = "bench";
  e.tokens.resize(args.tokens);
  for (std::uint32_t i = 0; i < args.tokens; ++i) e.tokens[i] = (i * 2654435761u) % 100000;
  return e;
}

Figures OneRep(RemoteTier& a, RemoteTier& b, const Args& args, std::uint64_t chunk, int rep) {
  const auto layers = MakeLayers(args.mib << 20, chunk, 1000 + rep, args.data == "planes");
  const double gb = static_cast<double>(args.mib << 20) / 1e9;
  Figures f;
  const Timed raw = PutAndFetch(a, b, EntryOf(args, 2 * rep), layers, args.lookups, &f.lookup_ms);
  f.put = gb / raw.put_s;
  f.fetch = gb / raw.fetch_s;
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
              "%d reps (medians)\n",
              args.remote.c_str(), args.io_threads, std::thread::hardware_concurrency(),
              static_cast<unsigned long long>(args.mib), args.data.c_str(), args.tokens, args.reps);
  std::printf("tier client: %zu connections a batch (spread over the primaries), pipeline depth %zu, "
              "%zu verify threads, %s memory; redis-benchmark --cluster -c %zu, the better of -P 1 and -P %zu, "
              "-n (at least %g GiB)\n",
              args.threads, args.depth, args.verify_threads, args.reuse_memory ? "reused" : "fresh", args.threads,
              args.depth, args.bench_gib);
  std::printf("| chunk | put GB/s | redis SET GB/s | put / SET | redis SET new keys GB/s | put / SET new keys "
              "| fetch GB/s | redis GET GB/s | fetch / GET | lookup p50 ms | lookup p99 ms |%s\n",
              args.zstd ? " zstd ratio | put GB/s zstd | fetch GB/s zstd |" : "");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |%s\n",
              args.zstd ? " --- | --- | --- |" : "");
}

void PrintRow(double cm, const std::vector<Figures>& runs, bool zstd) {
  auto med = [&](double Figures::*field) {
    std::vector<double> v;
    for (const auto& f : runs) v.push_back(f.*field);
    return Median(v);
  };
  std::vector<double> ms;
  for (const auto& f : runs) ms.insert(ms.end(), f.lookup_ms.begin(), f.lookup_ms.end());
  const double put = med(&Figures::put), set = med(&Figures::set), fetch = med(&Figures::fetch);
  const double get = med(&Figures::get), set_new = med(&Figures::set_new);
  std::printf("| %g MiB | %.2f | %.2f | %.2fx | %.2f | %.2fx | %.2f | %.2f | %.2fx | %.2f | %.2f |", cm, put, set,
              put / set, set_new, put / set_new, fetch, get, fetch / get, Percentile(ms, 0.5), Percentile(ms, 0.99));
  if (zstd) std::printf(" %.3fx | %.2f | %.2f |", med(&Figures::zratio), med(&Figures::zput), med(&Figures::zfetch));
  std::printf("\n");
  std::fflush(stdout);
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
  RemoteTierOptions to;
  to.verify_threads = args.verify_threads;
  RemoteTier a(std::shared_ptr<ClusterClient>(std::move(ca).value()), to);
  RemoteTier b(std::shared_ptr<ClusterClient>(std::move(cb).value()), to);
  PrintHeader(args);
  for (double cm : args.chunk_mib) {
    std::vector<Figures> runs;
    for (int r = 0; r < args.reps; ++r) {
      runs.push_back(OneRep(a, b, args, static_cast<std::uint64_t>(cm * (1 << 20)), r));
    }
    PrintRow(cm, runs, args.zstd);
  }
  if (own) (void)std::system((Script() + " stop " + dir + "/cluster").c_str());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

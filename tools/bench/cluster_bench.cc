// primecache-cluster-bench: the remote tier's put and fetch rates and lookup
// latency on a Redis Cluster, by chunk size, next to memcpy and a read of the
// same bytes from a local file (page cache) in the same run.
//
// Without --remote it starts a loopback cluster of 3 primaries and 3
// replicas with tools/redis-cluster (--io-threads sets redis-server's
// io-threads on every node) and stops it at the end. Each repetition puts
// one entry of --mib MiB (4 layers of incompressible chunks, a boundary of
// --tokens tokens), looks its boundary up --lookups times from a second
// client (a second host), fetches it whole there, and flushes the cluster.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/errno_text.h"
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
  std::vector<double> chunk_mib{0.25, 1, 4, 8, 16};
  int reps = 3;
  int lookups = 50;
  std::uint32_t tokens = 32768;
  int io_threads = 0;
  std::size_t threads = 8;
};

[[noreturn]] void Die(const Status& s, const char* what) {
  std::fprintf(stderr, "cluster-bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

std::string Script() { return std::string(PRIMECACHE_SOURCE_DIR) + "/tools/redis-cluster"; }

// Starts a loopback cluster in `dir`; its seed list.
std::string StartCluster(const std::string& dir, int io_threads) {
  std::string cmd = Script() + " start " + dir;
  if (io_threads > 0) cmd = "PRIMECACHE_REDIS_CONF='io-threads " + std::to_string(io_threads) + "' " + cmd;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096] = {};
  const std::size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
  if (p == nullptr || pclose(p) != 0 || n == 0) Die(Status::Unavailable("tools/redis-cluster start failed"), "cluster");
  std::string url(buf, n);
  while (!url.empty() && url.back() == '\n') url.pop_back();
  return url;
}

std::vector<LayerBytes> MakeLayers(std::uint64_t bytes, std::uint64_t chunk, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<LayerBytes> layers(4);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    layers[l].header = "layer " + std::to_string(l);
    for (std::uint64_t left = bytes / layers.size(); left > 0;) {
      std::string c(std::min(left, chunk), '\0');
      for (std::size_t i = 0; i + 8 <= c.size(); i += 8) {
        const std::uint64_t v = rng();
        std::memcpy(&c[i], &v, 8);
      }
      left -= c.size();
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

// GB/s of memcpy and of reading the bytes back from a file in the page cache.
std::pair<double, double> Baselines(const std::vector<LayerBytes>& layers, const std::string& dir) {
  std::uint64_t total = 0;
  for (const auto& l : layers)
    for (const auto& c : l.chunks) total += c.size();
  std::vector<char> dst(total);
  auto t0 = Clock::now();
  std::size_t at = 0;
  for (const auto& l : layers)
    for (const auto& c : l.chunks) std::memcpy(dst.data() + (at += c.size()) - c.size(), c.data(), c.size());
  const double copy = static_cast<double>(total) / Seconds(t0) / 1e9;
  const std::string path = dir + "/file";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  if (fd < 0) Die(Status::IOError(ErrnoText("open " + path)), "baseline file");
  if (::write(fd, dst.data(), total) != static_cast<ssize_t>(total)) Die(Status::IOError("short write"), "baseline");
  t0 = Clock::now();
  for (std::uint64_t off = 0; off < total;) {
    const ssize_t n = ::pread(fd, dst.data() + off, std::min<std::uint64_t>(total - off, 8 << 20), off);
    if (n <= 0) Die(Status::IOError("short read"), "baseline");
    off += static_cast<std::uint64_t>(n);
  }
  const double file = static_cast<double>(total) / Seconds(t0) / 1e9;
  ::close(fd);
  return {copy, file};
}

struct Figures {
  double put = 0, fetch = 0, lookup_ms = 0, copy = 0, file = 0;
};

Figures OneRep(RemoteTier& a, RemoteTier& b, const Args& args, std::uint64_t chunk, int rep, const std::string& dir) {
  const auto layers = MakeLayers(args.mib << 20, chunk, 1000 + rep);
  PublishRequest e;
  e.model = Hash128{7, static_cast<std::uint64_t>(rep)};
  e.ns = "bench";
  e.tokens.resize(args.tokens);
  for (std::uint32_t i = 0; i < args.tokens; ++i) e.tokens[i] = (i * 2654435761u) % 100000;
  Figures f;
  const double bytes = static_cast<double>(args.mib << 20);
  auto t0 = Clock::now();
  if (Status s = a.Put(e, layers); !s.ok()) Die(s, "put");
  f.put = bytes / Seconds(t0) / 1e9;
  std::vector<double> ms;
  std::optional<RemoteHit> hit;
  for (int i = 0; i < args.lookups; ++i) {
    t0 = Clock::now();
    auto h = b.Lookup(e.model, e.ns, e.tokens);
    if (!h.ok() || !*h) Die(h.ok() ? Status::NotFound("no hit") : h.status(), "lookup");
    ms.push_back(Seconds(t0) * 1e3);
    hit = *h;
  }
  std::sort(ms.begin(), ms.end());
  f.lookup_ms = ms[ms.size() / 2];
  t0 = Clock::now();
  auto got = b.Fetch(e.model, e.ns, e.tokens, *hit);
  if (!got.ok() || !*got) Die(got.ok() ? Status::NotFound("fetch missed") : got.status(), "fetch");
  f.fetch = bytes / Seconds(t0) / 1e9;
  std::tie(f.copy, f.file) = Baselines(layers, dir);
  Flush(a.client());
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"primecache-cluster-bench: the remote tier on Redis Cluster against memcpy and a local file"};
  app.add_option("--remote", args.remote, "redis://host:port[,...] (default: start a loopback cluster)");
  app.add_option("--mib", args.mib, "MiB per entry")->check(CLI::Range(1, 4096));
  app.add_option("--chunk-mib", args.chunk_mib, "chunk sizes to measure, in MiB (comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(0.004, 64.0));
  app.add_option("--reps", args.reps, "repetitions per chunk size (the median is reported)")->check(CLI::Range(1, 50));
  app.add_option("--lookups", args.lookups, "lookups per repetition")->check(CLI::Range(1, 10000));
  app.add_option("--tokens", args.tokens, "boundary length in tokens")->check(CLI::Range(1, 1 << 22));
  app.add_option("--io-threads", args.io_threads, "redis-server io-threads of the loopback cluster")
      ->check(CLI::Range(0, 64));
  app.add_option("--threads", args.threads, "client connections a batch uses at once (ClusterOptions::threads)")
      ->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
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
  auto ca = ClusterClient::Connect(o), cb = ClusterClient::Connect(o);
  if (!ca.ok() || !cb.ok()) Die(ca.ok() ? cb.status() : ca.status(), "connect");
  RemoteTier a(std::shared_ptr<ClusterClient>(std::move(ca).value()));
  RemoteTier b(std::shared_ptr<ClusterClient>(std::move(cb).value()));
  std::printf("remote tier on %s, %llu MiB entries, %u-token boundary, %zu client threads, %d reps (medians)\n",
              args.remote.c_str(), static_cast<unsigned long long>(args.mib), args.tokens, args.threads, args.reps);
  std::printf("| chunk | put GB/s | fetch GB/s | lookup ms | memcpy GB/s | file read GB/s | fetch/memcpy | fetch/file |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (double cm : args.chunk_mib) {
    std::vector<Figures> runs;
    for (int r = 0; r < args.reps; ++r) runs.push_back(OneRep(a, b, args, static_cast<std::uint64_t>(cm * (1 << 20)), r, dir));
    auto med = [&](double Figures::*field) {
      std::vector<double> v;
      for (const auto& f : runs) v.push_back(f.*field);
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double fetch = med(&Figures::fetch), copy = med(&Figures::copy), file = med(&Figures::file);
    std::printf("| %g MiB | %.2f | %.2f | %.2f | %.2f | %.2f | %.3fx | %.3fx |\n", cm, med(&Figures::put), fetch,
                med(&Figures::lookup_ms), copy, file, fetch / copy, fetch / file);
  }
  if (own) (void)std::system((Script() + " stop " + dir + "/cluster").c_str());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

// ipc_bench: fetch throughput over the socket and over shared memory against
// memcpy of the same bytes, and lookup round-trip latency, in one run against
// a real primecached (started here on a temporary data dir).
//
//   ipc_bench [--daemon PATH] [--mib 256] [--reps 3] [--lookups 20000] [--tokens 8192] [--csv-dir DIR]
//
// A fetch's callback copies every chunk into a destination buffer, as an
// engine copies into its staging (or pinned) memory; memcpy is the same copy
// of the same bytes from one buffer to another.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "tools/common/csv.h"
#include "tools/common/daemon_process.h"

using namespace primecache;          // NOLINT
using namespace primecache::client;  // NOLINT
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Real encoded layers (the store validates them): latent planes of `len`
// tokens, width 576 (kv_rank 512 + rope 64), raw transform, ~2.4 MB chunks.
std::vector<LayerData> MakeLayers(std::uint64_t len, int layers) {
  std::vector<LayerData> out;
  std::mt19937 g(1);
  for (int l = 0; l < layers; ++l) {
    LatentShape shape{len, 576, 0, 0, 0, false, 0};
    auto snap = MakeSnapshot(shape);
    auto& lat = std::get<LatentSnapshot>(*snap);
    for (auto& x : lat.latent_rows) x = static_cast<float>(g() % 20000) * 1e-3f - 10.f;
    EncodeOptions eo;
    eo.all_planes = TransformSpec{std::string(kRawTransform), 0};
    eo.target_chunk_bytes = 4u << 20;
    auto enc = EncodeLayer(*snap, eo);
    if (!enc.ok()) {
      std::fprintf(stderr, "encode: %s\n", enc.status().ToString().c_str());
      std::exit(1);
    }
    LayerData d;
    const std::string h = SerializeLayerHeader(enc->header);
    d.header.assign(reinterpret_cast<const std::byte*>(h.data()), reinterpret_cast<const std::byte*>(h.data()) + h.size());
    for (const auto& c : enc->chunks) {
      d.chunks.emplace_back(reinterpret_cast<const std::byte*>(c.data()), reinterpret_cast<const std::byte*>(c.data()) + c.size());
    }
    out.push_back(std::move(d));
  }
  return out;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * (v.size() - 1))];
}

// The command line.
struct Options {
  std::string daemon = PRIMECACHED_PATH;
  int mib = 256, reps = 3, lookups = 20000;
  std::uint64_t tokens = 8192;  // of the published entry (and so of its lookups)
  std::string csv_dir;
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--daemon", o.daemon, "primecached binary");
  app.add_option("--mib", o.mib, "entry size to fetch, MiB");
  app.add_option("--reps", o.reps, "fetch repetitions (best and median reported)");
  app.add_option("--lookups", o.lookups, "lookup round trips timed");
  app.add_option("--tokens", o.tokens, "tokens of the published entry and of the lookups' queries")
      ->check(CLI::Range(std::uint64_t{64}, std::uint64_t{1} << 20));
  app.add_option("--csv-dir", o.csv_dir,
                 "also write DIR/ipc-fetch.csv (every timed fetch and memcpy) and DIR/ipc-lookup.csv (tools/bench/plot.py)");
}

const ModelId kModel{Hash128{7, 7}, "bench", "", {}};

// The published entry, its tokens, and the clients: over the socket alone
// and with shared memory.
struct Bench {
  std::unique_ptr<Client> sock, shm;
  std::vector<std::uint32_t> tokens;
  int layers = 0;
  std::uint64_t total = 0;  // bytes of its chunks
  std::uint64_t entry = 0;
  double publish_s = 0;
};

// Connects both clients and publishes an entry of about `mib` MiB; nullopt
// (said on stderr) on an error.
std::optional<Bench> Publish(const std::string& socket, int mib, std::uint64_t len) {
  Bench b;
  const std::uint64_t layer_bytes = len * 576 * 4;
  b.layers = std::max<int>(1, static_cast<int>((std::uint64_t(mib) << 20) / layer_bytes));
  auto data = MakeLayers(len, b.layers);
  for (auto& l : data) {
    for (auto& c : l.chunks) b.total += c.size();
  }
  b.tokens.resize(len);
  for (std::uint64_t i = 0; i < len; ++i)
    b.tokens[i] = static_cast<std::uint32_t>((i * 2654435761u) % 150000);
  ClientOptions o;
  o.endpoint = socket;
  o.timeout = std::chrono::seconds(60);
  auto sc = Client::Connect(o);
  o.shared_memory = true;
  o.shared_memory_bytes = 128u << 20;
  auto mc = Client::Connect(o);
  if (!sc.ok() || !mc.ok()) {
    std::fprintf(stderr, "connect: %s %s\n", sc.status().ToString().c_str(), mc.status().ToString().c_str());
    return std::nullopt;
  }
  b.sock = std::move(*sc);
  b.shm = std::move(*mc);
  const auto tp0 = Clock::now();
  auto pub = b.sock->Publish(kModel, b.tokens, data);
  b.publish_s = Seconds(Clock::now() - tp0);
  if (!pub.ok()) {
    std::fprintf(stderr, "publish: %s\n", pub.status().ToString().c_str());
    return std::nullopt;
  }
  b.entry = pub->id;
  return b;
}

// GB/s of `reps` whole-entry fetches through `c`, each chunk copied into dst.
std::vector<double> FetchRates(Client& c, const Bench& b, std::vector<std::byte>& dst, int reps) {
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) {
    std::uint64_t at = 0;
    FetchCallbacks cb;
    cb.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> bytes) {
      if (at + bytes.size() > dst.size()) return Status::Internal("more bytes than published");
      std::memcpy(dst.data() + at, bytes.data(), bytes.size());
      at += bytes.size();
      return Status::Ok();
    };
    const auto t0 = Clock::now();
    Status s = c.Fetch(b.entry, {}, cb);
    const double sec = Seconds(Clock::now() - t0);
    if (!s.ok() || at != b.total) {
      std::fprintf(stderr, "fetch: %s (%llu of %llu bytes)\n", s.ToString().c_str(),
                   static_cast<unsigned long long>(at), static_cast<unsigned long long>(b.total));
      std::exit(1);
    }
    r.push_back(b.total / sec / 1e9);
  }
  return r;
}

// GB/s of `reps` memcpys of the same bytes, in the same pieces a fetch delivers (~2.4 MB).
std::vector<double> MemcpyRates(const std::vector<std::byte>& src, std::vector<std::byte>& dst, int reps) {
  const std::uint64_t total = src.size();
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    for (std::uint64_t at = 0; at < total; at += 2359296) {
      std::memcpy(dst.data() + at, src.data() + at, std::min<std::uint64_t>(2359296, total - at));
    }
    r.push_back(total / Seconds(Clock::now() - t0) / 1e9);
  }
  return r;
}

// Microseconds of `n` lookups of `model` with query `q` (after 200 untimed
// ones); exits when one fails, or misses where `must_hit`.
std::vector<double> LookupLatencies(Client& c, const ModelId& model, std::span<const std::uint32_t> q, int n,
                                    bool must_hit) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n + 200; ++i) {
    const auto t0 = Clock::now();
    auto r = c.Lookup(model, q);
    const double u = Seconds(Clock::now() - t0) * 1e6;
    if (!r.ok() || (must_hit && !r->has_value())) {
      if (must_hit) std::fprintf(stderr, "lookup failed\n");
      std::exit(1);
    }
    if (i >= 200) us.push_back(u);
  }
  return us;
}

void PrintRates(const Bench& b, const std::vector<double>& mem, const std::vector<double>& sock,
                const std::vector<double>& shm) {
  auto med = [](std::vector<double> v) { return Percentile(std::move(v), 0.5); };
  auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  std::printf(
      "entry: %d latent layers x %llu tokens, %.1f MiB in %zu-byte-ish chunks; publish %.2f s (%.2f GB/s)\n",
      b.layers, static_cast<unsigned long long>(b.tokens.size()), b.total / 1048576.0, static_cast<std::size_t>(2359296),
      b.publish_s, b.total / b.publish_s / 1e9);
  std::printf("%-28s %10s %10s %8s\n", "copy", "median GB/s", "best GB/s", "x memcpy");
  std::printf("%-28s %10.2f %10.2f %8s\n", "memcpy (same bytes)", med(mem), best(mem), "1.00");
  std::printf("%-28s %10.2f %10.2f %8.2f\n", "fetch over the socket", med(sock), best(sock), med(sock) / med(mem));
  std::printf("%-28s %10.2f %10.2f %8.2f\n", "fetch over shared memory", med(shm), best(shm), med(shm) / med(mem));
}

// Every timed copy (GB/s per repetition and path) and the lookup
// percentiles, as CSV under `dir` (nothing when it is empty).
Status WriteCsv(const std::string& dir, const Bench& b,
                const std::vector<std::pair<const char*, const std::vector<double>*>>& rates,
                const std::vector<std::pair<std::string, const std::vector<double>*>>& lookups) {
  bench::CsvTable fetch({"path", "rep", "bytes", "gbps"});
  for (const auto& [path, v] : rates) {
    for (std::size_t i = 0; i < v->size(); ++i) PC_RETURN_IF_ERROR(fetch.Add({path, i, b.total, (*v)[i]}));
  }
  bench::CsvTable lookup({"query", "round_trips", "p50_us", "p99_us"});
  for (const auto& [query, v] : lookups) {
    PC_RETURN_IF_ERROR(lookup.Add({query, v->size(), Percentile(*v, 0.5), Percentile(*v, 0.99)}));
  }
  PC_RETURN_IF_ERROR(fetch.WriteToDir(dir, "ipc-fetch"));
  return lookup.WriteToDir(dir, "ipc-lookup");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ipc_bench"};
  Options opt;
  AddOptions(app, opt);
  CLI11_PARSE(app, argc, argv);

  launcher::DaemonProcess d(opt.daemon, {"--max-chunk", "8M"});
  if (Status s = d.Start(); !s.ok()) {
    std::fprintf(stderr, "cannot start %s: %s\n", opt.daemon.c_str(), s.ToString().c_str());
    return 1;
  }
  std::optional<Bench> published = Publish(d.socket(), opt.mib, opt.tokens);
  if (!published) return 1;
  Bench& b = *published;
  std::vector<std::byte> src(b.total), dst(b.total);
  std::memset(src.data(), 1, b.total);
  std::memset(dst.data(), 2, b.total);
  // Warm the store's and the page cache once.
  (void)FetchRates(*b.sock, b, dst, opt.reps);
  auto mem = MemcpyRates(src, dst, opt.reps);
  auto sock = FetchRates(*b.sock, b, dst, opt.reps);
  auto shm = FetchRates(*b.shm, b, dst, opt.reps);

  std::vector<std::uint32_t> longq = b.tokens;
  for (int i = 0; i < 64; ++i) longq.push_back(i);
  auto l_long = LookupLatencies(*b.sock, kModel, longq, opt.lookups, true);
  auto l_short = LookupLatencies(*b.sock, kModel, std::span(b.tokens).first(b.tokens.size()), opt.lookups, true);
  // The same round trip with next to no store work (an unknown model, one
  // token): what the transport and the thread hand-offs cost alone.
  const std::uint32_t one = 1;
  auto l_min =
      LookupLatencies(*b.sock, ModelId{Hash128{1, 1}, "none", "", {}}, std::span(&one, 1), opt.lookups, false);

  PrintRates(b, mem, sock, shm);
  std::printf("lookup round trip, %zu-token query (hit of %llu): p50 %.1f us, p99 %.1f us\n", longq.size(),
              static_cast<unsigned long long>(b.tokens.size()), Percentile(l_long, 0.5), Percentile(l_long, 0.99));
  std::printf("lookup round trip, %llu-token query (exact):    p50 %.1f us, p99 %.1f us\n",
              static_cast<unsigned long long>(b.tokens.size()), Percentile(l_short, 0.5), Percentile(l_short, 0.99));
  std::printf("lookup round trip, 1-token miss (transport alone): p50 %.1f us, p99 %.1f us\n",
              Percentile(l_min, 0.5), Percentile(l_min, 0.99));
  const Status csv = WriteCsv(opt.csv_dir, b, {{"memcpy", &mem}, {"socket", &sock}, {"shared memory", &shm}},
                              {{std::to_string(longq.size()) + "-token hit", &l_long},
                               {std::to_string(b.tokens.size()) + "-token exact", &l_short},
                               {"1-token miss (transport)", &l_min}});
  if (!csv.ok()) {
    std::fprintf(stderr, "%s\n", csv.ToString().c_str());
    return 1;
  }
  return 0;
}

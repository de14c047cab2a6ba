// primecache-tp-bench: publish and restore of one boundary of a model at TP
// 1 and at TP N through a real primecached (started here on a temporary
// data dir), side by side with memcpy of the boundary's bytes.
//
//   primecache-tp-bench [--daemon PATH] [--config configs/hrm-glm5-class.json]
//                       [--tokens 4096] [--tp 4] [--reps 3] [--csv FILE]
//
// The boundary's planes are random values in the model's geometry (latent
// and indexer rows, pool keys, KDA conv rings and states; no model runs).
// At TP N it is published as a group of N parts, each rank's shards sliced
// from the whole (rank 0 also sends the replicated planes, once), and
// restored as TpPrefixCache restores it: lookup, fetch of every part,
// decode, gather into the whole boundary and slice for N ranks. Reported
// per TP size: the bytes the store holds for the entry (its stat's
// stored_bytes grows by them), the median publish and restore times, and
// their rate against memcpy of the same decoded bytes.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/model/tensor_parallel.h"
#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/shard.h"
#include "serving/prefix_cache.h"
#include "serving/tp_prefix_cache.h"
#include "tools/common/csv.h"
#include "tools/common/daemon_process.h"

using namespace primecache;  // NOLINT(google-build-using-namespace)
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string daemon = PRIMECACHED_PATH;
  std::string config = "configs/hrm-glm5-class.json";
  std::uint64_t tokens = 4096;
  std::uint32_t tp = 4;
  int reps = 3;
  std::string csv;
};

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "primecache-tp-bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Must(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.status());
  return std::move(r).value();
}
double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The whole boundary of `len` tokens in the model's geometry, random planes.
std::vector<LayerSnapshot> Boundary(const model::ModelConfig& c, std::uint64_t len, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<LayerSnapshot> out;
  for (model::LayerType t : c.layers) {
    LayerShape shape;
    if (t == model::LayerType::kMla) {
      LatentShape s{.len = len, .width = c.mla.row_width()};
      if (c.mla.indexer) {
        s.index_width = 2 * c.mla.indexer->head_dim;
        s.pool = c.mla.indexer->pool;
        s.pools_ready = len / s.pool;
      }
      shape = s;
    } else if (t == model::LayerType::kKda) {
      shape = RecurrentShape{c.kda.heads, c.kda.head_dim, c.kda.conv_kernel};
    } else {
      Die("config", Status::NotSupported("the TP bench builds MLA and KDA layers only"));
    }
    LayerSnapshot snap = Must(MakeSnapshot(shape), "snapshot");
    for (auto plane : CodecRegistry::Default().KindFor(shape).value()->MutablePlaneData(snap)) {
      for (float& x : plane) x = u(g);
    }
    out.push_back(std::move(snap));
  }
  return out;
}

std::uint64_t DecodedBytes(const std::vector<LayerSnapshot>& layers) {
  std::uint64_t n = 0;
  for (const LayerSnapshot& l : layers) {
    std::visit(
        [&](const auto& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<S, LatentSnapshot>) {
            n += (s.latent_rows.size() + s.index_tail_rows.size() + s.pool_keys.size()) * sizeof(float);
          } else if constexpr (std::is_same_v<S, RecurrentSnapshot>) {
            n += (s.conv_ring.size() + s.state.size()) * sizeof(float);
          } else {
            n += (s.k_rows.size() + s.v_rows.size()) * sizeof(float);
          }
        },
        l);
  }
  return n;
}

// Publishes the boundary at TP `tp` as TpPrefixCache does (a group of parts
// when tp > 1).
void Publish(client::Client& c, const client::ModelId& id, const std::vector<std::uint32_t>& tokens,
             const std::vector<LayerSnapshot>& whole, std::uint32_t kv_heads, std::uint32_t tp,
             std::uint64_t token) {
  std::vector<std::vector<LayerSnapshot>> ranks;
  for (std::uint32_t r = 0; r < tp; ++r) ranks.push_back(Must(SliceLayers(whole, kv_heads, tp, r), "slice"));
  const PublishResult p =
      Must(model::PublishRanks(c, id, tokens, std::move(ranks), kv_heads, token, {}), "publish");
  if (p.group_pending || p.id == 0) Die("publish", Status::Internal("no entry written"));
}

// Restores as TpPrefixCache does: every rank's shards of the hit.
std::vector<std::vector<LayerSnapshot>> Restore(client::Client& c, const client::ModelId& id,
                                                const std::vector<std::uint32_t>& tokens,
                                                std::uint32_t kv_heads, std::uint32_t tp) {
  auto hit = Must(c.Lookup(id, tokens), "lookup");
  if (!hit) Die("lookup", Status::NotFound("no entry"));
  auto fetched = Must(c.FetchLayers(hit->id), "fetch");
  return Must(model::ShardsForTp(fetched, hit->ranks, kv_heads, tp), "shards");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Publish and restore of a boundary at TP 1 and TP N through primecached"};
  Options o;
  app.add_option("--daemon", o.daemon, "primecached binary");
  app.add_option("--config", o.config, "model config (MLA and KDA layers)");
  app.add_option("--tokens", o.tokens, "boundary length")
      ->check(CLI::Range(std::uint64_t{8}, std::uint64_t{1} << 20));
  app.add_option("--tp", o.tp, "the TP size set against TP 1")->check(CLI::Range(2, 64));
  app.add_option("--reps", o.reps, "publishes and restores timed per TP size (medians)")
      ->check(CLI::Range(1, 20));
  app.add_option("--csv", o.csv, "also write the figures as CSV");
  CLI11_PARSE(app, argc, argv);

  const model::ModelConfig config = Must(model::LoadModelConfig(Env::Default(), o.config), "config");
  Must(model::RankConfig(config, o.tp), "TP size");
  const client::ModelId id = model::PrefixCache::ModelIdFor(config, model::Weights::Generate(config, 1));
  launcher::DaemonProcess d(o.daemon);
  if (Status s = d.Start(); !s.ok()) Die("daemon", s);
  client::ClientOptions co;
  co.endpoint = d.socket();
  co.timeout = std::chrono::minutes(5);
  auto admin_opts = co;
  admin_opts.endpoint = d.admin_socket();
  std::vector<std::uint32_t> tokens(o.tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>((i * 7919) % 256);

  bench::CsvTable csv({"tp", "tokens", "decoded_bytes", "stored_bytes", "publish_s", "restore_s", "memcpy_s",
                       "publish_gbps", "restore_gbps", "memcpy_gbps"});
  std::printf("%-4s %12s %12s %10s %10s %10s %13s %10s\n", "TP", "decoded MB", "stored MB", "publish s",
              "restore s", "memcpy s", "restore GB/s", "vs memcpy");
  for (std::uint32_t tp : {1u, o.tp}) {
    std::vector<double> publish, restore, copy;
    std::uint64_t decoded = 0, stored = 0;
    for (int rep = 0; rep < o.reps; ++rep) {
      const auto whole = Boundary(config, o.tokens, 1000 * tp + rep);  // new bytes each time: no dedup
      decoded = DecodedBytes(whole);
      co.ns = "tp" + std::to_string(tp) + "-" + std::to_string(rep);
      auto c = Must(client::Client::Connect(co), "connect");
      auto admin = Must(client::Client::Connect(admin_opts), "connect admin");
      const std::uint64_t before = Must(admin->Stat(), "stat").store.stored_bytes;
      auto t0 = Clock::now();
      Publish(*c, id, tokens, whole, config.attn.kv_heads, tp, 7000 + rep);
      publish.push_back(Seconds(Clock::now() - t0));
      stored = Must(admin->Stat(), "stat").store.stored_bytes - before;
      t0 = Clock::now();
      auto shards = Restore(*c, id, tokens, config.attn.kv_heads, tp);
      restore.push_back(Seconds(Clock::now() - t0));
      // memcpy of the same decoded bytes, once.
      std::vector<char> src(decoded, 1), dst(decoded);
      t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), decoded);
      copy.push_back(Seconds(Clock::now() - t0));
      if (shards.size() != tp) Die("restore", Status::Internal("wrong rank count"));
    }
    const double p = Median(publish), r = Median(restore), m = Median(copy);
    const double gb = static_cast<double>(decoded) / 1e9;
    std::printf("%-4u %12.1f %12.1f %10.3f %10.3f %10.4f %13.2f %9.3fx\n", tp, decoded / 1e6, stored / 1e6, p,
                r, m, gb / r, m / r);
    if (Status s = csv.Add({tp, o.tokens, decoded, stored, p, r, m, gb / p, gb / r, gb / m}); !s.ok())
      Die("csv", s);
  }
  if (!o.csv.empty()) {
    if (Status s = csv.WriteTo(o.csv); !s.ok()) Die("csv", s);
  }
  return 0;
}

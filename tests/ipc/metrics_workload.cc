// metrics_workload: a known amount of work against a running primecached,
// for tests/ipc/metrics_test.py, which then scrapes the daemon's metrics and
// holds them to what this program reports having done (one JSON object on
// stdout). Every request must succeed as planned, or it exits 1.
//
//   metrics_workload --socket PATH [--shm] [--publishes N] [--misses N]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tests/ipc/daemon_harness.h"

namespace {

using namespace primecache::client;  // NOLINT
using primecache::testing::MakeLayers;
using primecache::testing::TestModel;
using primecache::testing::Tokens;

[[noreturn]] void Die(const std::string& what, const primecache::Status& s) {
  std::fprintf(stderr, "metrics_workload: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

std::uint64_t ChunkBytes(const std::vector<LayerData>& layers) {
  std::uint64_t n = 0;
  for (const LayerData& l : layers) {
    for (const auto& c : l.chunks) n += c.size();
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"metrics_workload"};
  std::string socket;
  bool shm = false;
  int publishes = 3, misses = 2;
  app.add_option("--socket", socket)->required();
  app.add_flag("--shm", shm);
  app.add_option("--publishes", publishes);
  app.add_option("--misses", misses);
  CLI11_PARSE(app, argc, argv);

  ClientOptions o;
  o.endpoint = socket;
  o.shared_memory = shm;
  auto c = Client::Connect(o);
  if (!c.ok()) Die("connect", c.status());
  nlohmann::json did = {{"publishes", 0}, {"publish_bytes", 0}, {"hits", 0},         {"misses", 0},
                        {"errors", 0},    {"hit_tokens", 0},    {"fetches", 0},      {"fetch_bytes", 0}};
  std::vector<std::uint64_t> entries;
  for (int i = 0; i < publishes; ++i) {
    // Boundaries of 200, 300, ... tokens, each its own prefix.
    const auto len = static_cast<std::size_t>(200 + 100 * i);
    const auto tokens = Tokens(len + 50, 100 + static_cast<std::uint32_t>(i));
    const auto layers = MakeLayers(len, 3, 7 + static_cast<std::uint32_t>(i));
    auto pub = (*c)->Publish(TestModel(), std::span(tokens).first(len), layers);
    if (!pub.ok()) Die("publish", pub.status());
    did["publishes"] = did["publishes"].get<int>() + 1;
    did["publish_bytes"] = did["publish_bytes"].get<std::uint64_t>() + ChunkBytes(layers);
    // A query longer than the boundary finds it.
    auto hit = (*c)->Lookup(TestModel(), tokens);
    if (!hit.ok() || !hit->has_value() || (*hit)->length != len) Die("lookup of a stored prefix", hit.status());
    did["hits"] = did["hits"].get<int>() + 1;
    did["hit_tokens"] = did["hit_tokens"].get<std::uint64_t>() + len;
    entries.push_back((*hit)->id);
  }
  for (int i = 0; i < misses; ++i) {
    auto miss = (*c)->Lookup(TestModel(), Tokens(120, 900 + static_cast<std::uint32_t>(i)));
    if (!miss.ok() || miss->has_value()) Die("lookup of an unknown prefix", miss.status());
    did["misses"] = did["misses"].get<int>() + 1;
  }
  // The store refuses a lookup of no tokens: one error.
  auto bad = (*c)->Lookup(TestModel(), std::span<const std::uint32_t>());
  if (bad.ok()) Die("lookup of no tokens", primecache::Status::Internal("answered, not refused"));
  did["errors"] = 1;
  for (std::uint64_t e : entries) {
    auto layers = (*c)->FetchLayers(e);
    if (!layers.ok()) Die("fetch", layers.status());
    std::uint64_t n = 0;
    for (const FetchedLayer& l : *layers) {
      for (const auto& chunk : l.data.chunks) n += chunk.size();
    }
    did["fetches"] = did["fetches"].get<int>() + 1;
    did["fetch_bytes"] = did["fetch_bytes"].get<std::uint64_t>() + n;
  }
  std::printf("%s\n", did.dump().c_str());
  return 0;
}

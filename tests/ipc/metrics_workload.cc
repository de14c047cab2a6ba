// metrics_workload: a known amount of work against a running primecached,
// for tests/ipc/metrics_test.py, which then scrapes the daemon's metrics and
// holds them to what this program reports having done (one JSON object on
// stdout). Every request must succeed as planned, or it exits 1.
//
//   metrics_workload --socket PATH [--shm] [--publishes N] [--misses N]
//   metrics_workload --socket PATH --refused N   (a daemon with --admission seen-twice)
//   metrics_workload --socket PATH --hold
//
// --hold: publishes one entry, then fetches it through a small shared
// region and keeps the chunks it is handed, so the daemon's fetch window
// fills and the fetch waits; it prints {"held_shm_bytes": N} once the next
// chunk cannot fit in what the held ones leave of the window (the daemon then
// waits for a release and sends nothing more), waits for a line on stdin, releases everything, lets the
// fetch finish and prints {"fetched_chunks": N}.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
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

// N publishes of boundaries never seen before, each refused by admission.
int Refused(const std::string& socket, int n) {
  ClientOptions o;
  o.endpoint = socket;
  auto c = Client::Connect(o);
  if (!c.ok()) Die("connect", c.status());
  for (int i = 0; i < n; ++i) {
    const auto tokens = Tokens(100, 500 + static_cast<std::uint32_t>(i));
    auto pub = (*c)->Publish(TestModel(), tokens, MakeLayers(100, 1, 1));
    if (pub.ok() || pub.status().code() != primecache::StatusCode::kAborted) Die("a publish admission must refuse", pub.status());
  }
  std::printf("%s\n", nlohmann::json{{"refused", n}}.dump().c_str());
  return 0;
}

// The --hold run (see the file comment).
int Hold(const std::string& socket) {
  ClientOptions o;
  o.endpoint = socket;
  o.shared_memory = true;
  o.shared_memory_bytes = 128u << 10;  // a 64 KiB fetch window: the entry below does not fit
  auto c = Client::Connect(o);
  if (!c.ok()) Die("connect", c.status());
  const auto tokens = Tokens(1000, 5);
  const auto layers = MakeLayers(1000, 3, 5);
  auto pub = (*c)->Publish(TestModel(), tokens, layers);
  if (!pub.ok()) Die("publish", pub.status());
  const SharedRegion region = (*c)->region();
  const auto* base = static_cast<const std::byte*>(region.base);
  const std::uint64_t window = region.size / 2;  // the fetch window: the region's second half
  std::vector<std::uint64_t> sizes;              // every chunk's, in the order they are sent
  for (const LayerData& l : layers) {
    for (const auto& ch : l.chunks) sizes.push_back(ch.size());
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ChunkRelease> held;
  std::uint64_t held_shm_bytes = 0, chunks = 0;
  bool releasing = false;
  FetchCallbacks cb;
  cb.on_layer = [](std::uint32_t, std::span<const std::byte>, std::uint32_t) { return primecache::Status::Ok(); };
  cb.on_chunk_held = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> b, ChunkRelease release) {
    std::lock_guard<std::mutex> l(mu);
    ++chunks;
    if (releasing) {
      release();
      return primecache::Status::Ok();
    }
    if (b.data() >= base && b.data() < base + region.size) held_shm_bytes += b.size();
    held.push_back(std::move(release));
    cv.notify_all();
    return primecache::Status::Ok();
  };
  primecache::Status fetched;
  std::thread fetch([&] { fetched = (*c)->Fetch(pub->id, {}, cb); });
  // The window is full once the next chunk (one that fits a window at all)
  // does not fit beside the held ones: the daemon cannot place it.
  const auto full = [&] {
    return chunks < sizes.size() && sizes[chunks] <= window && held_shm_bytes + sizes[chunks] > window;
  };
  {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::seconds(30), full)) {
      Die("held fetch", primecache::Status::DeadlineExceeded("the fetch window never filled (" +
                                                             std::to_string(chunks) + " chunks held)"));
    }
    std::printf("%s\n", nlohmann::json{{"held_shm_bytes", held_shm_bytes}}.dump().c_str());
    std::fflush(stdout);
  }
  std::string line;
  std::getline(std::cin, line);
  {
    std::lock_guard<std::mutex> l(mu);
    releasing = true;
    for (ChunkRelease& r : held) r();
  }
  fetch.join();
  if (!fetched.ok()) Die("held fetch", fetched);
  std::printf("%s\n", nlohmann::json{{"fetched_chunks", chunks}}.dump().c_str());
  return 0;
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
  bool hold = false;
  int refused = 0;
  app.add_flag("--hold", hold);
  app.add_option("--refused", refused, "publish N new boundaries that admission must refuse, and stop");
  CLI11_PARSE(app, argc, argv);
  if (hold) return Hold(socket);
  if (refused > 0) return Refused(socket, refused);

  ClientOptions o;
  o.endpoint = socket;
  o.shared_memory = shm;
  auto c = Client::Connect(o);
  if (!c.ok()) Die("connect", c.status());
  nlohmann::json did = {{"publishes", 0}, {"publish_bytes", 0}, {"hits", 0},        {"misses", 0},
                        {"errors", 0},    {"hit_tokens", 0},    {"fetches", 0},     {"fetch_bytes", 0},
                        {"fetch_errors", 0}, {"fetch_chunks", 0}};
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
      did["fetch_chunks"] = did["fetch_chunks"].get<std::uint64_t>() + l.data.chunks.size();
    }
    did["fetches"] = did["fetches"].get<int>() + 1;
    did["fetch_bytes"] = did["fetch_bytes"].get<std::uint64_t>() + n;
  }
  // A fetch of an entry that does not exist: one fetch error.
  auto none = (*c)->FetchLayers(entries.empty() ? 1 : entries.back() + 1000);
  if (none.ok()) Die("fetch of no entry", primecache::Status::Internal("answered, not refused"));
  did["fetch_errors"] = 1;
  std::printf("%s\n", did.dump().c_str());
  return 0;
}

// Shared machinery of the stress campaigns (tests/stress, driven by
// tools/stress): varied real entries and their content digests, a registry of
// what was attempted and acknowledged, running primecachectl, and sampling a
// process's memory and open files.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "primecache/client.h"
#include "primecache/internal/statestore.h"
#include "tests/ipc/daemon_harness.h"

namespace primecache::stress {

using client::FetchedLayer;
using client::LayerData;

// What makes one entry: its tokens and layers are a pure function of these.
struct EntrySpec {
  std::uint32_t seed = 0;
  std::uint32_t length = 0;  // tokens = layer rows
  std::uint32_t layers = 0;
  std::uint32_t width = 64;
  std::uint32_t rows_per_chunk = 64;  // a power of two
};

// A spec of varied size: mostly small entries, some medium, a few large
// enough (several MiB) to take the store's direct-write path.
EntrySpec RandomSpec(std::mt19937_64& rng, std::uint32_t seed);
std::vector<std::uint32_t> SpecTokens(const EntrySpec& spec);
std::vector<LayerData> SpecLayers(const EntrySpec& spec);

// A digest of layers' exact bytes (headers and chunks, with their sizes and
// boundaries), the same whichever form holds them.
std::uint64_t LayersDigest(const std::vector<LayerData>& layers);
std::uint64_t LayersDigest(const std::vector<FetchedLayer>& layers);
std::uint64_t LayersDigest(const std::vector<LayerBytes>& layers);
std::vector<LayerBytes> ToLayerBytes(const std::vector<LayerData>& layers);

// The key of a token sequence in a Registry.
std::string TokensKey(const std::vector<std::uint32_t>& tokens);

// Every publish a campaign attempted, by tokens, with the digest its entry
// must read back with, and which ones were acknowledged (and as what entry).
// Thread-safe.
class Registry {
 public:
  struct Attempt {
    std::uint64_t digest = 0;
    std::uint32_t length = 0;
    bool acked = false;
    std::uint64_t entry = 0;  // when acked
    bool deleting = false;    // a delete was sent (it may or may not have happened)
    bool deleted = false;     // a delete was acknowledged (or found it gone)
    bool evicted = false;     // a fetch found it gone
  };
  void Attempted(const std::vector<std::uint32_t>& tokens, std::uint64_t digest);
  void Acked(const std::vector<std::uint32_t>& tokens, std::uint64_t entry);
  void Deleting(const std::string& key);
  void Deleted(const std::string& key);
  void DeleteRefused(const std::string& key);
  void Evicted(const std::string& key);  // the store refused it: nothing was deleted
  std::optional<Attempt> Find(const std::string& key) const;
  // An acknowledged entry picked at random (nullopt: none yet), with its key.
  std::optional<std::pair<std::string, Attempt>> RandomAcked(std::mt19937_64& rng) const;
  std::map<std::string, Attempt> Snapshot() const;
  std::size_t AckedCount() const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::map<std::string, Attempt> attempts_;
  std::vector<std::string> acked_keys_;
};

// An append-only log of acknowledgements, kept outside the data dir; each
// line is flushed and synced before the next publish starts.
class AckLog {
 public:
  explicit AckLog(const std::string& path);
  ~AckLog();
  AckLog(const AckLog&) = delete;
  AckLog& operator=(const AckLog&) = delete;
  void Record(const std::string& line);

 private:
  std::mutex mu_;
  std::FILE* f_ = nullptr;
};

using ProcResult = testing::ProcessResult;

// Runs a program to its end (killed after `limit`), collecting its output.
ProcResult RunProgram(const std::string& path, const std::vector<std::string>& args,
                      std::chrono::seconds limit = std::chrono::seconds(600));

// primecachectl against a daemon of the test harness (its admin socket).
ProcResult Ctl(const testing::Daemon& d, std::vector<std::string> args);
// primecachectl on a data dir with no daemon (read-only).
ProcResult CtlOffline(const std::string& data_dir, std::vector<std::string> args);

// Resident memory and open descriptors of a process.
struct ProcSample {
  long rss_kib = -1;
  long fds = -1;
};
ProcSample SampleProcess(pid_t pid);

// "name: 12.3 s" style progress lines and the closing summary.
void Say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

double SecondsSince(std::chrono::steady_clock::time_point t0);

// For printf's %llu.
inline unsigned long long U(std::uint64_t v) { return v; }

// Lists every live entry on a connection (all pages, tokens included).
Result<std::vector<client::EntryInfo>> ListAll(client::Client& c);

// A fresh directory under `base` (TMPDIR or /tmp when empty).
std::string MakeWorkDir(const std::string& base, const std::string& prefix);

}  // namespace primecache::stress

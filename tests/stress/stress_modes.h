// The campaigns of primecache-stress (docs/RELIABILITY.md). Each returns the
// process exit status: 0 when every check held, 1 when one failed, 77 when
// the campaign cannot run here (ctest's skip code).
#pragma once

#include <cstdint>
#include <string>

namespace primecache::stress {

// Options every campaign shares.
struct CommonOptions {
  std::string work_dir;    // where the campaign's directory goes (TMPDIR or /tmp when empty)
  std::uint64_t seed = 0;  // of every random choice
  bool keep = false;       // keep the campaign's directory even when it passed
};

// SIGKILL of the real daemon during 1..max_publishers concurrent publishes
// of the path (workload.h: plain, branch, group, gc); for group, a rank
// process or the daemon killed at each kill point of the group commit in
// turn (group_loop.cc).
struct CrashOptions {
  CommonOptions common;
  std::string path = "plain";
  int iterations = 5;
  int max_publishers = 3;
  int kill_max_ms = 400;  // the kill comes uniformly in [0, this] after the publishers start
  int epoch = 20;         // a fresh store every this many iterations
};
int RunCrashLoop(const CrashOptions& o);

// A power loss (unsynced data dropped, through FaultInjectionEnv) during
// 1..max_publishers concurrent publishers of the path into the store.
struct PowerLossOptions {
  CommonOptions common;
  std::string path = "plain";
  int iterations = 5;
  int max_publishers = 3;
  int freeze_max_ms = 300;
  int epoch = 20;
};
int RunPowerLoss(const PowerLossOptions& o);

// The budget, in MiB, of the gc path's store: small, so that publishes evict.
inline constexpr int kGcBudgetMib = 16;

// One rank process of the crash loop's group path (the hidden subcommand
// grouprank): connects, then on stdin's "go" streams its part of the group
// and says STREAMED, on "commit" commits and says PENDING or ENTRY id; it
// raises SIGKILL on itself at kill_at (before_begin, mid_stream, streamed,
// in_commit: kill_delay_us after sending its commit, after_answer; none).
struct GroupRankOptions {
  std::string socket;
  std::uint32_t entry_seed = 0, length = 0, layers = 0, rows_per_chunk = 64;
  std::uint32_t ranks = 2, rank = 0;
  std::uint64_t token = 0;
  std::string kill_at = "none";
  std::uint32_t kill_delay_us = 0;
};
int RunGroupRank(const GroupRankOptions& o);

// Many clients doing lookups, fetches and publishes against one daemon for a
// while; no error, and the daemon's memory and open files stay bounded.
struct SoakOptions {
  CommonOptions common;
  int clients = 8;
  double seconds = 10;
  double warmup_seconds = -1;  // <0: a tenth of the run, at least 3 s
  long rss_slack_mib = 128;    // RSS growth allowed past its value at the warm-up's end
  long fd_slack = 64;          // open-file growth allowed past the warm-up's peak
  // Publishes counted per window of this many seconds from the start; with
  // three full windows or more, each after the second must be within
  // throughput_tolerance of the second's (the first holds the fill before
  // eviction begins).
  double throughput_window_seconds = 300;
  double throughput_tolerance = 0.2;
  int window = 4;            // entries each client keeps using
  long capacity_mib = 256;  // the daemon's byte budget; eviction keeps the store within it
};
int RunSoak(const SoakOptions& o);

// Damaged copies of an exported .pcsnap: every one refused by
// `primecachectl verify --file` and by `import`.
struct FlipOptions {
  CommonOptions common;
  int copies = 50;
};
int RunFlips(const FlipOptions& o);

// The daemon on a small tmpfs: filled until publishes are refused, then
// freed, and publishing again without a restart.
struct DiskFullOptions {
  CommonOptions common;
  int tmpfs_mib = 48;
  int recover_seconds = 60;  // how long the daemon may take to accept writes again
};
int RunDiskFull(const DiskFullOptions& o);

}  // namespace primecache::stress

// primecached under a service manager (packaging/systemd/primecached.service,
// docs/operations.md): readiness and shutdown told to systemd with sd_notify,
// SIGHUP re-reading the config, and log lines shaped for the journal.
//
// Signals: BlockServiceSignals (first thing in main, before any thread)
// blocks SIGHUP, SIGTERM and SIGINT in every thread; ServiceSignals' own
// thread takes them with sigwait, so no handler runs at an arbitrary point
// and the libuv loop, the workers and RocksDB's threads never see them.
//   SIGTERM, SIGINT: STOPPING=1 to systemd, then the stop hook.
//   SIGHUP: RELOADING=1, the reread hook (the command line and the config
//     file parsed again), then only if all of it is valid: the byte budget
//     and the log level applied and logged; READY=1 after either way. A
//     setting that cannot change at run time is logged as waiting for a
//     restart.
// sd_notify does nothing when NOTIFY_SOCKET is unset (not under systemd).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "primecache/internal/logging.h"
#include "primecache/status.h"

namespace primecache::daemon {

// What the daemon's settings are, as a reload compares them.
struct Settings {
  LogLevel log_level = LogLevel::kInfo;
  std::uint64_t capacity_bytes = 0;
  // Every other setting, a JSON object as primecached --print-config writes
  // it: a change there needs a restart, and a reload names the keys.
  std::string others;
};

Status BlockServiceSignals();

// READY=1 with a STATUS line; STOPPING=1. Failures to reach the manager are
// logged, not fatal: the daemon serves either way.
void NotifyReady(const std::string& status);
void NotifyStopping();

// Whether stderr is the journal's stream (systemd sets JOURNAL_STREAM to its
// device:inode for a service whose output goes to the journal).
bool StderrIsJournal();
// Log lines as the journal reads them: "<N>" syslog priority first (so
// journalctl -p filters and colours by level), no timestamp (the journal
// stamps each line).
void UseJournalLogFormat();

// The signal thread. Thread-safety: Start and Join from one thread; the
// hooks run on the signal thread.
class ServiceSignals {
 public:
  struct Hooks {
    std::function<Result<Settings>()> reread;
    std::function<Status(std::uint64_t bytes)> set_capacity;
    std::function<void()> stop;
  };
  ServiceSignals(Settings current, Hooks hooks);
  ~ServiceSignals();
  ServiceSignals(const ServiceSignals&) = delete;
  ServiceSignals& operator=(const ServiceSignals&) = delete;

  void Start();
  // Ends the thread (after the server stopped).
  void Join();

 private:
  void Loop();
  void Reload();
  void Apply(const Settings& next);

  Settings current_;
  Hooks hooks_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace primecache::daemon

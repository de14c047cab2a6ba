// DaemonProcess: starts the real primecached for a test or a benchmark, on a
// directory of its own (a fresh temporary one, or a given one to reopen a
// store), and stops, kills or restarts it.
//
// Layout under dir(): d.sock (the socket), a.sock (the admin socket), data/
// (the store's data dir). Start() returns once the daemon has written "ready"
// to its --ready-fd pipe (within 30 s). The daemon dies with the process that started it
// (PR_SET_PDEATHSIG), so a test that aborts leaves no orphan behind.
//
// Thread-safety: one thread at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "primecache/status.h"

namespace primecache::launcher {

class DaemonProcess {
 public:
  // `binary`: the primecached to run; `extra_args` go after the launcher's
  // own; `dir` empty: a fresh temporary directory, removed at the end.
  explicit DaemonProcess(std::string binary, std::vector<std::string> extra_args = {}, std::string dir = "");
  ~DaemonProcess();  // kills a daemon still running; removes a directory it owns
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts the daemon and waits until it serves. Again after Stop (or a
  // Kill): a new daemon on the same directory and store.
  Status Start();
  // Stop, then Start: a new daemon on the same store. An error when the old
  // one did not exit cleanly.
  Status Restart();
  // SIGTERM, then waits up to `limit`; the exit status (128 + signal when
  // signalled), or -1 when it had to be killed or none was running.
  int Stop(std::chrono::milliseconds limit = std::chrono::milliseconds(20000));
  // Waits up to `limit` for the daemon to exit by itself; as Stop.
  int Wait(std::chrono::milliseconds limit);
  // SIGKILL, and reaps it.
  void Kill();
  bool Alive() const;
  // The daemon's resident memory in KiB; -1 when unknown.
  long RssKiB() const;

  const std::string& dir() const { return dir_; }
  std::string socket() const { return dir_ + "/d.sock"; }
  std::string admin_socket() const { return dir_ + "/a.sock"; }
  std::string data_dir() const { return dir_ + "/data"; }
  pid_t pid() const { return pid_; }
  // Whether the directory is removed with this object.
  void DisownDir() { own_dir_ = false; }
  void OwnDir() { own_dir_ = true; }

 private:
  std::vector<std::string> Args(int ready_fd) const;

  std::string binary_;
  std::vector<std::string> extra_args_;
  std::string dir_;
  Status dir_status_;  // why there is no directory, when making one failed
  bool own_dir_ = false;
  pid_t pid_ = -1;
};

}  // namespace primecache::launcher

#include "tools/common/daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/errno_text.h"

namespace primecache::launcher {

namespace {
constexpr int kReadyTimeoutMs = 30000;
}  // namespace

DaemonProcess::DaemonProcess(std::string binary, std::vector<std::string> extra_args, std::string dir)
    : binary_(std::move(binary)), extra_args_(std::move(extra_args)), dir_(std::move(dir)) {
  if (!dir_.empty()) return;
  std::string tmpl = (std::filesystem::temp_directory_path() / "primecached-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    dir_status_ = Status::IOError(ErrnoText("mkdtemp " + tmpl));
    return;
  }
  dir_ = tmpl;
  own_dir_ = true;
}

DaemonProcess::~DaemonProcess() {
  Kill();
  if (own_dir_ && !dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::vector<std::string> DaemonProcess::Args(int ready_fd) const {
  std::vector<std::string> args = {binary_,          "--socket",     socket(),
                                   "--admin-socket", admin_socket(), "--data-dir",
                                   data_dir(),       "--ready-fd",   std::to_string(ready_fd)};
  const auto& extra = extra_args_;
  if (std::find(extra.begin(), extra.end(), "--log-level") == extra.end())
    args.insert(args.end(), {"--log-level", "warn"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

Status DaemonProcess::Start() {
  if (!dir_status_.ok()) return dir_status_;
  if (pid_ > 0 && Alive()) {
    return Status::FailedPrecondition("primecached is running already (pid " + std::to_string(pid_) + ")");
  }
  pid_ = -1;  // one that exited by itself (reaped by Alive)
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return Status::IOError(ErrnoText("pipe2"));
  std::vector<std::string> args = Args(p[1]);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) {
    Status s = Status::IOError(ErrnoText("fork"));
    close(p[0]);
    close(p[1]);
    return s;
  }
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    fcntl(p[1], F_SETFD, 0);  // the write end survives exec
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(p[1]);
  pollfd pf{p[0], POLLIN, 0};
  char buf[16] = {};
  const bool ready = poll(&pf, 1, kReadyTimeoutMs) == 1 && read(p[0], buf, sizeof(buf) - 1) > 0 &&
                     std::string(buf).rfind("ready", 0) == 0;
  close(p[0]);
  if (ready) return Status::Ok();
  // Gone already (a refused flag, an unusable store) or hung: either way, not serving.
  const int rc = Wait(std::chrono::milliseconds(500));
  return Status::Unavailable(binary_ + " did not become ready" +
                             (rc >= 0 ? " (exit status " + std::to_string(rc) + ")" : ""));
}

Status DaemonProcess::Restart() {
  if (const int rc = Stop(); rc != 0) {
    return Status::Aborted("primecached did not stop cleanly (status " + std::to_string(rc) + ")");
  }
  return Start();
}

int DaemonProcess::Stop(std::chrono::milliseconds limit) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  return Wait(limit);
}

int DaemonProcess::Wait(std::chrono::milliseconds limit) {
  if (pid_ <= 0) return -1;
  const auto end = std::chrono::steady_clock::now() + limit;
  while (true) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (std::chrono::steady_clock::now() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Kill();
  return -1;
}

void DaemonProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

bool DaemonProcess::Alive() const {
  return pid_ > 0 && kill(pid_, 0) == 0 && waitpid(pid_, nullptr, WNOHANG) == 0;
}

long DaemonProcess::RssKiB() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

}  // namespace primecache::launcher

#include "tools/primecached/service.h"

#include <signal.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace primecache::daemon {
namespace {

sigset_t ServiceSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

void Notify(const std::string& state) {
  // 0: keep NOTIFY_SOCKET in the environment (nothing we start inherits it anyway).
  const int rc = sd_notify(0, state.c_str());
  if (rc < 0) spdlog::warn("primecached: sd_notify({}): {}", state.substr(0, state.find('\n')), std::strerror(-rc));
}

// "<N>": the syslog priority of spdlog's level (sd-daemon.h's SD_ERR etc.).
class PriorityFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm*/, spdlog::memory_buf_t& dest) override {
    static constexpr const char* kPriority[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", "<6>"};
    const auto level = static_cast<std::size_t>(msg.level);
    const char* p = level < std::size(kPriority) ? kPriority[level] : "<6>";
    dest.append(p, p + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<PriorityFlag>(); }
};

std::string Bytes(std::uint64_t bytes) { return bytes == 0 ? std::string("unlimited") : std::to_string(bytes); }

// The keys whose values differ between two JSON objects of settings ("" for
// text that is not such an object, which compares whole).
std::string ChangedKeys(const std::string& before, const std::string& after) {
  const auto a = nlohmann::json::parse(before, nullptr, /*allow_exceptions=*/false);
  const auto b = nlohmann::json::parse(after, nullptr, /*allow_exceptions=*/false);
  if (!a.is_object() || !b.is_object()) return before == after ? "" : "(settings)";
  std::set<std::string> keys;
  for (const auto& [k, v] : a.items()) keys.insert(k);
  for (const auto& [k, v] : b.items()) keys.insert(k);
  std::string changed;
  for (const auto& k : keys) {
    if (a.value(k, nlohmann::json()) != b.value(k, nlohmann::json())) changed += (changed.empty() ? "" : ", ") + k;
  }
  return changed;
}

}  // namespace

Status BlockServiceSignals() {
  const sigset_t set = ServiceSignalSet();
  if (int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0) {
    return Status::Internal(std::string("pthread_sigmask: ") + std::strerror(rc));
  }
  return Status::Ok();
}

void NotifyReady(const std::string& status) { Notify("READY=1\nSTATUS=" + status); }

void NotifyStopping() { Notify("STOPPING=1\nSTATUS=stopping"); }

bool StderrIsJournal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  if (env == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(env, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev && static_cast<unsigned long long>(st.st_ino) == ino;
}

void UseJournalLogFormat() {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<PriorityFlag>('*').set_pattern("%*%v");
  spdlog::set_formatter(std::move(formatter));
}

ServiceSignals::ServiceSignals(Settings current, Hooks hooks) : current_(std::move(current)), hooks_(std::move(hooks)) {}

ServiceSignals::~ServiceSignals() { Join(); }

void ServiceSignals::Start() { thread_ = std::thread([this] { Loop(); }); }

void ServiceSignals::Join() {
  if (!thread_.joinable()) return;
  done_ = true;
  // Wakes the sigwait: the signal is blocked everywhere, so it is taken
  // there; done_ tells the loop it was ours.
  pthread_kill(thread_.native_handle(), SIGHUP);
  thread_.join();
}

void ServiceSignals::Loop() {
  const sigset_t set = ServiceSignalSet();
  bool stopping = false;
  while (true) {
    int signum = 0;
    if (sigwait(&set, &signum) != 0) continue;
    if (done_) return;
    if (signum == SIGHUP) {
      if (!stopping) Reload();
      continue;
    }
    spdlog::info("primecached: signal {}, shutting down", signum);
    if (!stopping) NotifyStopping();
    stopping = true;
    hooks_.stop();
  }
}

void ServiceSignals::Reload() {
  struct timespec now {};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const auto usec = static_cast<std::uint64_t>(now.tv_sec) * 1000000 + static_cast<std::uint64_t>(now.tv_nsec) / 1000;
  Notify("RELOADING=1\nSTATUS=reloading\nMONOTONIC_USEC=" + std::to_string(usec));
  spdlog::info("primecached: SIGHUP, reloading the configuration");
  Result<Settings> next = hooks_.reread();
  if (!next.ok()) {
    spdlog::error("primecached: reload refused, nothing changed: {}", next.status().ToString());
  } else {
    Apply(*next);
  }
  NotifyReady("serving");
}

// The budget first: it is the step that can fail (a store refusing writes),
// and a failed reload changes nothing.
void ServiceSignals::Apply(const Settings& next) {
  std::vector<std::string> changed;
  if (next.capacity_bytes != current_.capacity_bytes) {
    if (Status s = hooks_.set_capacity(next.capacity_bytes); !s.ok()) {
      spdlog::error("primecached: reload refused, nothing changed: capacity {}: {}", next.capacity_bytes,
                    s.ToString());
      return;
    }
    changed.push_back("capacity " + Bytes(current_.capacity_bytes) + " -> " + Bytes(next.capacity_bytes));
  }
  if (next.log_level != current_.log_level) {
    SetLogLevel(next.log_level);
    changed.push_back("log level " + std::string(LogLevelName(current_.log_level)) + " -> " +
                      std::string(LogLevelName(next.log_level)));
  }
  if (const std::string keys = ChangedKeys(current_.others, next.others); !keys.empty()) {
    spdlog::warn("primecached: reload: {} changed; only log_level and capacity change while running, the rest at "
                 "the next restart",
                 keys);
  }
  const std::string others = current_.others;
  current_ = next;
  current_.others = others;  // what runs is still the old one until a restart
  std::string summary;
  for (const auto& c : changed) summary += (summary.empty() ? "" : ", ") + c;
  spdlog::info("primecached: reloaded: {}", summary.empty() ? std::string("nothing changed") : summary);
}

}  // namespace primecache::daemon

// primecached as a service: sd_notify readiness and shutdown through a real
// NOTIFY_SOCKET, SIGHUP reloads (log level, byte budget; a bad file changes
// nothing), the config file as the flags, and journal-shaped log lines. Each
// test starts the real daemon (PRIMECACHED_PATH) with its stderr in a file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "primecache/client.h"

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace client = primecache::client;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// A datagram socket standing in for systemd's notification socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  }
  ~NotifySocket() { close(fd_); }
  const std::string& path() const { return path_; }

  // The next datagram within `limit` ("" on timeout).
  std::string Next(std::chrono::milliseconds limit) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(limit.count())) != 1) return "";
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
  }
  // Datagrams until one holding `state` (e.g. "READY=1"); every one seen is
  // appended to *seen. False on timeout.
  bool WaitFor(const std::string& state, std::vector<std::string>* seen, std::chrono::seconds limit = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      std::string msg = Next(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
      if (msg.empty()) continue;
      seen->push_back(msg);
      if (("\n" + msg + "\n").find("\n" + state + "\n") != std::string::npos) return true;
    }
    return false;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// The daemon, started with `args` and `env` added to ours, its stderr (and
// stdout) in a file; killed at the end if still running.
class Daemon {
 public:
  Daemon(const std::vector<std::string>& args, const std::vector<std::string>& env, const std::string& log) {
    std::vector<std::string> argv_s = {PRIMECACHED_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    env_s.insert(env_s.end(), env.begin(), env.end());
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> a, e;
      for (auto& s : argv_s) a.push_back(s.data());
      for (auto& s : env_s) e.push_back(s.data());
      a.push_back(nullptr);
      e.push_back(nullptr);
      execve(a[0], a.data(), e.data());
      _exit(127);
    }
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  void Signal(int sig) { kill(pid_, sig); }
  // The exit status, -1 when it did not exit within `limit`.
  int Wait(std::chrono::seconds limit = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/primecache-service.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> Where() const {
    return {"--data-dir", path("data"), "--socket", path("d.sock"), "--admin-socket", path("a.sock"),
            "--device-copies", "off"};
  }
  std::vector<std::string> With(std::vector<std::string> extra) const {
    auto args = Where();
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  primecache::Result<std::unique_ptr<client::Client>> Connect(const std::string& socket, const std::string& ns = "") {
    client::ClientOptions o;
    o.endpoint = socket;
    o.ns = ns;
    o.reconnect_attempts = 1;
    return client::Client::Connect(o);
  }
  std::uint64_t Budget() {
    auto c = Connect(path("a.sock"));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return ~0ull;
    auto st = (*c)->Stat();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return st.ok() ? st->store.byte_budget : ~0ull;
  }
  // Stdout of `primecached ARGS` (run to its end), and its exit status.
  std::pair<std::string, int> RunToEnd(const std::vector<std::string>& args) {
    std::string cmd = PRIMECACHED_PATH;
    for (const auto& a : args) cmd += " '" + a + "'";
    FILE* p = popen((cmd + " 2>" + path("run.err")).c_str(), "r");
    std::string out;
    char buf[4096];
    for (std::size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
    const int status = pclose(p);
    return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
  }

  std::string dir_;
};

TEST_F(ServiceTest, NotifiesReadyOnceServingAndStoppingOnSigterm) {
  NotifySocket notify(path("notify.sock"));
  Daemon d(Where(), {"NOTIFY_SOCKET=" + notify.path()}, path("log"));
  std::vector<std::string> seen;
  ASSERT_TRUE(notify.WaitFor("READY=1", &seen)) << ReadFile(path("log"));
  // READY=1 comes after the socket accepts: a client connects at once.
  auto c = Connect(path("d.sock"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(seen.back().find("STATUS=serving " + path("d.sock")), std::string::npos) << seen.back();
  c->reset();

  d.Signal(SIGTERM);
  seen.clear();
  ASSERT_TRUE(notify.WaitFor("STOPPING=1", &seen, 10s)) << ReadFile(path("log"));
  EXPECT_EQ(d.Wait(), 0) << ReadFile(path("log"));
  EXPECT_FALSE(fs::exists(path("d.sock")));
}

TEST_F(ServiceTest, SighupAppliesLogLevelAndCapacityFromTheConfig) {
  const std::string cfg = path("primecached.conf");
  WriteFile(cfg, R"({"log_level": "info", "capacity": "1G"})");
  NotifySocket notify(path("notify.sock"));
  Daemon d(With({"--config", cfg}), {"NOTIFY_SOCKET=" + notify.path()}, path("log"));
  std::vector<std::string> seen;
  ASSERT_TRUE(notify.WaitFor("READY=1", &seen)) << ReadFile(path("log"));
  EXPECT_EQ(Budget(), 1ull << 30);
  EXPECT_EQ(ReadFile(path("log")).find("primecached: connection "), std::string::npos) << "debug line at info";

  WriteFile(cfg, "// comments are allowed\n{\"log_level\": \"debug\", \"capacity\": \"2G\"}\n");
  d.Signal(SIGHUP);
  ASSERT_TRUE(notify.WaitFor("RELOADING=1", &seen, 10s));
  ASSERT_TRUE(notify.WaitFor("READY=1", &seen, 10s));
  EXPECT_EQ(Budget(), 2ull << 30);
  std::string log = ReadFile(path("log"));
  EXPECT_NE(log.find("reloaded: capacity 1073741824 -> 2147483648, log level info -> debug"), std::string::npos)
      << log;
  // At debug, the connection Budget() made is logged.
  EXPECT_NE(log.find("primecached: connection "), std::string::npos) << log;

  // Up to warn: the shutdown's info lines are no longer written. A setting
  // that cannot change while running is named as waiting for a restart.
  WriteFile(cfg, R"({"log_level": "warn", "capacity": "2G", "idle_timeout": 77})");
  d.Signal(SIGHUP);
  ASSERT_TRUE(notify.WaitFor("RELOADING=1", &seen, 10s));
  ASSERT_TRUE(notify.WaitFor("READY=1", &seen, 10s));
  log = ReadFile(path("log"));
  EXPECT_NE(log.find("reload: idle_timeout changed; only log_level and capacity change while running"),
            std::string::npos)
      << log;
  const std::size_t before = log.size();
  d.Signal(SIGTERM);
  EXPECT_EQ(d.Wait(), 0);
  log = ReadFile(path("log")).substr(before);
  EXPECT_EQ(log.find("primecached: stopped"), std::string::npos) << log;
}

TEST_F(ServiceTest, BadConfigOnReloadChangesNothing) {
  const std::string cfg = path("primecached.conf");
  WriteFile(cfg, R"({"log_level": "info", "capacity": "1G"})");
  NotifySocket notify(path("notify.sock"));
  Daemon d(With({"--config", cfg}), {"NOTIFY_SOCKET=" + notify.path()}, path("log"));
  std::vector<std::string> seen;
  ASSERT_TRUE(notify.WaitFor("READY=1", &seen)) << ReadFile(path("log"));

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"log_level": "debug", "capacity": "2Q"})", "2Q"},
      {R"({"log_level": "loud", "capacity": "2G"})", "loud"},
      {R"({"log_level": "debug", "capacity": "2G", "capacityy": "3G"})", "unknown flag, argument or config key: capacityy"},
      {R"({"log_level": "debug", "capacity": "2G", "max_publishes": 0})", "max-publishes"},
      {R"({"log_level": "debug", "capacity": "2G", "eviction": "lfu"})", "lru, utility or marginal"},
      {R"({"log_level": "debug", "capacity": )", "not JSON"},
  };
  for (const auto& [text, why] : bad) {
    SCOPED_TRACE(text);
    const std::size_t before = ReadFile(path("log")).size();
    WriteFile(cfg, text);
    d.Signal(SIGHUP);
    ASSERT_TRUE(notify.WaitFor("RELOADING=1", &seen, 10s));
    ASSERT_TRUE(notify.WaitFor("READY=1", &seen, 10s));
    const std::string log = ReadFile(path("log")).substr(before);
    EXPECT_NE(log.find("reload refused, nothing changed"), std::string::npos) << log;
    EXPECT_NE(log.find(why), std::string::npos) << log;
    EXPECT_EQ(Budget(), 1ull << 30);
  }
  // Still at info: no debug line for those connections.
  EXPECT_EQ(ReadFile(path("log")).find("primecached: connection "), std::string::npos);
  d.Signal(SIGTERM);
  EXPECT_EQ(d.Wait(), 0);
}

TEST_F(ServiceTest, ConfigFileKeysAreTheFlags) {
  const std::string uid = std::to_string(getuid());
  const std::vector<std::string> flags = {
      "--capacity", "3G", "--max-chunk", "2M", "--max-publishes", "7", "--eviction", "utility",
      "--utility-window", "32", "--admission", "seen-twice", "--idle-timeout", "120", "--tenant", uid + "=team-a,",
      "--admin-uid", "4242", "--admin-uid", "4243", "--direct-reads", "--log-level", "warn"};
  auto print = With(flags);
  print.push_back("--print-config");
  auto [from_flags, rc1] = RunToEnd(print);
  ASSERT_EQ(rc1, 0) << ReadFile(path("run.err"));
  const auto j = nlohmann::json::parse(from_flags);
  EXPECT_EQ(j.at("capacity"), "3G");
  EXPECT_EQ(j.at("admin_uid"), nlohmann::json::array({"4242", "4243"}));
  EXPECT_EQ(j.at("direct_reads"), true);

  // That output, as a config file, is the same settings.
  const std::string cfg = path("primecached.conf");
  WriteFile(cfg, from_flags);
  auto [from_file, rc2] = RunToEnd({"--config", cfg, "--print-config"});
  ASSERT_EQ(rc2, 0) << ReadFile(path("run.err"));
  EXPECT_EQ(nlohmann::json::parse(from_file), j);

  // And a daemon started from the file behaves as one started with the flags.
  for (bool use_file : {false, true}) {
    SCOPED_TRACE(use_file ? "config file" : "flags");
    NotifySocket notify(path(use_file ? "n2.sock" : "n1.sock"));
    Daemon d(use_file ? std::vector<std::string>{"--config", cfg} : With(flags),
             {"NOTIFY_SOCKET=" + notify.path()}, path("log"));
    std::vector<std::string> seen;
    ASSERT_TRUE(notify.WaitFor("READY=1", &seen)) << ReadFile(path("log"));
    auto c = Connect(path("d.sock"), "team-a");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ((*c)->server_info().max_chunk_bytes, 2u << 20);
    EXPECT_EQ((*c)->server_info().max_publishes_in_flight, 7u);
    EXPECT_FALSE(Connect(path("d.sock"), "team-b").ok()) << "the tenant's namespaces";
    EXPECT_TRUE(Connect(path("d.sock"), "").ok()) << "the tenant's empty namespace";
    EXPECT_EQ(Budget(), 3ull << 30);
    d.Signal(SIGTERM);
    EXPECT_EQ(d.Wait(), 0);
  }
}

TEST_F(ServiceTest, TheOldTenantsObjectStillReads) {
  const std::string cfg = path("primecached.conf");
  WriteFile(cfg, R"({"tenants": {")" + std::to_string(getuid()) + R"(": ["team-a"]}, "max_connections": 8})");
  auto [out, rc] = RunToEnd(With({"--config", cfg, "--print-config"}));
  ASSERT_EQ(rc, 0) << ReadFile(path("run.err"));
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("tenant"), nlohmann::json::array({std::to_string(getuid()) + "=team-a"}));
  EXPECT_EQ(j.at("max_connections"), "8");
}

// The commented example that is installed (packaging/primecached.conf) reads,
// and says what docs/operations.md says it does.
TEST_F(ServiceTest, TheExampleConfigReads) {
  auto [out, rc] = RunToEnd({"--config", EXAMPLE_CONFIG, "--print-config"});
  ASSERT_EQ(rc, 0) << ReadFile(path("run.err"));
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("data_dir"), "/var/lib/primecache");
  EXPECT_EQ(j.at("socket"), "/run/primecache/primecached.sock");
  EXPECT_EQ(j.at("socket_group"), "primecache");
  EXPECT_EQ(j.at("capacity"), "64G");
}

TEST_F(ServiceTest, StartRefusesUnknownKeysAndMissingFiles) {
  const std::string cfg = path("primecached.conf");
  WriteFile(cfg, R"({"capacity": "1G", "max_chunks": "2M"})");
  auto [out, rc] = RunToEnd(With({"--config", cfg}));
  EXPECT_NE(rc, 0);
  EXPECT_NE(ReadFile(path("run.err")).find("unknown flag, argument or config key: max_chunks"), std::string::npos) << ReadFile(path("run.err"));
  auto [out1, rc1] = RunToEnd(With({"--capacit", "1G"}));
  EXPECT_NE(rc1, 0);
  EXPECT_NE(ReadFile(path("run.err")).find("unknown flag, argument or config key: --capacit 1G"), std::string::npos)
      << ReadFile(path("run.err"));
  auto [out2, rc2] = RunToEnd(With({"--config", path("absent.conf")}));
  EXPECT_NE(rc2, 0);
  EXPECT_NE(ReadFile(path("run.err")).find("absent.conf"), std::string::npos) << ReadFile(path("run.err"));
}

TEST_F(ServiceTest, LogLinesCarryThePriorityUnderTheJournal) {
  for (const std::string format : {"auto", "text"}) {
    SCOPED_TRACE(format);
    const std::string log = path("log-" + format);
    WriteFile(log, "");
    struct stat st {};
    ASSERT_EQ(stat(log.c_str(), &st), 0);
    // The journal's stream is stderr: JOURNAL_STREAM names its device and inode.
    const std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    NotifySocket notify(path("notify-" + format + ".sock"));
    Daemon d(With({"--log-format", format}), {"NOTIFY_SOCKET=" + notify.path(), "JOURNAL_STREAM=" + stream}, log);
    std::vector<std::string> seen;
    ASSERT_TRUE(notify.WaitFor("READY=1", &seen)) << ReadFile(log);
    d.Signal(SIGTERM);
    EXPECT_EQ(d.Wait(), 0);
    std::istringstream lines(ReadFile(log));
    std::string first;
    ASSERT_TRUE(std::getline(lines, first));
    if (format == "auto") {
      EXPECT_EQ(first.rfind("<6>primecached: ", 0), 0u) << first;  // info, no timestamp
    } else {
      EXPECT_EQ(first.rfind("20", 0), 0u) << first;  // a timestamp first
    }
  }
}

}  // namespace

// A real Redis Cluster for a test: tools/redis-cluster starts 3 primaries and
// 3 replicas on free loopback ports in a temporary directory; the destructor
// stops them and removes the directory. Plus raw access to one node, for the
// commands a test uses to move slots or watch a failover.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "remote/cluster_client.h"
#include "remote/redis_conn.h"

namespace primecache::remote::testing {

// The output of a shell command, or nullopt when it exited non-zero.
inline std::optional<std::string> RunCommand(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  if (pclose(p) != 0) return std::nullopt;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

class RedisCluster {
 public:
  RedisCluster() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pcredis-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return;
    dir_ = tmpl;
    auto url = RunCommand(Script() + " start " + dir_ + " 2>" + dir_ + "/start.err");
    if (!url) {
      std::ifstream err(dir_ + "/start.err");
      error_.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
      return;
    }
    url_ = *url;
    std::ifstream ports(dir_ + "/ports");
    for (int p; ports >> p;) ports_.push_back(p);
  }
  ~RedisCluster() {
    if (dir_.empty()) return;
    (void)RunCommand(Script() + " stop " + dir_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  bool ok() const { return !url_.empty(); }
  // What tools/redis-cluster said when it could not start the cluster.
  const std::string& error() const { return error_; }
  const std::string& url() const { return url_; }
  const std::vector<int>& ports() const { return ports_; }
  ClusterOptions Options() const {
    ClusterOptions o;
    o.seeds = ParseRedisUrl(url_).value();
    return o;
  }
  void Kill(int port) { ASSERT_TRUE(RunCommand(Script() + " kill " + dir_ + " " + std::to_string(port))); }
  void StopAll() { ASSERT_TRUE(RunCommand(Script() + " stop " + dir_)); }

  // One command on one node, its reply as text ("" for nil).
  static std::string On(const Endpoint& at, std::vector<std::string> argv) {
    auto conn = RedisConn::Open(at, std::chrono::milliseconds(500), std::chrono::milliseconds(2000));
    if (!conn.ok()) return "connect failed: " + conn.status().ToString();
    auto r = (*conn)->Call(argv);
    if (!r.ok()) return "call failed: " + r.status().ToString();
    auto t = ReplyText(r->get(), std::size_t{1} << 30);
    if (!t.ok()) return "error: " + t.status().ToString();
    return t->value_or("");
  }

 private:
  static std::string Script() { return std::string(PRIMECACHE_SOURCE_DIR) + "/tools/redis-cluster"; }
  std::string dir_, url_, error_;
  std::vector<int> ports_;
};

}  // namespace primecache::remote::testing

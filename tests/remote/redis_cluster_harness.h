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
#include <thread>
#include <vector>

#include "remote/cluster_client.h"
#include "remote/redis_conn.h"
#include "remote/tier.h"

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

// What a secured cluster asks of its clients: the default user's password
// on every node, and more of every node's config (ACL "user" lines).
struct RedisSecurity {
  std::string password;
  std::string conf;
};

// A tenant's daemon user and the namespaces it serves.
struct TenantUser {
  RedisAuth auth;
  std::vector<std::string> namespaces;
};

// A cluster whose default user (the operator) has `admin_password` and
// whose tenants' users have the rules `primecachectl remote-acl` prints.
inline RedisSecurity TenantSecurity(std::string admin_password, const std::vector<TenantUser>& tenants) {
  RedisSecurity s;
  s.password = std::move(admin_password);
  for (const TenantUser& t : tenants) {
    s.conf +=
        "user " + t.auth.user + " " + NamespaceAclRules(t.namespaces) + " \">" + t.auth.password + "\"\n";
  }
  return s;
}

class RedisCluster {
 public:
  RedisCluster() : RedisCluster(RedisSecurity{}) {}
  explicit RedisCluster(RedisSecurity security) : admin_{"", security.password} {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pcredis-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return;
    dir_ = tmpl;
    std::string env;
    if (!security.password.empty()) {
      std::ofstream(dir_ + "/password") << security.password << "\n";
      env += "PRIMECACHE_REDIS_PASSWORD_FILE=" + dir_ + "/password ";
    }
    if (!security.conf.empty()) {
      std::ofstream(dir_ + "/security.conf") << security.conf;
      env += "PRIMECACHE_REDIS_CONF_FILE=" + dir_ + "/security.conf ";
    }
    auto url = RunCommand(env + Script() + " start " + dir_ + " 2>" + dir_ + "/start.err");
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
  // Options of a client of the cluster: as its admin (the default user,
  // with the password when the cluster has one), or as `auth` says.
  ClusterOptions Options() const { return Options(admin_); }
  ClusterOptions Options(RedisAuth auth) const {
    ClusterOptions o;
    o.seeds = ParseRedisUrl(url_).value();
    o.auth = std::move(auth);
    return o;
  }
  void Kill(int port) { ASSERT_TRUE(RunCommand(Script() + " kill " + dir_ + " " + std::to_string(port))); }
  void StopAll() { ASSERT_TRUE(RunCommand(Script() + " stop " + dir_)); }

  // The keys of `slot` held by the node at `at` (at most 100).
  static std::vector<std::string> KeysInSlot(const Endpoint& at, int slot) {
    auto conn = RedisConn::Open(at, std::chrono::milliseconds(500), std::chrono::milliseconds(2000));
    if (!conn.ok()) return {};
    auto r = (*conn)->Call({"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), "100"});
    if (!r.ok()) return {};
    auto keys = ReplyStrings(r->get(), 100, 1024);
    return keys.ok() ? *keys : std::vector<std::string>{};
  }

  // Moves `slot` from its owner `from` to `to` as redis-cli --cluster
  // reshard does: IMPORTING on `to`, MIGRATING on `from`, its keys moved
  // with MIGRATE one at a time with `pause` after each (clients meanwhile
  // get ASK for the keys already moved), then the slot given to `to` on
  // every primary. Returns what went wrong, or "" when it moved.
  static std::string MoveSlot(int slot, const Endpoint& from, const Endpoint& to,
                              const std::vector<Endpoint>& primaries, std::chrono::milliseconds pause) {
    const std::string s = std::to_string(slot);
    const std::string from_id = On(from, {"CLUSTER", "MYID"}), to_id = On(to, {"CLUSTER", "MYID"});
    if (std::string r = On(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", from_id}); r != "OK") return "IMPORTING: " + r;
    if (std::string r = On(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", to_id}); r != "OK") return "MIGRATING: " + r;
    for (std::vector<std::string> keys; !(keys = KeysInSlot(from, slot)).empty();) {
      for (const std::string& k : keys) {
        const std::string r = On(from, {"MIGRATE", to.host, std::to_string(to.port), k, "0", "5000"});
        if (r != "OK" && r != "NOKEY") return "MIGRATE " + k + ": " + r;
        std::this_thread::sleep_for(pause);
      }
    }
    // The new owner first, then the old one, then the rest (as redis-cli does).
    if (std::string r = On(to, {"CLUSTER", "SETSLOT", s, "NODE", to_id}); r != "OK") return "NODE on target: " + r;
    if (std::string r = On(from, {"CLUSTER", "SETSLOT", s, "NODE", to_id}); r != "OK") return "NODE on source: " + r;
    for (const Endpoint& p : primaries) {
      if (p == from || p == to) continue;
      if (std::string r = On(p, {"CLUSTER", "SETSLOT", s, "NODE", to_id}); r != "OK") return "NODE: " + r;
    }
    return "";
  }

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
  RedisAuth admin_;
  std::string dir_, url_, error_;
  std::vector<int> ports_;
};

}  // namespace primecache::remote::testing

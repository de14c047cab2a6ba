// Built only into the test variant of the store (see kill_point.h).
#include "statestore/kill_point.h"

#ifndef PRIMECACHE_KILL_POINTS
#error "kill_point.cc belongs to primecache_statestore_killpoints only"
#endif

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace primecache::killpoint {
namespace {

struct Config {
  bool armed = false;
  bool trace = false;
  std::string name;
  unsigned long long nth = 1;
  std::atomic<unsigned long long> hits{0};
};

Config& Get() {
  static Config* config = [] {
    auto* c = new Config();  // never deleted: used until exit
    if (const char* v = std::getenv("PRIMECACHE_KILL_POINT"); v != nullptr && *v != '\0') {
      std::string spec(v);
      auto at = spec.rfind('@');
      if (at != std::string::npos) {
        c->nth = std::strtoull(spec.c_str() + at + 1, nullptr, 10);
        if (c->nth == 0) c->nth = 1;
        spec.resize(at);
      }
      c->name = spec;
      c->armed = true;
    }
    if (const char* t = std::getenv("PRIMECACHE_KILL_TRACE"); t != nullptr && *t == '1') c->trace = true;
    return c;
  }();
  return *config;
}

}  // namespace

void Hit(const char* name) {
  static std::atomic<int> active{-1};  // -1 unknown, 0 off, 1 on
  int a = active.load(std::memory_order_relaxed);
  if (a == 0) return;
  Config& c = Get();
  if (a < 0) active.store((c.armed || c.trace) ? 1 : 0, std::memory_order_relaxed);
  if (!c.armed && !c.trace) return;
  if (c.trace) {
    char line[256];
    int n = std::snprintf(line, sizeof line, "killpoint %s\n", name);
    if (n > 0) {
      ssize_t ignored = ::write(2, line, static_cast<std::size_t>(n) < sizeof line ? n : sizeof line - 1);
      (void)ignored;
    }
  }
  if (c.armed && (c.name == "*" || c.name == name)) {
    if (c.hits.fetch_add(1) + 1 == c.nth) {
      ::kill(::getpid(), SIGKILL);
      ::pause();
    }
  }
}

}  // namespace primecache::killpoint

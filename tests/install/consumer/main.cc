// An engine's view of an installed primecache: this program is built against
// an install prefix only (tests/install/install_test.sh), through the CMake
// package or pkg-config, and talks to a daemon started from that prefix.
//
//   primecache-consumer DATA_SOCKET ADMIN_SOCKET
//
// It connects over shared memory, misses a lookup, sets the byte budget
// through the admin socket and reads it back from the daemon's stats, and
// checks a checksum the library computes. Exit 0 only if all of that holds.
#include <primecache/checksum.h>
#include <primecache/client.h>
#include <primecache/status.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

namespace pc = primecache;

int Fail(const char* what, const pc::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

pc::Result<std::unique_ptr<pc::client::Client>> Connect(const std::string& socket, bool shared_memory) {
  pc::client::ClientOptions o;
  o.endpoint = socket;
  o.client_name = "primecache-consumer";
  o.shared_memory = shared_memory;
  o.shared_memory_bytes = 1u << 20;
  return pc::client::Client::Connect(o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DATA_SOCKET ADMIN_SOCKET\n", argv[0]);
    return 2;
  }
  auto data = Connect(argv[1], /*shared_memory=*/true);
  if (!data.ok()) return Fail("connect", data.status());
  const pc::client::ServerInfo& info = (*data)->server_info();
  std::printf("server %s, protocol %u, admin %d\n", info.server.c_str(), info.version, info.admin ? 1 : 0);
  if (info.version == 0 || info.admin) return Fail("hello", pc::Status::Internal("unexpected server info"));

  const std::vector<std::uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  pc::client::ModelId model;
  model.name = "consumer-model";
  model.digest = pc::Checksum128(std::as_bytes(std::span(model.name.data(), model.name.size())));
  auto hit = (*data)->Lookup(model, tokens);
  if (!hit.ok()) return Fail("lookup", hit.status());
  if (hit->has_value()) return Fail("lookup", pc::Status::Internal("a hit in an empty store"));

  auto admin = Connect(argv[2], /*shared_memory=*/false);
  if (!admin.ok()) return Fail("connect admin", admin.status());
  constexpr std::uint64_t kBudget = 3ull << 30;
  if (pc::Status s = (*admin)->SetByteBudget(kBudget); !s.ok()) return Fail("set capacity", s);
  auto stats = (*data)->Stat();
  if (!stats.ok()) return Fail("stat", stats.status());
  std::printf("entries %llu, budget %llu\n", static_cast<unsigned long long>(stats->store.entries),
              static_cast<unsigned long long>(stats->store.byte_budget));
  if (stats->store.byte_budget != kBudget) return Fail("stat", pc::Status::Internal("budget not applied"));
  std::printf("consumer: ok\n");
  return 0;
}

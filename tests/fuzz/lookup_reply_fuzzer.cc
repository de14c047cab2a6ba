// libFuzzer target: the client's reading of the daemon's lookup answer, the
// hit and its branch point (LookupReply.sharedTokens), through the real
// client library. A crafted daemon (a thread of this process on a Unix
// socket) answers hello as a daemon that fetches by query, and each lookup
// (Client::Lookup) or fetch by query (Client::LookupAndFetch: fetchHit, then
// fetchDone) with the reply the input describes, its bytes corrupted and cut
// short when the input says so (the daemon then ends the connection, so that
// no call waits for an answer that cannot come).
//  - every call returns, an error with a message or a value;
//  - a hit is within its bounds: 1 <= length <= the query's tokens, ranks >=
//    1, and the branch point between the hit's length (0 on a miss) and the
//    query's tokens; on_hit sees only such a hit;
//  - an intact reply of a hit within its bounds is read back as sent (the
//    branch point clamped to [length, tokens], ranks 0 read as 1), and an
//    intact miss is a miss.
// Input layout: [flags][query tokens - 1] then the reply: [found][length
// u32][entry u64][layerCount u32][bytes u64][rawBytes u64][sharedTokens
// u32][ranks u32] (little-endian; missing bytes read 0), then with flags'
// corrupt bit [bytes cut from the end] and 3-byte records [offset u16][xor].
// flags: bit 0 LookupAndFetch (else Lookup), bit 1 ask for the branch point,
// bit 2 corrupt, bit 3 skip_parted_hits.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ipc/framing.h"
#include "ipc/wire.h"
#include "primecache/client.h"
#include "tests/ipc/crafted_server.h"

namespace {

namespace wire = primecache::wire;
namespace ipc = primecache::ipc;
using primecache::LookupHit;
using primecache::client::Client;

#define PC_FUZZ_CHECK(cond)        \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

// What the crafted daemon answers the next lookup or fetch by query with.
struct Script {
  bool found = false;
  std::uint32_t length = 0, layer_count = 0, shared = 0, ranks = 0;
  std::uint64_t entry = 0, bytes = 0, raw_bytes = 0;
  bool corrupt = false;
  std::size_t cut = 0;  // bytes cut from the end of the reply's frame
  std::vector<std::pair<std::uint16_t, std::uint8_t>> flips;
};

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Get() {
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(Byte()) << (8 * i));
    return v;
  }
  std::uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::size_t left() const { return size_ - std::min(at_, size_); }

 private:
  const std::uint8_t* data_;
  std::size_t size_, at_ = 0;
};

class CraftedDaemon {
 public:
  CraftedDaemon() : server_([this](int fd, ipc::Frame& f) { return Answer(fd, f); }) {}
  const std::string& path() const { return server_.path(); }
  void Set(Script s) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(s);
  }

 private:
  using Server = primecache::testing::CraftedServer;
  static void SetReply(wire::LookupReply::Builder h, const Script& s) {
    h.setFound(s.found);
    h.setLength(s.length);
    h.setEntry(s.entry);
    h.setLayerCount(s.layer_count);
    h.setBytes(s.bytes);
    h.setRawBytes(s.raw_bytes);
    h.setSharedTokens(s.shared);
    h.setRanks(s.ranks);
  }
  // False: the connection is to end (after a corrupted reply).
  bool Answer(int fd, ipc::Frame& f) {
    auto rd = f.Reader({});
    auto q = rd->getRoot<wire::Request>();
    const std::uint64_t id = q.getId();
    Script s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = script_;
    }
    if (q.which() == wire::Request::HELLO) {
      Server::PutHello(fd, id, 1u << 20, /*fetch_by_query=*/true, /*device_copies=*/false);
      return true;
    }
    const bool lookup = q.which() == wire::Request::LOOKUP;
    if (!lookup && q.which() != wire::Request::FETCH) return false;
    std::vector<std::byte> reply = ipc::Flatten(*ipc::BuildResponse(
        id, [&](wire::Response::Builder r) { SetReply(lookup ? r.initLookup() : r.initFetchHit(), s); }));
    if (s.corrupt) {
      reply.resize(reply.size() - std::min(s.cut, reply.size()));
      for (const auto& [at, x] : s.flips) {
        if (!reply.empty()) reply[at % reply.size()] ^= static_cast<std::byte>(x);
      }
      Server::Put(fd, reply);
      return false;
    }
    Server::Put(fd, reply);
    if (!lookup) {
      Server::Put(fd, *ipc::BuildResponse(id, [](wire::Response::Builder r) { r.initFetchDone(); }));
    }
    return true;
  }

  std::mutex mu_;
  Script script_;
  Server server_;  // last: its thread stops before the rest goes
};

struct World {
  CraftedDaemon daemon;
  std::unique_ptr<Client> client;
  World() {
    primecache::client::ClientOptions o;
    o.endpoint = daemon.path();
    o.client_name = "lookup-reply-fuzzer";
    o.ns = "t";
    o.timeout = std::chrono::milliseconds(5000);  // every answer comes at once, or the connection ends
    o.reconnect_attempts = 3;
    o.reconnect_backoff = std::chrono::milliseconds(1);
    auto c = Client::Connect(o);
    PC_FUZZ_CHECK(c.ok());
    client = std::move(c).value();
  }
};

// A hit as the client must hand it out for a query of n tokens.
void CheckBounds(const LookupHit& hit, std::size_t n) {
  PC_FUZZ_CHECK(hit.length >= 1 && hit.length <= n);
  PC_FUZZ_CHECK(hit.ranks >= 1);
}

void CheckAsSent(const LookupHit& hit, const Script& s) {
  PC_FUZZ_CHECK(hit.id == s.entry && hit.length == s.length && hit.layers == s.layer_count);
  PC_FUZZ_CHECK(hit.ranks == std::max<std::uint32_t>(s.ranks, 1));
  PC_FUZZ_CHECK(hit.chunk_bytes == s.bytes && hit.raw_bytes == s.raw_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static World* world = new World();
  if (size < 2) return 0;
  Reader in(data, size);
  const std::uint8_t flags = in.Byte();
  const bool by_query = flags & 1, want_shared = flags & 2, skip_parted = flags & 8;
  const std::size_t n = 1 + in.Byte() % 64;
  Script s;
  s.found = in.Byte() & 1;
  s.length = in.Get<std::uint32_t>();
  s.entry = in.Get<std::uint64_t>();
  s.layer_count = in.Get<std::uint32_t>();
  s.bytes = in.Get<std::uint64_t>();
  s.raw_bytes = in.Get<std::uint64_t>();
  s.shared = in.Get<std::uint32_t>();
  s.ranks = in.Get<std::uint32_t>();
  s.corrupt = flags & 4;
  if (s.corrupt) {
    s.cut = in.Byte() % 32;
    while (in.left() >= 3) {
      const auto at = in.Get<std::uint16_t>();
      s.flips.emplace_back(at, in.Byte());
    }
  }
  world->daemon.Set(s);

  std::vector<std::uint32_t> tokens(n);
  for (std::size_t i = 0; i < n; ++i) tokens[i] = static_cast<std::uint32_t>(i + 1);
  const primecache::client::ModelId model{primecache::Hash128{1, 2}, "m", "", {}};
  std::uint64_t shared = ~0ull;
  std::optional<LookupHit> seen;  // what on_hit was told
  primecache::Result<std::optional<LookupHit>> got = std::optional<LookupHit>{};
  if (by_query) {
    primecache::client::FetchCallbacks cb;
    cb.on_hit = [&](const LookupHit& hit) {
      PC_FUZZ_CHECK(!seen);
      CheckBounds(hit, n);
      seen = hit;
      return primecache::Status::Ok();
    };
    cb.skip_parted_hits = skip_parted;
    got = world->client->LookupAndFetch(model, tokens, cb, want_shared ? &shared : nullptr);
  } else {
    got = world->client->Lookup(model, tokens, want_shared ? &shared : nullptr);
  }

  const bool in_bounds = !s.found || (s.length >= 1 && s.length <= n);
  if (!got.ok()) {
    PC_FUZZ_CHECK(!got.status().message().empty());
    // Lookup reads an intact answer within its bounds. (LookupAndFetch may
    // refuse one: its stream ends with no layers where the hit has some.)
    PC_FUZZ_CHECK(by_query || s.corrupt || !in_bounds);
    return 0;
  }
  const std::optional<LookupHit>& hit = *got;
  if (hit) CheckBounds(*hit, n);
  if (want_shared) PC_FUZZ_CHECK(shared >= (hit ? hit->length : 0) && shared <= n);
  if (s.corrupt) return 0;
  // An intact reply: read back as sent.
  if (!s.found) {
    PC_FUZZ_CHECK(!hit);
    if (want_shared) PC_FUZZ_CHECK(shared == std::min<std::uint64_t>(s.shared, n));
    return 0;
  }
  PC_FUZZ_CHECK(hit);
  CheckAsSent(*hit, s);
  if (by_query) PC_FUZZ_CHECK(seen && seen->id == hit->id && seen->length == hit->length);
  if (want_shared) PC_FUZZ_CHECK(shared == std::clamp<std::uint64_t>(s.shared, s.length, n));
  return 0;
}

// libFuzzer target: the daemon's message decoding and dispatch. Input bytes
// are a client's byte stream: framed by FrameDecoder exactly as the server
// frames a socket, each frame handed to a Session over the real store (a
// throwaway one in a temporary directory), store work run inline. Every
// response is read back as a client reads it: it must be one Response whose
// id is 0 or the id of a request this stream sent, and an error must say why.
// With PC_FUZZ_SESSION_TRACE set, each response is printed (request kind,
// answer kind, error) to see which paths a seed reaches.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include <capnp/serialize.h>

#include "ipc/framing.h"
#include "ipc/session.h"
#include "tools/primecached/store_open.h"

namespace {

using namespace primecache::ipc;  // NOLINT

class Inline : public Executor {
 public:
  void Post(std::function<void()> job) override { job(); }
};

#define PC_FUZZ_CHECK(cond)        \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

// Keeps nothing but reads every response, as a client would.
class Drain : public ResponseSink {
 public:
  void Send(std::unique_ptr<OutMessage> m) override {
    bytes += m->size();
    const std::vector<std::byte> flat = Flatten(*m);
    PC_FUZZ_CHECK(flat.size() % sizeof(capnp::word) == 0);
    std::vector<capnp::word> words(flat.size() / sizeof(capnp::word));
    std::memcpy(words.data(), flat.data(), flat.size());
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.data(), words.size()));
    PC_FUZZ_CHECK(reader.getEnd() == words.data() + words.size());  // one message, whole
    const auto r = reader.getRoot<primecache::wire::Response>();
    PC_FUZZ_CHECK(r.getId() == 0 || asked.count(r.getId()) == 1);
    const bool error = r.which() == primecache::wire::Response::ERROR;
    if (error) PC_FUZZ_CHECK(r.getError().getMessage().size() > 0);
    if (trace) {
      std::fprintf(stderr, "answer id=%llu which=%u%s%s\n", static_cast<unsigned long long>(r.getId()),
                   static_cast<unsigned>(r.which()), error ? " error: " : "",
                   error ? r.getError().getMessage().cStr() : "");
    }
  }
  bool WaitForRoom() override { return true; }
  bool Closed() const override { return false; }
  std::size_t bytes = 0;
  std::set<std::uint64_t> asked;  // the ids of the requests read so far
  bool trace = std::getenv("PC_FUZZ_SESSION_TRACE") != nullptr;
};

struct World {
  std::string dir;
  std::unique_ptr<primecache::LocalStore> store;
  ServerCounters counters;
  Inline ex;
  World() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pcfuzz-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    dir = tmpl;
    primecache::daemon::StoreConfig c;
    c.data_dir = dir;
    c.sync_commits = false;
    auto s = primecache::daemon::OpenStore(c);
    if (!s.ok()) std::abort();
    store = std::move(s).value();
  }
  ~World() {
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

World* TheWorld() {
  static World* w = [] {
    auto* x = new World();
    std::atexit([] { delete TheWorld(); });
    return x;
  }();
  return w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  World* w = TheWorld();
  SessionLimits limits;
  limits.frame.max_message_bytes = 1u << 20;
  limits.max_chunk_bytes = 256u << 10;
  PeerInfo peer;
  peer.admin = size > 0 && (data[0] & 1) != 0;  // both kinds of connection
  auto sink = std::make_shared<Drain>();
  auto session = std::make_shared<Session>(w->store.get(), &w->ex, &w->ex, sink, limits, peer, &w->counters);
  FrameDecoder dec(limits.frame, 4096);
  std::vector<Frame> frames;
  std::vector<int> fds;
  std::size_t pos = 0;
  bool open = true;
  while (pos < size && open) {
    auto buf = dec.ReadBuffer();
    // Odd-sized reads, as a socket delivers them.
    const std::size_t n = std::min({buf.size(), size - pos, std::size_t{1} + (pos * 7919) % 3001});
    std::memcpy(buf.data(), data + pos, n);
    pos += n;
    if (!dec.Consume(n, &frames).ok()) break;
    for (auto& f : frames) {
      try {
        auto rd = f.Reader(limits.frame);
        const auto req = rd->getRoot<primecache::wire::Request>();
        sink->asked.insert(req.getId());
        if (sink->trace) {
          std::fprintf(stderr, "request id=%llu which=%u\n", static_cast<unsigned long long>(req.getId()),
                       static_cast<unsigned>(req.which()));
        }
      } catch (const kj::Exception&) {
        // Unreadable: the session answers it with id 0.
      }
      if (session->OnFrame(std::move(f), &fds) == Session::Connection::kClose) {
        open = false;
        break;
      }
    }
    frames.clear();
  }
  session->OnClose();
  return 0;
}

// Runs the real primecached on a temporary data dir and socket for a test
// (through the launcher the benchmarks use too), and speaks raw frames to it
// when a test needs to misbehave.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "primecache/internal/shard.h"
#include "ipc/framing.h"
#include "ipc/wire.h"
#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/snapshot.h"
#include "tests/support/tmpfs.h"
#include "tools/common/daemon_process.h"

namespace primecache::testing {

using namespace primecache::client;  // NOLINT

inline std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "pcipc-XXXXXX").string();
  char* d = mkdtemp(tmpl.data());
  if (d == nullptr) std::abort();
  return tmpl;
}

// The real primecached (tools/common/daemon_process.h) on a fresh temporary
// directory, or on `dir` to reopen a store (a restart), with `extra` flags.
class Daemon : public launcher::DaemonProcess {
 public:
  explicit Daemon(std::vector<std::string> extra = {}, std::string dir = "")
      : DaemonProcess(PRIMECACHED_PATH, std::move(extra), std::move(dir)) {}

  // DaemonProcess::Start as a bool for ASSERT_TRUE, saying why when it fails.
  bool Start() {
    const Status s = DaemonProcess::Start();
    if (!s.ok()) std::fprintf(stderr, "[harness] %s\n", s.ToString().c_str());
    return s.ok();
  }

  ClientOptions Options(std::string ns = "", bool shm = false) const {
    ClientOptions o;
    o.endpoint = socket();
    o.ns = std::move(ns);
    o.shared_memory = shm;
    o.timeout = std::chrono::milliseconds(15000);
    return o;
  }
};

// A raw socket that speaks frames, for tests that misbehave.
class RawConn {
 public:
  explicit RawConn(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() { Close(); }
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  bool SendBytes(const void* p, std::size_t n) {
    auto* b = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t k = send(fd_, b, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      b += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  }
  bool Send(const ipc::OutMessage& m) {
    auto flat = ipc::Flatten(m);
    return SendBytes(flat.data(), flat.size());
  }
  bool Hello(const std::string& ns = "") {
    auto m = ipc::BuildRequest(1, [&](wire::Request::Builder r) {
      auto h = r.initHello();
      h.setMinVersion(1);
      h.setMaxVersion(1);
      h.setNamespace(ns);
    });
    if (!Send(*m)) return false;
    auto f = Next();
    if (!f) return false;
    auto rd = f->Reader({});
    return rd->getRoot<wire::Response>().which() == wire::Response::HELLO;
  }

  // The next response frame, or nullopt on EOF / timeout.
  std::optional<ipc::Frame> Next(int timeout_ms = 10000) {
    ipc::FrameLimits lim;
    lim.max_message_bytes = 512u << 20;
    while (frames_.empty()) {
      pollfd pf{fd_, POLLIN, 0};
      if (poll(&pf, 1, timeout_ms) != 1) return std::nullopt;
      auto buf = dec_.ReadBuffer();
      ssize_t n = recv(fd_, buf.data(), buf.size(), 0);
      if (n <= 0) return std::nullopt;
      if (!dec_.Consume(static_cast<std::size_t>(n), &frames_).ok()) return std::nullopt;
    }
    ipc::Frame f = std::move(frames_.front());
    frames_.erase(frames_.begin());
    return f;
  }
  // True when the daemon closed the connection (EOF) within the timeout.
  bool ClosedByPeer(int timeout_ms = 10000) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      pollfd pf{fd_, POLLIN, 0};
      if (poll(&pf, 1, 100) == 1) {
        char buf[4096];
        ssize_t n = recv(fd_, buf, sizeof(buf), 0);
        if (n <= 0) return true;
      }
    }
    return false;
  }

 private:
  int fd_ = -1;
  ipc::FrameDecoder dec_{[] {
    ipc::FrameLimits l;
    l.max_message_bytes = 512u << 20;
    return l;
  }()};
  std::vector<ipc::Frame> frames_;
};

// Deterministic test content.
inline std::vector<std::byte> Bytes(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 g(seed);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

// Real encoded layers (the store's validator checks every header): even
// layers are MLA latent planes of `len` tokens and `width` floats per row,
// cut every `rows_per_chunk` rows (a power of two); odd layers are KDA
// recurrent states (two eager chunks). Raw transform: bytes are the floats.
inline LayerData ToLayerData(const primecache::EncodedLayer& e) {
  LayerData d;
  const std::string h = SerializeLayerHeader(e.header);
  d.header.assign(reinterpret_cast<const std::byte*>(h.data()), reinterpret_cast<const std::byte*>(h.data()) + h.size());
  for (const auto& c : e.chunks) {
    d.chunks.emplace_back(reinterpret_cast<const std::byte*>(c.data()), reinterpret_cast<const std::byte*>(c.data()) + c.size());
  }
  return d;
}

// Layer l of MakeLayers' entries: a latent layer of `width` floats a row
// when l is even, a small recurrent layer when it is odd.
inline primecache::LayerShape MakeLayersShape(std::uint64_t len, std::uint32_t l, std::uint32_t width = 64) {
  if (l % 2 == 0) return primecache::LatentShape{len, width, 0, 0, 0, false, 0};
  return primecache::RecurrentShape{2, 8, 4};
}

// The plan digest of a model whose entries are MakeLayers' (of any length):
// what its fingerprint's plan_digest must be for the daemon to take them.
inline primecache::Hash128 MakeLayersPlan(std::uint32_t layers, std::uint32_t width = 64) {
  std::vector<primecache::LayerShape> shapes;
  for (std::uint32_t l = 0; l < layers; ++l) shapes.push_back(MakeLayersShape(0, l, width));
  return primecache::PlanDigest(shapes);
}

inline std::vector<LayerData> MakeLayers(std::uint64_t len, std::uint32_t layers, std::uint32_t seed,
                                         std::uint32_t width = 64, std::uint64_t rows_per_chunk = 64) {
  std::vector<LayerData> out;
  std::mt19937 g(seed);
  for (std::uint32_t l = 0; l < layers; ++l) {
    const primecache::LayerShape shape = MakeLayersShape(len, l, width);
    auto snap = primecache::MakeSnapshot(shape);
    if (!snap.ok()) std::abort();
    for (auto plane : primecache::CodecRegistry::Default().KindFor(shape).value()->MutablePlaneData(*snap)) {
      for (float& x : plane) x = static_cast<float>(g() % 100000) * 1e-3f;
    }
    primecache::EncodeOptions eo;
    eo.all_planes = primecache::TransformSpec{std::string(primecache::kRawTransform), 0};
    eo.target_chunk_bytes = rows_per_chunk * width * sizeof(float);
    auto enc = primecache::EncodeLayer(*snap, eo);
    if (!enc.ok()) std::abort();
    out.push_back(ToLayerData(*enc));
  }
  return out;
}

// The parts two TP ranks publish of MakeLayers(len, 2, seed) (a latent
// layer and a recurrent layer of 2 heads; PublishGroup's order): rank 0 the
// latent layer and its head of the recurrent layer, rank 1 its head.
inline std::vector<std::vector<LayerData>> MakeGroupParts(std::uint64_t len, std::uint32_t seed) {
  const std::vector<LayerData> whole = MakeLayers(len, 2, seed);
  std::vector<std::vector<LayerData>> parts(2);
  parts[0].push_back(whole[0]);
  auto header = primecache::ParseLayerHeader(whole[1].header);
  if (!header.ok()) std::abort();
  primecache::EncodedLayer enc{*header, {}};
  for (const auto& c : whole[1].chunks) enc.chunks.emplace_back(reinterpret_cast<const char*>(c.data()), c.size());
  auto snapshot = primecache::DecodeLayer(enc);
  if (!snapshot.ok()) std::abort();
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto shard = primecache::SliceRecurrent(std::get<primecache::RecurrentSnapshot>(*snapshot), 2, r);
    if (!shard.ok()) std::abort();
    primecache::EncodeOptions eo;
    eo.all_planes = primecache::TransformSpec{std::string(primecache::kRawTransform), 0};
    auto one = primecache::EncodeLayer(primecache::LayerSnapshot{*shard}, eo);
    if (!one.ok()) std::abort();
    parts[r].push_back(ToLayerData(*one));
  }
  return parts;
}

inline std::size_t ChunkCount(const std::vector<LayerData>& layers) {
  std::size_t n = 0;
  for (const auto& l : layers) n += l.chunks.size();
  return n;
}

inline std::vector<std::uint32_t> Tokens(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint32_t> t(n);
  std::mt19937 g(seed);
  for (auto& x : t) x = g() % 150000;
  return t;
}

// Runs a program to its end, collecting its exit status, stdout and stderr;
// as another uid (and gid of the same number) when `as_uid` is given. A
// program still running after `limit` is killed (and said so in err).
struct ProcessResult {
  int rc = -1;  // the exit status, or 128 + the signal
  std::string out, err;
};
inline ProcessResult RunProcess(std::vector<std::string> argv_in, std::optional<uid_t> as_uid = std::nullopt,
                                std::chrono::seconds limit = std::chrono::seconds(120)) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) std::abort();
  std::vector<char*> argv;
  for (auto& a : argv_in) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    if (dup2(out_pipe[1], 1) < 0 || dup2(err_pipe[1], 2) < 0) _exit(126);
    if (as_uid.has_value() && (setgid(*as_uid) != 0 || setuid(*as_uid) != 0)) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  ProcessResult r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || poll(fds, 2, static_cast<int>(left.count())) <= 0) {
      kill(pid, SIGKILL);
      r.err += "\n[harness] killed after " + std::to_string(limit.count()) + " s";
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[65536];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

inline ModelId TestModel(std::uint64_t k = 1) { return ModelId{Hash128{0x1234 + k, 0xabcd * k}, "test-model", "", {}}; }

// One response, as a test reads it.
struct Reply {
  std::uint64_t id = 0;
  wire::Response::Which which = wire::Response::ACK;
  wire::ErrorCode code = wire::ErrorCode::INTERNAL;
  std::string message;  // of an error
};

inline std::optional<Reply> NextReply(RawConn& c, int timeout_ms = 10000) {
  auto f = c.Next(timeout_ms);
  if (!f) return std::nullopt;
  auto rd = f->Reader({});
  auto r = rd->getRoot<wire::Response>();
  Reply out;
  out.id = r.getId();
  out.which = r.which();
  if (out.which == wire::Response::ERROR) {
    out.code = r.getError().getCode();
    out.message = r.getError().getMessage().cStr();
  }
  return out;
}

// Raw publish requests (the client library never misbehaves this way): a
// publish of `layers` layers over 16 tokens, chunks of `bytes` zero bytes.
inline bool SendBegin(RawConn& c, std::uint64_t id, std::uint32_t layers, std::uint32_t seed) {
  const auto tokens = Tokens(16, seed);
  return c.Send(*ipc::BuildRequest(id, [&](wire::Request::Builder q) {
    auto pb = q.initPublishBegin();
    pb.setLayerCount(layers);
    auto b = pb.initBoundary();
    b.initFingerprint().setDigestLo(TestModel().digest.lo);
    b.getFingerprint().setDigestHi(TestModel().digest.hi);
    auto t = b.initTokens(static_cast<unsigned>(tokens.size()));
    for (unsigned i = 0; i < tokens.size(); ++i) t.set(i, tokens[i]);
    b.setLength(static_cast<std::uint32_t>(tokens.size()));
  }));
}

inline bool SendLayer(RawConn& c, std::uint64_t id, std::uint64_t pub, std::uint32_t layer, std::uint32_t chunks) {
  return c.Send(*ipc::BuildRequest(id, [&](wire::Request::Builder q) {
    auto l = q.initPublishLayer();
    l.setPublish(pub);
    l.setLayer(layer);
    l.setChunkCount(chunks);
  }));
}

inline bool SendChunk(RawConn& c, std::uint64_t id, std::uint64_t pub, std::uint32_t layer, std::uint32_t index,
                      std::size_t bytes) {
  return c.Send(*ipc::BuildRequest(id, [&](wire::Request::Builder q) {
    auto ch = q.initPublishChunk();
    ch.setPublish(pub);
    ch.setLayer(layer);
    ch.setIndex(index);
    ch.initData().initInline(static_cast<unsigned>(bytes));
  }, bytes / 8 + 64));
}

inline bool SendCommit(RawConn& c, std::uint64_t id, std::uint64_t pub) {
  return c.Send(*ipc::BuildRequest(id, [&](wire::Request::Builder q) { q.initPublishCommit().setPublish(pub); }));
}

// A client on the daemon's admin socket (it may Stat), or null.
inline std::unique_ptr<Client> Admin(const Daemon& d) {
  ClientOptions o = d.Options();
  o.endpoint = d.admin_socket();
  auto c = Client::Connect(o);
  if (!c.ok()) std::fprintf(stderr, "[harness] admin socket: %s\n", c.status().ToString().c_str());
  return c.ok() ? std::move(c).value() : nullptr;
}

// Polls the daemon's stat until `pred` holds or 10 s pass.
template <typename Pred>
inline bool StatBecomes(Client& admin, Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    auto st = admin.Stat();
    if (st.ok() && pred(*st)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Publishes 1 MiB entries of distinct content until the store refuses one
// (at most 100); that refusal.
inline Status FillStore(Client& c) {
  for (std::uint32_t i = 0; i < 100; ++i) {
    Status s = c.Publish(TestModel(), Tokens(4096, 1000 + i), MakeLayers(4096, 1, 1000 + i)).status();
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace primecache::testing

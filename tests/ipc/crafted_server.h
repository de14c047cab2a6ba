// The plumbing of a crafted daemon, for the client's tests and fuzzers that
// answer it with replies no real daemon sends: a Unix socket in a temporary
// directory and one thread that accepts one connection at a time and hands
// every request frame to the answer function, which writes its replies with
// Put and returns false to end the connection. Thread-safety: the answer
// function runs on the server's thread only; destroying the server stops
// that thread and removes the directory.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ipc/framing.h"
#include "ipc/wire.h"

namespace primecache::testing {

class CraftedServer {
 public:
  using AnswerFn = std::function<bool(int fd, ipc::Frame& frame)>;

  explicit CraftedServer(AnswerFn answer) : answer_(std::move(answer)) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pccrafted-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    dir_ = tmpl;
    path_ = dir_ + "/crafted.sock";
    listen_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path_.c_str(), path_.size() + 1);
    if (bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listen_, 4) != 0)
      std::abort();
    thread_ = std::thread([this] { Serve(); });
  }
  ~CraftedServer() {
    stop_ = true;
    shutdown(listen_, SHUT_RDWR);
    thread_.join();
    close(listen_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  CraftedServer(const CraftedServer&) = delete;
  CraftedServer& operator=(const CraftedServer&) = delete;

  const std::string& path() const { return path_; }

  static void Put(int fd, const std::vector<std::byte>& bytes) {
    (void)send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  static void Put(int fd, const ipc::OutMessage& m) { Put(fd, ipc::Flatten(m)); }
  // A hello of this build's protocol from a daemon named "crafted".
  static void PutHello(int fd, std::uint64_t id, std::uint32_t max_message_bytes, bool fetch_by_query,
                       bool device_copies) {
    Put(fd, *ipc::BuildResponse(id, [&](wire::Response::Builder r) {
          auto h = r.initHello();
          h.setVersion(ipc::kMaxProtocolVersion);
          h.setServer("crafted");
          h.setMaxMessageBytes(max_message_bytes);
          h.setMaxChunkBytes(max_message_bytes);
          h.setMaxPublishesInFlight(1);
          h.setDeviceCopies(device_copies);
          h.setFetchByQuery(fetch_by_query);
        }));
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd pf{listen_, POLLIN, 0};
      if (poll(&pf, 1, 100) != 1) continue;
      const int fd = accept(listen_, nullptr, nullptr);
      if (fd < 0) continue;
      Talk(fd);
      close(fd);
    }
  }
  void Talk(int fd) {
    ipc::FrameDecoder dec({});
    std::vector<ipc::Frame> frames;
    while (!stop_) {
      pollfd pf{fd, POLLIN, 0};
      if (poll(&pf, 1, 100) != 1) continue;
      auto buf = dec.ReadBuffer();
      const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0 || !dec.Consume(static_cast<std::size_t>(n), &frames).ok()) return;
      for (ipc::Frame& f : frames) {
        if (!answer_(fd, f)) return;
      }
      frames.clear();
    }
  }

  AnswerFn answer_;
  std::string dir_, path_;
  int listen_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace primecache::testing

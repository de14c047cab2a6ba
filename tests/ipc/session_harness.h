// A daemon Session driven in process: over a real store in a temporary
// directory, its store work run inline (so every request's answers have
// been sent when OnFrame returns), and every response it sends kept.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ipc/framing.h"
#include "ipc/session.h"
#include "tools/primecached/store_open.h"
#include "ipc/wire.h"

namespace primecache::ipc::session_testing {

class InlineExecutor : public Executor {
 public:
  void Post(std::function<void()> job) override { job(); }
};

// The frames of a flattened message (or of several, back to back). A stream
// that cannot be framed fails the test, unless `may_break`: then the frames
// before the break.
inline std::vector<Frame> ToFrames(std::span<const std::byte> flat, bool may_break = false) {
  FrameDecoder dec({});
  std::vector<Frame> out;
  std::size_t pos = 0;
  while (pos < flat.size()) {
    auto buf = dec.ReadBuffer();
    const std::size_t n = std::min(buf.size(), flat.size() - pos);
    std::memcpy(buf.data(), flat.data() + pos, n);
    pos += n;
    const bool ok = dec.Consume(n, &out).ok();
    if (!ok && may_break) break;
    EXPECT_TRUE(ok);
  }
  return out;
}

inline Frame ToFrame(const OutMessage& m) { return std::move(ToFrames(Flatten(m)).at(0)); }

// Keeps every response, decoded back into a frame.
class CollectSink : public ResponseSink {
 public:
  void Send(std::unique_ptr<OutMessage> m) override {
    for (auto& f : ToFrames(Flatten(*m))) frames.push_back(std::move(f));
  }
  bool WaitForRoom() override { return true; }
  bool Closed() const override { return false; }
  std::vector<Frame> frames;
};

// A store in a temporary directory, and a session over it.
class SessionRig {
 public:
  explicit SessionRig(SessionLimits limits = {}, PeerInfo peer = {}) {
    dir_ = (std::filesystem::temp_directory_path() / "pcsess-XXXXXX").string();
    if (mkdtemp(dir_.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    daemon::StoreConfig sc;
    sc.data_dir = dir_;
    sc.sync_commits = false;
    auto opened = daemon::OpenStore(sc);
    if (!opened.ok()) ADD_FAILURE() << opened.status().ToString();
    store = std::move(opened).value();
    sink = std::make_shared<CollectSink>();
    session = std::make_shared<Session>(store.get(), &executor, &executor, sink, limits, std::move(peer), &counters);
  }
  ~SessionRig() {
    if (session) session->OnClose();
    session.reset();
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  SessionRig(const SessionRig&) = delete;
  SessionRig& operator=(const SessionRig&) = delete;

  template <typename F>
  Session::Connection Send(std::uint64_t id, F&& fill) {
    return session->OnFrame(ToFrame(*BuildRequest(id, std::forward<F>(fill))), &fds);
  }

  std::unique_ptr<LocalStore> store;
  ServerCounters counters;
  InlineExecutor executor;
  std::shared_ptr<CollectSink> sink;
  std::shared_ptr<Session> session;
  std::vector<int> fds;

 private:
  std::string dir_;
};

}  // namespace primecache::ipc::session_testing

// The data path's RESP2 reader (remote/resp_reader.h) on a real socketpair,
// fed by a peer thread that writes the replies whole, byte by byte or in
// random fragments, truncated, oversized, malformed or of the wrong type.
// Whatever arrives, a reply is either read exactly or is an error that
// leaves the reader broken and the socket shut down; nothing crashes, hangs
// or lands in the wrong buffer.
#include "remote/resp_reader.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <tuple>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "remote/redis_conn.h"

namespace primecache::remote {
namespace {

using Kind = RespReply::Kind;

// A connected pair: the reader's end and the peer's.
class Pair {
 public:
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    reader_ = fds[0];
    peer_ = fds[1];
    timeval tv{5, 0};  // no test waits this long unless the reader hangs
    ::setsockopt(reader_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~Pair() {
    if (writer_.joinable()) writer_.join();
    ::close(reader_);
    if (peer_ >= 0) ::close(peer_);
  }
  int reader() const { return reader_; }
  int peer() const { return peer_; }
  // Writes `bytes` from a thread in pieces of the sizes `cut` picks (all
  // at once when it is empty), pausing between pieces so that the reader
  // meets each one alone; closes the peer's end afterwards when `close`.
  void Write(std::string bytes, std::function<std::size_t(std::size_t left)> cut = {}, bool close = false) {
    writer_ = std::thread([this, bytes = std::move(bytes), cut = std::move(cut), close] {
      for (std::size_t at = 0; at < bytes.size();) {
        const std::size_t n = cut ? std::max<std::size_t>(1, std::min(cut(bytes.size() - at), bytes.size() - at))
                                  : bytes.size() - at;
        const ssize_t w = ::send(peer_, bytes.data() + at, n, MSG_NOSIGNAL);
        if (w <= 0) break;
        at += static_cast<std::size_t>(w);
        if (cut) std::this_thread::sleep_for(std::chrono::microseconds(30));
      }
      if (close) {
        ::close(peer_);
        peer_ = -1;
      }
    });
  }
  void Join() {
    if (writer_.joinable()) writer_.join();
  }
  // True when the reader's end was shut down (the peer reads end-of-file).
  bool ReaderShutDown() {
    Join();
    pollfd p{peer_, POLLIN, 0};
    if (::poll(&p, 1, 2000) != 1) return false;
    char c;
    return ::recv(peer_, &c, 1, MSG_DONTWAIT) == 0;
  }

 private:
  int reader_ = -1, peer_ = -1;
  std::thread writer_;
};

std::string Bulk(const std::string& v) { return "$" + std::to_string(v.size()) + "\r\n" + v + "\r\n"; }

std::string Pattern(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::span<std::byte> Span(std::string& s) { return std::as_writable_bytes(std::span(s)); }

// A stream of every reply kind the data path meets, and what each must read as.
struct Script {
  std::string wire;
  std::vector<std::string> values;  // the bulk payloads, in order
};

Script Mixed(std::size_t big) {
  Script s;
  s.values = {Pattern(big, 1), Pattern(17, 2), std::string(), Pattern(big / 3 + 1, 3)};
  s.wire = Bulk(s.values[0]) + "$-1\r\n" + "+OK\r\n" + "-MOVED 3999 127.0.0.1:6381\r\n" + ":-42\r\n" +
           Bulk(s.values[1]) + Bulk("not the size asked") + Bulk(s.values[2]) + Bulk(s.values[3]);
  return s;
}

// Reads `s` back, each bulk into a buffer of its expected size.
void ExpectMixed(RespReader& r, const Script& s) {
  auto bulk = [&](const std::string& want) {
    std::string got(want.size(), '\x55');
    auto v = r.Read(Span(got), 1 << 24);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->kind, Kind::kBulk);
    EXPECT_EQ(v->length, want.size());
    EXPECT_TRUE(got == want) << "the payload landed intact";
  };
  bulk(s.values[0]);
  auto nil = r.Read({}, 16);
  ASSERT_TRUE(nil.ok());
  EXPECT_EQ(nil->kind, Kind::kNil);
  auto ok = r.Read({}, 16);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->kind, Kind::kStatus);
  EXPECT_EQ(ok->text, "OK");
  auto err = r.Read({}, 16);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->kind, Kind::kError);
  EXPECT_EQ(ParseRedirect(err->text).kind, Redirect::kMoved);
  EXPECT_EQ(ParseRedirect(err->text).to.port, 6381);
  auto num = r.Read({}, 16);
  ASSERT_TRUE(num.ok());
  EXPECT_EQ(num->kind, Kind::kInteger);
  EXPECT_EQ(num->integer, -42);
  bulk(s.values[1]);
  std::string small(4, '\0');
  auto wrong = r.Read(Span(small), 1 << 24);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(wrong->kind, Kind::kWrongSize) << "a value of another size is dropped, not half-read";
  EXPECT_EQ(wrong->length, 18u);
  bulk(s.values[2]);
  bulk(s.values[3]);
  EXPECT_EQ(r.buffered(), 0u);
  EXPECT_FALSE(r.broken());
}

TEST(RespReader, ReadsEveryReplyKindWrittenAtOnce) {
  Pair p;
  const Script s = Mixed(3 << 20);
  p.Write(s.wire);
  RespReader r(p.reader());
  ExpectMixed(r, s);
}

TEST(RespReader, ReadsRepliesArrivingOneByteAtATime) {
  Pair p;
  const Script s = Mixed(700);
  p.Write(s.wire, [](std::size_t) { return 1; });
  RespReader r(p.reader());
  ExpectMixed(r, s);
}

TEST(RespReader, ReadsRepliesArrivingInRandomFragments) {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Pair p;
    const Script s = Mixed(1 << 20);
    std::mt19937_64 rng(seed);
    // Mostly small pieces (headers split anywhere), now and then a large one.
    p.Write(s.wire, [rng](std::size_t) mutable { return rng() % 8 == 0 ? rng() % 300000 : rng() % 40; });
    RespReader r(p.reader());
    ExpectMixed(r, s);
  }
}

// Every strict prefix of a stream, the peer then closing: each read either
// returns a whole reply that is right or fails; none returns a wrong one.
TEST(RespReader, ATruncatedReplyIsAnErrorAtEveryCut) {
  const Script s = Mixed(40);
  // The replies of Mixed in order: the destination size each is read into,
  // the kind it must be, and the payload a bulk must hold.
  const std::vector<std::tuple<std::size_t, Kind, const std::string*>> want = {
      {40, Kind::kBulk, &s.values[0]}, {0, Kind::kNil, nullptr},      {0, Kind::kStatus, nullptr},
      {0, Kind::kError, nullptr},      {0, Kind::kInteger, nullptr},  {17, Kind::kBulk, &s.values[1]},
      {4, Kind::kWrongSize, nullptr},  {0, Kind::kBulk, &s.values[2]}, {14, Kind::kBulk, &s.values[3]},
  };
  for (std::size_t cut = 0; cut < s.wire.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    Pair p;
    p.Write(s.wire.substr(0, cut), {}, true);
    RespReader r(p.reader());
    Status last = Status::Ok();
    for (std::size_t i = 0; i < want.size() && last.ok(); ++i) {
      const auto& [size, kind, payload] = want[i];
      std::string into(size, '\0');
      auto v = r.Read(Span(into), 1 << 20);
      last = v.status();
      if (!v.ok()) break;
      EXPECT_EQ(v->kind, kind) << "reply " << i;
      if (payload != nullptr) {
        EXPECT_TRUE(into == *payload) << "reply " << i;
      }
    }
    EXPECT_FALSE(last.ok()) << "the stream ended early, yet every reply read";
    EXPECT_EQ(last.code(), StatusCode::kIOError) << last.ToString();
    EXPECT_TRUE(r.broken());
    std::string into(40, '\0');
    EXPECT_FALSE(r.Read(Span(into), 1 << 20).ok()) << "a broken reader reads nothing more";
  }
}

TEST(RespReader, ALengthOverTheBoundIsRefusedBeforeAnyPayloadIsRead) {
  for (const std::string head : {"$1001\r\n", "$18446744073709551615\r\n", "$99999999999999999999999\r\n"}) {
    SCOPED_TRACE(head);
    Pair p;
    p.Write(head + std::string(1001, 'x') + "\r\n");
    RespReader r(p.reader());
    std::string into(1001, '\0');
    auto v = r.Read(Span(into), 1000);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << v.status().ToString();
    EXPECT_EQ(into, std::string(1001, '\0')) << "nothing of a refused payload reached the buffer";
    EXPECT_TRUE(r.broken());
    EXPECT_TRUE(p.ReaderShutDown()) << "the connection was shut down";
  }
}

TEST(RespReader, MalformedLengthsAndLinesAreCorruption) {
  const std::vector<std::string> bad = {
      "$-2\r\n",  "$-0\r\n",     "$+5\r\nhello\r\n", "$5x\r\nhello\r\n", "$\r\n",     "$ 5\r\nhello\r\n",
      ":abc\r\n", ":+1\r\n",     ":\r\n",            "$5\nhello\r\n",    "\r\n",      "$5\r\nhelloXY",
      "_\r\n",    "%1\r\n",      "#t\r\n",           ",1.5\r\n",         "=3\r\ntxt",  "$0x10\r\n",
  };
  for (const std::string& b : bad) {
    SCOPED_TRACE(b);
    Pair p;
    p.Write(b + "+OK\r\n");
    RespReader r(p.reader());
    std::string into(5, '\0');
    auto v = r.Read(Span(into), 1 << 20);
    ASSERT_FALSE(v.ok()) << "read as kind " << static_cast<int>(v->kind);
    EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << v.status().ToString();
    EXPECT_TRUE(r.broken());
    EXPECT_TRUE(p.ReaderShutDown());
  }
}

TEST(RespReader, ALineWithNoEndIsRefusedWithoutWaitingForMore) {
  Pair p;
  p.Write("-" + std::string(kMaxRespLine + 100, 'e'));  // and then nothing: the peer stays open
  RespReader r(p.reader());
  const auto t0 = std::chrono::steady_clock::now();
  auto v = r.Read({}, 16);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << v.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4)) << "refused on the bound, not the timeout";
}

TEST(RespReader, AnArrayWhereAValueIsExpectedIsRefused) {
  Pair p;
  p.Write("*2\r\n$1\r\na\r\n$1\r\nb\r\n");
  RespReader r(p.reader());
  std::string into(1, '\0');
  auto v = r.Read(Span(into), 16);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(r.broken());
  EXPECT_TRUE(p.ReaderShutDown());
}

TEST(RespReader, APeerThatStallsMidPayloadTimesOut) {
  Pair p;
  timeval tv{0, 200000};
  ::setsockopt(p.reader(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  p.Write("$100\r\n" + std::string(50, 'x'));
  RespReader r(p.reader());
  std::string into(100, '\0');
  auto v = r.Read(Span(into), 1000);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kIOError);
  EXPECT_NE(v.status().message().find("timed out"), std::string::npos) << v.status().ToString();
}

TEST(SendAll, SendsEveryByteOfManyAndLargePieces) {
  Pair p;
  std::vector<std::string> pieces;
  for (int i = 0; i < 2500; ++i) pieces.push_back(Pattern(1 + i % 7, i));  // over IOV_MAX pieces
  pieces.push_back(Pattern(6 << 20, 99));                                    // over the socket's buffer
  std::string want;
  std::vector<iovec> iov;
  for (std::string& s : pieces) {
    want += s;
    iov.push_back(iovec{s.data(), s.size()});
  }
  std::string got;
  std::thread peer([&] {
    std::vector<char> buf(1 << 16);
    while (got.size() < want.size()) {
      const ssize_t n = ::recv(p.peer(), buf.data(), buf.size(), 0);
      if (n <= 0) break;
      got.append(buf.data(), static_cast<std::size_t>(n));
    }
  });
  EXPECT_TRUE(SendAll(p.reader(), iov).ok());
  peer.join();
  EXPECT_TRUE(got == want);
}

TEST(SendAll, APeerThatIsGoneIsAnErrorNotASignal) {
  Pair p;
  ::shutdown(p.peer(), SHUT_RDWR);
  std::string big(1 << 20, 'x');
  iovec iov{big.data(), big.size()};
  Status s = Status::Ok();
  for (int i = 0; i < 8 && s.ok(); ++i) s = SendAll(p.reader(), std::span(&iov, 1));
  EXPECT_EQ(s.code(), StatusCode::kIOError);
}

}  // namespace
}  // namespace primecache::remote

// One hiredis connection and the reply helpers the cluster client needs.
// RedisConn owns its redisContext; it is used by one thread at a time (the
// cluster client's per-node pools hand each out to one caller).
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "primecache/status.h"
#include "remote/cluster_client.h"
#include "remote/resp_reader.h"

namespace primecache::remote {

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

class RedisConn {
 public:
  // Connects and, when `auth` holds a password, authenticates (AUTH) before
  // returning: a refusal is kFailedPrecondition (RefusalStatus).
  static Result<std::unique_ptr<RedisConn>> Open(const Endpoint& at,
                                                 std::chrono::milliseconds connect_timeout,
                                                 std::chrono::milliseconds io_timeout,
                                                 const RedisAuth& auth = {});
  ~RedisConn();
  RedisConn(const RedisConn&) = delete;
  RedisConn& operator=(const RedisConn&) = delete;

  // Queues one command (sent with the next Read).
  Status Append(const std::vector<std::string>& argv);
  // The next reply. An IOError means the connection is unusable.
  Result<ReplyPtr> Read();
  // Append then Read.
  Result<ReplyPtr> Call(const std::vector<std::string>& argv);

  // The data path on the same socket, past hiredis (remote/resp_reader.h):
  // Send writes commands already encoded, ReadData reads one reply. Each
  // fails (kIOError) while hiredis holds a command it has not sent or bytes
  // it has not parsed, and Append/Read fail while the data path's reader
  // holds unread bytes, so the two never interleave within a reply. After
  // a data-path error the connection is shut down: drop it.
  Status Send(std::span<iovec> iov);
  Result<RespReply> ReadData(std::span<std::byte> into, std::uint64_t max_bulk);
  const Endpoint& endpoint() const { return at_; }

 private:
  RedisConn(redisContext* c, Endpoint at) : c_(c), at_(std::move(at)), data_(c->fd) {}
  Status Authenticate(const RedisAuth& auth);
  Status ContextError(const char* what) const;
  Status HiredisIdle() const;
  Status DataIdle() const;
  redisContext* c_;
  Endpoint at_;
  RespReader data_;
};

// What an error reply asks of the client.
struct Redirect {
  enum Kind { kNone, kMoved, kAsk } kind = kNone;
  Endpoint to;
};
Redirect ParseRedirect(const redisReply* r);
Redirect ParseRedirect(std::string_view error_text);
// Error replies worth another try after a pause: the cluster is electing,
// migrating or loading.
bool IsTransientError(const redisReply* r);
bool IsTransientError(std::string_view error_text);
// An error reply as a Status: a refusal of who we are (NOAUTH, WRONGPASS,
// NOPERM) is kFailedPrecondition saying what to fix, anything else kIOError;
// `where` names the node or command ("redis 10.0.0.5:7000").
Status ErrorReplyStatus(std::string_view where, std::string_view error_text);
// A reply as text: strings and statuses as they are, integers in decimal, nil
// as nullopt; error replies become ErrorReplyStatus, other types kIOError.
// Strings longer than max_bytes are refused (kCorruption).
Result<std::optional<std::string>> ReplyText(const redisReply* r, std::size_t max_bytes);
// An array reply of strings, at most max_items of at most max_bytes each.
Result<std::vector<std::string>> ReplyStrings(const redisReply* r, std::size_t max_items, std::size_t max_bytes);

}  // namespace primecache::remote

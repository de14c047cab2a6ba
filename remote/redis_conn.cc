#include "remote/redis_conn.h"

#include <hiredis/sds.h>

#include <charconv>

namespace primecache::remote {
namespace {

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

std::string_view ErrorText(const redisReply* r) { return {r->str, r->len}; }

}  // namespace

Result<std::unique_ptr<RedisConn>> RedisConn::Open(const Endpoint& at,
                                                   std::chrono::milliseconds connect_timeout,
                                                   std::chrono::milliseconds io_timeout,
                                                   const RedisAuth& auth) {
  redisContext* c = redisConnectWithTimeout(at.host.c_str(), at.port, ToTimeval(connect_timeout));
  if (c == nullptr) return Status::ResourceExhausted("redis " + at.ToString() + ": cannot allocate a connection");
  if (c->err != 0) {
    Status s = Status::Unavailable("redis " + at.ToString() + ": " + c->errstr);
    redisFree(c);
    return s;
  }
  if (redisSetTimeout(c, ToTimeval(io_timeout)) != REDIS_OK) {
    redisFree(c);
    return Status::IOError("redis " + at.ToString() + ": cannot set the timeout");
  }
  std::unique_ptr<RedisConn> conn(new RedisConn(c, at));
  if (!auth.empty()) PC_RETURN_IF_ERROR(conn->Authenticate(auth));
  return conn;
}

Status RedisConn::Authenticate(const RedisAuth& auth) {
  std::vector<std::string> argv{"AUTH"};
  if (!auth.user.empty()) argv.push_back(auth.user);
  argv.push_back(auth.password);
  PC_ASSIGN_OR_RETURN(ReplyPtr r, Call(argv));
  if (r->type == REDIS_REPLY_ERROR) {
    return ErrorReplyStatus("redis " + at_.ToString() + " (as " + auth.Who() + ")", ErrorText(r.get()));
  }
  if (r->type != REDIS_REPLY_STATUS)
    return Status::IOError("redis " + at_.ToString() + ": AUTH was not answered OK");
  return Status::Ok();
}

RedisConn::~RedisConn() { redisFree(c_); }

Status RedisConn::ContextError(const char* what) const {
  return Status::IOError("redis " + at_.ToString() + " " + what + ": " + (c_->err != 0 ? c_->errstr : "unknown error"));
}

Status RedisConn::HiredisIdle() const {
  if (sdslen(c_->obuf) != 0 || c_->reader->len > c_->reader->pos) {
    return Status::IOError("redis " + at_.ToString() + ": the data path met hiredis mid-command");
  }
  return Status::Ok();
}

Status RedisConn::DataIdle() const {
  if (data_.broken() || data_.buffered() != 0) {
    return Status::IOError("redis " + at_.ToString() + ": hiredis met the data path mid-reply");
  }
  return Status::Ok();
}

Status RedisConn::Send(std::span<iovec> iov) {
  PC_RETURN_IF_ERROR(HiredisIdle());
  Status s = SendAll(c_->fd, iov);
  if (!s.ok()) return Status::IOError("redis " + at_.ToString() + ": " + s.message());
  return s;
}

Result<RespReply> RedisConn::ReadData(std::span<std::byte> into, std::uint64_t max_bulk) {
  PC_RETURN_IF_ERROR(HiredisIdle());
  return data_.Read(into, max_bulk);
}

Status RedisConn::Append(const std::vector<std::string>& argv) {
  PC_RETURN_IF_ERROR(DataIdle());
  std::vector<const char*> ptrs(argv.size());
  std::vector<std::size_t> lens(argv.size());
  for (std::size_t i = 0; i < argv.size(); ++i) {
    ptrs[i] = argv[i].data();
    lens[i] = argv[i].size();
  }
  if (redisAppendCommandArgv(c_, static_cast<int>(argv.size()), ptrs.data(), lens.data()) != REDIS_OK) {
    return ContextError("append");
  }
  return Status::Ok();
}

Result<ReplyPtr> RedisConn::Read() {
  PC_RETURN_IF_ERROR(DataIdle());
  void* reply = nullptr;
  if (redisGetReply(c_, &reply) != REDIS_OK || reply == nullptr) return ContextError("read");
  return ReplyPtr(static_cast<redisReply*>(reply));
}

Result<ReplyPtr> RedisConn::Call(const std::vector<std::string>& argv) {
  PC_RETURN_IF_ERROR(Append(argv));
  return Read();
}

Redirect ParseRedirect(const redisReply* r) {
  if (r == nullptr || r->type != REDIS_REPLY_ERROR) return {};
  return ParseRedirect(ErrorText(r));
}

Redirect ParseRedirect(std::string_view text) {
  // "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>".
  Redirect out;
  if (text.starts_with("MOVED ")) {
    out.kind = Redirect::kMoved;
  } else if (text.starts_with("ASK ")) {
    out.kind = Redirect::kAsk;
  } else {
    return {};
  }
  const std::size_t space = text.rfind(' ');
  auto to = ParseRedisUrl(text.substr(space + 1));
  if (!to.ok() || to->size() != 1) return {};
  out.to = (*to)[0];
  return out;
}

Status ErrorReplyStatus(std::string_view where, std::string_view text) {
  const std::string said = std::string(where) + ": " + std::string(text);
  if (text.starts_with("NOAUTH")) {
    return Status::FailedPrecondition(said +
                                      " (the cluster requires a password: give the tier its credentials, "
                                      "docs/cluster.md, \"Authentication and tenants\")");
  }
  if (text.starts_with("WRONGPASS")) {
    return Status::FailedPrecondition(said + " (the cluster refused the tier's user name or password)");
  }
  if (text.starts_with("NOPERM")) {
    return Status::FailedPrecondition(said +
                                      " (the cluster's ACL does not let the tier's user do this: a "
                                      "namespace outside its key prefix, or a command it is not given)");
  }
  return Status::IOError(said);
}

bool IsTransientError(const redisReply* r) {
  if (r == nullptr || r->type != REDIS_REPLY_ERROR) return false;
  return IsTransientError(ErrorText(r));
}

bool IsTransientError(std::string_view text) {
  for (std::string_view prefix : {"CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN"}) {
    if (text.starts_with(prefix)) return true;
  }
  return false;
}

Result<std::optional<std::string>> ReplyText(const redisReply* r, std::size_t max_bytes) {
  switch (r->type) {
    case REDIS_REPLY_NIL:
      return std::optional<std::string>();
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      if (r->len > max_bytes) {
        return Status::Corruption("redis reply of " + std::to_string(r->len) + " bytes is over the limit of " +
                                  std::to_string(max_bytes));
      }
      return std::optional<std::string>(std::string(r->str, r->len));
    case REDIS_REPLY_INTEGER:
      return std::optional<std::string>(std::to_string(r->integer));
    case REDIS_REPLY_ERROR:
      return ErrorReplyStatus("redis", ErrorText(r));
    default:
      return Status::IOError("redis: unexpected reply type " + std::to_string(r->type));
  }
}

Result<std::vector<std::string>> ReplyStrings(const redisReply* r, std::size_t max_items, std::size_t max_bytes) {
  if (r->type == REDIS_REPLY_ERROR) return ErrorReplyStatus("redis", ErrorText(r));
  if (r->type != REDIS_REPLY_ARRAY) return Status::IOError("redis: expected an array, got type " + std::to_string(r->type));
  if (r->elements > max_items) {
    return Status::Corruption("redis reply of " + std::to_string(r->elements) + " items is over the limit of " +
                              std::to_string(max_items));
  }
  std::vector<std::string> out;
  out.reserve(r->elements);
  for (std::size_t i = 0; i < r->elements; ++i) {
    PC_ASSIGN_OR_RETURN(auto item, ReplyText(r->element[i], max_bytes));
    if (!item) return Status::IOError("redis: a nil item in an array reply");
    out.push_back(std::move(*item));
  }
  return out;
}

}  // namespace primecache::remote

#include "remote/resp_reader.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>

#include "core/errno_text.h"

namespace primecache::remote {
namespace {

Status RecvError(ssize_t n, int err) {
  if (n == 0) return Status::IOError("redis: the connection closed in the middle of a reply");
  if (err == EAGAIN || err == EWOULDBLOCK) return Status::IOError("redis: timed out reading a reply");
  return Status::IOError(ErrnoText("redis: recv", err));
}

// A decimal length or integer of a RESP line, all of it; nullopt for
// anything else (empty, a sign where none belongs, junk, overflow).
std::optional<long long> Decimal(std::string_view s, bool allow_sign) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  if (!allow_sign && (s[0] == '-' || s[0] == '+')) return std::nullopt;
  if (s[0] == '+') return std::nullopt;
  long long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

RespReader::RespReader(int fd) : fd_(fd), buf_(new char[kRespBufferBytes]) {}

Status RespReader::Fail(Status s) {
  if (!broken_) {
    broken_ = true;
    ::shutdown(fd_, SHUT_RDWR);
  }
  return s;
}

Status RespReader::Fill(std::size_t most) {
  if (pos_ == end_) {
    pos_ = end_ = 0;
  } else if (end_ == kRespBufferBytes) {
    std::memmove(buf_.get(), buf_.get() + pos_, end_ - pos_);
    end_ -= pos_;
    pos_ = 0;
  }
  for (;;) {
    const ssize_t n = ::recv(fd_, buf_.get() + end_, std::min(most, kRespBufferBytes - end_), 0);
    if (n > 0) {
      end_ += static_cast<std::size_t>(n);
      return Status::Ok();
    }
    if (n < 0 && errno == EINTR) continue;
    return RecvError(n, errno);
  }
}

// The next line without its "\r\n"; valid until the next read.
Result<std::string_view> RespReader::Line() {
  for (std::size_t scanned = 0;;) {
    const char* base = buf_.get() + pos_;
    const std::size_t have = end_ - pos_;
    const void* lf = have > scanned ? std::memchr(base + scanned, '\n', have - scanned) : nullptr;
    if (lf != nullptr) {
      const std::size_t len = static_cast<std::size_t>(static_cast<const char*>(lf) - base);
      if (len == 0 || base[len - 1] != '\r') return Status::Corruption("redis: a reply line not ended by CRLF");
      if (len - 1 > kMaxRespLine) break;
      pos_ += len + 1;
      return std::string_view(base, len - 1);
    }
    if (have > kMaxRespLine + 1) break;
    scanned = have;
    PC_RETURN_IF_ERROR(Fill(kRespHeaderRecv));
  }
  return Status::Corruption("redis: a reply line over " + std::to_string(kMaxRespLine) + " bytes");
}

Status RespReader::Payload(std::span<std::byte> into) {
  const std::size_t from_buf = std::min(into.size(), end_ - pos_);
  std::memcpy(into.data(), buf_.get() + pos_, from_buf);
  pos_ += from_buf;
  for (std::size_t got = from_buf; got < into.size();) {
    const ssize_t n = ::recv(fd_, into.data() + got, into.size() - got, MSG_WAITALL);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return RecvError(n, errno);
  }
  return Status::Ok();
}

Status RespReader::Drain(std::uint64_t n) {
  while (n > 0) {
    if (pos_ == end_) PC_RETURN_IF_ERROR(Fill(kRespBufferBytes));
    const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(n, end_ - pos_));
    pos_ += take;
    n -= take;
  }
  return Status::Ok();
}

Status RespReader::Trailer() {
  while (end_ - pos_ < 2) PC_RETURN_IF_ERROR(Fill(kRespHeaderRecv));
  if (buf_[pos_] != '\r' || buf_[pos_ + 1] != '\n') return Status::Corruption("redis: a bulk string not ended by CRLF");
  pos_ += 2;
  return Status::Ok();
}

Result<RespReply> RespReader::ReadOne(std::span<std::byte> into, std::uint64_t max_bulk) {
  PC_ASSIGN_OR_RETURN(std::string_view line, Line());
  if (line.empty()) return Status::Corruption("redis: an empty reply line");
  const char type = line[0];
  const std::string_view rest = line.substr(1);
  RespReply r;
  switch (type) {
    case '+':
    case '-':
      r.kind = type == '+' ? RespReply::Kind::kStatus : RespReply::Kind::kError;
      r.text.assign(rest);
      return r;
    case ':': {
      const auto v = Decimal(rest, true);
      if (!v) return Status::Corruption("redis: a malformed integer reply");
      r.kind = RespReply::Kind::kInteger;
      r.integer = *v;
      return r;
    }
    case '$':
      break;
    case '*':
      return Status::IOError("redis: an array reply where a value was expected");
    default:
      return Status::Corruption("redis: a reply of unknown type byte " + std::to_string(static_cast<unsigned char>(type)));
  }
  if (rest == "-1") return r;  // nil
  const auto len = Decimal(rest, false);
  if (!len) return Status::Corruption("redis: a malformed bulk length \"" + std::string(rest.substr(0, 32)) + "\"");
  const auto n = static_cast<std::uint64_t>(*len);
  if (n > max_bulk) {
    return Status::Corruption("redis value of " + std::to_string(n) + " bytes is over the limit of " +
                              std::to_string(max_bulk));
  }
  r.length = n;
  if (n == into.size()) {
    r.kind = RespReply::Kind::kBulk;
    PC_RETURN_IF_ERROR(Payload(into));
  } else {
    r.kind = RespReply::Kind::kWrongSize;
    PC_RETURN_IF_ERROR(Drain(n));
  }
  PC_RETURN_IF_ERROR(Trailer());
  return r;
}

Result<RespReply> RespReader::Read(std::span<std::byte> into, std::uint64_t max_bulk) {
  if (broken_) return Status::IOError("redis: the connection lost its place in the reply stream");
  Result<RespReply> r = ReadOne(into, max_bulk);
  if (!r.ok()) return Fail(r.status());
  return r;
}

Status SendAll(int fd, std::span<iovec> iov) {
  while (!iov.empty()) {
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = std::min<std::size_t>(iov.size(), IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::IOError("redis: timed out sending a command");
      return Status::IOError(ErrnoText("redis: send"));
    }
    auto left = static_cast<std::size_t>(n);
    while (!iov.empty() && left >= iov.front().iov_len) {
      left -= iov.front().iov_len;
      iov = iov.subspan(1);
    }
    if (left > 0) {
      iov.front().iov_base = static_cast<char*>(iov.front().iov_base) + left;
      iov.front().iov_len -= left;
    }
  }
  return Status::Ok();
}

void AppendBulkHeader(std::string& out, std::size_t len) {
  out += '$';
  out += std::to_string(len);
  out += "\r\n";
}

}  // namespace primecache::remote

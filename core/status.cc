#include "primecache/status.h"

namespace primecache {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorruption: return "corruption";
    case StatusCode::kIOError: return "I/O error";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kFailedPrecondition: return "failed precondition";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kAlreadyExists: return "already exists";
    case StatusCode::kAborted: return "aborted";
    case StatusCode::kDeadlineExceeded: return "deadline exceeded";
    case StatusCode::kNotSupported: return "not supported";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown status code";
}

Status::Status(StatusCode code, std::string message)
    : code_(code), message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  if (!message_.empty()) {
    msg += ": ";
    msg += message_;
  }
  return {code_, std::move(msg)};
}

}  // namespace primecache

// Status and Result<T>: the error values every fallible primecache call returns.
//
// A Status is either OK or a (code, message) pair. Result<T> holds a T or a
// non-OK Status. Neither throws; both are cheap to move. They are plain values:
// a given object is not synchronised, distinct objects may be used from any
// thread.
#pragma once

#include <cassert>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace primecache {

enum class StatusCode : std::uint8_t {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kCorruption,
  kIOError,
  kResourceExhausted,
  kFailedPrecondition,
  kUnavailable,
  kAlreadyExists,
  kAborted,
  kDeadlineExceeded,
  kNotSupported,
  kInternal,
};

// The stable, human-readable name of a code ("invalid argument", ...).
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status IOError(std::string msg) { return {StatusCode::kIOError, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) { return {StatusCode::kDeadlineExceeded, std::move(msg)}; }
  static Status NotSupported(std::string msg) { return {StatusCode::kNotSupported, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  bool IsInvalidArgument() const { return code_ == StatusCode::kInvalidArgument; }
  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }
  bool IsCorruption() const { return code_ == StatusCode::kCorruption; }
  bool IsIOError() const { return code_ == StatusCode::kIOError; }
  bool IsResourceExhausted() const { return code_ == StatusCode::kResourceExhausted; }
  bool IsFailedPrecondition() const { return code_ == StatusCode::kFailedPrecondition; }
  bool IsUnavailable() const { return code_ == StatusCode::kUnavailable; }

  // "OK", or "<code name>: <message>".
  std::string ToString() const;

  // The same code with "context: " put before the message; OK stays OK.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A T, or the Status that explains why there is none. Constructing a Result
// from an OK Status is a programming error and becomes kInternal.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) {
      v_ = Status::Internal("Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }

  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }

  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace primecache

#define PC_CONCAT_INNER_(a, b) a##b
#define PC_CONCAT_(a, b) PC_CONCAT_INNER_(a, b)

// Evaluates a Status expression and returns it from the caller when not OK.
#define PC_RETURN_IF_ERROR(expr)                          \
  do {                                                    \
    ::primecache::Status pc_status_ = (expr);             \
    if (!pc_status_.ok()) return pc_status_;              \
  } while (0)

// `PC_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define PC_ASSIGN_OR_RETURN(lhs, expr) \
  PC_ASSIGN_OR_RETURN_IMPL_(PC_CONCAT_(pc_result_, __LINE__), lhs, expr)
#define PC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#include "ipc/wire.h"

#include <string>

namespace primecache::ipc {

wire::ErrorCode ToWireCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
    case StatusCode::kInternal: return wire::ErrorCode::INTERNAL;
    case StatusCode::kInvalidArgument: return wire::ErrorCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound: return wire::ErrorCode::NOT_FOUND;
    case StatusCode::kCorruption: return wire::ErrorCode::CORRUPTION;
    case StatusCode::kIOError: return wire::ErrorCode::IO_ERROR;
    case StatusCode::kResourceExhausted: return wire::ErrorCode::RESOURCE_EXHAUSTED;
    case StatusCode::kFailedPrecondition: return wire::ErrorCode::FAILED_PRECONDITION;
    case StatusCode::kUnavailable: return wire::ErrorCode::UNAVAILABLE;
    case StatusCode::kAlreadyExists: return wire::ErrorCode::ALREADY_EXISTS;
    case StatusCode::kAborted: return wire::ErrorCode::ABORTED;
    case StatusCode::kDeadlineExceeded: return wire::ErrorCode::DEADLINE_EXCEEDED;
    case StatusCode::kNotSupported: return wire::ErrorCode::NOT_SUPPORTED;
  }
  return wire::ErrorCode::INTERNAL;
}

Status FromWireError(wire::ErrorCode code, std::string message) {
  switch (code) {
    case wire::ErrorCode::INTERNAL: return Status::Internal(std::move(message));
    case wire::ErrorCode::INVALID_ARGUMENT: return Status::InvalidArgument(std::move(message));
    case wire::ErrorCode::NOT_FOUND: return Status::NotFound(std::move(message));
    case wire::ErrorCode::CORRUPTION: return Status::Corruption(std::move(message));
    case wire::ErrorCode::IO_ERROR: return Status::IOError(std::move(message));
    case wire::ErrorCode::RESOURCE_EXHAUSTED: return Status::ResourceExhausted(std::move(message));
    case wire::ErrorCode::FAILED_PRECONDITION: return Status::FailedPrecondition(std::move(message));
    case wire::ErrorCode::UNAVAILABLE: return Status::Unavailable(std::move(message));
    case wire::ErrorCode::ALREADY_EXISTS: return Status::AlreadyExists(std::move(message));
    case wire::ErrorCode::ABORTED: return Status::Aborted(std::move(message));
    case wire::ErrorCode::DEADLINE_EXCEEDED: return Status::DeadlineExceeded(std::move(message));
    case wire::ErrorCode::NOT_SUPPORTED: return Status::NotSupported(std::move(message));
    case wire::ErrorCode::PERMISSION_DENIED: return Status::FailedPrecondition("permission denied: " + message);
    case wire::ErrorCode::PROTOCOL: return Status::InvalidArgument("protocol: " + message);
  }
  return Status::Internal("unknown error code " + std::to_string(static_cast<int>(code)) + ": " + message);
}

std::unique_ptr<OutMessage> ErrorResponse(std::uint64_t id, wire::ErrorCode code, const std::string& message) {
  return BuildResponse(id, [&](wire::Response::Builder r) {
    auto e = r.initError();
    e.setCode(code);
    e.setMessage(message);
  });
}

}  // namespace primecache::ipc

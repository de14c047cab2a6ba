// What a session's request handler gives back: the one answer to its request.
//
// Every handler returns an Answer, and only Session::Deliver turns one into
// bytes for the client, so an error path cannot forget to answer: it returns
// its error (a Status, or one of the two wire codes no StatusCode has) and
// the dispatcher sends it. A handler whose work runs on a worker returns the
// Queued() answer that Session::Serve and the publish queue hand back, and
// that work's own Answer is delivered when it ends. Internal to the daemon.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ipc/framing.h"
#include "ipc/primecache.capnp.h"
#include "ipc/wire.h"
#include "primecache/status.h"

namespace primecache::ipc {

class Session;

class [[nodiscard]] Answer {
 public:
  // The reply itself, a Response carrying the request's id.
  Answer(std::unique_ptr<OutMessage> reply)  // NOLINT(google-explicit-constructor)
      : kind_(Kind::kReply), reply_(std::move(reply)) {}
  // An error answer: the Status's code as the wire names it (ToWireCode) and
  // its message. An OK Status is a programming error and answers internal.
  Answer(const Status& error)  // NOLINT(google-explicit-constructor)
      : kind_(Kind::kError),
        code_(ToWireCode(error.code())),
        message_(error.ok() ? "an answer made from an OK status" : error.message()) {}
  // The two wire errors with no StatusCode of their own.
  static Answer PermissionDenied(std::string message) {
    return Answer(wire::ErrorCode::PERMISSION_DENIED, std::move(message));
  }
  static Answer Protocol(std::string message) { return Answer(wire::ErrorCode::PROTOCOL, std::move(message)); }
  // An empty acknowledgement of request `id`.
  static Answer Ack(std::uint64_t id) {
    return BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); });
  }

  bool queued() const { return kind_ == Kind::kQueued; }
  bool error() const { return kind_ == Kind::kError; }
  wire::ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  friend class Session;
  enum class Kind { kReply, kError, kQueued };
  struct QueuedTag {};
  explicit Answer(QueuedTag) : kind_(Kind::kQueued) {}
  Answer(wire::ErrorCode code, std::string message) : kind_(Kind::kError), code_(code), message_(std::move(message)) {}
  // The request's work was handed to a worker, which answers when it ends.
  // Only the session's queues make one (Serve, RunPublishStep).
  static Answer Queued() { return Answer(QueuedTag{}); }

  Kind kind_;
  std::unique_ptr<OutMessage> reply_;
  wire::ErrorCode code_ = wire::ErrorCode::INTERNAL;
  std::string message_;
};

}  // namespace primecache::ipc

// What the session's files share (ipc/session*.cc): the bounded readers of
// request fields and the clock. Internal to the daemon.
#pragma once

#include <capnp/blob.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "primecache/status.h"

namespace primecache::ipc::session_internal {

inline std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Copies capnp text out, bounded.
inline Result<std::string> ReadText(capnp::Text::Reader t, std::size_t max, const char* what) {
  if (t.size() > max) return Status::InvalidArgument(std::string(what) + " longer than " + std::to_string(max) + " bytes");
  return std::string(t.cStr(), t.size());
}

inline std::span<const std::byte> AsBytes(capnp::Data::Reader d) {
  return {reinterpret_cast<const std::byte*>(d.begin()), d.size()};
}

}  // namespace primecache::ipc::session_internal

// The message of a failed system call: "what: strerror(err)", `err`
// defaulting to errno as it is at the call. One helper for every layer
// that turns an OS error into a Status (the caller picks the code).
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

namespace primecache {

inline std::string ErrnoText(std::string_view what, int err = errno) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  return msg;
}

}  // namespace primecache

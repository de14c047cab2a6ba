// The daemon's metrics endpoint: an HTTP server (libmicrohttpd, one thread
// of its own) that answers GET /metrics with what a render function returns,
// in the Prometheus text format; any other path is 404, any other method 405.
//
// It listens where --metrics-listen says: HOST:PORT with HOST an IPv4
// address, [IPv6] or localhost, PORT 0 for any free one. It has no
// authentication, so a HOST that is not a loopback address is refused unless
// allowed explicitly (--metrics-allow-non-loopback), and then logged as a
// warning. Thread-safety: the render function runs on the endpoint's thread,
// one request at a time; it must not touch the event loop's state.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "primecache/status.h"

struct MHD_Daemon;

namespace primecache::ipc {

// A parsed --metrics-listen.
struct ListenAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool loopback = false;
};

Result<ListenAddress> ParseListenAddress(const std::string& text);
// "127.0.0.1:9464" or "[::1]:9464".
std::string FormatAddress(const sockaddr_storage& addr);

class MetricsEndpoint {
 public:
  using Render = std::function<Result<std::string>()>;
  ~MetricsEndpoint();  // stops the thread; no render runs after it returns
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Binds `listen` and serves until destroyed. A non-loopback address is
  // refused (InvalidArgument) unless `allow_non_loopback`.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen, bool allow_non_loopback,
                                                        Render render);

  // Where it listens, the port the kernel chose included: "127.0.0.1:9464".
  const std::string& address() const { return address_; }
  std::uint16_t port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  Render render_;  // the MHD thread's; its address is the request handler's argument
  MHD_Daemon* mhd_ = nullptr;
  std::string address_;
  std::uint16_t port_ = 0;
};

}  // namespace primecache::ipc

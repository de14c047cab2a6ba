#include "ipc/metrics_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "core/errno_text.h"
#include "ipc/exposition.h"

namespace primecache::ipc {

namespace {

// Bounds on what a scraper may hold: a few connections, each idle at most
// this long, so a stuck client never keeps the endpoint from the next scrape.
constexpr unsigned kMaxConnections = 8;
constexpr unsigned kConnectionTimeoutSeconds = 10;

bool IsLoopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;  // 127.0.0.0/8
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
  if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
  return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
}

Result<std::uint16_t> ParsePort(const std::string& text, const std::string& whole) {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(text) > 65535) {
    return Status::InvalidArgument("--metrics-listen '" + whole + "': the port must be 0..65535");
  }
  return static_cast<std::uint16_t>(std::stoul(text));
}

MHD_Result Send(MHD_Connection* connection, unsigned code, const std::string& body, const char* type) {
  MHD_Response* r =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  const MHD_Result ok = MHD_queue_response(connection, code, r);
  MHD_destroy_response(r);
  return ok;
}

MHD_Result OnRequest(void* cls, MHD_Connection* connection, const char* url, const char* method, const char*,
                     const char*, std::size_t*, void**) {
  constexpr const char* kText = "text/plain; charset=utf-8";
  if (std::strcmp(url, "/metrics") != 0) {
    return Send(connection, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n", kText);
  }
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 && std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    return Send(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n", kText);
  }
  auto text = (*static_cast<MetricsEndpoint::Render*>(cls))();
  if (!text.ok()) {
    spdlog::warn("primecached: metrics scrape failed: {}", text.status().ToString());
    return Send(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, text.status().ToString() + "\n", kText);
  }
  return Send(connection, MHD_HTTP_OK, *text, kExpositionContentType);
}

void LogFromMhd(void*, const char* fmt, va_list ap) {
  char line[512];
  std::vsnprintf(line, sizeof(line), fmt, ap);
  std::size_t n = std::strlen(line);
  while (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
  spdlog::warn("primecached: metrics endpoint: {}", line);
}

// A listening socket on `a`; the caller hands it to libmicrohttpd.
Result<int> Bind(const ListenAddress& a) {
  const int fd = socket(a.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::IOError(ErrnoText("metrics socket"));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (a.addr.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0 || listen(fd, 16) != 0) {
    Status s = Status::IOError(ErrnoText("metrics endpoint: bind/listen " + FormatAddress(a.addr)));
    close(fd);
    return s;
  }
  return fd;
}

}  // namespace

Result<ListenAddress> ParseListenAddress(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find("]:");
    if (close == std::string::npos) return Status::InvalidArgument("--metrics-listen '" + text + "': not [IPV6]:PORT");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) return Status::InvalidArgument("--metrics-listen '" + text + "': not HOST:PORT");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host == "localhost") host = "127.0.0.1";
  }
  PC_ASSIGN_OR_RETURN(std::uint16_t p, ParsePort(port, text));
  ListenAddress a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.addr);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.addr);
  if (text[0] != '[' && inet_pton(AF_INET, host.c_str(), &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(p);
    a.len = sizeof(sockaddr_in);
  } else if (text[0] == '[' && inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(p);
    a.len = sizeof(sockaddr_in6);
  } else {
    return Status::InvalidArgument("--metrics-listen '" + text +
                                   "': the host must be an IPv4 address, [IPv6 address] or localhost");
  }
  a.loopback = IsLoopback(a.addr);
  return a;
}

std::string FormatAddress(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
}

MetricsEndpoint::~MetricsEndpoint() {
  if (mhd_ != nullptr) MHD_stop_daemon(mhd_);  // joins its thread, closes the listening socket
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen, bool allow_non_loopback,
                                                                Render render) {
  PC_ASSIGN_OR_RETURN(ListenAddress a, ParseListenAddress(listen));
  if (!a.loopback && !allow_non_loopback) {
    return Status::InvalidArgument("--metrics-listen " + listen +
                                   " is not a loopback address; the endpoint has no authentication, so it "
                                   "listens beyond this host only with --metrics-allow-non-loopback");
  }
  PC_ASSIGN_OR_RETURN(int fd, Bind(a));
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->render_ = std::move(render);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
  if (a.addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  e->mhd_ = MHD_start_daemon(flags, 0, nullptr, nullptr, &OnRequest, &e->render_, MHD_OPTION_EXTERNAL_LOGGER,
                             &LogFromMhd, nullptr, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
                             kMaxConnections, MHD_OPTION_CONNECTION_TIMEOUT, kConnectionTimeoutSeconds,
                             MHD_OPTION_END);
  if (e->mhd_ == nullptr) {
    close(fd);
    return Status::Internal("metrics endpoint: libmicrohttpd did not start on " + FormatAddress(a.addr));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  e->address_ = FormatAddress(bound);
  e->port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  if (!a.loopback) spdlog::warn("primecached: metrics endpoint on {}, beyond loopback, without authentication", e->address_);
  return e;
}

}  // namespace primecache::ipc

#include "primecache/internal/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

namespace primecache {

Result<LogLevel> ParseLogLevel(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "trace") return LogLevel::kTrace;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "warn" || s == "warning") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  if (s == "critical") return LogLevel::kCritical;
  if (s == "off") return LogLevel::kOff;
  return Status::InvalidArgument("unknown log level '" + std::string(text) +
                                 "' (expected trace, debug, info, warn, error, critical or off)");
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kCritical: return "critical";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

Result<LogLevel> ResolveLogLevel(std::string_view flag_value) {
  if (!flag_value.empty()) {
    auto level = ParseLogLevel(flag_value);
    if (!level.ok()) return level.status().WithContext("--log-level");
    return level;
  }
  if (const char* env = std::getenv(kLogLevelEnvVar); env != nullptr && *env != '\0') {
    auto level = ParseLogLevel(env);
    if (!level.ok()) return level.status().WithContext(kLogLevelEnvVar);
    return level;
  }
  return LogLevel::kInfo;
}

void SetLogLevel(LogLevel level) {
  static constexpr spdlog::level::level_enum kMap[] = {
      spdlog::level::trace, spdlog::level::debug,    spdlog::level::info, spdlog::level::warn,
      spdlog::level::err,   spdlog::level::critical, spdlog::level::off};
  spdlog::set_level(kMap[static_cast<int>(level)]);
}

Status InitLogging(std::string_view flag_value) {
  PC_ASSIGN_OR_RETURN(LogLevel level, ResolveLogLevel(flag_value));
  static std::once_flag once;
  std::call_once(once, [] {
    // Logs go to stderr so that tools can keep stdout for their output.
    spdlog::set_default_logger(std::make_shared<spdlog::logger>(
        "primecache", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  });
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  SetLogLevel(level);
  return Status::Ok();
}

}  // namespace primecache

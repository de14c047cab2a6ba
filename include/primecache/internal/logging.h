// Logging setup. primecache logs through spdlog's default logger; this header
// only decides where the level comes from: an explicit flag value wins, then
// the PRIMECACHE_LOG_LEVEL environment variable, then "info".
// Call InitLogging once at start-up, before other threads log.
#pragma once

#include <string>
#include <string_view>

#include "primecache/status.h"

namespace primecache {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };

inline constexpr const char* kLogLevelEnvVar = "PRIMECACHE_LOG_LEVEL";

// "trace", "debug", "info", "warn"/"warning", "error", "critical", "off"; case-insensitive.
Result<LogLevel> ParseLogLevel(std::string_view text);
std::string_view LogLevelName(LogLevel level);

// The level that applies: flag (if non-empty), else the environment, else info.
// A malformed value is an error naming where it came from.
Result<LogLevel> ResolveLogLevel(std::string_view flag_value);

// Resolves the level and applies it to spdlog's default logger (stderr).
Status InitLogging(std::string_view flag_value);

// Applies a level directly.
void SetLogLevel(LogLevel level);

}  // namespace primecache

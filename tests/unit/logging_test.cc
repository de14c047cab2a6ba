#include "primecache/internal/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <sstream>

namespace primecache {
namespace {

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override { ::unsetenv(kLogLevelEnvVar); }
  void TearDown() override { ::unsetenv(kLogLevelEnvVar); }
};

TEST_F(LoggingTest, ParsesEveryLevelCaseInsensitively) {
  EXPECT_EQ(*ParseLogLevel("trace"), LogLevel::kTrace);
  EXPECT_EQ(*ParseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("Info"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarn);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(*ParseLogLevel("critical"), LogLevel::kCritical);
  EXPECT_EQ(*ParseLogLevel("off"), LogLevel::kOff);
  auto bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("loud"), std::string::npos);
}

TEST_F(LoggingTest, FlagBeatsEnvironmentBeatsDefault) {
  EXPECT_EQ(*ResolveLogLevel(""), LogLevel::kInfo);
  ::setenv(kLogLevelEnvVar, "debug", 1);
  EXPECT_EQ(*ResolveLogLevel(""), LogLevel::kDebug);
  EXPECT_EQ(*ResolveLogLevel("error"), LogLevel::kError);
}

TEST_F(LoggingTest, MalformedSourcesAreNamed) {
  ::setenv(kLogLevelEnvVar, "chatty", 1);
  auto r = ResolveLogLevel("");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(kLogLevelEnvVar), std::string::npos);
  auto f = ResolveLogLevel("nope");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("--log-level"), std::string::npos);
  EXPECT_FALSE(InitLogging("nope").ok());
}

TEST_F(LoggingTest, InitLoggingFiltersBelowTheLevel) {
  ASSERT_TRUE(InitLogging("warn").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  // Route the default logger to a stream to see what passes the filter.
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto saved = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>("test", sink);
  logger->set_level(spdlog::get_level());
  spdlog::set_default_logger(logger);
  spdlog::info("hidden-info");
  spdlog::warn("shown-warn");
  spdlog::error("shown-error");
  spdlog::set_default_logger(saved);
  std::string text = out.str();
  EXPECT_EQ(text.find("hidden-info"), std::string::npos);
  EXPECT_NE(text.find("shown-warn"), std::string::npos);
  EXPECT_NE(text.find("shown-error"), std::string::npos);
  ::setenv(kLogLevelEnvVar, "trace", 1);
  ASSERT_TRUE(InitLogging("").ok());
  EXPECT_EQ(spdlog::get_level(), spdlog::level::trace);
}

}  // namespace
}  // namespace primecache

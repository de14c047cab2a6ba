// primecachectl's output helpers in process: human sizes and ages, and the
// progress bar, which is drawn on a terminal only and never with --json.
#include "tools/ctl/output.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

namespace primecache::ctl {
namespace {

TEST(HumanBytes, BinaryUnitsWithTwoDecimals) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.00 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(1536ull << 20), "1.50 GiB");
  EXPECT_EQ(HumanBytes((1ull << 40) - 1), "1024.00 GiB");  // rounded at the top of a unit
  EXPECT_EQ(HumanBytes(5ull << 40), "5.00 TiB");
  EXPECT_EQ(HumanBytes(~0ull), "16384.00 PiB");
}

TEST(HumanAge, LargestUnitAndTheNext) {
  EXPECT_EQ(HumanAge(0), "0s");
  EXPECT_EQ(HumanAge(59), "59s");
  EXPECT_EQ(HumanAge(60), "1m");
  EXPECT_EQ(HumanAge(3599), "59m");
  EXPECT_EQ(HumanAge(3600), "1h00m");
  EXPECT_EQ(HumanAge(3 * 3600 + 4 * 60 + 59), "3h04m");
  EXPECT_EQ(HumanAge(86400), "1d00h");
  EXPECT_EQ(HumanAge(5 * 86400 + 2 * 3600 + 1), "5d02h");
}

// What `draw` writes to stderr while stderr is `fd`.
std::string StderrOf(int fd, int read_fd, const std::function<void()>& draw) {
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  draw();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string got;
  char buf[4096];
  fcntl(read_fd, F_SETFL, O_NONBLOCK);
  for (ssize_t n; (n = read(read_fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  return got;
}

void DrawEverything(const Output& out) {
  out.Progress("verifying entries", 3, 10);
  out.EndProgress();
  {
    const ProgressTicker ticker(out, "compact");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TEST(Progress, NothingWhenStderrIsNotATerminal) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_EQ(StderrOf(p[1], p[0], [&] {
              const Output piped(false, true);
              EXPECT_FALSE(piped.ShowsProgress());
              DrawEverything(piped);
            }),
            "");
  close(p[0]);
  close(p[1]);
}

TEST(Progress, DrawnOnATerminalUnlessJsonOrNoProgress) {
  int master = -1, slave = -1;
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  const std::string drawn = StderrOf(slave, master, [] { DrawEverything(Output(false, true)); });
  EXPECT_NE(drawn.find("verifying entries [#########"), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("3/10"), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("compact ... 0.0 s"), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("\r\033[K"), std::string::npos) << "the line is cleared: " << drawn;
  EXPECT_EQ(StderrOf(slave, master, [] { DrawEverything(Output(/*json=*/true, true)); }), "");
  EXPECT_EQ(StderrOf(slave, master, [] { DrawEverything(Output(false, /*progress=*/false)); }), "");
  close(master);
  close(slave);
}

}  // namespace
}  // namespace primecache::ctl

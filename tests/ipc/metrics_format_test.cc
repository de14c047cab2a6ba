// The metrics endpoint's parts on their own: the histogram, the text
// exposition writer (escaping, cumulative buckets, +Inf, _sum/_count), the
// --metrics-listen parser, and the HTTP endpoint in-process. The daemon's
// numbers through a real primecached: tests/ipc/metrics_test.py.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "ipc/exposition.h"
#include "ipc/histogram.h"
#include "ipc/metrics_http.h"
#include "tests/ipc/http_scrape.h"

namespace primecache::ipc {
namespace {

using primecache::testing::HttpRequest;

TEST(ExpositionTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  // HELP keeps double quotes as they are.
  EXPECT_EQ(EscapeHelp("say \"x\"\\\nnext"), "say \"x\"\\\\\\nnext");
}

TEST(ExpositionTest, WritesFamiliesAndSamples) {
  ExpositionWriter w;
  w.Family("pc_lookups_total", ExpositionWriter::Type::kCounter, "Lookups\nby result.");
  w.Sample("pc_lookups_total", {{"result", "hit"}}, std::uint64_t{3});
  w.Sample("pc_lookups_total", {{"result", "a\"b"}, {"ns", "x\\y"}}, std::uint64_t{18446744073709551615ull});
  w.Gauge("pc_entries", "Entries.", 7);
  w.Family("pc_ratio", ExpositionWriter::Type::kGauge, "A ratio.");
  w.Sample("pc_ratio", {}, 0.25);
  EXPECT_EQ(w.text(),
            "# HELP pc_lookups_total Lookups\\nby result.\n"
            "# TYPE pc_lookups_total counter\n"
            "pc_lookups_total{result=\"hit\"} 3\n"
            "pc_lookups_total{result=\"a\\\"b\",ns=\"x\\\\y\"} 18446744073709551615\n"
            "# HELP pc_entries Entries.\n"
            "# TYPE pc_entries gauge\n"
            "pc_entries 7\n"
            "# HELP pc_ratio A ratio.\n"
            "# TYPE pc_ratio gauge\n"
            "pc_ratio 0.25\n");
}

TEST(ExpositionTest, FormatsValues) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(1), "1");
  EXPECT_EQ(FormatValue(2.5), "2.5");
  EXPECT_EQ(FormatValue(0.0005), "0.0005");
  EXPECT_EQ(FormatValue(-0.1), "-0.1");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  // Whatever the form, it reads back as the same double.
  for (double v : {1.0 / 3, 123456.789, 1e-9, 6.02e23}) EXPECT_EQ(std::stod(FormatValue(v)), v) << v;
}

TEST(ExpositionTest, HistogramBucketsAreCumulativeUpToInf) {
  const double bounds[] = {0.1, 1, 10};
  Histogram h(bounds);
  for (double v : {0.05, 0.1, 0.5, 5.0, 50.0, 0.0}) h.Observe(v);
  const HistogramData d = h.Snapshot();
  EXPECT_EQ(d.counts, (std::vector<std::uint64_t>{3, 1, 1, 1}));  // 0.1 itself is in le="0.1"
  EXPECT_EQ(d.count(), 6u);
  ExpositionWriter w;
  w.Family("pc_seconds", ExpositionWriter::Type::kHistogram, "Durations.");
  w.HistogramSeries("pc_seconds", {{"op", "fetch"}}, d);
  EXPECT_EQ(w.text(), "# HELP pc_seconds Durations.\n"
                      "# TYPE pc_seconds histogram\n"
                      "pc_seconds_bucket{op=\"fetch\",le=\"0.1\"} 3\n"
                      "pc_seconds_bucket{op=\"fetch\",le=\"1\"} 4\n"
                      "pc_seconds_bucket{op=\"fetch\",le=\"10\"} 5\n"
                      "pc_seconds_bucket{op=\"fetch\",le=\"+Inf\"} 6\n"
                      "pc_seconds_sum{op=\"fetch\"} " +
                          FormatValue(0.05 + 0.1 + 0.5 + 5.0 + 50.0 + 0.0) +
                          "\n"
                          "pc_seconds_count{op=\"fetch\"} 6\n");
}

TEST(ExpositionTest, EmptyHistogramHasEveryBucketAtZero) {
  ExpositionWriter w;
  w.HistogramSeries("pc_s", {}, Histogram(RequestSecondsBuckets()).Snapshot());
  const std::string& t = w.text();
  EXPECT_NE(t.find("pc_s_bucket{le=\"0.0001\"} 0\n"), std::string::npos) << t;
  EXPECT_NE(t.find("pc_s_bucket{le=\"60\"} 0\n"), std::string::npos) << t;
  EXPECT_NE(t.find("pc_s_bucket{le=\"+Inf\"} 0\npc_s_sum 0\npc_s_count 0\n"), std::string::npos) << t;
}

TEST(HistogramTest, NanCountsInInfAndStaysOutOfTheSum) {
  const double bounds[] = {1};
  Histogram h(bounds);
  h.Observe(std::nan(""));
  h.Observe(0.5);
  const HistogramData d = h.Snapshot();
  EXPECT_EQ(d.counts, (std::vector<std::uint64_t>{1, 1}));
  EXPECT_EQ(d.sum, 0.5);
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Histogram h(RequestSecondsBuckets());
  constexpr int kThreads = 4, kEach = 50000;
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, &done, t] {
      for (int i = 0; i < kEach; ++i) h.Observe(std::chrono::microseconds(50 * (t + 1) + i % 1000));
      done.fetch_add(1);
    });
  }
  // Read while they record: the count never goes back.
  std::uint64_t seen = 0;
  while (done.load() < kThreads) {
    const std::uint64_t now = h.Snapshot().count();
    EXPECT_GE(now, seen);
    seen = now;
  }
  for (auto& th : threads) th.join();
  const HistogramData d = h.Snapshot();
  EXPECT_EQ(d.count(), std::uint64_t{kThreads} * kEach);
  EXPECT_GT(d.sum, 0.0);
}

TEST(ListenAddressTest, ParsesAndTellsLoopback) {
  struct Case {
    const char* text;
    bool loopback;
    const char* formatted;
  };
  for (const Case& c : {Case{"127.0.0.1:9464", true, "127.0.0.1:9464"}, Case{"127.1.2.3:0", true, "127.1.2.3:0"},
                        Case{"localhost:80", true, "127.0.0.1:80"}, Case{"[::1]:9464", true, "[::1]:9464"},
                        Case{"0.0.0.0:9464", false, "0.0.0.0:9464"}, Case{"10.1.2.3:1", false, "10.1.2.3:1"},
                        Case{"[::]:65535", false, "[::]:65535"}}) {
    auto a = ParseListenAddress(c.text);
    ASSERT_TRUE(a.ok()) << c.text << ": " << a.status().ToString();
    EXPECT_EQ(a->loopback, c.loopback) << c.text;
    EXPECT_EQ(FormatAddress(a->addr), c.formatted);
  }
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:9x",
                          "example.com:80", "::1:80", "[::1]80", "[127.0.0.1]:80", "1.2.3:80"}) {
    EXPECT_FALSE(ParseListenAddress(bad).ok()) << bad;
  }
}

// The status code of an HTTP response ("HTTP/1.1 200 OK..."); -1 if none.
int Code(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return -1;
  return std::atoi(response.substr(9, 3).c_str());
}

TEST(MetricsEndpointTest, ServesMetricsAndRefusesTheRest) {
  int renders = 0;
  auto e = MetricsEndpoint::Start("127.0.0.1:0", false, [&renders]() -> Result<std::string> {
    if (++renders == 3) return Status::IOError("store unreadable");
    return std::string("# TYPE x counter\nx 1\n");
  });
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_NE((*e)->port(), 0);
  EXPECT_EQ((*e)->address(), "127.0.0.1:" + std::to_string((*e)->port()));

  std::string r = HttpRequest((*e)->port(), "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(Code(r), 200) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("\r\n\r\n# TYPE x counter\nx 1\n"), std::string::npos) << r;

  r = HttpRequest((*e)->port(), "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(Code(r), 200) << r;
  EXPECT_EQ(r.find("x 1"), std::string::npos) << r;

  r = HttpRequest((*e)->port(), "GET /metrics HTTP/1.0\r\n\r\n");  // the third render fails
  EXPECT_EQ(Code(r), 500) << r;
  EXPECT_NE(r.find("store unreadable"), std::string::npos) << r;

  for (const char* path : {"/", "/metrics/", "/metricsx", "/other"}) {
    r = HttpRequest((*e)->port(), std::string("GET ") + path + " HTTP/1.0\r\n\r\n");
    EXPECT_EQ(Code(r), 404) << path << ": " << r;
  }
  r = HttpRequest((*e)->port(), "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(Code(r), 405) << r;
  EXPECT_NE(r.find("Allow: GET, HEAD"), std::string::npos) << r;
  EXPECT_EQ(renders, 3);  // neither the 404s nor the 405 rendered
}

TEST(MetricsEndpointTest, RefusesAnAddressBeyondLoopbackUnlessAllowed) {
  auto render = []() -> Result<std::string> { return std::string(); };
  auto refused = MetricsEndpoint::Start("0.0.0.0:0", false, render);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--metrics-allow-non-loopback"), std::string::npos)
      << refused.status().ToString();
  auto allowed = MetricsEndpoint::Start("0.0.0.0:0", true, render);
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  EXPECT_EQ(Code(HttpRequest((*allowed)->port(), "GET /metrics HTTP/1.0\r\n\r\n")), 200);
}

TEST(MetricsEndpointTest, APortInUseIsAnError) {
  auto render = []() -> Result<std::string> { return std::string(); };
  auto first = MetricsEndpoint::Start("127.0.0.1:0", false, render);
  ASSERT_TRUE(first.ok());
  auto second = MetricsEndpoint::Start((*first)->address(), false, render);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().ToString().find("bind"), std::string::npos) << second.status().ToString();
}

}  // namespace
}  // namespace primecache::ipc

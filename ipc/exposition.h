// Writes metrics in the Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/): per
// family a HELP and a TYPE line, then its samples, one a line.
//
// Names are the caller's constants and are not checked here; label values
// and help texts are escaped (backslash, newline, and in label values the
// double quote). Integer values are written exactly; doubles as the shortest
// text that reads back as the same value (+Inf, -Inf, NaN as the format
// spells them). Not thread-safe: one writer per scrape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ipc/histogram.h"

namespace primecache::ipc {

// The Content-Type of a text exposition, version 0.0.4.
inline constexpr const char* kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

class ExpositionWriter {
 public:
  enum class Type { kCounter, kGauge, kHistogram };
  using Labels = std::vector<std::pair<std::string_view, std::string_view>>;

  // Starts a family: its HELP and TYPE lines. Its samples follow.
  void Family(std::string_view name, Type type, std::string_view help);
  void Sample(std::string_view name, const Labels& labels, std::uint64_t value);
  void Sample(std::string_view name, const Labels& labels, double value);
  // A histogram's series under `name` (its family started): the cumulative
  // NAME_bucket{le=...} lines up to le="+Inf", then NAME_sum and NAME_count.
  void HistogramSeries(std::string_view name, const Labels& labels, const HistogramData& h);

  // A family of one unlabelled sample.
  void Counter(std::string_view name, std::string_view help, std::uint64_t value);
  void Gauge(std::string_view name, std::string_view help, std::uint64_t value);

  const std::string& text() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void SampleStart(std::string_view name, const Labels& labels, std::string_view le = {});
  std::string out_;
};

// Label values: \ as \\, " as \", newline as \n.
std::string EscapeLabelValue(std::string_view v);
// HELP text: \ as \\, newline as \n.
std::string EscapeHelp(std::string_view v);
// A sample value or an le bound as the format writes it.
std::string FormatValue(double v);

}  // namespace primecache::ipc

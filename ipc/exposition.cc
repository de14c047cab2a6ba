#include "ipc/exposition.h"

#include <charconv>
#include <cmath>

namespace primecache::ipc {

namespace {

std::string Escape(std::string_view v, bool quote) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

const char* TypeName(ExpositionWriter::Type t) {
  switch (t) {
    case ExpositionWriter::Type::kCounter:
      return "counter";
    case ExpositionWriter::Type::kGauge:
      return "gauge";
    case ExpositionWriter::Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string EscapeLabelValue(std::string_view v) { return Escape(v, true); }
std::string EscapeHelp(std::string_view v) { return Escape(v, false); }

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Plain decimals where they stay short (bucket bounds read as 0.0005, not
  // 5e-04), the shortest round-tripping form otherwise.
  char buf[64];
  const double mag = std::fabs(v);
  const auto fmt = (mag == 0 || (mag >= 1e-6 && mag < 1e15)) ? std::chars_format::fixed : std::chars_format::general;
  std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v, fmt);
  if (r.ec != std::errc()) r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

void ExpositionWriter::Family(std::string_view name, Type type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += EscapeHelp(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += TypeName(type);
  out_ += '\n';
}

void ExpositionWriter::SampleStart(std::string_view name, const Labels& labels, std::string_view le) {
  out_ += name;
  if (labels.empty() && le.empty()) {
    out_ += ' ';
    return;
  }
  char sep = '{';
  for (const auto& [k, v] : labels) {
    out_ += sep;
    out_ += k;
    out_ += "=\"";
    out_ += EscapeLabelValue(v);
    out_ += '"';
    sep = ',';
  }
  if (!le.empty()) {
    out_ += sep;
    out_ += "le=\"";
    out_ += le;
    out_ += '"';
  }
  out_ += "} ";
}

void ExpositionWriter::Sample(std::string_view name, const Labels& labels, std::uint64_t value) {
  SampleStart(name, labels);
  out_ += std::to_string(value);
  out_ += '\n';
}

void ExpositionWriter::Sample(std::string_view name, const Labels& labels, double value) {
  SampleStart(name, labels);
  out_ += FormatValue(value);
  out_ += '\n';
}

void ExpositionWriter::HistogramSeries(std::string_view name, const Labels& labels, const HistogramData& h) {
  const std::string bucket = std::string(name) + "_bucket";
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    const std::string le = i < h.bounds.size() ? FormatValue(h.bounds[i]) : "+Inf";
    SampleStart(bucket, labels, le);
    out_ += std::to_string(cumulative);
    out_ += '\n';
  }
  Sample(std::string(name) + "_sum", labels, h.sum);
  // The +Inf bucket's count, so that the two always agree.
  Sample(std::string(name) + "_count", labels, cumulative);
}

void ExpositionWriter::Counter(std::string_view name, std::string_view help, std::uint64_t value) {
  Family(name, Type::kCounter, help);
  Sample(name, {}, value);
}

void ExpositionWriter::Gauge(std::string_view name, std::string_view help, std::uint64_t value) {
  Family(name, Type::kGauge, help);
  Sample(name, {}, value);
}

}  // namespace primecache::ipc

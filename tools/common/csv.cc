#include "tools/common/csv.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace primecache::bench {

namespace {

// A field as RFC 4180 writes it: quoted, quotes doubled, when it must be.
std::string Field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string Line(const std::vector<std::string>& cells) {
  std::string line;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    if (i != 0) line += ',';
    line += Field(cells[i]);
  }
  return line + "\n";
}

}  // namespace

CsvCell::CsvCell(double v) {
  if (!std::isfinite(v)) {
    text_ = "nan";
    return;
  }
  char buf[32];  // the shortest text that reads back as the same double
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  text_.assign(buf, r.ptr);
}

Status CsvTable::Add(std::vector<CsvCell> row) {
  if (row.size() != columns_.size()) {
    return Status::InvalidArgument("csv row of " + std::to_string(row.size()) + " cells for " +
                                   std::to_string(columns_.size()) + " columns");
  }
  std::vector<std::string> cells;
  cells.reserve(row.size());
  for (CsvCell& c : row) cells.push_back(c.text());
  rows_.push_back(std::move(cells));
  return Status::Ok();
}

Status CsvTable::WriteTo(const std::string& path) const {
  std::ofstream f(path, std::ios::trunc);
  f << Line(columns_);
  for (const auto& r : rows_) f << Line(r);
  f.close();
  if (!f) return Status::IOError("cannot write " + path);
  return Status::Ok();
}

Status CsvTable::WriteToDir(const std::string& dir, std::string_view name) const {
  if (dir.empty()) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create " + dir + ": " + ec.message());
  return WriteTo(dir + "/" + std::string(name) + ".csv");
}

}  // namespace primecache::bench

// CsvTable: one benchmark figure as a tidy CSV file (one row per measured
// point, one column per variable, the unit in the column's name, e.g.
// `decode_gbps`, `p99_us`), for tools/bench/plot.py.
//
// Invariants: every row has exactly as many cells as there are columns (Add
// refuses another); a cell holding a comma, a quote or a line break is
// quoted as RFC 4180 says. Numbers are written in the shortest form that
// reads back as the same double.
//
// Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "primecache/status.h"

namespace primecache::bench {

// One cell: text, or a number written in full precision.
class CsvCell {
 public:
  CsvCell(std::string_view text) : text_(text) {}  // NOLINT(google-explicit-constructor)
  CsvCell(const char* text) : text_(text) {}       // NOLINT(google-explicit-constructor)
  CsvCell(const std::string& text) : text_(text) {}  // NOLINT(google-explicit-constructor)
  CsvCell(double v);                                  // NOLINT(google-explicit-constructor)
  template <typename T>
    requires std::is_integral_v<T>
  CsvCell(T v) : text_(std::to_string(v)) {}  // NOLINT(google-explicit-constructor)
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

class CsvTable {
 public:
  explicit CsvTable(std::vector<std::string> columns) : columns_(std::move(columns)) {}

  // One row, its cells in the columns' order.
  Status Add(std::vector<CsvCell> row);
  // The header and every row; the file is replaced.
  Status WriteTo(const std::string& path) const;
  // Under `dir` (made when missing) as `name`.csv; nothing when `dir` is empty.
  Status WriteToDir(const std::string& dir, std::string_view name) const;

  std::size_t rows() const { return rows_.size(); }

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace primecache::bench

#include "tools/common/csv.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace primecache::bench {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "csv_test.XXXXXX").string();
  return mkdtemp(tmpl.data());
}

TEST(CsvTable, WritesHeaderAndRowsQuotingWhereNeeded) {
  CsvTable t({"path", "rep", "gbps"});
  ASSERT_TRUE(t.Add({"memcpy", 0, 1.5}).ok());
  ASSERT_TRUE(t.Add({"a, \"b\"", std::uint64_t{18446744073709551615u}, 0.1}).ok());
  const std::string dir = TempDir();
  ASSERT_TRUE(t.WriteToDir(dir + "/sub", "fig").ok());
  EXPECT_EQ(Slurp(dir + "/sub/fig.csv"),
            "path,rep,gbps\nmemcpy,0,1.5\n\"a, \"\"b\"\"\",18446744073709551615,0.1\n");
  std::filesystem::remove_all(dir);
}

TEST(CsvTable, NumbersReadBackExactly) {
  const double v = 2.0 / 3.0;
  EXPECT_EQ(std::strtod(CsvCell(v).text().c_str(), nullptr), v);
  EXPECT_EQ(CsvCell(-7).text(), "-7");
}

TEST(CsvTable, RefusesARowOfTheWrongWidth) {
  CsvTable t({"a", "b"});
  EXPECT_FALSE(t.Add({1}).ok());
  EXPECT_FALSE(t.Add({1, 2, 3}).ok());
  EXPECT_EQ(t.rows(), 0u);
}

TEST(CsvTable, EmptyDirWritesNothingAndAnUnwritablePathFails) {
  CsvTable t({"a"});
  EXPECT_TRUE(t.WriteToDir("", "x").ok());
  EXPECT_FALSE(t.WriteTo("/nonexistent-dir/x.csv").ok());
}

}  // namespace
}  // namespace primecache::bench

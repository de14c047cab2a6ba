#include "primecache/checksum.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace primecache {
namespace {

TEST(ChecksumTest, KnownXxh3Vectors) {
  // Published XXH3-64 values (seed 0).
  EXPECT_EQ(Checksum64(std::string_view("")), 0x2D06800538D394C2ULL);
  EXPECT_EQ(Checksum64(std::string_view("a")), Checksum64(std::string_view("a")));
}

TEST(ChecksumTest, StreamEqualsOneShotForAnySplit) {
  std::mt19937_64 rng(42);
  std::string data(100000, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  const std::uint64_t whole = Checksum64(data);
  for (std::size_t step : {1UL, 7UL, 64UL, 4096UL, 99999UL}) {
    Checksum64Stream s;
    for (std::size_t off = 0; off < data.size(); off += step) {
      s.Update(std::string_view(data).substr(off, step));
    }
    EXPECT_EQ(s.Digest(), whole) << "step " << step;
  }
}

TEST(ChecksumTest, EveryFlippedBitChangesTheSum) {
  std::string data(257, 'x');
  const std::uint64_t base = Checksum64(data);
  for (std::size_t i = 0; i < data.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      data[i] = static_cast<char>(data[i] ^ (1 << b));
      EXPECT_NE(Checksum64(data), base) << "byte " << i << " bit " << b;
      data[i] = static_cast<char>(data[i] ^ (1 << b));
    }
  }
}

TEST(ChecksumTest, SeedChangesTheSum) {
  EXPECT_NE(Checksum64(std::string_view("abc"), 0), Checksum64(std::string_view("abc"), 1));
  Checksum64Stream s(1);
  s.Update(std::string_view("abc"));
  EXPECT_EQ(s.Digest(), Checksum64(std::string_view("abc"), 1));
}

TEST(ChecksumTest, Hash128DiffersInBothHalves) {
  std::string a = "chunk-a", b = "chunk-b";
  Hash128 ha = Checksum128(std::as_bytes(std::span(a.data(), a.size())));
  Hash128 hb = Checksum128(std::as_bytes(std::span(b.data(), b.size())));
  EXPECT_NE(ha.lo, hb.lo);
  EXPECT_NE(ha.hi, hb.hi);
  EXPECT_EQ(ha, Checksum128(std::as_bytes(std::span(a.data(), a.size()))));
}

}  // namespace
}  // namespace primecache

// RegistrationLedger, the device registrations' budget, without a device:
// a file is counted once however many mappings of it were registered (a
// segment that grew is mapped again, longer), the shorter one is let go once
// no copy uses it, and past the budget the least recently used unused ones
// go, never the most recent.
#include <gtest/gtest.h>

#include <algorithm>

#include "ipc/registration_ledger.h"

namespace primecache::ipc {
namespace {

bool Contains(const std::vector<std::uint64_t>& v, std::uint64_t id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

TEST(RegistrationLedger, ALongerMappingOfAFileReplacesTheShorterInTheCount) {
  RegistrationLedger l(100);
  l.Added(1, /*file=*/7, 40);  // segment 7 mapped up to 40 bytes, one copy using it
  EXPECT_EQ(l.counted_bytes(), 40u);
  l.Added(2, /*file=*/7, 60);  // the segment grew: mapped again, longer
  EXPECT_EQ(l.counted_bytes(), 60u) << "one file counted twice";
  EXPECT_TRUE(l.TakeEvictable().empty()) << "the shorter one is let go only once no copy uses it";
  EXPECT_TRUE(l.Has(1));
  l.Unused(1);
  const auto gone = l.TakeEvictable();
  EXPECT_EQ(gone, std::vector<std::uint64_t>{1});
  EXPECT_FALSE(l.Has(1));
  EXPECT_EQ(l.counted_bytes(), 60u);
  // A third, longer still, replaces the second the same way.
  l.Unused(2);
  l.Added(3, 7, 80);
  EXPECT_EQ(l.counted_bytes(), 80u);
  EXPECT_EQ(l.TakeEvictable(), std::vector<std::uint64_t>{2});
}

TEST(RegistrationLedger, PastTheBudgetTheLeastRecentlyUsedUnusedGoFirst) {
  RegistrationLedger l(100);
  l.Added(1, 1, 50);
  l.Added(2, 2, 50);
  l.Unused(1);
  l.Unused(2);
  EXPECT_TRUE(l.TakeEvictable().empty()) << "within the budget";
  l.Used(1);  // 1 is now more recent than 2
  l.Unused(1);
  l.Added(3, 3, 50);
  const auto gone = l.TakeEvictable();
  EXPECT_EQ(gone, std::vector<std::uint64_t>{2});
  EXPECT_EQ(l.counted_bytes(), 100u);
  // One in use stays past the budget; the most recent always stays.
  l.Added(4, 4, 200);
  const auto more = l.TakeEvictable();
  EXPECT_TRUE(Contains(more, 1));
  EXPECT_FALSE(Contains(more, 3)) << "in use";
  EXPECT_FALSE(Contains(more, 4)) << "the most recent";
  l.Unused(3);
  l.Unused(4);
  EXPECT_EQ(l.TakeEvictable(), std::vector<std::uint64_t>{3});
  EXPECT_EQ(l.counted_bytes(), 200u);
  EXPECT_TRUE(l.TakeEvictable().empty()) << "the most recent stays, even alone past the budget";
}

TEST(RegistrationLedger, MappingsOfNoNamedFileAreEachTheirOwn) {
  RegistrationLedger l(1000);
  l.Added(1, 0, 10);
  l.Added(2, 0, 20);
  EXPECT_EQ(l.counted_bytes(), 30u);
  EXPECT_TRUE(l.TakeEvictable().empty());
}

}  // namespace
}  // namespace primecache::ipc

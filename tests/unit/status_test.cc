#include "primecache/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace primecache {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(s.message().empty());
}

TEST(StatusTest, EveryFactoryCarriesItsCodeAndMessage) {
  struct Case {
    Status s;
    StatusCode code;
    const char* name;
  };
  const Case cases[] = {
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument, "invalid argument"},
      {Status::NotFound("m"), StatusCode::kNotFound, "not found"},
      {Status::Corruption("m"), StatusCode::kCorruption, "corruption"},
      {Status::IOError("m"), StatusCode::kIOError, "I/O error"},
      {Status::ResourceExhausted("m"), StatusCode::kResourceExhausted, "resource exhausted"},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition, "failed precondition"},
      {Status::Unavailable("m"), StatusCode::kUnavailable, "unavailable"},
      {Status::AlreadyExists("m"), StatusCode::kAlreadyExists, "already exists"},
      {Status::Aborted("m"), StatusCode::kAborted, "aborted"},
      {Status::DeadlineExceeded("m"), StatusCode::kDeadlineExceeded, "deadline exceeded"},
      {Status::NotSupported("m"), StatusCode::kNotSupported, "not supported"},
      {Status::Internal("m"), StatusCode::kInternal, "internal"},
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(c.s.ok());
    EXPECT_EQ(c.s.code(), c.code);
    EXPECT_EQ(c.s.message(), "m");
    EXPECT_EQ(c.s.ToString(), std::string(c.name) + ": m");
  }
  EXPECT_TRUE(Status::Corruption("x").IsCorruption());
  EXPECT_TRUE(Status::NotFound("x").IsNotFound());
  EXPECT_FALSE(Status::NotFound("x").IsCorruption());
}

TEST(StatusTest, OkCodeDropsMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s, Status::Ok());
}

TEST(StatusTest, WithContextPrefixesAndKeepsCode) {
  Status s = Status::IOError("disk gone").WithContext("writing manifest");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_EQ(s.message(), "writing manifest: disk gone");
  EXPECT_TRUE(Status::Ok().WithContext("anything").ok());
}

Status FailsWhen(bool fail) { return fail ? Status::Unavailable("down") : Status::Ok(); }

Status Chain(bool fail, int* reached) {
  PC_RETURN_IF_ERROR(FailsWhen(fail));
  *reached = 1;
  return Status::Ok();
}

TEST(StatusTest, ReturnIfErrorStopsAtFirstError) {
  int reached = 0;
  EXPECT_TRUE(Chain(true, &reached).IsUnavailable());
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(Chain(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  PC_ASSIGN_OR_RETURN(int h, Half(x));
  PC_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(ResultTest, HoldsValueOrStatus) {
  auto r = Half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 4);
  EXPECT_TRUE(r.status().ok());
  auto e = Half(3);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(e.status().IsInvalidArgument());
  EXPECT_EQ(e.status().message(), "odd");
}

TEST(ResultTest, AssignOrReturnPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "odd");  // 6 -> 3 is odd
  EXPECT_EQ(Quarter(5).status().message(), "odd");
}

TEST(ResultTest, OkStatusWithoutValueBecomesInternal) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

}  // namespace
}  // namespace primecache

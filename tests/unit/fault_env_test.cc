// Every fault the FaultInjectionEnv can inject, and the crash model that later
// crash tests rely on.
#include <gtest/gtest.h>

#include "primecache/internal/env.h"
#include "tests/support/fault_env.h"

namespace primecache {
namespace {

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

class FaultEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = NewMemEnv();
    ASSERT_TRUE(base_->CreateDir("/d").ok());
    env_ = std::make_unique<FaultInjectionEnv>(base_.get());
  }
  Status Write(const std::string& path, std::string_view data, bool sync) {
    PC_ASSIGN_OR_RETURN(auto f, env_->NewWritableFile(path));
    PC_RETURN_IF_ERROR(f->Append(Bytes(data)));
    if (sync) PC_RETURN_IF_ERROR(f->Sync());
    return f->Close();
  }
  std::unique_ptr<Env> base_;
  std::unique_ptr<FaultInjectionEnv> env_;
};

TEST_F(FaultEnvTest, CountsEveryOperationKind) {
  ASSERT_TRUE(Write("/d/a", "x", true).ok());
  ASSERT_TRUE(env_->RenameFile("/d/a", "/d/b").ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  ASSERT_TRUE(ReadFileToString(env_.get(), "/d/b").ok());
  EXPECT_EQ(env_->OpCount(FaultOp::kWrite), 1u);
  EXPECT_EQ(env_->OpCount(FaultOp::kSync), 2u);  // file sync + directory sync
  EXPECT_EQ(env_->OpCount(FaultOp::kRename), 1u);
  EXPECT_GE(env_->OpCount(FaultOp::kRead), 1u);
  EXPECT_EQ(env_->BytesWritten(), 1u);
}

TEST_F(FaultEnvTest, FailsTheNthWriteOnlyOnce) {
  env_->FailNth(FaultOp::kWrite, 2);
  auto f = env_->NewWritableFile("/d/w");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Append(Bytes("one")).ok());
  Status s = (*f)->Append(Bytes("two"));
  EXPECT_TRUE(s.IsIOError());
  EXPECT_NE(s.message().find("injected"), std::string::npos);
  EXPECT_TRUE((*f)->Append(Bytes("three")).ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/w"), "onethree") << "the failed write had no effect";
}

TEST_F(FaultEnvTest, CorruptsTheNextWriteToAMatchingPathOnly) {
  env_->CorruptNextWrite("/seg");
  ASSERT_TRUE(Write("/d/other", "abc", true).ok());
  ASSERT_TRUE(Write("/d/seg1", "abc", true).ok());
  ASSERT_TRUE(Write("/d/seg2", "abc", true).ok());
  EXPECT_EQ(ReadFileToString(env_.get(), "/d/other").value(), "abc");
  EXPECT_EQ(ReadFileToString(env_.get(), "/d/seg1").value(), "abC");  // the last byte flipped
  EXPECT_EQ(ReadFileToString(env_.get(), "/d/seg2").value(), "abc");  // only once
}

TEST_F(FaultEnvTest, CorruptsTheNextReadOfAMatchingPathOnly) {
  ASSERT_TRUE(Write("/d/seg1", "abc", true).ok());
  auto f = env_->NewRandomAccessFile("/d/seg1");
  ASSERT_TRUE(f.ok());
  env_->CorruptNextRead("/seg");
  std::byte buf[3];
  std::size_t n = 0;
  ASSERT_TRUE((*f)->Read(0, buf, &n).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buf), n), "abC");
  ASSERT_TRUE((*f)->Read(0, buf, &n).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buf), n), "abc");  // only once; the file is intact
}

TEST_F(FaultEnvTest, FailsTheNthRead) {
  ASSERT_TRUE(Write("/d/r", "data", true).ok());
  env_->FailNth(FaultOp::kRead, 1);
  EXPECT_TRUE(ReadFileToString(env_.get(), "/d/r").status().IsIOError());
  EXPECT_EQ(*ReadFileToString(env_.get(), "/d/r"), "data");
  auto ra = env_->NewRandomAccessFile("/d/r");
  ASSERT_TRUE(ra.ok());
  env_->FailNth(FaultOp::kRead, 1);
  std::byte buf[4];
  std::size_t got = 7;
  EXPECT_TRUE((*ra)->Read(0, buf, &got).IsIOError());
  EXPECT_EQ(got, 0u);
}

TEST_F(FaultEnvTest, FailsTheNthSyncAndLeavesDataUnsynced) {
  env_->FailNth(FaultOp::kSync, 1);
  EXPECT_TRUE(Write("/d/s", "abc", true).IsIOError());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/s"), "") << "a failed sync made nothing durable";
}

TEST_F(FaultEnvTest, FailsTheNthRenameWithoutEffect) {
  ASSERT_TRUE(Write("/d/a", "A", true).ok());
  env_->FailNth(FaultOp::kRename, 1);
  EXPECT_TRUE(env_->RenameFile("/d/a", "/d/b").IsIOError());
  EXPECT_TRUE(env_->FileExists("/d/a"));
  EXPECT_FALSE(env_->FileExists("/d/b"));
  EXPECT_TRUE(env_->RenameFile("/d/a", "/d/b").ok());
}

TEST_F(FaultEnvTest, DiskFullRefusesWritesPastTheLimit) {
  env_->SetSpaceLimit(10);
  auto f = env_->NewWritableFile("/d/full");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Append(Bytes("12345678")).ok());
  Status s = (*f)->Append(Bytes("abc"));
  EXPECT_TRUE(s.IsResourceExhausted());
  EXPECT_NE(s.message().find("no space"), std::string::npos);
  EXPECT_TRUE((*f)->Append(Bytes("ab")).ok()) << "exactly at the limit is allowed";
  env_->ClearSpaceLimit();
  EXPECT_TRUE((*f)->Append(Bytes("more")).ok());
}

TEST_F(FaultEnvTest, ADiskOfFixedSizeGetsSpaceBackWhenFilesGo) {
  ASSERT_TRUE(Write("/d/a", "0123456789", true).ok());
  env_->SetDiskSize(env_->LiveBytes() + 5);
  EXPECT_EQ(env_->LiveBytes(), 10u);
  Status full = Write("/d/b", "0123456789", true);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_TRUE(Write("/d/c", "01234", true).ok()) << "what fits is written";
  ASSERT_TRUE(env_->RemoveFile("/d/a").ok());
  EXPECT_EQ(env_->LiveBytes(), 5u);
  EXPECT_TRUE(Write("/d/b", "0123456789", true).ok()) << "the removed file's space is free again";
  // Truncating a file by creating it again frees its bytes too.
  EXPECT_TRUE(Write("/d/b", "", true).ok());
  EXPECT_EQ(env_->LiveBytes(), 5u);
  env_->ClearDiskSize();
  EXPECT_TRUE(Write("/d/e", std::string(100, 'x'), true).ok());
}

TEST_F(FaultEnvTest, CrashDropsUnsyncedTail) {
  auto f = env_->NewWritableFile("/d/log");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  ASSERT_TRUE((*f)->Append(Bytes("durable|")).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Append(Bytes("lost")).ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/log"), "durable|");
}

// A truncation is counted (and failed) as a write, and a crash afterwards
// keeps only what was synced below the cut.
TEST_F(FaultEnvTest, TruncateIsAWriteAndShrinksTheSyncedLength) {
  auto f = env_->NewAppendableFile("/d/seg");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  ASSERT_TRUE((*f)->Append(Bytes("0123456789")).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  env_->FailNth(FaultOp::kWrite, 1);
  EXPECT_FALSE(env_->TruncateFile("/d/seg", 4).ok());
  EXPECT_EQ(*env_->GetFileSize("/d/seg"), 10u) << "a failed truncate has no effect";
  ASSERT_TRUE(env_->TruncateFile("/d/seg", 4).ok());
  ASSERT_TRUE((*f)->Append(Bytes("ab")).ok());  // not synced
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/seg"), "0123");
}

TEST_F(FaultEnvTest, CrashRemovesFilesWhoseDirectoryWasNotSynced) {
  ASSERT_TRUE(Write("/d/new", "synced data", true).ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_FALSE(base_->FileExists("/d/new")) << "the name was never made durable";
}

TEST_F(FaultEnvTest, CrashUndoesUnsyncedRenameAndRestoresTheOldTarget) {
  ASSERT_TRUE(Write("/d/cur", "old", true).ok());
  ASSERT_TRUE(Write("/d/tmp", "new", true).ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  ASSERT_TRUE(env_->RenameFile("/d/tmp", "/d/cur").ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/cur"), "new");
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/cur"), "old");
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/tmp"), "new");
}

TEST_F(FaultEnvTest, SyncedRenameSurvivesCrash) {
  ASSERT_TRUE(Write("/d/tmp", "new", true).ok());
  ASSERT_TRUE(env_->RenameFile("/d/tmp", "/d/cur").ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/cur"), "new");
  EXPECT_FALSE(base_->FileExists("/d/tmp"));
}

// The crash-point sweep later crash tests use: fail each I/O operation of a
// workload in turn, crash, and check the invariant. Here the workload is
// WriteFileAtomically replacing "old" with "new": after any fault and crash the
// file holds exactly one of them.
TEST_F(FaultEnvTest, AtomicWriteIsAllOrNothingAtEveryCrashPoint) {
  ASSERT_TRUE(WriteFileAtomically(env_.get(), "/d/m", "old").ok());
  // Count the operations one replacement takes.
  auto probe_base = NewMemEnv();
  ASSERT_TRUE(probe_base->CreateDir("/d").ok());
  FaultInjectionEnv probe(probe_base.get());
  ASSERT_TRUE(WriteFileAtomically(&probe, "/d/m", "new").ok());
  int checked = 0;
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kSync, FaultOp::kRename}) {
    for (std::uint64_t n = 1; n <= probe.OpCount(op); ++n) {
      env_->FailNth(op, n);
      Status s = WriteFileAtomically(env_.get(), "/d/m", "new");
      env_->ClearFaults();
      EXPECT_FALSE(s.ok());
      ASSERT_TRUE(env_->SimulateCrash().ok());
      EXPECT_EQ(*ReadFileToString(base_.get(), "/d/m"), "old") << "fault at op " << int(op) << " #" << n;
      ++checked;
    }
  }
  EXPECT_GE(checked, 4);
  // With no fault, then a crash right after: the new content is durable.
  ASSERT_TRUE(WriteFileAtomically(env_.get(), "/d/m", "new").ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(*ReadFileToString(base_.get(), "/d/m"), "new");
}

TEST_F(FaultEnvTest, WorksOverThePosixEnvToo) {
  char tmpl[] = "/tmp/primecache-fault-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  FaultInjectionEnv env(Env::Default());
  auto f = env.NewWritableFile(dir + "/x");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(env.SyncDir(dir).ok());
  ASSERT_TRUE((*f)->Append(Bytes("keep")).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Append(Bytes("drop")).ok());
  ASSERT_TRUE((*f)->Close().ok());
  ASSERT_TRUE(env.SimulateCrash().ok());
  EXPECT_EQ(*ReadFileToString(Env::Default(), dir + "/x"), "keep");
  ASSERT_TRUE(Env::Default()->RemoveFile(dir + "/x").ok());
  ASSERT_TRUE(Env::Default()->RemoveDir(dir).ok());
}

}  // namespace
}  // namespace primecache

// The Env contract, run against the POSIX Env (in a temporary directory) and
// the in-memory Env alike.
#include "primecache/internal/env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

namespace primecache {
namespace {

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

struct EnvCase {
  const char* name;
  bool posix;
};

class EnvContractTest : public ::testing::TestWithParam<EnvCase> {
 protected:
  void SetUp() override {
    if (GetParam().posix) {
      env_ = Env::Default();
      char tmpl[] = "/tmp/primecache-env-XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      root_ = tmpl;
    } else {
      mem_ = NewMemEnv();
      env_ = mem_.get();
      root_ = "/t";
      ASSERT_TRUE(env_->CreateDir(root_).ok());
    }
  }
  void TearDown() override {
    if (GetParam().posix) std::filesystem::remove_all(root_);
  }
  std::string P(const std::string& name) const { return root_ + "/" + name; }

  Status Write(const std::string& path, std::string_view data) {
    PC_ASSIGN_OR_RETURN(auto f, env_->NewWritableFile(path));
    PC_RETURN_IF_ERROR(f->Append(Bytes(data)));
    PC_RETURN_IF_ERROR(f->Sync());
    return f->Close();
  }

  std::unique_ptr<Env> mem_;
  Env* env_ = nullptr;
  std::string root_;
};

// What the POSIX Env creates is its user's alone, whatever the umask; the
// in-memory Env keeps no permissions.
TEST_P(EnvContractTest, CreatesPrivateFilesAndDirectories) {
  const mode_t old = ::umask(0);
  ASSERT_TRUE(CreateDirs(env_, P("x/y")).ok());
  ASSERT_TRUE(Write(P("x/y/f"), "secret").ok());
  {
    auto app = env_->NewAppendableFile(P("x/g"));
    ASSERT_TRUE(app.ok());
    ASSERT_TRUE((*app)->Close().ok());
  }
  ASSERT_TRUE(WriteFileAtomically(env_, P("x/h"), "data").ok());
  ::umask(old);
  auto mode = env_->GetFileMode(P("x"));
  if (!GetParam().posix) {
    EXPECT_EQ(mode.status().code(), StatusCode::kNotSupported);
    return;
  }
  ASSERT_TRUE(mode.ok()) << mode.status().ToString();
  EXPECT_EQ(mode->kind, FileMode::Kind::kDirectory);
  EXPECT_EQ(mode->permissions, 0700u);
  EXPECT_EQ(env_->GetFileMode(P("x/y"))->permissions, 0700u);
  for (const char* f : {"x/y/f", "x/g", "x/h"}) {
    auto m = env_->GetFileMode(P(f));
    ASSERT_TRUE(m.ok()) << f;
    EXPECT_EQ(m->kind, FileMode::Kind::kFile) << f;
    EXPECT_EQ(m->permissions, 0600u) << f;
  }
  ASSERT_TRUE(env_->SetPermissions(P("x/g"), 0640).ok());
  EXPECT_EQ(env_->GetFileMode(P("x/g"))->permissions, 0640u);
  ASSERT_EQ(::symlink(P("x/g").c_str(), P("x/link").c_str()), 0);
  EXPECT_EQ(env_->GetFileMode(P("x/link"))->kind, FileMode::Kind::kOther);
  EXPECT_FALSE(env_->SetPermissions(P("x/link"), 0600).ok()) << "a symbolic link is refused, not followed";
  EXPECT_EQ(env_->GetFileMode(P("x/g"))->permissions, 0640u);
}

TEST_P(EnvContractTest, WriteThenReadBack) {
  ASSERT_TRUE(Write(P("a"), "hello world").ok());
  EXPECT_TRUE(env_->FileExists(P("a")));
  EXPECT_EQ(*env_->GetFileSize(P("a")), 11u);
  EXPECT_EQ(*ReadFileToString(env_, P("a")), "hello world");

  auto seq = env_->NewSequentialFile(P("a"));
  ASSERT_TRUE(seq.ok());
  std::byte buf[5];
  std::size_t got = 0;
  ASSERT_TRUE((*seq)->Read(buf, &got).ok());
  EXPECT_EQ(got, 5u);
  ASSERT_TRUE((*seq)->Skip(1).ok());
  ASSERT_TRUE((*seq)->Read(buf, &got).ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), got), "world");
  ASSERT_TRUE((*seq)->Read(buf, &got).ok());
  EXPECT_EQ(got, 0u);

  auto ra = env_->NewRandomAccessFile(P("a"));
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->Read(6, buf, &got).ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), got), "world");
  ASSERT_TRUE((*ra)->Read(9, buf, &got).ok());  // short read at end of file
  EXPECT_EQ(got, 2u);
  ASSERT_TRUE((*ra)->Read(100, buf, &got).ok());
  EXPECT_EQ(got, 0u);
}

TEST_P(EnvContractTest, LargeFileRoundTrip) {
  std::string big(3 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 9));
  ASSERT_TRUE(Write(P("big"), big).ok());
  EXPECT_EQ(*ReadFileToString(env_, P("big")), big);
}

TEST_P(EnvContractTest, WritableTruncatesAppendableAppends) {
  ASSERT_TRUE(Write(P("f"), "first").ok());
  ASSERT_TRUE(Write(P("f"), "2nd").ok());
  EXPECT_EQ(*ReadFileToString(env_, P("f")), "2nd");
  auto app = env_->NewAppendableFile(P("f"));
  ASSERT_TRUE(app.ok());
  ASSERT_TRUE((*app)->Append(Bytes("+more")).ok());
  ASSERT_TRUE((*app)->Close().ok());
  EXPECT_EQ(*ReadFileToString(env_, P("f")), "2nd+more");
  EXPECT_FALSE((*app)->Append(Bytes("x")).ok()) << "append after close must fail";
}

TEST_P(EnvContractTest, MissingFilesAreNotFound) {
  EXPECT_FALSE(env_->FileExists(P("nope")));
  EXPECT_TRUE(env_->NewSequentialFile(P("nope")).status().IsNotFound());
  EXPECT_TRUE(env_->NewRandomAccessFile(P("nope")).status().IsNotFound());
  EXPECT_TRUE(env_->GetFileSize(P("nope")).status().IsNotFound());
  EXPECT_TRUE(env_->RemoveFile(P("nope")).IsNotFound());
  EXPECT_TRUE(env_->RenameFile(P("nope"), P("other")).IsNotFound());
  EXPECT_TRUE(env_->GetChildren(P("nodir")).status().IsNotFound());
  EXPECT_FALSE(env_->NewWritableFile(P("nodir/x")).ok());
}

TEST_P(EnvContractTest, DirectoriesAndChildren) {
  ASSERT_TRUE(CreateDirs(env_, P("x/y/z")).ok());
  ASSERT_TRUE(CreateDirs(env_, P("x/y/z")).ok()) << "creating again is fine";
  ASSERT_TRUE(Write(P("x/b"), "1").ok());
  ASSERT_TRUE(Write(P("x/a"), "2").ok());
  auto kids = env_->GetChildren(P("x"));
  ASSERT_TRUE(kids.ok());
  EXPECT_EQ(*kids, (std::vector<std::string>{"a", "b", "y"}));
  EXPECT_FALSE(env_->RemoveDir(P("x")).ok()) << "not empty";
  ASSERT_TRUE(env_->RemoveDir(P("x/y/z")).ok());
  ASSERT_TRUE(env_->SyncDir(P("x")).ok());
}

TEST_P(EnvContractTest, RenameReplacesAtomically) {
  ASSERT_TRUE(Write(P("old"), "old-content").ok());
  ASSERT_TRUE(Write(P("new"), "new-content").ok());
  ASSERT_TRUE(env_->RenameFile(P("new"), P("old")).ok());
  EXPECT_FALSE(env_->FileExists(P("new")));
  EXPECT_EQ(*ReadFileToString(env_, P("old")), "new-content");
  ASSERT_TRUE(env_->RemoveFile(P("old")).ok());
  EXPECT_FALSE(env_->FileExists(P("old")));
}

TEST_P(EnvContractTest, WriteFileAtomicallyLeavesNoTemporaries) {
  ASSERT_TRUE(WriteFileAtomically(env_, P("m"), "v1").ok());
  ASSERT_TRUE(WriteFileAtomically(env_, P("m"), "v2").ok());
  EXPECT_EQ(*ReadFileToString(env_, P("m")), "v2");
  EXPECT_EQ(*env_->GetChildren(root_), std::vector<std::string>{"m"});
}

TEST_P(EnvContractTest, ConcurrentRandomReads) {
  std::string data(1 << 16, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i);
  ASSERT_TRUE(Write(P("r"), data).ok());
  auto ra = env_->NewRandomAccessFile(P("r"));
  ASSERT_TRUE(ra.ok());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::byte buf[64];
      for (std::size_t off = static_cast<std::size_t>(t); off + 64 <= data.size(); off += 997) {
        std::size_t got = 0;
        if (!(*ra)->Read(off, buf, &got).ok() || got != 64 ||
            std::memcmp(buf, data.data() + off, 64) != 0) {
          ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(DirNameTest, Cases) {
  EXPECT_EQ(DirName("a/b"), "a");
  EXPECT_EQ(DirName("a/b/"), "a");
  EXPECT_EQ(DirName("b"), ".");
  EXPECT_EQ(DirName("/b"), "/");
  EXPECT_EQ(DirName("/x/y/z"), "/x/y");
}

// TruncateFile cuts a file; a file open for appending goes on at the new
// end (segment files rely on it); growing is refused.
TEST_P(EnvContractTest, TruncateCutsAndAppendsGoOnAtTheNewEnd) {
  auto f = env_->NewAppendableFile(P("seg"));
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append(Bytes("keep|drop me")).ok());
  ASSERT_TRUE(env_->TruncateFile(P("seg"), 5).ok());
  EXPECT_EQ(*env_->GetFileSize(P("seg")), 5u);
  ASSERT_TRUE((*f)->Append(Bytes("more")).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  EXPECT_EQ(*ReadFileToString(env_, P("seg")), "keep|more");
  EXPECT_FALSE(env_->TruncateFile(P("seg"), 100).ok()) << "a longer size is refused";
  EXPECT_FALSE(env_->TruncateFile(P("absent"), 0).ok());
}

// A file opened for direct reads: the POSIX Env asks for 4 KiB alignment
// (0 where the file system has no O_DIRECT), the in-memory one none; an
// aligned read returns the bytes and a short one the end of the file.
TEST_P(EnvContractTest, DirectReadsOfAlignedRanges) {
  std::string data(3 * 4096 + 100, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(Write(P("d"), data).ok());
  auto f = env_->NewDirectRandomAccessFile(P("d"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  // A mapping of it goes through the page cache like any other.
  auto m = (*f)->Map(data.size());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::memcmp(m->data, data.data(), data.size()), 0);
  const std::size_t a = (*f)->alignment();
  if (!GetParam().posix) {
    EXPECT_EQ(a, 0u);
  }
  if (a == 0) return;
  EXPECT_EQ(a, 4096u);
  std::unique_ptr<std::byte, decltype(&std::free)> buf(static_cast<std::byte*>(std::aligned_alloc(a, 4 * a)),
                                                       &std::free);
  std::size_t n = 0;
  ASSERT_TRUE((*f)->Read(a, std::span<std::byte>(buf.get(), 4 * a), &n).ok());
  EXPECT_EQ(n, data.size() - a) << "short at the end of the file";
  EXPECT_EQ(std::memcmp(buf.get(), data.data() + a, n), 0);
}

INSTANTIATE_TEST_SUITE_P(Envs, EnvContractTest,
                         ::testing::Values(EnvCase{"posix", true}, EnvCase{"mem", false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace primecache

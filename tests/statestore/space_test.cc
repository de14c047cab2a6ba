// experiment
#include <cstring>
#include <random>
#include <thread>
#include "store_test_util.h"

namespace primecache {
namespace {
using namespace store_test;  // NOLINT(google-build-using-namespace)

std::uint64_t DirBytes(const std::string& dir) {
  std::uint64_t n = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}
void ListDir(const std::string& dir) {
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    std::printf("  %s %llu\n", e.path().filename().c_str(), (unsigned long long)(e.is_regular_file() ? e.file_size() : 0));
  }
}

std::string RandomChunk(std::mt19937_64& rng, std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i + 8 <= n; i += 8) { std::uint64_t v = rng(); std::memcpy(&s[i], &v, 8); }
  return s;
}

void RunCase(std::size_t chunk, int per, bool mix = false) {
  TempDir dir;
  StoreOptions o;
  o.path = dir.path + "/store";
  auto st = Store::Open(o);
  ASSERT_TRUE(st.ok());
  auto& s = **st;
  MustPublish(s, Conversation(300, 1));
  std::printf("baseline %llu\n", (unsigned long long)DirBytes(o.path));
  std::mt19937_64 rng(1);
  std::vector<std::unique_ptr<Publisher>> pubs;
  for (int p = 0; p < 4; ++p) {
    auto pub = s.BeginPublish(Request(Conversation(100, 10 + p)));
    ASSERT_TRUE(pub.ok());
    ASSERT_TRUE((*pub)->BeginLayer("header").ok());
    pubs.push_back(std::move(pub).value());
  }
  for (int i = 0; i < per; ++i) {
    for (auto& p : pubs) ASSERT_TRUE(p->AddChunk(RandomChunk(rng, chunk)).ok());
    if (mix && i % 4 == 0) MustPublish(s, Conversation(300, 1000 + i));
  }
  std::printf("staged %llu\n", (unsigned long long)DirBytes(o.path));
  for (auto& p : pubs) p->Abort();
  std::printf("aborted %llu\n", (unsigned long long)DirBytes(o.path));
  for (int i = 0; i < 50; ++i) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }
  std::printf("aborted+5s %llu\n", (unsigned long long)DirBytes(o.path));
  ListDir(o.path);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.Compact().ok());
    std::printf("compact %d: %llu (stat %llu)\n", i, (unsigned long long)DirBytes(o.path), (unsigned long long)s.Stat()->disk_bytes);
  }
  ListDir(o.path);
  st->reset();
  std::printf("closed %llu\n", (unsigned long long)DirBytes(o.path));
  st = Store::Open(o);
  std::printf("reopened %llu\n", (unsigned long long)DirBytes(o.path));
  ASSERT_TRUE((*st)->Compact().ok());
  std::printf("reopened+compact %llu\n", (unsigned long long)DirBytes(o.path));
  ListDir(o.path);
}

TEST(Experiment, Small) { RunCase(64 << 10, 512); }
TEST(Experiment, Big) { RunCase(4 << 20, 8); }
TEST(Experiment, Mixed) { RunCase(1 << 20, 32, true); }
}  // namespace
}  // namespace primecache

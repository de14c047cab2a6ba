// primecache-run end to end against the real daemon: its summary and exit
// status when a publish fails, and what it says when the daemon is up but
// its store cannot write.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/ipc/daemon_harness.h"
#include "tests/model/step_compare.h"

namespace primecache::testing {
namespace {

const char kPrompt[] =
    "The lighthouse keeper counted the ships that passed each night and wrote their names in a ledger.";

ProcessResult RunThrough(const Daemon& d, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {PRIMECACHE_RUN_PATH, "--model",
                                   std::string(PRIMECACHE_SOURCE_DIR) + "/configs/hrm-tiny.json",
                                   "--prompt", kPrompt, "--socket", d.socket(), "--max-new-tokens", "2",
                                   "--log-level", "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  return RunProcess(args);
}

std::string LastLine(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const auto nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

TEST(RunTool, TheSummaryCountsPublishesAndAFailedOneExitsThree) {
  Daemon ok;
  ASSERT_TRUE(ok.Start());
  ProcessResult r = RunThrough(ok);
  EXPECT_EQ(r.rc, 0) << r.err;
  // The prompt's end and the generation's end.
  EXPECT_NE(LastLine(r.out).find("published=2 publish_failures=0"), std::string::npos) << r.out;
  // Only the prompt's end when the generation's is switched off.
  ProcessResult one = RunThrough(ok, {"--no-generation-end", "--namespace", "other"});
  EXPECT_EQ(one.rc, 0) << one.err;
  EXPECT_NE(LastLine(one.out).find("published=1 publish_failures=0"), std::string::npos) << one.out;

  // A daemon that refuses the entry: the text is still printed, but the
  // run exits 3 and says why.
  Daemon tight({"--max-uncommitted-per-connection", "1K"});
  ASSERT_TRUE(tight.Start());
  r = RunThrough(tight);
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(LastLine(r.out).find("published=0 publish_failures=2"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("--max-uncommitted-per-connection"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("the daemon is unavailable"), std::string::npos) << r.err;
}

// The generated text: everything before the speculate and summary lines.
std::string Generated(const std::string& out) {
  std::size_t end = out.find("\nspeculate: ");
  if (end == std::string::npos) end = out.find("\nsummary: ");
  return out.substr(0, end);
}

// --speculate decodes through the prefix cache as before (a longer prompt
// restores the first run's prefix; its own boundary is published after the
// speculative rounds) and prints the plain greedy text.
TEST(RunTool, SpeculationPrintsThePlainGreedyTextThroughTheCache) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  const std::string prompt = "abcabcabcabc abcabcabc abc abc abcabcabcabcabc";
  auto run = [&](const std::string& text, std::vector<std::string> extra) {
    std::vector<std::string> args{PRIMECACHE_RUN_PATH, "--model",
                                  std::string(PRIMECACHE_SOURCE_DIR) + "/configs/hrm-tiny-swa-tq2.json",
                                  "--prompt", text, "--socket", d.socket(), "--max-new-tokens", "40",
                                  "--log-level", "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunProcess(args);
  };
  ASSERT_EQ(run(prompt, {}).rc, 0);  // publishes the prompt's boundary
  const std::string longer = prompt + " abcabc";
  ProcessResult spec = run(longer, {"--speculate", "4"});
  ASSERT_EQ(spec.rc, 0) << spec.err;
  ProcessResult plain = run(longer, {"--no-cache"});
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ProcessResult alone = run(longer, {"--speculate", "2", "--no-cache"});
  ASSERT_EQ(alone.rc, 0) << alone.err;
  EXPECT_FALSE(Generated(plain.out).empty());
  EXPECT_EQ(Generated(spec.out), Generated(plain.out));
  EXPECT_EQ(Generated(alone.out), Generated(plain.out));
  EXPECT_NE(spec.out.find("speculate: gamma=4 rounds="), std::string::npos) << spec.out;
  EXPECT_NE(LastLine(spec.out).find("published=2 publish_failures=0"), std::string::npos) << spec.out;
  EXPECT_EQ(LastLine(spec.out).find("restored_tokens=0 "), std::string::npos) << spec.out;
}

// The data dir on a small tmpfs, filled until the store refuses writes.
TEST(RunTool, AStoreThatCannotWriteIsNotReportedAsTheDaemonDown) {
  const std::string dir = MakeTempDir();
  const std::string data = dir + "/data";
  ASSERT_EQ(mkdir(data.c_str(), 0700), 0);
  {
    Tmpfs small(data, 16);
    PRIMECACHE_TMPFS_OR_SKIP(small);
    Daemon d({}, dir);
    ASSERT_TRUE(d.Start());
    auto c = Client::Connect(d.Options("default"));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_FALSE(FillStore(**c).ok()) << "16 MiB never filled";
    // The refused publish gave its bytes back: the disk is filled to the
    // last byte from outside.
    testing::FillFileSystem(data + "/filler");
    ASSERT_TRUE(d.Alive());
    ProcessResult r = RunThrough(d);
    EXPECT_EQ(r.rc, 3) << r.out << r.err;
    EXPECT_NE(LastLine(r.out).find("publish_failures=2"), std::string::npos) << r.out;
    EXPECT_EQ(r.err.find("the daemon is unavailable"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("publish of a"), std::string::npos) << r.err;
    d.Kill();
  }
  std::filesystem::remove_all(dir);
}

// --tp N: the ranks of a tensor-parallel run give the TP 1 text (no greedy
// pick of this prompt is near a tie) and logits within the spec's
// tolerance; a TP size that does not divide a split dimension is refused
// by name; through a daemon, a TP run publishes and a later one restores.
TEST(RunTool, TensorParallelRunsGiveTheTpOneTextAndLogits) {
  const std::string dir = MakeTempDir();
  auto run = [&](const std::string& tp) {
    std::vector<std::string> args{PRIMECACHE_RUN_PATH, "--model",
                                  std::string(PRIMECACHE_SOURCE_DIR) + "/configs/hrm-tiny-swa-tq2.json",
                                  "--prompt", kPrompt, "--max-new-tokens", "12", "--tp", tp,
                                  "--dump-logits", dir + "/tp" + tp, "--log-level", "warn", "--no-cache"};
    return RunProcess(args);
  };
  auto logits = [&](const std::string& tp) {
    std::ifstream in(dir + "/tp" + tp, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / sizeof(float));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
    return v;
  };
  ProcessResult one = run("1");
  ASSERT_EQ(one.rc, 0) << one.err;
  const std::vector<float> want = logits("1");
  ASSERT_FALSE(want.empty());
  {  // TP 4 would split the 2 kv heads: refused below
    const std::string tp = "2";
    ProcessResult r = run(tp);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(Generated(r.out), Generated(one.out)) << "TP " << tp;
    EXPECT_NE(LastLine(r.out).find("restored_tokens=0 "), std::string::npos) << r.out;
    const std::vector<float> got = logits(tp);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(model::testing::RelErr(got, want), 1e-4) << "TP " << tp;
    EXPECT_NE(got, want) << "TP " << tp << " summed in another order, yet bit-identical";
  }
  ProcessResult odd = run("3");
  EXPECT_EQ(odd.rc, 1);
  EXPECT_NE(odd.err.find("TP 3 does not divide mlp_hidden = 128"), std::string::npos) << odd.err;
  ProcessResult four = run("4");  // 2 kv heads
  EXPECT_EQ(four.rc, 1);
  EXPECT_NE(four.err.find("TP 4 does not divide attn.kv_heads = 2"), std::string::npos) << four.err;
  // Through a daemon: the prompt's and the generation's ends are published
  // as group entries of two parts, and a longer prompt restores the first.
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto through = [&](const std::string& prompt) {
    return RunProcess({PRIMECACHE_RUN_PATH, "--model",
                       std::string(PRIMECACHE_SOURCE_DIR) + "/configs/hrm-tiny-swa-tq2.json", "--prompt", prompt,
                       "--max-new-tokens", "4", "--tp", "2", "--socket", d.socket(), "--log-level", "warn"});
  };
  ProcessResult first = through(kPrompt);
  ASSERT_EQ(first.rc, 0) << first.err;
  EXPECT_NE(LastLine(first.out).find("restored_tokens=0 "), std::string::npos) << first.out;
  EXPECT_NE(LastLine(first.out).find("published=2 publish_failures=0"), std::string::npos) << first.out;
  ProcessResult again = through(std::string(kPrompt) + " And more.");
  ASSERT_EQ(again.rc, 0) << again.err;
  const std::size_t prompt_tokens = std::string(kPrompt).size() + 1;  // BOS, then a token a byte
  EXPECT_NE(LastLine(again.out).find("restored_tokens=" + std::to_string(prompt_tokens) + " "), std::string::npos)
      << again.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace primecache::testing

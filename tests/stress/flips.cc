// The flip campaign: one real entry (with its model descriptor) exported to a
// .pcsnap by primecachectl, then K damaged copies (one bit flipped at a random
// offset, a burst of random bytes, or a truncation at a random length), each
// of which `primecachectl verify --file` must refuse as damage (exit 1) and
// `primecachectl import` into a second, empty daemon must refuse (a non-zero
// exit that is not a crash). The second daemon must stay empty, and then
// take the undamaged file.
#include <filesystem>
#include <fstream>
#include <iterator>

#include "primecache/internal/snapshot.h"
#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"

namespace primecache::stress {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A model with a real fingerprint, so that its entries can be exported, whose
// plan is that of MakeLayers' four-layer entries.
client::ModelId ExportableModel() {
  ModelFingerprint fp;
  fp.architecture = "stress-model";
  fp.plan_digest = testing::MakeLayersPlan(4);
  fp.weights_digest = {23, 24};
  fp.codec_versions = {"kda-recurrent/v1", "mla-latent/v1", "raw/v1"};
  return client::ModelId{fp.Digest(), fp.architecture, EncodeFingerprint(fp), {}};
}

// One damaged copy of `good` and what was done to it.
std::pair<std::string, std::string> Damage(const std::string& good, std::mt19937_64& rng) {
  auto at = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  std::string bad = good;
  const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
  if (kind < 6) {
    const std::size_t off = at(bad.size());
    const int bit = std::uniform_int_distribution<int>(0, 7)(rng);
    bad[off] = static_cast<char>(bad[off] ^ (1 << bit));
    return {bad, "bit " + std::to_string(bit) + " of byte " + std::to_string(off) + " flipped"};
  }
  if (kind < 8) {
    const std::size_t off = at(bad.size());
    const std::size_t len = std::min<std::size_t>(1 + at(16), bad.size() - off);
    for (std::size_t k = 0; k < len; ++k) bad[off + k] = static_cast<char>(rng());
    if (bad == good) bad[off] = static_cast<char>(bad[off] ^ 0x80);
    return {bad, std::to_string(len) + " random bytes at " + std::to_string(off)};
  }
  const std::size_t keep = at(bad.size());
  bad.resize(keep);
  return {bad, "truncated to " + std::to_string(keep) + " of " + std::to_string(good.size()) + " bytes"};
}

struct Tally {
  int copies = 0, verify_refused = 0, import_refused = 0, accepted = 0;
  std::map<int, int> verify_rc, import_rc;
};

// Exports one entry of `a` and checks the file; empty on failure.
std::string ExportOne(const testing::Daemon& a, const std::string& file) {
  auto c = client::Client::Connect(a.Options());
  if (!c.ok()) return {};
  const auto tokens = testing::Tokens(300, 41);
  auto pub = (*c)->Publish(ExportableModel(), tokens, testing::MakeLayers(300, 4, 41, 64, 32));
  if (!pub.ok()) {
    Say("flips: publish: %s", pub.status().ToString().c_str());
    return {};
  }
  ProcResult e = Ctl(a, {"export", std::to_string(pub->id), file});
  ProcResult v = RunProgram(PRIMECACHECTL_PATH, {"verify", "--file", file});
  if (e.rc != 0 || v.rc != 0) {
    Say("flips: export exit %d, verify of the export exit %d\n%s%s%s", e.rc, v.rc, e.err.c_str(), v.out.c_str(),
        v.err.c_str());
    return {};
  }
  return ReadFile(file);
}

// Offers one damaged copy to verify --file and to import.
void Offer(const testing::Daemon& b, const std::string& path, const std::string& what, int k, Tally& t) {
  ProcResult v = RunProgram(PRIMECACHECTL_PATH, {"verify", "--file", path});
  ProcResult i = Ctl(b, {"import", path});
  ++t.verify_rc[v.rc];
  ++t.import_rc[i.rc];
  const bool v_ok = v.rc == 1;                  // damage
  const bool i_ok = i.rc >= 1 && i.rc <= 6;     // refused, not crashed
  t.verify_refused += v_ok ? 1 : 0;
  t.import_refused += i_ok ? 1 : 0;
  if (!v_ok || !i_ok) {
    ++t.accepted;
    const std::string kept = path + ".accepted-" + std::to_string(k);
    std::filesystem::copy_file(path, kept, std::filesystem::copy_options::overwrite_existing);
    Say("flips: copy %d (%s) NOT refused: verify exit %d, import exit %d; kept as %s\n%s%s", k, what.c_str(), v.rc,
        i.rc, kept.c_str(), v.out.c_str(), i.err.c_str());
  }
}

std::string Histogram(const std::map<int, int>& h) {
  std::string s;
  for (const auto& [rc, n] : h) s += (s.empty() ? "" : ",") + std::to_string(rc) + ":" + std::to_string(n);
  return s;
}

// The importing daemon took nothing damaged, and takes the good file.
bool AfterwardsClean(const testing::Daemon& b, const std::string& good_path) {
  auto c = client::Client::Connect(b.Options());
  auto st = c.ok() ? (*c)->Stat() : Result<client::DaemonStats>(c.status());
  const bool empty = st.ok() && st->store.entries == 0;
  if (!empty) Say("flips: the importing daemon holds %llu entries after the damaged imports", st.ok() ? U(st->store.entries) : 0);
  ProcResult i = Ctl(b, {"import", good_path});
  ProcResult v = Ctl(b, {"verify", "--all"});
  if (i.rc != 0 || v.rc != 0) Say("flips: the good file: import exit %d, verify --all exit %d\n%s", i.rc, v.rc, i.err.c_str());
  return empty && i.rc == 0 && v.rc == 0;
}

}  // namespace

int RunFlips(const FlipOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = MakeWorkDir(o.common.work_dir, "pcstress-flips");
  testing::Daemon a({}, dir + "/a"), b({}, dir + "/b");
  std::filesystem::create_directories(dir + "/a");
  std::filesystem::create_directories(dir + "/b");
  Say("flips: %d damaged copies; work dir %s, seed %llu", o.copies, dir.c_str(), U(o.common.seed));
  if (!a.Start() || !b.Start()) {
    Say("flips: FAIL: a daemon did not start");
    return 1;
  }
  const std::string good_path = dir + "/good.pcsnap";
  const std::string good = ExportOne(a, good_path);
  if (good.empty()) return 1;
  std::mt19937_64 rng(o.common.seed);
  Tally t;
  const std::string path = dir + "/damaged.pcsnap";
  for (int k = 0; k < o.copies; ++k) {
    auto [bad, what] = Damage(good, rng);
    WriteFile(path, bad);
    Offer(b, path, what, k, t);
    ++t.copies;
    if ((k + 1) % 500 == 0) Say("flips: %d copies, %d not refused, %.0f s", k + 1, t.accepted, SecondsSince(t0));
  }
  const bool clean = AfterwardsClean(b, good_path);
  const bool ok = t.accepted == 0 && clean;
  Say("RESULT flips %s: file_bytes=%zu copies=%d refused_by_verify=%d refused_by_import=%d verify_exits=%s "
      "import_exits=%s importer_clean=%d seconds=%.1f",
      ok ? "PASS" : "FAIL", good.size(), t.copies, t.verify_refused, t.import_refused, Histogram(t.verify_rc).c_str(),
      Histogram(t.import_rc).c_str(), clean ? 1 : 0, SecondsSince(t0));
  a.Stop();
  b.Stop();
  std::error_code ec;
  if (ok && !o.common.keep) std::filesystem::remove_all(dir, ec);
  return ok ? 0 : 1;
}

}  // namespace primecache::stress

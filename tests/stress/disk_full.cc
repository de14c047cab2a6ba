// The disk-full cycle: the real primecached with its data dir on a small
// tmpfs mounted here (root only; otherwise the campaign is skipped, exit 77,
// or fails under CI=true: tests/support/tmpfs.h).
// A filler file takes most of the room, then publishes go on until one is
// refused; that refusal must name the lack of space. While full, stored
// entries are still served byte-exact. Then the filler is removed and,
// without a restart, publishes must succeed again within recover_seconds;
// every acknowledged entry is present and byte-exact, `verify --all` is
// clean, and all of it survives a restart.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/stress/stress_modes.h"
#include "tests/stress/stress_util.h"
#include "tests/support/tmpfs.h"

namespace primecache::stress {
namespace {

struct Published {
  std::vector<std::uint32_t> tokens;
  std::uint64_t entry = 0, digest = 0;
};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Fills the file system but `leave` bytes with one file; false when it could not.
bool WriteFiller(const std::string& path, std::uint64_t leave) {
  struct statvfs sv {};
  if (statvfs(std::filesystem::path(path).parent_path().c_str(), &sv) != 0) return false;
  const std::uint64_t avail = static_cast<std::uint64_t>(sv.f_bavail) * sv.f_frsize;
  std::uint64_t todo = avail > leave ? avail - leave : 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::string block(1 << 20, 'x');
  while (todo > 0 && out) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(todo, block.size()));
    out.write(block.data(), static_cast<std::streamsize>(n));
    todo -= n;
  }
  out.flush();
  return static_cast<bool>(out);
}

class DiskFull {
 public:
  DiskFull(const DiskFullOptions& o, std::string dir) : o_(o), dir_(std::move(dir)), d_({}, dir_ + "/fs") {}
  int Run();

 private:
  Result<Published> PublishOne(client::Client& c, std::uint32_t seed, std::uint32_t length);
  bool FillUntilRefused(client::Client& c);
  bool ServesEverything(const std::string& when);
  bool PublishesAgain(client::Client& c);

  const DiskFullOptions o_;
  const std::string dir_;
  testing::Daemon d_;
  std::vector<Published> acked_;
  std::string refusal_;
};

Result<Published> DiskFull::PublishOne(client::Client& c, std::uint32_t seed, std::uint32_t length) {
  EntrySpec spec;
  spec.seed = seed;
  spec.length = length;
  spec.layers = 4;
  spec.rows_per_chunk = 256;
  Published p{SpecTokens(spec), 0, 0};
  const auto layers = SpecLayers(spec);
  p.digest = LayersDigest(layers);
  PC_ASSIGN_OR_RETURN(auto r, c.Publish(testing::TestModel(), p.tokens, layers));
  p.entry = r.id;
  acked_.push_back(p);
  return p;
}

// Publishes ~0.5 MiB entries until one is refused; its message must say why.
bool DiskFull::FillUntilRefused(client::Client& c) {
  for (std::uint32_t k = 0; k < 400; ++k) {
    auto r = PublishOne(c, 1000 + k, 1024);
    if (r.ok()) continue;
    refusal_ = r.status().ToString();
    Say("diskfull: publish %u refused: %s", k, refusal_.c_str());
    const std::string m = Lower(refusal_);
    const bool clear = m.find("space") != std::string::npos || m.find("full") != std::string::npos;
    if (!clear) Say("diskfull: FAIL: the refusal does not say that the disk is full");
    return clear;
  }
  Say("diskfull: FAIL: 400 publishes into a full file system were all acknowledged");
  return false;
}

// Every acknowledged entry found and byte-exact; stats answer.
bool DiskFull::ServesEverything(const std::string& when) {
  auto c = client::Client::Connect(d_.Options());
  if (!c.ok()) {
    Say("diskfull: %s: connect: %s", when.c_str(), c.status().ToString().c_str());
    return false;
  }
  int bad = 0;
  for (const auto& p : acked_) {
    auto hit = (*c)->Lookup(testing::TestModel(), p.tokens);
    auto got = hit.ok() && hit->has_value() && (*hit)->id == p.entry ? (*c)->FetchLayers(p.entry)
                                                               : Result<std::vector<FetchedLayer>>(Status::NotFound("lookup"));
    if (!got.ok() || LayersDigest(*got) != p.digest) {
      if (bad++ < 5) Say("diskfull: %s: entry %llu not served: %s", when.c_str(), U(p.entry),
                         got.ok() ? "bytes differ" : got.status().ToString().c_str());
    }
  }
  const bool stat_ok = (*c)->Stat().ok();
  Say("diskfull: %s: %zu acknowledged entries, %d not served, stats %s", when.c_str(), acked_.size(), bad,
      stat_ok ? "ok" : "failed");
  return bad == 0 && stat_ok;
}

// After the room comes back: a new publish is acknowledged within the bound.
bool DiskFull::PublishesAgain(client::Client& c) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string last;
  for (std::uint32_t k = 0; SecondsSince(t0) < o_.recover_seconds; ++k) {
    auto r = PublishOne(c, 5000 + k, 256);
    if (r.ok()) {
      Say("diskfull: publishing again %.1f s after the room came back (%u refused meanwhile)", SecondsSince(t0), k);
      return true;
    }
    last = r.status().ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  Say("diskfull: FAIL: no publish acknowledged within %d s of freeing space; last: %s", o_.recover_seconds,
      last.c_str());
  return false;
}

int DiskFull::Run() {
  const std::string filler = dir_ + "/fs/filler";
  if (!d_.Start()) {
    Say("diskfull: FAIL: the daemon did not start on the tmpfs");
    return 1;
  }
  auto c = client::Client::Connect(d_.Options());
  std::unique_ptr<client::Client> cl = c.ok() ? std::move(c).value() : nullptr;
  bool ok = cl != nullptr;
  for (std::uint32_t k = 0; ok && k < 3; ++k) ok = PublishOne(*cl, 1 + k, 300).ok();
  ok = ok && WriteFiller(filler, 6u << 20) && FillUntilRefused(*cl) && ServesEverything("while full");
  std::error_code ec;
  std::filesystem::remove(filler, ec);
  ok = ok && PublishesAgain(*cl) && ServesEverything("after freeing");
  ProcResult v = Ctl(d_, {"verify", "--all"});
  if (v.rc != 0) Say("diskfull: verify --all exit %d\n%s%s", v.rc, v.out.c_str(), v.err.c_str());
  cl.reset();
  const bool restarted = d_.Stop() == 0 && d_.Start() && ServesEverything("after a restart");
  d_.Stop();
  ok = ok && v.rc == 0 && restarted;
  Say("RESULT diskfull %s: tmpfs_mib=%d acknowledged=%zu refusal=\"%s\" verify_all=%d", ok ? "PASS" : "FAIL",
      o_.tmpfs_mib, acked_.size(), refusal_.c_str(), v.rc);
  return ok ? 0 : 1;
}

}  // namespace

int RunDiskFull(const DiskFullOptions& o) {
  const std::string dir = MakeWorkDir(o.common.work_dir, "pcstress-diskfull");
  const std::string fs = dir + "/fs";
  std::filesystem::create_directories(fs);
  int rc = 0;
  {
    testing::Tmpfs tmpfs(fs, o.tmpfs_mib);
    if (!tmpfs.mounted()) {
      // Skipped where mounting is not allowed; under CI=true a failure.
      Say("diskfull: %s: %s", testing::Tmpfs::Required() ? "FAIL" : "SKIPPED", tmpfs.Why().c_str());
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      return testing::Tmpfs::Required() ? 1 : 77;
    }
    Say("diskfull: a %d MiB tmpfs at %s", o.tmpfs_mib, fs.c_str());
    rc = DiskFull(o, dir).Run();
  }
  std::error_code ec;
  if (rc == 0 && !o.common.keep) std::filesystem::remove_all(dir, ec);
  return rc;
}

}  // namespace primecache::stress

#include "tests/stress/stress_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <fstream>

#include "primecache/checksum.h"

namespace primecache::stress {

EntrySpec RandomSpec(std::mt19937_64& rng, std::uint32_t seed) {
  auto pick = [&](std::uint32_t lo, std::uint32_t hi) {
    return static_cast<std::uint32_t>(std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng));
  };
  EntrySpec s;
  s.seed = seed;
  const std::uint32_t size_class = pick(0, 99);
  if (size_class < 70) {  // up to ~0.5 MiB
    s.length = pick(16, 640);
    s.layers = pick(2, 6);
    s.rows_per_chunk = 1u << pick(4, 7);
  } else if (size_class < 95) {  // up to ~2 MiB
    s.length = pick(640, 3000);
    s.layers = pick(2, 5);
    s.rows_per_chunk = 1u << pick(6, 9);
  } else {  // 4 to 9 MiB: past the store's direct-write threshold
    s.length = pick(4096, 9000);
    s.layers = pick(3, 4);
    s.width = 128;
    s.rows_per_chunk = 1u << pick(8, 10);
  }
  return s;
}

std::vector<std::uint32_t> SpecTokens(const EntrySpec& spec) { return testing::Tokens(spec.length, spec.seed); }

std::vector<LayerData> SpecLayers(const EntrySpec& spec) {
  return testing::MakeLayers(spec.length, spec.layers, spec.seed, spec.width, spec.rows_per_chunk);
}

namespace {

// Feeds a layer's header and chunks, each preceded by its size.
void Feed(Checksum64Stream& h, std::span<const std::byte> bytes) {
  const std::uint64_t n = bytes.size();
  h.Update(std::as_bytes(std::span(&n, 1)));
  h.Update(bytes);
}
std::span<const std::byte> AsBytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace

std::uint64_t LayersDigest(const std::vector<LayerData>& layers) {
  Checksum64Stream h;
  for (const auto& l : layers) {
    Feed(h, l.header);
    for (const auto& c : l.chunks) Feed(h, c);
  }
  return h.Digest();
}

std::uint64_t LayersDigest(const std::vector<FetchedLayer>& layers) {
  Checksum64Stream h;
  for (const auto& l : layers) {
    Feed(h, l.data.header);
    for (const auto& c : l.data.chunks) Feed(h, c);
  }
  return h.Digest();
}

std::uint64_t LayersDigest(const std::vector<LayerBytes>& layers) {
  Checksum64Stream h;
  for (const auto& l : layers) {
    Feed(h, AsBytes(l.header));
    for (const auto& c : l.chunks) Feed(h, AsBytes(c));
  }
  return h.Digest();
}

std::vector<LayerBytes> ToLayerBytes(const std::vector<LayerData>& layers) {
  std::vector<LayerBytes> out;
  for (const auto& l : layers) {
    LayerBytes b;
    b.header.assign(reinterpret_cast<const char*>(l.header.data()), l.header.size());
    for (const auto& c : l.chunks) b.chunks.emplace_back(reinterpret_cast<const char*>(c.data()), c.size());
    out.push_back(std::move(b));
  }
  return out;
}

std::string TokensKey(const std::vector<std::uint32_t>& tokens) {
  return {reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(std::uint32_t)};
}

void Registry::Attempted(const std::vector<std::uint32_t>& tokens, std::uint64_t digest) {
  std::lock_guard lock(mu_);
  auto& a = attempts_[TokensKey(tokens)];
  a.digest = digest;
  a.length = static_cast<std::uint32_t>(tokens.size());
}

void Registry::Acked(const std::vector<std::uint32_t>& tokens, std::uint64_t entry) {
  std::lock_guard lock(mu_);
  auto& a = attempts_[TokensKey(tokens)];
  if (!a.acked) acked_keys_.push_back(TokensKey(tokens));
  a.acked = true;
  a.entry = entry;
}

void Registry::Deleting(const std::string& key) {
  std::lock_guard lock(mu_);
  attempts_[key].deleting = true;
}

void Registry::DeleteRefused(const std::string& key) {
  std::lock_guard lock(mu_);
  attempts_[key].deleting = false;
}

void Registry::Evicted(const std::string& key) {
  std::lock_guard lock(mu_);
  attempts_[key].evicted = true;
}

void Registry::Deleted(const std::string& key) {
  std::lock_guard lock(mu_);
  attempts_[key].deleted = true;
}

std::optional<std::pair<std::string, Registry::Attempt>> Registry::RandomAcked(std::mt19937_64& rng) const {
  std::lock_guard lock(mu_);
  if (acked_keys_.empty()) return std::nullopt;
  const std::string& key =
      acked_keys_[std::uniform_int_distribution<std::size_t>(0, acked_keys_.size() - 1)(rng)];
  return std::make_pair(key, attempts_.at(key));
}

std::optional<Registry::Attempt> Registry::Find(const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = attempts_.find(key);
  if (it == attempts_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, Registry::Attempt> Registry::Snapshot() const {
  std::lock_guard lock(mu_);
  return attempts_;
}

std::size_t Registry::AckedCount() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto& [k, a] : attempts_) n += a.acked ? 1 : 0;
  return n;
}

void Registry::Clear() {
  std::lock_guard lock(mu_);
  attempts_.clear();
  acked_keys_.clear();
}

AckLog::AckLog(const std::string& path) : f_(std::fopen(path.c_str(), "a")) {
  if (f_ == nullptr) {
    std::fprintf(stderr, "stress: cannot open the ack log %s\n", path.c_str());
    std::exit(1);
  }
}

AckLog::~AckLog() {
  if (f_ != nullptr) std::fclose(f_);
}

void AckLog::Record(const std::string& line) {
  std::lock_guard lock(mu_);
  std::fputs(line.c_str(), f_);
  std::fputc('\n', f_);
  std::fflush(f_);
  fdatasync(fileno(f_));
}

ProcResult RunProgram(const std::string& path, const std::vector<std::string>& args, std::chrono::seconds limit) {
  std::vector<std::string> all = {path};
  all.insert(all.end(), args.begin(), args.end());
  return testing::RunProcess(std::move(all), std::nullopt, limit);
}

ProcResult Ctl(const testing::Daemon& d, std::vector<std::string> args) {
  std::vector<std::string> a = {"--data-dir", d.data_dir(), "--socket", d.admin_socket(), "--no-progress"};
  a.insert(a.end(), args.begin(), args.end());
  return RunProgram(PRIMECACHECTL_PATH, a);
}

ProcResult CtlOffline(const std::string& data_dir, std::vector<std::string> args) {
  std::vector<std::string> a = {"--data-dir", data_dir, "--offline", "--no-progress"};
  a.insert(a.end(), args.begin(), args.end());
  return RunProgram(PRIMECACHECTL_PATH, a);
}

ProcSample SampleProcess(pid_t pid) {
  ProcSample s;
  const std::string base = "/proc/" + std::to_string(pid);
  std::ifstream in(base + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kib = std::strtol(line.c_str() + 6, nullptr, 10);
  }
  if (DIR* d = opendir((base + "/fd").c_str())) {
    s.fds = 0;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++s.fds;
    }
    closedir(d);
  }
  return s;
}

void Say(const char* fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result<std::vector<client::EntryInfo>> ListAll(client::Client& c) {
  std::vector<client::EntryInfo> all;
  client::ListOptions o;
  o.limit = 500;
  for (;;) {
    PC_ASSIGN_OR_RETURN(auto page, c.List(o));
    for (auto& e : page.entries) all.push_back(std::move(e));
    if (page.next_page_token.empty()) return all;
    o.page_token = page.next_page_token;
  }
}

std::string MakeWorkDir(const std::string& base, const std::string& prefix) {
  std::string root = base;
  if (root.empty()) {
    const char* t = std::getenv("TMPDIR");
    root = t != nullptr && *t != '\0' ? t : "/tmp";
  }
  std::string tmpl = root + "/" + prefix + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "stress: cannot create a directory under %s\n", root.c_str());
    std::exit(1);
  }
  return tmpl;
}

}  // namespace primecache::stress

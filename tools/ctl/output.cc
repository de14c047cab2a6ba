#include "tools/ctl/output.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "primecache/internal/model.h"

namespace primecache::ctl {

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kCorruption:
      return kExitDamage;
    case StatusCode::kNotFound:
      return kExitNotFound;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return kExitUnavailable;
    case StatusCode::kFailedPrecondition:
      return kExitRefused;
    default:
      return kExitFailed;
  }
}

std::string_view ExitCodeName(int code) {
  switch (code) {
    case kExitOk:
      return "ok";
    case kExitDamage:
      return "damage";
    case kExitUsage:
      return "usage";
    case kExitNotFound:
      return "not_found";
    case kExitUnavailable:
      return "unavailable";
    case kExitRefused:
      return "refused";
    default:
      return "failed";
  }
}

void Output::Json(const nlohmann::json& doc) const {
  if (!json_) return;
  // Replacement of invalid UTF-8 keeps the document parseable whatever the
  // stored strings hold.
  std::cout << doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  std::cout.flush();
}

void Output::Line(const std::string& text) const {
  if (json_) return;
  std::cout << text << '\n';
}

void Output::Note(const std::string& text) const {
  EndProgress();
  std::cerr << "primecachectl: " << text << '\n';
}

int Output::Error(const Status& s) const {
  const int code = ExitCodeFor(s);
  EndProgress();
  std::cerr << "primecachectl: " << s.ToString() << '\n';
  if (json_) {
    Json({{"error", {{"code", std::string(ExitCodeName(code))}, {"status", std::string(StatusCodeName(s.code()))},
                     {"message", s.message()}}}});
  }
  return code;
}

bool Output::ShowsProgress() const {
  return !json_ && progress_ && isatty(STDERR_FILENO) != 0;
}

void Output::Progress(std::string_view what, std::uint64_t done, std::uint64_t total) const {
  if (!ShowsProgress() || total == 0) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(std::min<std::uint64_t>(kWidth, done * kWidth / total));
  std::cerr << '\r' << what << " [" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] " << done
            << '/' << total << std::flush;
  drawn_ = true;
}

void Output::Elapsed(std::string_view what, double seconds) const {
  if (!ShowsProgress()) return;
  char took[32];
  std::snprintf(took, sizeof took, "%.1f s", seconds);
  std::cerr << '\r' << what << " ... " << took << std::flush;
  drawn_ = true;
}

ProgressTicker::ProgressTicker(const Output& out, std::string what) : out_(out), what_(std::move(what)) {
  if (!out_.ShowsProgress()) return;
  thread_ = std::thread([this] {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      out_.Elapsed(what_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      cv_.wait_for(lock, std::chrono::milliseconds(200));
    }
  });
}

ProgressTicker::~ProgressTicker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
  out_.EndProgress();
}

void Output::EndProgress() const {
  if (!drawn_) return;
  std::cerr << "\r\033[K" << std::flush;
  drawn_ = false;
}

std::string RenderTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(header.size());
  std::vector<bool> right(header.size());
  std::vector<std::string> names(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) {
    right[c] = !header[c].empty() && header[c][0] == '>';
    names[c] = right[c] ? header[c].substr(1) : header[c];
    width[c] = names[c].size();
  }
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      const std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
      if (c > 0) out += "  ";
      out += right[c] ? pad + cell : (c + 1 == width.size() ? cell : cell + pad);
    }
    return out;
  };
  std::string out = line(names) + '\n';
  for (const auto& r : rows) out += line(r) + '\n';
  if (!out.empty()) out.pop_back();
  return out;
}

std::string HumanBytes(std::uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string HumanAge(std::uint64_t s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llus", static_cast<unsigned long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%llum", static_cast<unsigned long long>(s / 60));
  } else if (s < 86400) {
    std::snprintf(buf, sizeof buf, "%lluh%02llum", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llud%02lluh", static_cast<unsigned long long>(s / 86400),
                  static_cast<unsigned long long>(s % 86400 / 3600));
  }
  return buf;
}

bool HexPrefixMatches(const Hash128& h, std::string_view prefix) {
  if (prefix.size() < 4 || prefix.size() > 32) return false;
  std::string lower(prefix);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return HexDigits(h).starts_with(lower);
}

namespace {

std::string TokenText(std::uint32_t t) {
  if (t == model::kBosToken) return "<bos>";
  if (t == model::kEosToken) return "<eos>";
  if (t > 255) return "<#" + std::to_string(t) + ">";
  const unsigned char c = static_cast<unsigned char>(t);
  if (c == '\n') return "\\n";
  if (c == '\t') return "\\t";
  if (c == '\\') return "\\\\";
  if (c >= 0x20 && c < 0x7f) return std::string(1, static_cast<char>(c));
  char buf[5];
  std::snprintf(buf, sizeof buf, "\\x%02x", c);
  return buf;
}

}  // namespace

std::string TokensAsText(const std::vector<std::uint32_t>& tokens, std::size_t max_chars, bool* shortened) {
  std::vector<std::string> pieces;
  pieces.reserve(tokens.size());
  std::size_t total = 0;
  for (std::uint32_t t : tokens) {
    pieces.push_back(TokenText(t));
    total += pieces.back().size();
  }
  *shortened = total > max_chars;
  if (!*shortened) {
    std::string out;
    out.reserve(total);
    for (const auto& p : pieces) out += p;
    return out;
  }
  // Whole tokens from each end, up to half the budget each.
  std::string head, tail;
  std::size_t h = 0, t = pieces.size();
  while (h < t && head.size() + pieces[h].size() <= max_chars / 2) head += pieces[h++];
  std::vector<std::string> back;
  std::size_t tail_chars = 0;
  while (t > h && tail_chars + pieces[t - 1].size() <= max_chars / 2) {
    tail_chars += pieces[t - 1].size();
    back.push_back(pieces[--t]);
  }
  for (auto it = back.rbegin(); it != back.rend(); ++it) tail += *it;
  return head + " … [" + std::to_string(t - h) + " more tokens] … " + tail;
}

}  // namespace primecache::ctl

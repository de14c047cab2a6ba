// primecachectl's output: tables and words for people, JSON for scripts,
// errors with documented exit codes (docs/cli.md), and a progress bar on a
// terminal. Everything here writes to stdout/stderr of one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/status.h"

namespace primecache::ctl {

// Exit statuses (docs/cli.md, "Exit status").
enum ExitCode : int {
  kExitOk = 0,
  kExitDamage = 1,       // verify found damage, or a command met corrupt bytes
  kExitUsage = 2,        // bad flags or arguments
  kExitNotFound = 3,     // no such entry or file
  kExitUnavailable = 4,  // no daemon answers and no store can be opened
  kExitRefused = 5,      // needs the daemon (read-only access), no permission, or the entry is in use
  kExitFailed = 6,       // anything else (I/O, a full disk, an internal error)
};

int ExitCodeFor(const Status& s);
std::string_view ExitCodeName(int code);

// Where results go: a JSON document, or lines for people.
class Output {
 public:
  Output(bool json, bool progress) : json_(json), progress_(progress) {}
  bool json() const { return json_; }

  // Prints a JSON document (json mode) on stdout.
  void Json(const nlohmann::json& doc) const;
  // A line for people on stdout (ignored in json mode).
  void Line(const std::string& text) const;
  // A note on stderr (both modes): what happened besides the result.
  void Note(const std::string& text) const;
  // Reports an error: a line on stderr; in json mode also {"error": ...} on
  // stdout. Returns its exit code.
  int Error(const Status& s) const;

  // A progress bar on stderr, drawn only on a terminal and not in json mode.
  void Progress(std::string_view what, std::uint64_t done, std::uint64_t total) const;
  // Where no fraction is known: what runs and for how long, as Progress.
  void Elapsed(std::string_view what, double seconds) const;
  void EndProgress() const;
  // Whether Progress and Elapsed draw: not --json, not --no-progress, and
  // stderr a terminal.
  bool ShowsProgress() const;

 private:
  bool json_;
  bool progress_;
  mutable bool drawn_ = false;
};

// While one long call runs whose progress cannot be told (compact, import's
// publish): redraws Output::Elapsed every 200 ms from a thread of its own,
// started only when the output shows progress; clears the line when it
// goes. The caller writes nothing else to `out` while a ticker lives.
class ProgressTicker {
 public:
  ProgressTicker(const Output& out, std::string what);
  ~ProgressTicker();
  ProgressTicker(const ProgressTicker&) = delete;
  ProgressTicker& operator=(const ProgressTicker&) = delete;

 private:
  const Output& out_;
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// A plain text table: a header row, then rows, columns padded to fit; a
// column whose header starts with '>' is right-aligned.
std::string RenderTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

std::string HumanBytes(std::uint64_t bytes);  // "1023 B", "1.50 MiB" (binary units, two decimals)
std::string HumanAge(std::uint64_t seconds);   // "45s", "12m", "3h04m", "5d02h"
// Parses HexDigits()'s form or a prefix of it (at least 4 digits).
bool HexPrefixMatches(const Hash128& h, std::string_view prefix);

// The byte tokenizer's tokens as text for a terminal: printable ASCII as is,
// other bytes as \n, \t, \xNN, special tokens as <bos>, <eos>, <#id>. When
// the text is longer than max_chars, its middle is replaced by
// " … [N more tokens] … ". *shortened says whether it was.
std::string TokensAsText(const std::vector<std::uint32_t>& tokens, std::size_t max_chars, bool* shortened);

}  // namespace primecache::ctl

// primecachectl's output: tables and words for people, JSON for scripts,
// errors with documented exit codes (docs/cli.md), and a progress bar on a
// terminal. Everything here writes to stdout/stderr of one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
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
  void EndProgress() const;

 private:
  bool json_;
  bool progress_;
  mutable bool drawn_ = false;
};

// A plain text table: a header row, then rows, columns padded to fit; a
// column whose header starts with '>' is right-aligned.
std::string RenderTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

std::string HumanBytes(std::uint64_t bytes);  // "1.50 MiB"
std::string HumanAge(std::uint64_t seconds);   // "45s", "12m", "3h04m", "5d02h"
std::string Hex(const Hash128& h);             // 32 hex digits, hi then lo
std::string Hex64(std::uint64_t v);            // 16 hex digits
// Parses Hex()'s form or a prefix of it (at least 4 digits).
bool HexPrefixMatches(const Hash128& h, std::string_view prefix);

// The byte tokenizer's tokens as text for a terminal: printable ASCII as is,
// other bytes as \n, \t, \xNN, special tokens as <bos>, <eos>, <#id>. When
// the text is longer than max_chars, its middle is replaced by
// " … [N more tokens] … ". *shortened says whether it was.
std::string TokensAsText(const std::vector<std::uint32_t>& tokens, std::size_t max_chars, bool* shortened);

}  // namespace primecache::ctl

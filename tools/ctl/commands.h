// primecachectl's commands. Each runs against a Target (a Store, access.h) (or, for
// `verify --file`, a file alone), writes through Output, and returns the
// process exit status (docs/cli.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/ctl/access.h"
#include "tools/ctl/output.h"

namespace primecache::ctl {

struct LsOptions {
  std::string model;  // a model name, or a fingerprint hex prefix (4+ digits)
  std::optional<std::string> ns;
  std::uint64_t min_length = 0;
  bool quarantined = false;
  std::string sort = "id";  // id, age, size, raw, length, layers, hits, recent
  bool reverse = false;
  std::size_t limit = 0;  // 0: all
};
int Ls(Target& access, const LsOptions& options, const Output& out);

int Show(Target& access, std::uint64_t id, std::size_t text_chars, const Output& out);

struct VerifyOptions {
  std::optional<std::uint64_t> entry;
  bool all = false;
  std::string file;  // a .pcsnap; needs no store
};
// `access` may be null for a file.
int Verify(Target* access, const VerifyOptions& options, const Output& out);

int Rm(Target& access, const std::vector<std::uint64_t>& ids, const Output& out);

struct GcOptions {
  std::optional<std::uint64_t> older_than_seconds;
  bool dry_run = false;
  bool compact = true;
};
int Gc(Target& access, const GcOptions& options, const Output& out);

int Stats(Target& access, const Output& out);
// lookup: what a request with these tokens would restore, and how far it
// shares tokens with a stored entry (its branch point).
struct LookupCommand {
  std::string model;  // a model name, or a fingerprint hex prefix (4+ digits), of a stored entry
  std::string ns;     // the namespace ("" the default)
  std::string text;   // the query as text (the byte tokenizer: <bos>, then its bytes), or
  std::vector<std::uint32_t> tokens;  // the query's token ids
};
int Lookup(Target& access, const LookupCommand& command, const Output& out);
int Export(Target& access, std::uint64_t id, const std::string& file, bool force, const Output& out);
int Import(Target& access, const std::string& file, const std::optional<std::string>& ns, const Output& out);
int Compact(Target& access, const Output& out);

// Opens the store at store_path for writing, which migrates an older schema
// (refused while a daemon answers, unless access.offline).
int Migrate(const AccessOptions& access, const std::string& store_path, const Output& out);

}  // namespace primecache::ctl

// primecachectl: the admin CLI of a primecache store (docs/cli.md).
//
// It talks to the running daemon over its admin socket; when no daemon runs
// it opens the data dir's store directly, read-only, for the commands that
// only read.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <optional>

#include "primecache/logging.h"
#include "primecache/statestore.h"
#include "tools/ctl/access.h"
#include "tools/ctl/commands.h"
#include "tools/ctl/output.h"

using namespace primecache;       // NOLINT(google-build-using-namespace)
using namespace primecache::ctl;  // NOLINT(google-build-using-namespace)

namespace {

constexpr const char* kFooter = R"(
Exit status: 0 ok; 1 damage found (verify) or corrupt bytes met; 2 bad usage;
3 no such entry or file; 4 no daemon answers and no store can be opened;
5 refused (needs the running daemon, no permission, or entry in use);
6 any other failure.  Details: docs/cli.md)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "primecachectl: inspect and manage a primecache store of prefix snapshots.\n\n"
      "Talks to the running primecached over its admin socket (DATA_DIR/primecached-admin.sock).\n"
      "When no daemon answers, the commands that only read (ls, show, verify, stats, export,\n"
      "gc --dry-run) open DATA_DIR/store directly, read-only.  Every command takes --json.",
      "primecachectl");
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();

  std::string data_dir, socket, log_level;
  bool json = false, offline = false, no_progress = false;
  double timeout_s = 600;
  app.add_option("--data-dir", data_dir, "the daemon's data dir (default: $XDG_DATA_HOME/primecache)");
  app.add_option("--socket", socket, "the daemon's admin socket (default: DATA_DIR/primecached-admin.sock)");
  app.add_flag("--offline", offline, "do not contact the daemon: open DATA_DIR/store read-only");
  app.add_flag("--json", json, "print one JSON document on stdout instead of tables");
  app.add_flag("--no-progress", no_progress, "no progress bar, even on a terminal");
  app.add_option("--timeout", timeout_s, "seconds to wait for the daemon's answer to one request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off (default: warn)");

  // ls
  LsOptions ls;
  auto* ls_cmd = app.add_subcommand("ls", "list stored entries (boundaries), one per line");
  ls_cmd->add_option("--model", ls.model, "only this model: its name, or a fingerprint hex prefix (4+ digits)");
  ls_cmd->add_option("--namespace", ls.ns, "only this namespace (\"\" is the default namespace)");
  ls_cmd->add_option("--min-length", ls.min_length, "only boundaries of at least this many tokens");
  ls_cmd->add_flag("--quarantined", ls.quarantined, "list quarantined (damaged) entries instead, with the reason");
  ls_cmd->add_option("--sort", ls.sort, "order by: id, age (oldest first), size, raw, length, layers, hits, recent")
      ->check(CLI::IsMember({"id", "age", "size", "raw", "length", "layers", "hits", "recent"}))
      ->capture_default_str();
  ls_cmd->add_flag("--reverse", ls.reverse, "reverse the order");
  ls_cmd->add_option("--limit", ls.limit, "print at most this many");

  // show
  std::uint64_t show_id = 0;
  std::size_t text_chars = 240;
  auto* show_cmd = app.add_subcommand("show", "one entry: its model, tokens as text, and every layer");
  show_cmd->add_option("ENTRY", show_id, "entry id (from ls)")->required();
  show_cmd->add_option("--text-chars", text_chars, "show at most this many characters of the tokens' text")
      ->capture_default_str();

  // verify
  VerifyOptions verify;
  auto* verify_cmd = app.add_subcommand(
      "verify", "decode and validate an entry, the whole store (--all) or a .pcsnap file (--file)");
  auto* v_entry = verify_cmd->add_option("ENTRY", verify.entry, "entry id");
  auto* v_all = verify_cmd->add_flag("--all", verify.all, "every entry, plus the store's records and chunk references");
  auto* v_file = verify_cmd->add_option("--file", verify.file, "a .pcsnap file (no store needed)");
  v_entry->excludes(v_all)->excludes(v_file);
  v_all->excludes(v_file);

  // rm
  std::vector<std::uint64_t> rm_ids;
  auto* rm_cmd = app.add_subcommand("rm", "remove entries (live or quarantined)");
  rm_cmd->add_option("ENTRY", rm_ids, "entry ids")->required();

  // gc
  GcOptions gc;
  bool gc_no_compact = false;
  auto* gc_cmd = app.add_subcommand(
      "gc", "remove quarantined entries (and, with --older-than, old ones), then compact to free the space");
  gc_cmd->add_option("--older-than", gc.older_than_seconds,
                     "also remove entries created longer ago than this (e.g. 90s, 30m, 12h, 7d)")
      ->transform(CLI::AsNumberWithUnit(std::map<std::string, std::uint64_t>{{"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}},
                                        static_cast<CLI::AsNumberWithUnit::Options>(CLI::AsNumberWithUnit::CASE_SENSITIVE |
                                                                                   CLI::AsNumberWithUnit::UNIT_REQUIRED),
                                        "DURATION"));
  gc_cmd->add_flag("--dry-run", gc.dry_run, "only say what would be removed");
  gc_cmd->add_flag("--no-compact", gc_no_compact, "do not compact afterwards");

  // stats
  auto* stats_cmd = app.add_subcommand("stats", "totals: entries, bytes, dedup savings, hit rate, evictions");

  // export / import
  std::uint64_t export_id = 0;
  std::string export_file, import_file;
  bool export_force = false;
  std::optional<std::string> import_ns;
  auto* export_cmd = app.add_subcommand("export", "write an entry to a .pcsnap file");
  export_cmd->add_option("ENTRY", export_id, "entry id")->required();
  export_cmd->add_option("FILE", export_file, "the .pcsnap to write")->required();
  export_cmd->add_flag("--force", export_force, "replace FILE if it exists");
  auto* import_cmd = app.add_subcommand("import", "store a .pcsnap file's boundary (checked through first)");
  import_cmd->add_option("FILE", import_file, "the .pcsnap to read")->required();
  import_cmd->add_option("--namespace", import_ns, "store it in this namespace instead of the file's");

  // compact
  auto* compact_cmd = app.add_subcommand("compact", "compact the database now, reclaiming deleted entries' space");

  // migrate
  std::string migrate_store;
  auto* migrate_cmd = app.add_subcommand(
      "migrate", "bring a store of an older schema to this build's (the daemon stopped; crash-safe, resumable)");
  migrate_cmd->add_option("--store", migrate_store, "the store directory (default: DATA_DIR/store)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (verify_cmd->parsed() && !verify.entry && !verify.all && verify.file.empty()) {
    std::fprintf(stderr, "primecachectl: verify needs ENTRY, --all or --file F.pcsnap\n");
    return kExitUsage;
  }

  const Output out(json, !no_progress);
  if (Status s = InitLogging(log_level.empty() ? "warn" : log_level); !s.ok()) {
    std::fprintf(stderr, "primecachectl: %s\n", s.ToString().c_str());
    return kExitUsage;
  }

  // verify --file needs no store.
  if (verify_cmd->parsed() && !verify.file.empty()) return Verify(nullptr, verify, out);

  AccessOptions ao;
  if (data_dir.empty()) {
    auto d = DefaultDataDir();
    if (!d.ok()) return out.Error(d.status());
    data_dir = *d;
  }
  ao.data_dir = data_dir;
  ao.admin_socket = socket;
  ao.offline = offline;
  ao.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
  if (migrate_cmd->parsed()) return Migrate(ao, migrate_store.empty() ? data_dir + "/store" : migrate_store, out);
  bool fell_back = false;
  auto access = OpenAccess(ao, &fell_back);
  if (!access.ok()) return out.Error(access.status());
  if (fell_back) out.Note("no daemon answers; reading " + (*access)->where());
  StoreAccess& a = **access;

  if (ls_cmd->parsed()) return Ls(a, ls, out);
  if (show_cmd->parsed()) return Show(a, show_id, text_chars, out);
  if (verify_cmd->parsed()) return Verify(&a, verify, out);
  if (rm_cmd->parsed()) return Rm(a, rm_ids, out);
  if (gc_cmd->parsed()) {
    gc.compact = !gc_no_compact;
    return Gc(a, gc, out);
  }
  if (stats_cmd->parsed()) return Stats(a, out);
  if (export_cmd->parsed()) return Export(a, export_id, export_file, export_force, out);
  if (import_cmd->parsed()) return Import(a, import_file, import_ns, out);
  if (compact_cmd->parsed()) return Compact(a, out);
  return kExitUsage;
}

// primecachectl: the admin CLI of a primecache store (docs/cli.md).
//
// It talks to the running daemon over its admin socket; when no daemon runs
// it opens the data dir's store directly, read-only, for the commands that
// only read.
#include <CLI/CLI.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "primecache/internal/logging.h"
#include "primecache/internal/statestore.h"
#include "tools/ctl/access.h"
#include "tools/ctl/commands.h"
#include "tools/ctl/completion.h"
#include "tools/ctl/output.h"
#include "tools/ctl/remote.h"

using namespace primecache;       // NOLINT(google-build-using-namespace)
using namespace primecache::ctl;  // NOLINT(google-build-using-namespace)

namespace {

constexpr const char* kFooter = R"(
Exit status: 0 ok; 1 damage found (verify) or corrupt bytes met; 2 bad usage;
3 no such entry or file; 4 no daemon answers and no store can be opened;
5 refused (needs the running daemon, no permission, or entry in use);
6 any other failure.  Details: docs/cli.md)";

// What one command line asks for: the global options, every subcommand's
// options, and the subcommands themselves (to ask which one was given).
// CLI11 writes into these fields while parsing, so an Invocation stays put.
struct Invocation {
  std::string data_dir, socket, log_level;
  bool json = false, offline = false, no_progress = false;
  double timeout_s = 600;

  // A Redis Cluster's seeds: ls, show and verify read the remote tier there,
  // authenticated as remote_auth says (docs/cluster.md, "Authentication").
  std::string remote;
  remote::RedisAuthSource remote_auth;
  std::vector<std::string> acl_namespaces;
  LsOptions ls;
  std::string show_entry;  // an entry id; with --remote a remote entry's name
  std::uint64_t show_id = 0;
  std::size_t text_chars = 240;
  std::string verify_entry;
  VerifyOptions verify;
  std::vector<std::uint64_t> rm_ids;
  GcOptions gc;
  bool gc_no_compact = false;
  std::uint64_t export_id = 0;
  std::string export_file;
  bool export_force = false;
  std::string import_file;
  std::optional<std::string> import_ns;
  std::string migrate_store;
  std::string completion_shell;
  LookupCommand lookup;

  CLI::App* ls_cmd = nullptr;
  CLI::App* show_cmd = nullptr;
  CLI::App* verify_cmd = nullptr;
  CLI::App* rm_cmd = nullptr;
  CLI::App* gc_cmd = nullptr;
  CLI::App* stats_cmd = nullptr;
  CLI::App* export_cmd = nullptr;
  CLI::App* import_cmd = nullptr;
  CLI::App* compact_cmd = nullptr;
  CLI::App* migrate_cmd = nullptr;
  CLI::App* completion_cmd = nullptr;
  CLI::App* lookup_cmd = nullptr;
  CLI::App* remote_acl_cmd = nullptr;
};

void AddGlobalOptions(CLI::App& app, Invocation& in) {
  app.add_option("--data-dir", in.data_dir, "the daemon's data dir (default: $XDG_DATA_HOME/primecache)");
  app.add_option("--socket", in.socket, "the daemon's admin socket (default: DATA_DIR/primecached-admin.sock)");
  app.add_flag("--offline", in.offline, "do not contact the daemon: open DATA_DIR/store read-only");
  app.add_flag("--json", in.json, "print one JSON document on stdout instead of tables");
  app.add_flag("--no-progress", in.no_progress, "no progress bar, even on a terminal");
  app.add_option("--timeout", in.timeout_s, "seconds to wait for the daemon's answer to one request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
      "--remote-user", in.remote_auth.user,
      "with --remote: the cluster's ACL user (default $PRIMECACHE_REMOTE_USER, else the default user)");
  app.add_option("--remote-password-file", in.remote_auth.password_file,
                 "with --remote: file whose first line is the cluster's password, mode 0600 (default "
                 "$PRIMECACHE_REMOTE_PASSWORD)");
  app.add_option("--log-level", in.log_level, "trace, debug, info, warn, error, off (default: warn)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
}

void AddLs(CLI::App& app, Invocation& in) {
  LsOptions& ls = in.ls;
  in.ls_cmd = app.add_subcommand("ls", "list stored entries (boundaries), one per line");
  CLI::App* cmd = in.ls_cmd;
  cmd->add_option("--model", ls.model, "only this model: its name, or a fingerprint hex prefix (4+ digits)");
  cmd->add_option("--namespace", ls.ns, "only this namespace (\"\" is the default namespace)");
  cmd->add_option("--min-length", ls.min_length, "only boundaries of at least this many tokens");
  cmd->add_flag("--quarantined", ls.quarantined, "list quarantined (damaged) entries instead, with the reason");
  cmd->add_option("--sort", ls.sort, "order by: id, age (oldest first), size, raw, length, layers, hits, recent")
      ->check(CLI::IsMember({"id", "age", "size", "raw", "length", "layers", "hits", "recent"}))
      ->capture_default_str();
  cmd->add_flag("--reverse", ls.reverse, "reverse the order");
  cmd->add_option("--limit", ls.limit, "print at most this many");
  cmd->add_option("--remote", in.remote, "list the remote tier's entries in this Redis Cluster (redis://host:port,...)");
}

// The --remote option of show and verify.
void AddRemoteEntryOption(CLI::App* cmd, Invocation& in) {
  cmd->add_option("--remote", in.remote,
                  "ENTRY is in the remote tier of this Redis Cluster (redis://host:port,...): its id (4+ hex "
                  "digits, from ls --remote) or manifest key");
}

void AddShowAndVerify(CLI::App& app, Invocation& in) {
  in.show_cmd = app.add_subcommand("show", "one entry: its model, tokens as text, and every layer");
  in.show_cmd->add_option("ENTRY", in.show_entry, "entry id (from ls)")->required();
  AddRemoteEntryOption(in.show_cmd, in);
  in.show_cmd->add_option("--text-chars", in.text_chars, "show at most this many characters of the tokens' text")
      ->capture_default_str();

  VerifyOptions& verify = in.verify;
  in.verify_cmd = app.add_subcommand(
      "verify", "decode and validate an entry, the whole store (--all) or a .pcsnap file (--file)");
  auto* v_entry = in.verify_cmd->add_option("ENTRY", in.verify_entry, "entry id");
  AddRemoteEntryOption(in.verify_cmd, in);
  auto* v_all =
      in.verify_cmd->add_flag("--all", verify.all, "every entry, plus the store's records and chunk references");
  auto* v_file = in.verify_cmd->add_option("--file", verify.file, "a .pcsnap file (no store needed)");
  v_entry->excludes(v_all)->excludes(v_file);
  v_all->excludes(v_file);
}

void AddRmAndGc(CLI::App& app, Invocation& in) {
  in.rm_cmd = app.add_subcommand("rm", "remove entries (live or quarantined)");
  in.rm_cmd->add_option("ENTRY", in.rm_ids, "entry ids")->required();

  in.gc_cmd = app.add_subcommand(
      "gc", "remove quarantined entries (and, with --older-than, old ones), then compact to free the space");
  in.gc_cmd
      ->add_option("--older-than", in.gc.older_than_seconds,
                   "also remove entries created longer ago than this (e.g. 90s, 30m, 12h, 7d)")
      ->transform(CLI::AsNumberWithUnit(
          std::map<std::string, std::uint64_t>{{"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}},
          static_cast<CLI::AsNumberWithUnit::Options>(CLI::AsNumberWithUnit::CASE_SENSITIVE |
                                                      CLI::AsNumberWithUnit::UNIT_REQUIRED),
          "DURATION"));
  in.gc_cmd->add_flag("--dry-run", in.gc.dry_run, "only say what would be removed");
  in.gc_cmd->add_flag("--no-compact", in.gc_no_compact, "do not compact afterwards");
}

void AddStatsExportImport(CLI::App& app, Invocation& in) {
  in.stats_cmd = app.add_subcommand("stats", "totals: entries, bytes, dedup savings, hit rate, evictions");
  in.lookup_cmd = app.add_subcommand(
      "lookup", "what a request with these tokens restores, and how far it shares tokens with a stored entry");
  in.lookup_cmd->add_option("--model", in.lookup.model, "a stored model: its name, or a fingerprint hex prefix (4+ digits)")
      ->required();
  in.lookup_cmd->add_option("--namespace", in.lookup.ns, "the namespace (default: the default namespace)");
  auto* text = in.lookup_cmd->add_option("--text", in.lookup.text,
                                         "the query as text: <bos>, then its bytes (the byte tokenizer's tokens)");
  auto* toks = in.lookup_cmd->add_option("--tokens", in.lookup.tokens, "the query's token ids (comma-separated)")
                   ->delimiter(',');
  text->excludes(toks);

  in.export_cmd = app.add_subcommand("export", "write an entry to a .pcsnap file");
  in.export_cmd->add_option("ENTRY", in.export_id, "entry id")->required();
  in.export_cmd->add_option("FILE", in.export_file, "the .pcsnap to write")->required();
  in.export_cmd->add_flag("--force", in.export_force, "replace FILE if it exists");

  in.import_cmd = app.add_subcommand("import", "store a .pcsnap file's boundary (checked through first)");
  in.import_cmd->add_option("FILE", in.import_file, "the .pcsnap to read")->required();
  in.import_cmd->add_option("--namespace", in.import_ns, "store it in this namespace instead of the file's");
}

void AddRemoteAcl(CLI::App& app, Invocation& in) {
  in.remote_acl_cmd = app.add_subcommand(
      "remote-acl",
      "print the Redis ACL rules of a user that serves these namespaces through the remote tier");
  in.remote_acl_cmd->add_option("--namespace", in.acl_namespaces, "a namespace the user serves (repeat)")
      ->required();
}

void AddCompactAndMigrate(CLI::App& app, Invocation& in) {
  in.compact_cmd =
      app.add_subcommand("compact", "compact the database now, reclaiming deleted entries' space");
  in.migrate_cmd = app.add_subcommand(
      "migrate", "bring a store of an older schema to this build's (the daemon stopped; crash-safe, resumable)");
  in.migrate_cmd->add_option("--store", in.migrate_store, "the store directory (default: DATA_DIR/store)");
}

// Every subcommand's --help ends with examples (docs/cli.md has more).
void AddExamples(const Invocation& in) {
  const std::pair<CLI::App*, const char*> examples[] = {
      {in.ls_cmd,
       "Examples:\n"
       "  primecachectl ls --sort size --reverse --limit 10   # the ten largest entries\n"
       "  primecachectl ls --model hrm-tiny --namespace t1    # one model's entries in one namespace\n"
       "  primecachectl ls --quarantined                      # damaged entries and why\n"
       "  primecachectl ls --json | jq '.entries[].id'        # exact numbers for scripts"},
      {in.show_cmd,
       "Examples:\n"
       "  primecachectl show 42                    # model, tokens as text, every layer\n"
       "  primecachectl show 42 --text-chars 2000  # more of the prompt's text\n"
       "  primecachectl show 3fa9c0 --remote redis://10.0.0.5:7000"},
      {in.verify_cmd,
       "Examples:\n"
       "  primecachectl verify 42                # one entry: every checksum and layer\n"
       "  primecachectl verify --all --json      # the whole store, problems as JSON (exit 1 on damage)\n"
       "  primecachectl verify --file e42.pcsnap # a .pcsnap file, no store needed"},
      {in.rm_cmd,
       "Examples:\n"
       "  primecachectl rm 42         # one entry\n"
       "  primecachectl rm 42 43 57   # several"},
      {in.gc_cmd,
       "Examples:\n"
       "  primecachectl gc --older-than 7d --dry-run  # what a weekly clean-up would remove\n"
       "  primecachectl gc --older-than 7d            # then do it, and compact\n"
       "  primecachectl gc                            # quarantined entries only"},
      {in.lookup_cmd,
       "Examples:\n"
       "  primecachectl lookup --model hrm-tiny --text \"The cat sat on\"   # hit, and shared tokens\n"
       "  primecachectl lookup --model 3fa9c0 --namespace t1 --tokens 256,84,104 --json"},
      {in.stats_cmd,
       "Examples:\n"
       "  primecachectl stats          # entries, bytes, dedup, hit rate, evictions\n"
       "  primecachectl stats --json   # exact numbers for scripts and monitoring"},
      {in.export_cmd,
       "Examples:\n"
       "  primecachectl export 42 e42.pcsnap          # one entry as a file\n"
       "  primecachectl export 42 e42.pcsnap --force  # replace the file"},
      {in.import_cmd,
       "Examples:\n"
       "  primecachectl --data-dir /srv/primecache import e42.pcsnap  # into another daemon's store\n"
       "  primecachectl import e42.pcsnap --namespace tenant-b        # into another namespace"},
      {in.compact_cmd,
       "Examples:\n"
       "  primecachectl compact                  # reclaim deleted entries' space now\n"
       "  primecachectl compact --timeout 3600   # a large store: wait up to an hour"},
      {in.remote_acl_cmd,
       "Examples:\n"
       "  primecachectl remote-acl --namespace team-a   # the user's rules, without a password\n"
       "  primecachectl remote-acl --namespace a --namespace b --json\n"
       "  (docs/cluster.md: an ACL file line of them with the password's SHA-256)"},
      {in.migrate_cmd,
       "Examples:\n"
       "  primecachectl migrate                       # the default data dir's store (daemon stopped)\n"
       "  primecachectl migrate --store /srv/primecache/store"},
  };
  for (const auto& [cmd, text] : examples) cmd->footer(text);
}

// `completion bash`: the completion script, generated from the command tree.
// Hidden from --help (an empty group); docs/cli.md says how to install it.
void AddCompletion(CLI::App& app, Invocation& in) {
  in.completion_cmd = app.add_subcommand("completion", "print a shell completion script (bash)")->group("");
  in.completion_cmd->add_option("SHELL", in.completion_shell, "the shell")
      ->required()
      ->check(CLI::IsMember({"bash"}));
  in.completion_cmd->footer(
      "Examples:\n"
      "  primecachectl completion bash > /etc/bash_completion.d/primecachectl\n"
      "  source <(primecachectl completion bash)");
}

// ls, show and verify of the remote tier: the cluster alone, no store.
int RunOnRemote(const Invocation& in, const Output& out) {
  RemoteOptions ro;
  ro.url = in.remote;
  ro.auth = in.remote_auth;
  ro.timeout = std::min(std::chrono::milliseconds(static_cast<std::int64_t>(in.timeout_s * 1000)),
                        std::chrono::milliseconds(std::chrono::seconds(30)));
  if (in.ls_cmd->parsed()) return LsRemote(ro, in.ls, out);
  if (in.show_cmd->parsed()) return ShowRemote(ro, in.show_entry, in.text_chars, out);
  return VerifyRemote(ro, in.verify_entry, out);
}

// The subcommands that need a store (or the daemon), once it is open.
int RunOnStore(Target& a, Invocation& in, const Output& out) {
  if (in.ls_cmd->parsed()) return Ls(a, in.ls, out);
  if (in.show_cmd->parsed()) return Show(a, in.show_id, in.text_chars, out);
  if (in.verify_cmd->parsed()) return Verify(&a, in.verify, out);
  if (in.rm_cmd->parsed()) return Rm(a, in.rm_ids, out);
  if (in.gc_cmd->parsed()) {
    in.gc.compact = !in.gc_no_compact;
    return Gc(a, in.gc, out);
  }
  if (in.stats_cmd->parsed()) return Stats(a, out);
  if (in.lookup_cmd->parsed()) return Lookup(a, in.lookup, out);
  if (in.export_cmd->parsed()) return Export(a, in.export_id, in.export_file, in.export_force, out);
  if (in.import_cmd->parsed()) return Import(a, in.import_file, in.import_ns, out);
  if (in.compact_cmd->parsed()) return Compact(a, out);
  return kExitUsage;
}

// Runs the parsed command: `verify --file` alone, `migrate` on the store
// path, every other one through the daemon or the store opened read-only.
int Run(Invocation& in, const Output& out) {
  if (in.remote_acl_cmd->parsed()) return RemoteAcl(in.acl_namespaces, out);
  if (!in.remote.empty()) return RunOnRemote(in, out);
  if (in.verify_cmd->parsed() && !in.verify.file.empty()) return Verify(nullptr, in.verify, out);

  AccessOptions ao;
  if (in.data_dir.empty()) {
    auto d = DefaultDataDir();
    if (!d.ok()) return out.Error(d.status());
    in.data_dir = *d;
  }
  ao.data_dir = in.data_dir;
  ao.admin_socket = in.socket;
  ao.offline = in.offline;
  ao.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(in.timeout_s * 1000));
  if (in.migrate_cmd->parsed()) {
    return Migrate(ao, in.migrate_store.empty() ? in.data_dir + "/store" : in.migrate_store, out);
  }
  bool fell_back = false;
  auto target = OpenTarget(ao, &fell_back);
  if (!target.ok()) return out.Error(target.status());
  if (fell_back) out.Note("no daemon answers; reading " + target->where);
  return RunOnStore(*target, in, out);
}

// An entry id given on the command line; nullopt when it is not a number.
std::optional<std::uint64_t> EntryId(const std::string& arg) {
  std::uint64_t id = 0;
  const auto r = std::from_chars(arg.data(), arg.data() + arg.size(), id);
  if (arg.empty() || r.ec != std::errc() || r.ptr != arg.data() + arg.size()) return std::nullopt;
  return id;
}

// What CLI11 cannot say of the parsed arguments: verify's target, --remote's
// subcommands and options, ENTRY as a number (without --remote).
Status CheckArguments(Invocation& in) {
  if (in.verify_cmd->parsed() && in.verify_entry.empty() && !in.verify.all && in.verify.file.empty()) {
    return Status::InvalidArgument("verify needs ENTRY, --all or --file F.pcsnap");
  }
  if (in.lookup_cmd->parsed() && in.lookup.text.empty() && in.lookup.tokens.empty()) {
    return Status::InvalidArgument("lookup needs --text or --tokens");
  }
  if (!in.remote.empty()) {
    if (in.verify_cmd->parsed() && in.verify_entry.empty()) return Status::InvalidArgument("verify --remote needs ENTRY");
    if (in.ls_cmd->parsed() && in.ls.quarantined) return Status::InvalidArgument("ls --remote has no --quarantined");
    return Status::Ok();
  }
  const std::string& arg = in.show_cmd->parsed() ? in.show_entry : in.verify_entry;
  if (!arg.empty() && (in.show_cmd->parsed() || in.verify_cmd->parsed())) {
    const auto id = EntryId(arg);
    if (!id) return Status::InvalidArgument("ENTRY is an entry id (a number), not '" + arg + "'");
    in.show_id = *id;
    in.verify.entry = *id;
  }
  return Status::Ok();
}

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
  Invocation in;
  AddGlobalOptions(app, in);
  AddLs(app, in);
  AddShowAndVerify(app, in);
  AddRmAndGc(app, in);
  AddStatsExportImport(app, in);
  AddCompactAndMigrate(app, in);
  AddRemoteAcl(app, in);
  AddExamples(in);
  AddCompletion(app, in);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (in.completion_cmd->parsed()) {
    std::fputs(BashCompletion(app, "primecachectl").c_str(), stdout);
    return kExitOk;
  }
  if (Status s = CheckArguments(in); !s.ok()) {
    std::fprintf(stderr, "primecachectl: %s\n", s.message().c_str());
    return kExitUsage;
  }
  const Output out(in.json, !in.no_progress);
  if (Status s = InitLogging(in.log_level.empty() ? "warn" : in.log_level); !s.ok()) {
    std::fprintf(stderr, "primecachectl: %s\n", s.ToString().c_str());
    return kExitUsage;
  }
  return Run(in, out);
}

// primecached's config file: one JSON object (comments allowed) whose keys
// are the daemon's long flags, with '_' or '-' between words
// ("max_chunk": "4M" is --max-chunk 4M). It is read through CLI11's config
// machinery (JsonConfig is a CLI::Config), so every flag is a key, a value
// passes the same checks as on the command line, and a flag given on the
// command line wins over the file. A flag that repeats takes an array; a
// switch takes true or false. "tenants" may also be written as an object
// {"UID": ["ns", ...], ...} (the --tenant flag's UID=NS,NS... form is the
// other); "admin_uids" and "remote_namespaces", the keys of older configs,
// still name --admin-uid and --remote-ns.
//
// docs/operations.md describes the file; packaging/primecached.conf is the
// commented example that is installed.
#pragma once

#include <sys/types.h>

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "primecache/status.h"

namespace primecache::daemon {

class JsonConfig : public CLI::Config {
 public:
  // Throws CLI::ConfigError (a CLI::ParseError) on a file that is not such an object.
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;
  // The options that were given (on the command line or in a file) as one
  // JSON object of this format, keys with underscores; default_also adds the
  // others' defaults where CLI11 knows them.
  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;
};

// Makes `option` (e.g. "--config") name a JsonConfig file of `app`; keys that
// name no flag (and unknown command-line arguments) are kept for
// CheckConfigKeys.
CLI::Option* UseJsonConfig(CLI::App* app, const std::string& option, const std::string& help);

// After a parse: an error naming the config keys and arguments that match no flag.
Status CheckConfigKeys(const CLI::App& app);

// The settings `app` was given (command line and file), as to_config writes
// them, less the keys in `except` (underscored names).
std::string SettingsText(const CLI::App& app, const std::vector<std::string>& except);

// --tenant values, "UID=NS[,NS...]" (a namespace may be empty: "1000=a,"
// allows "a" and the default namespace), as uid -> namespaces.
Result<std::map<uid_t, std::vector<std::string>>> ParseTenants(const std::vector<std::string>& specs);

}  // namespace primecache::daemon

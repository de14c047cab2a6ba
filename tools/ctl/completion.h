// Shell completion for primecachectl, generated from its CLI11 command tree
// (`primecachectl completion bash`), so that it follows every subcommand and
// option as they are defined and cannot drift from them.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace primecache::ctl {

// A bash completion script defining _primecachectl and registering it for
// `program`: subcommand names, each subcommand's options (and the global
// ones, which CLI11's fallthrough accepts after the subcommand), the choices
// of an option restricted to a set (IsMember), file names for other values.
std::string BashCompletion(CLI::App& app, const std::string& program);

}  // namespace primecache::ctl

// primecachectl's view of the remote tier (docs/cluster.md): entries kept in
// a Redis Cluster, read directly through primecache_remote, without a
// daemon. Nothing here changes the cluster.
//
// A remote entry is named by its manifest key (pc:t:<ns>:m:<model>:<tokens>)
// or by its id, the key's last 32 hex digits (the Checksum128 of its
// tokens), or a prefix of at least 4 digits of that id.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "primecache/status.h"
#include "remote/credentials.h"
#include "remote/tier.h"
#include "tools/ctl/commands.h"
#include "tools/ctl/output.h"

namespace primecache::ctl {

struct RemoteOptions {
  std::string url;  // redis://host:port[,host:port...]
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};  // one cluster command
  remote::RedisAuthSource auth;  // --remote-user, --remote-password-file or the environment
};

// Manifests listed at most (a listing stops there and says so).
inline constexpr std::size_t kMaxRemoteEntries = 100000;

// A tier on the cluster at options.url; kUnavailable when no node answers.
Result<std::unique_ptr<remote::RemoteTier>> OpenRemote(const RemoteOptions& options);
// The entry's id: a manifest key's last 32 hex digits.
std::string_view RemoteId(std::string_view manifest_key);
// The manifest key `name` designates (see above): kNotFound when none,
// kInvalidArgument when a prefix fits several.
Result<std::string> ResolveRemoteEntry(remote::RemoteTier& tier, std::string_view name);
// `remote-acl`: the ACL rules of a user that serves `namespaces` through
// the tier (remote::NamespaceAclRules), and each namespace's key prefix.
int RemoteAcl(const std::vector<std::string>& namespaces, const Output& out);
// An error of resolving or reaching the cluster, as an exit status
// (an ambiguous name is bad usage).
int RemoteError(const Output& out, const Status& s);

int LsRemote(const RemoteOptions& options, const LsOptions& ls, const Output& out);
int ShowRemote(const RemoteOptions& options, const std::string& entry, std::size_t text_chars, const Output& out);
// Every chunk read and checked against its reference, every layer decoded
// and validated as `verify ENTRY` does locally (verify.cc).
int VerifyRemote(const RemoteOptions& options, const std::string& entry, const Output& out);

}  // namespace primecache::ctl

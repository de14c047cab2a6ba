// Where the remote tier's credentials come from (docs/cluster.md,
// "Authentication"). The password is read from a file or the environment,
// never from the command line, where every user of the host can read it
// (ps, /proc/PID/cmdline); the user name is not a secret and may be given
// either way.
#pragma once

#include <string>

#include "primecache/status.h"
#include "remote/cluster_client.h"

namespace primecache::remote {

// The environment variables read when no flag gives the value.
inline constexpr char kRemoteUserEnv[] = "PRIMECACHE_REMOTE_USER";
inline constexpr char kRemotePasswordEnv[] = "PRIMECACHE_REMOTE_PASSWORD";
// A password file longer than this is not a password file.
inline constexpr std::size_t kMaxPasswordFileBytes = 4096;

struct RedisAuthSource {
  std::string user;           // empty: $PRIMECACHE_REMOTE_USER, else the default user
  std::string password_file;  // empty: $PRIMECACHE_REMOTE_PASSWORD, else no password
};

// The credentials `source` names. The password file's first line is the
// password (its line end dropped); the file must be a regular file no one
// but its owner may read or write (as ssh asks of a private key), else
// kFailedPrecondition names it and its mode. A user with no password, an
// empty password, or an unreadable or oversized file are errors. No user
// and no password: RedisAuth{} (the cluster is not asked to authenticate).
Result<RedisAuth> LoadRedisAuth(const RedisAuthSource& source);

}  // namespace primecache::remote

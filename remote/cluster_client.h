// ClusterClient: a small Redis Cluster client on hiredis (Debian's hiredis has
// no cluster support). It learns the slot map from CLUSTER SLOTS, sends each
// command to the primary that owns its key's slot, follows MOVED (and then
// reloads the map) and ASK (one ASKING + command on the named node), retries
// transient failures (a lost connection, CLUSTERDOWN, TRYAGAIN, LOADING) with
// exponential backoff, and fails fast behind a circuit breaker once the
// cluster has failed `breaker_failures` commands in a row, so a sick cluster
// costs its callers a branch, not a timeout.
//
// Batches (GetMany, SetMany, GetInto, SetFrom) group their keys by node, cut
// each node's group over several connections, pipeline each slice on its
// connection and run them all in parallel. GetInto and SetFrom are the data
// path: our own RESP reader receives each value into the caller's buffer and
// sendmsg() sends each value from it (remote/resp_reader.h), with up to
// `pipeline_depth` commands in flight per connection.
//
// Every reply is bounded: a value over `max_value_bytes` (or an array over
// `max_batch`) fails the command with kCorruption; a reply of an unexpected
// type fails it with kIOError. Nothing here interprets the values.
//
// A cluster that requires a password (requirepass, or ACL users) is given
// one in ClusterOptions::auth. A node's refusal of who we are (NOAUTH:
// none given; WRONGPASS; NOPERM: the user's ACL does not reach a key or a
// command) fails the command with kFailedPrecondition and a message saying
// which; it is not retried.
//
// Thread-safety: every method may be called from any thread at once; each
// connection is used by one caller at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "primecache/status.h"

namespace primecache::remote {

struct Endpoint {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// "redis://host:port[,host:port...]" (the scheme may be left out).
Result<std::vector<Endpoint>> ParseRedisUrl(std::string_view url);

// Who the client says it is to every node (Redis AUTH, sent on each new
// connection before anything else): an ACL user and its password, or the
// password alone for the default user (requirepass). Empty: no AUTH.
struct RedisAuth {
  std::string user;
  std::string password;
  bool empty() const { return password.empty(); }
  // "user NAME" or "the default user", for messages (never the password).
  std::string Who() const { return user.empty() ? std::string("the default user") : "user " + user; }
};

struct ClusterOptions {
  std::vector<Endpoint> seeds;
  RedisAuth auth;
  std::chrono::milliseconds connect_timeout{250};
  std::chrono::milliseconds io_timeout{1000};
  int attempts = 4;                                // tries of one command (redirections not counted)
  int max_redirects = 8;                           // MOVED/ASK hops of one command
  std::chrono::milliseconds backoff{20};           // before the second try; doubled each try
  std::chrono::milliseconds backoff_max{400};
  int breaker_failures = 8;                        // failed commands in a row that open the breaker
  std::chrono::milliseconds breaker_open_for{2000};  // then one trial command is let through
  std::size_t max_value_bytes = std::size_t{64} << 20;
  std::size_t max_batch = 1u << 16;                // keys in one GetMany/SetMany
  std::size_t threads = 8;                         // node groups of a batch run at once
  std::size_t pipeline_depth = 2;                  // data-path commands in flight on one connection
};

// What GetInto found at one key.
enum class ValueState : std::uint8_t { kFilled, kAbsent, kWrongSize };

// Counters since Connect. Monotonic; read without locks.
struct ClusterStats {
  std::uint64_t commands = 0;    // commands answered (batch keys count one each)
  std::uint64_t moved = 0;       // MOVED redirections followed
  std::uint64_t asked = 0;       // ASK redirections followed
  std::uint64_t retries = 0;     // tries after a transient failure
  std::uint64_t failures = 0;    // commands that failed after every try
  std::uint64_t refreshes = 0;   // slot maps loaded
  std::uint64_t breaker_opens = 0;
  std::uint64_t fast_failures = 0;  // commands refused while the breaker was open
};

class ClusterClient {
 public:
  // Loads the slot map from the first seed that answers.
  static Result<std::unique_ptr<ClusterClient>> Connect(ClusterOptions options);
  // Touches no network: the map is loaded by the first command (or Refresh),
  // so a client may exist while the cluster is down.
  static Result<std::unique_ptr<ClusterClient>> Open(ClusterOptions options);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // The value at `key`; nullopt when there is none.
  Result<std::optional<std::string>> Get(std::string_view key);
  Status Set(std::string_view key, std::string_view value);
  // Deletes `key`; true when it existed.
  Result<bool> Del(std::string_view key);
  // Values of many keys (nullopt where absent), in the order asked.
  Result<std::vector<std::optional<std::string>>> GetMany(std::span<const std::string> keys);
  Status SetMany(std::span<const std::pair<std::string, std::string>> items);
  // The data path: values of many keys received straight into into[i],
  // each span the size the caller expects. A value of exactly that size
  // fills it (kFilled); one of another size up to max_value_bytes is read
  // and dropped (kWrongSize, into[i] unspecified); none is kAbsent. When
  // `filled` is set, it is called with i, on a reading thread, as soon as
  // into[i] is final and kFilled (a caller checks the value elsewhere
  // meanwhile; it must not block); it may be called for some keys of a
  // batch that then fails as a whole.
  Result<std::vector<ValueState>> GetInto(std::span<const std::string> keys, std::span<const std::span<std::byte>> into,
                                          const std::function<void(std::size_t)>& filled = {});
  // The same, each destination given by into(i) on the reading thread just
  // before key i's reply is read (it may be called again for a key that is
  // resent, and must then give the same span): the caller's buffers are
  // touched as they are filled, while still in cache, not all ahead.
  Result<std::vector<ValueState>> GetInto(std::span<const std::string> keys,
                                          const std::function<std::span<std::byte>(std::size_t)>& into,
                                          const std::function<void(std::size_t)>& filled = {});
  // SETs of values[i] at keys[i], sent from the caller's bytes (no copy).
  Status SetFrom(std::span<const std::string> keys, std::span<const std::span<const std::byte>> values);
  // Sets of strings (SADD, SREM, SMEMBERS). A set over `max_members`
  // members, or a member over max_value_bytes, fails the read (kCorruption).
  Status AddMember(std::string_view key, std::string_view member);
  Status RemoveMember(std::string_view key, std::string_view member);
  Result<std::vector<std::vector<std::string>>> MembersMany(std::span<const std::string> keys,
                                                            std::size_t max_members);
  // Every key matching a glob `pattern` on every primary (SCAN), at most `limit`.
  Result<std::vector<std::string>> Keys(std::string_view pattern, std::size_t limit);
  // Any command routed by `key` (e.g. {"EXPIRE", key, "60"}); the reply as
  // text (integers in decimal, nil as nullopt). For tests and tools.
  Result<std::optional<std::string>> Command(std::string_view key, std::vector<std::string> argv);

  // Reloads the slot map (also done on MOVED and after a lost connection).
  Status Refresh();
  // The primaries as the client last saw them.
  std::vector<Endpoint> Primaries() const;
  // The primary owning `key`'s slot, as the client last saw it.
  Result<Endpoint> PrimaryFor(std::string_view key) const;
  ClusterStats stats() const;
  bool breaker_open() const;
  // ClusterOptions::max_value_bytes: no value longer is ever read.
  std::size_t max_value_bytes() const;

  class Impl;

 private:
  explicit ClusterClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace primecache::remote

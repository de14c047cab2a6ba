// RemoteTier: entries kept in a Redis Cluster that every host's daemon shares.
// The layout (docs/cluster.md): every key of an entry begins with its
// namespace's prefix, pc:t:<ns>: (NamespaceKeyPrefix), so a Redis ACL user
// given only ~pc:t:<ns>:* reaches that namespace's entries and no other's:
//   pc:t:<ns>:c:<address>               one chunk's bytes; the address is the
//                                       Checksum128 of those bytes, in hex
//   pc:t:<ns>:m:<model>:<tokens>        the entry's manifest (remote/manifest.h)
//   pc:t:<ns>:n:<model>:<level>:<hash>  an index node: a set of members
//                                       "<length>:<exact hash>", keyed like
//                                       the local store's prefix index
// (<ns> and <tokens> are Checksum128s of the namespace's bytes and of the
// boundary's tokens, in hex.) Chunks are shared by the entries of one
// namespace, never across namespaces. Put writes the chunks, then the
// manifest, then the index member, so a reader that finds a member finds a
// manifest whose chunks were all written; Redis may have evicted some since,
// which Fetch turns into a miss and a clean-up, never a partial entry.
//
// Nothing read back is trusted: Fetch checks the manifest's checksum, bounds
// and identity (model, namespace, the exact tokens of the query) and every
// chunk's size and address; damage is removed from the cluster and counted.
// Chunks travel on the cluster client's data path (GetInto, SetFrom: into
// and from the entry's own buffers, pipelined over every node); each fetched
// chunk's address is checked on a pool of `verify_threads` while the others
// still arrive, and no chunk leaves Fetch before every check has passed.
// The caller still hands the entry to a local Store::Publish, whose layer
// validator checks every layer before anything can be restored from it.
//
// Thread-safety: every method may be called from any thread at once.
#pragma once

#include <mutex>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/worker_pool.h"
#include "primecache/internal/store.h"
#include "remote/cluster_client.h"
#include "remote/manifest.h"
#include "remote/receive_pool.h"

namespace primecache::remote {

struct RemoteTierOptions {
  std::uint32_t block_tokens = 256;    // the index's hashed block (as the local store's)
  std::size_t max_node_members = 4096;  // members of one index node read at most
  std::size_t verify_threads = 2;       // threads checking fetched chunks' addresses
  // Capacity of fetched chunk buffers kept for the next fetch (0: none).
  std::size_t receive_pool_bytes = std::size_t{256} << 20;
};

// Where the longest stored boundary of a query is.
struct RemoteHit {
  std::uint64_t length = 0;
  std::string manifest_key;
};

// An entry fetched and checked, ready for a local publish. Its chunks are
// buffers of the tier's receive pool, given back to it (whatever chunks the
// layers still hold) when the entry is destroyed or assigned over.
struct RemoteEntry {
  PublishRequest entry;
  std::vector<LayerBytes> layers;
  std::uint64_t chunk_bytes = 0;
  std::shared_ptr<ReceivePool> pool;  // null: the chunks are simply freed

  RemoteEntry() = default;
  RemoteEntry(RemoteEntry&&) noexcept = default;
  RemoteEntry& operator=(RemoteEntry&& other) noexcept;
  ~RemoteEntry();
};

struct RemoteTierStats {
  std::uint64_t puts = 0, put_bytes = 0;
  std::uint64_t lookups = 0, index_hits = 0;
  std::uint64_t fetched = 0, fetched_bytes = 0;
  std::uint64_t evicted = 0;  // hits whose manifest or chunks Redis no longer had
  std::uint64_t damaged = 0;  // manifests or chunks that failed a check (removed)
  std::uint64_t foreign = 0;  // manifests of another identity than the query's
};

class RemoteTier {
 public:
  explicit RemoteTier(std::shared_ptr<ClusterClient> client, RemoteTierOptions options = {});

  Status Put(const PublishRequest& entry, const std::vector<LayerBytes>& layers);
  // The longest boundary of (model, ns) that prefixes `tokens`, by the index
  // alone (hashes); Fetch confirms it.
  Result<std::optional<RemoteHit>> Lookup(const Hash128& model, std::string_view ns,
                                          std::span<const std::uint32_t> tokens);
  // The entry behind `hit` for this query, checked; nullopt when it is gone,
  // damaged or not the query's.
  Result<std::optional<RemoteEntry>> Fetch(const Hash128& model, std::string_view ns,
                                           std::span<const std::uint32_t> tokens, const RemoteHit& hit);
  // Removes an entry's manifest and index member (its chunks may be shared).
  Status Remove(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> boundary);

  // For tools (primecachectl), read-only, nothing checked or removed (SCAN:
  // an operator's user, whose ACL reaches every namespace):
  // every manifest key in the cluster (at most `limit`); the manifests under
  // `keys` in order (nullopt where a key holds none, kCorruption where one
  // does not decode); a manifest's chunk values in its order (nullopt where
  // absent), to be judged with CheckChunk.
  Result<std::vector<std::string>> ManifestKeys(std::size_t limit);
  Result<std::vector<std::optional<Result<RemoteManifest>>>> ReadManifests(std::span<const std::string> keys);
  Result<std::vector<std::optional<std::string>>> ReadChunks(const RemoteManifest& m);

  RemoteTierStats stats() const;
  ReceivePoolStats receive_pool_stats() const { return pool_->stats(); }
  ClusterClient& client() { return *client_; }

 private:
  // Every chunk of `m`, each checked against its reference; nullopt (and the
  // entry removed) when one is missing or damaged.
  Result<std::optional<std::vector<std::string>>> FetchChunks(const RemoteManifest& m,
                                                              std::span<const std::uint32_t> boundary);
  // Receives every chunk of `refs` into `out` (buffers of the receive pool,
  // taken here), each checked on the verify pool as soon as it has arrived;
  // what each was found to be.
  Result<std::vector<ChunkCheck>> ReceiveChunks(std::span<const ChunkRef* const> refs,
                                                std::span<const std::string> keys, std::vector<std::string>& out);

  std::shared_ptr<ClusterClient> client_;
  const RemoteTierOptions options_;
  void Count(std::uint64_t RemoteTierStats::*field, std::uint64_t n);

  mutable Mutex stats_mu_;
  RemoteTierStats stats_ GUARDED_BY(stats_mu_);
  std::shared_ptr<ReceivePool> pool_;  // the buffers fetches receive into
  WorkerPool verify_;  // checks fetched chunks while the rest still arrive
};

// The keys of the layout above.
std::string NamespaceKeyPrefix(std::string_view ns);
std::string ChunkKey(std::string_view ns, const Hash128& address);
std::string ManifestKey(const Hash128& model, std::string_view ns, std::span<const std::uint32_t> boundary);
// Matches every manifest key and nothing else of the layout (SCAN MATCH).
inline constexpr char kManifestKeyPattern[] = "pc:t:*:m:*";
// The Redis ACL rules (as ACL SETUSER and an ACL file take them, after the
// user's name) that let a user do what a daemon's RemoteTier does for
// `namespaces` and nothing else: the commands it sends, only on keys under
// those namespaces' prefixes. No password is in it: the operator adds one.
std::string NamespaceAclRules(std::span<const std::string> namespaces);

}  // namespace primecache::remote

// The values that describe stored entries: what the store returns
// (primecache/internal/statestore.h), what the daemon passes through and writes on the
// wire (one mapping per type and direction, ipc/wire.cc), and what the client
// returns (primecache/client.h). Declared once, here.
//
// Plain values: copyable, no invariants beyond their comments, no
// thread-safety concerns of their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "primecache/checksum.h"

namespace primecache {

using EntryId = std::uint64_t;

enum class EntryState : std::uint8_t { kLive = 0, kQuarantined = 1 };

// What a publish did (Store::Publish, PublishStream::Commit).
// One rank's part of a tensor-parallel entry (docs/design-tensor-parallel.md,
// "One entry, committed by the group"). The `ranks` ranks of one group
// publish the same identity under one token; the entry's layers are rank
// 0's, which holds every layer (the replicated ones and its shards), then
// each later rank's shards of the sharded layers (recurrent and KV), rank
// after rank. The entry is written, in one atomic batch, when the last part
// commits; until then a lookup does not see it. A part that aborts, or a
// group not complete within the store's group timeout of its first part
// (StoreOptions::group_timeout_ms), aborts the group: no entry, and every
// part's staged bytes given back.
struct PublishGroup {
  std::uint64_t token = 0;  // chosen by the engine (e.g. from the request id); not 0
  std::uint32_t ranks = 0;  // 2..StoreLimits::kMaxGroupRanks (1024)
  std::uint32_t rank = 0;   // < ranks
  friend bool operator==(const PublishGroup&, const PublishGroup&) = default;
};

struct PublishResult {
  EntryId id = 0;
  bool existed = false;                  // the identity was stored already; nothing was written
  std::uint64_t new_chunk_bytes = 0;     // chunk bytes this publish added to the store
  std::uint64_t shared_chunk_bytes = 0;  // chunk bytes it shares with entries already stored
  std::uint64_t evicted = 0;             // entries evicted to make room
  // A group part (PublishGroup): its bytes are durable and wait for the
  // other ranks' parts; the entry (id) is written when the last one commits.
  bool group_pending = false;
};

// One stored entry (Store::Describe, Store::List; through the daemon
// Client::Describe and Client::List).
struct EntryInfo {
  EntryId id = 0;
  EntryState state = EntryState::kLive;  // a quarantined entry failed a check and is never served
  Hash128 model;                         // the model fingerprint's digest
  std::string model_name;
  std::string model_descriptor;  // empty when no publish of this model and namespace gave one
  std::string ns;
  std::uint64_t length = 0;  // boundary length in tokens
  // The boundary's tokens where asked for (the daemon's List and Describe
  // unless told to omit them, and Store::Describe and List the same way);
  // empty for a quarantined entry, whose tokens are not kept.
  std::vector<std::uint32_t> tokens;
  std::uint32_t layers = 0;
  std::uint32_t ranks = 1;  // >1: a tensor-parallel entry of that many parts (PublishGroup)
  std::uint64_t chunk_bytes = 0;  // the entry's chunk bytes, shared ones included
  std::uint64_t raw_bytes = 0;    // decoded bytes of its layers
  std::uint64_t meta_bytes = 0;   // its manifest, tokens and records
  double flops = 0;               // estimated prefill compute a hit saves
  std::uint64_t created_unix_ms = 0;
  std::uint64_t last_access = 0;  // the store's logical clock; larger is more recent
  std::uint64_t hits = 0;
  std::string reason;  // why it was quarantined

  bool quarantined() const { return state == EntryState::kQuarantined; }
};

// An entry and, when asked for, its layers' serialized headers (kind, shape,
// transforms, chunk sizes and checksums; no chunk bytes).
struct EntryDetail {
  EntryInfo info;
  std::vector<std::string> layer_headers;
};

// What Describe gives besides the entry (Store::Describe, Client::Describe).
struct DescribeOptions {
  // Set: only a live entry of this namespace; any other is kNotFound.
  std::optional<std::string> ns;
  bool layer_headers = false;  // also every layer's serialized header
};

// Which entries a List page holds (Store::List, Client::List).
struct ListOptions {
  std::optional<Hash128> model;  // only this fingerprint
  // Only this namespace; nullopt: every namespace the caller may see (a
  // tenant connection its own, the admin socket and a local store all).
  std::optional<std::string> ns;
  EntryState state = EntryState::kLive;
  bool omit_tokens = false;  // leave EntryInfo::tokens empty (length still set)
  std::string page_token;    // from the previous page; empty: the first
  std::size_t limit = 100;   // 1..StoreLimits::kMaxListLimit (primecache/internal/store.h)
};

struct ListPage {
  std::vector<EntryInfo> entries;
  // Empty: no more. A page may hold fewer entries than asked (even none)
  // while more follow.
  std::string next_page_token;
};

// The longest stored boundary that prefixes a query, with what a restore
// needs to size itself.
// What a model costs to prefill, for the utility and marginal eviction
// policies (EstimatePrefillFlops in primecache/internal/statestore.h).
// flops_per_token covers every per-token cost that does not grow with the
// context (projections, MLPs, recurrent/linear-attention layers, a sliding
// window's bounded attention: about 2 x active parameters);
// attention_flops_per_pair is one full-attention layer's cost for one
// (query, key) pair (2 x (qk width + v width) x heads), averaged over the
// attention_layers. All zero: unknown (a boundary then weighs its tokens).
struct ModelCost {
  std::uint64_t flops_per_token = 0;
  std::uint32_t attention_layers = 0;
  std::uint64_t attention_flops_per_pair = 0;
  friend bool operator==(const ModelCost&, const ModelCost&) = default;
};

struct LookupHit {
  EntryId id = 0;
  std::uint64_t length = 0;  // boundary length: tokens[0, length) of the query are stored
  std::uint32_t layers = 0;
  std::uint32_t ranks = 1;  // >1: a tensor-parallel entry (EntryInfo::ranks)
  std::uint64_t chunk_bytes = 0;  // stored (encoded) bytes of its chunks
  std::uint64_t raw_bytes = 0;    // decoded bytes of its layers
};

struct StoreStats {
  std::uint64_t entries = 0;
  std::uint64_t quarantined = 0;
  std::uint64_t chunks = 0;             // distinct chunks stored
  std::uint64_t stored_bytes = 0;       // what the budget counts: distinct chunk bytes + metadata
  std::uint64_t logical_bytes = 0;      // what the entries would take without dedup
  std::uint64_t raw_bytes = 0;          // decoded bytes of every entry's layers
  std::uint64_t dedup_saved_bytes = 0;  // logical_bytes - stored_bytes
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;
  std::uint64_t admission_refusals = 0;
  std::uint64_t active_leases = 0;
  std::uint64_t byte_budget = 0;   // 0: unlimited
  std::uint64_t disk_bytes = 0;    // every file in the store's directory (tables, blobs, log)
  std::uint64_t staged_bytes = 0;  // chunk bytes written by publishes not committed yet
  // Group publishes (PublishGroup) begun and neither written nor aborted,
  // and those aborted since the store opened (a part abandoned, the group
  // timeout, a close).
  std::uint64_t group_publishes_open = 0;
  std::uint64_t group_publishes_aborted = 0;
  // Set while writes are refused after a failed write (a full disk): why, in
  // words; empty when writes go on. Reads are served either way.
  std::string write_error;
  // Memory the store's RocksDB holds, as RocksDB counts it: its block cache
  // (blocks of the metadata tables, their indexes and filters, and the
  // memtables' share: at most block_cache_capacity_bytes, the store's
  // StoreOptions::block_cache_bytes), its memtables (records written and not
  // yet flushed, the active and the immutable ones; at most
  // StoreOptions::memtable_bytes, charged to the cache), and its table
  // readers' own memory outside the cache.
  std::uint64_t block_cache_used_bytes = 0;
  std::uint64_t block_cache_capacity_bytes = 0;
  std::uint64_t memtable_bytes = 0;
  std::uint64_t table_reader_bytes = 0;
};

// The daemon's remote tier on a Redis Cluster (docs/cluster.md), counted
// since it started.
struct RemoteStats {
  // Lookups the local store did not cover whole: extended from the cluster
  // (fetched, checked, kept locally) or not extended. Errors: cluster
  // operations that failed, lookups (answered locally) and write-behind puts.
  std::uint64_t hits = 0, misses = 0, errors = 0;
  // Lookups not asked of the cluster: the same query missed there within
  // the daemon's --remote-miss-ttl.
  std::uint64_t misses_cached = 0;
  std::uint64_t fetched_bytes = 0;  // chunk bytes brought from the cluster
  // Write-behind entries: queued, written, dropped (queue full); bytes written;
  // entries waiting or being written now.
  std::uint64_t queued = 0, put = 0, dropped = 0, put_bytes = 0, queue_depth = 0;
  // Remote entries met evicted or damaged (each a miss, removed from the cluster).
  std::uint64_t evicted = 0, damaged = 0;
  // Remote entries refused by the local checks: whole and matching their
  // addresses, but their layers do not decode to what their headers declare
  // or are not the plan of their model. Each a miss, removed from the cluster.
  std::uint64_t refused = 0;
  // The cluster client: breaker open now, times opened, commands refused
  // while open; MOVED and ASK redirections followed.
  bool breaker_open = false;
  std::uint64_t breaker_opens = 0, fast_failures = 0, moved = 0, asked = 0;
};

// The daemon's own figures, next to its store's (Client::Stat).
struct DaemonStats {
  StoreStats store;
  std::uint32_t connections = 0;
  std::uint32_t publishes_in_flight = 0;
  // Header and chunk bytes of publishes begun and not yet committed or
  // aborted, over every connection.
  std::uint64_t uncommitted_bytes = 0;
  // Times a fetch waited for its client to release room in its shared or
  // device window, since the daemon started (a slow reader or a small window).
  std::uint64_t fetch_window_waits = 0;
  // Absent when the daemon runs without a remote tier.
  std::optional<RemoteStats> remote;
  // The daemon process's memory: its resident set, and what glibc's
  // allocator holds: bytes in use, and bytes freed but kept in its arenas
  // (not given back to the system; part of the resident set).
  std::uint64_t rss_bytes = 0;
  std::uint64_t heap_in_use_bytes = 0;
  std::uint64_t heap_free_bytes = 0;
};

// What a store-wide consistency check found (Store::CheckStore, Client::CheckStore).
struct StoreCheckReport {
  std::uint64_t entries = 0;
  std::uint64_t chunks = 0;
  std::vector<std::string> problems;  // in words; empty: consistent; the first 1000
  std::uint64_t problem_count = 0;    // all of them
};

// One entry's check (Store::CheckEntry, Client::CheckEntry): every chunk read and its checksum
// compared; ok false says why in message (the entry is then quarantined).
struct EntryCheckReport {
  bool ok = false;
  std::string message;
  std::uint32_t layers = 0;
  std::uint64_t bytes = 0;
};

}  // namespace primecache

#include "ipc/metrics.h"

#include <atomic>

#include "ipc/exposition.h"
#include "ipc/process_memory.h"

namespace primecache::ipc {

namespace {

using Type = ExpositionWriter::Type;

template <typename T>
std::uint64_t Load(const std::atomic<T>& a) {
  return a.load(std::memory_order_relaxed);
}

void WriteLookups(ExpositionWriter& w, const StoreStats& st, const ServerCounters& c) {
  w.Family("primecache_lookups_total", Type::kCounter,
           "Lookups by result: hit and miss as the store counts them (kept across restarts), error since the "
           "daemon started.");
  w.Sample("primecache_lookups_total", {{"result", "hit"}}, st.hits);
  w.Sample("primecache_lookups_total", {{"result", "miss"}}, st.misses);
  w.Sample("primecache_lookups_total", {{"result", "error"}}, Load(c.lookup_errors));
  w.Counter("primecache_lookup_hit_tokens_total", "Tokens of the stored prefixes that lookups found.",
            Load(c.hit_tokens));
}

// The fetch pool (docs/protocol.md, "Fetch budget").
void WriteFetchPool(ExpositionWriter& w, const ServerCounters& c) {
  w.Gauge("primecache_fetch_pool_running", "Fetches holding one of the fetch pool's places (--fetch-workers).",
          Load(c.fetch_pool_running));
  w.Gauge("primecache_fetch_pool_parked",
          "Fetches parked without a place: waiting for their client, or back from that and waiting for a place.",
          Load(c.fetch_pool_parked));
  w.Gauge("primecache_fetch_pool_queued", "Fetches not started: every place taken.", Load(c.fetch_pool_queued));
  w.Gauge("primecache_fetch_pool_threads", "Threads of the fetch pool.", Load(c.fetch_pool_threads));
  w.Counter("primecache_fetch_parks_total", "Waits of a fetch for its client that gave its place to others.",
            Load(c.fetch_pool_parks));
  w.Counter("primecache_fetch_parks_refused_total",
            "Waits of a fetch for its client that kept their place: --max-parked-fetches were parked already.",
            Load(c.fetch_pool_parks_refused));
}

void WriteRequests(ExpositionWriter& w, const ServerCounters& c) {
  w.Counter("primecache_publish_bytes_total", "Chunk bytes of committed publishes.", Load(c.publish_bytes));
  w.Counter("primecache_publish_errors_total",
            "Publishes that a store step or the commit failed (admission refusals are counted apart).",
            Load(c.publish_errors));
  w.Family("primecache_publish_duration_seconds", Type::kHistogram,
           "Seconds from a publishBegin's arrival to its commit's answer, of committed publishes.");
  w.HistogramSeries("primecache_publish_duration_seconds", {}, c.publish_seconds.Snapshot());
  w.Gauge("primecache_publishes_in_flight", "Publishes begun and not yet committed or aborted.",
          Load(c.publishes_in_flight));
  w.Gauge("primecache_publish_uncommitted_bytes", "Header and chunk bytes of the publishes in flight.",
          Load(c.uncommitted_bytes));
  w.Counter("primecache_fetch_bytes_total", "Chunk bytes sent by fetches.", Load(c.fetch_bytes));
  w.Counter("primecache_fetch_errors_total", "Fetches answered with an error, cancelled ones included.",
            Load(c.fetch_errors));
  w.Family("primecache_fetch_duration_seconds", Type::kHistogram,
           "Seconds from a fetch request's arrival to its fetchDone, of successful fetches.");
  w.HistogramSeries("primecache_fetch_duration_seconds", {}, c.fetch_seconds.Snapshot());
  w.Gauge("primecache_connections", "Client connections open (data and admin).", Load(c.connections));
  w.Gauge("primecache_shm_regions", "Shared-memory regions attached by clients.", Load(c.shm_regions));
  w.Gauge("primecache_shm_capacity_bytes", "Bytes of the shared-memory regions attached.", Load(c.shm_bytes));
  w.Gauge("primecache_shm_in_use_bytes",
          "Bytes of the shared regions that fetched chunks occupy until their client releases them.",
          Load(c.shm_bytes_in_use));
  w.Counter("primecache_fetch_window_waits_total",
            "Times a fetch waited for its client to release room in its shared or device window.",
            Load(c.fetch_window_waits));
  w.Family("primecache_fetch_window_chunks_total", Type::kCounter,
           "Chunks fetches sent through the shared or the device window.");
  w.Sample("primecache_fetch_window_chunks_total", {{"window", "shared"}}, Load(c.fetch_window_chunks_shm));
  w.Sample("primecache_fetch_window_chunks_total", {{"window", "device"}}, Load(c.fetch_window_chunks_device));
  w.Family("primecache_fetch_window_messages_total", Type::kCounter,
           "fetchChunk messages that carried them (one per extent of adjacent chunks).");
  w.Sample("primecache_fetch_window_messages_total", {{"window", "shared"}}, Load(c.fetch_window_messages_shm));
  w.Sample("primecache_fetch_window_messages_total", {{"window", "device"}}, Load(c.fetch_window_messages_device));
  WriteFetchPool(w, c);
  w.Family("primecache_rank_publish_bytes_total", Type::kCounter,
           "Chunk bytes of committed parts of group publishes (tensor-parallel entries), by the part's rank.");
  for (const auto& [rank, bytes] : c.rank_publish_bytes.Snapshot()) {
    w.Sample("primecache_rank_publish_bytes_total", {{"rank", std::to_string(rank)}}, bytes);
  }
  w.Family("primecache_rank_fetch_bytes_total", Type::kCounter,
           "Chunk bytes sent by the fetches of connections that are a tensor-parallel rank, by rank.");
  for (const auto& [rank, bytes] : c.rank_fetch_bytes.Snapshot()) {
    w.Sample("primecache_rank_fetch_bytes_total", {{"rank", std::to_string(rank)}}, bytes);
  }
}

void WriteStore(ExpositionWriter& w, const StoreStats& st) {
  w.Gauge("primecache_entries", "Live entries in the store.", st.entries);
  w.Gauge("primecache_quarantined_entries", "Entries quarantined after failing a check (never served).",
          st.quarantined);
  w.Gauge("primecache_chunks", "Distinct chunks stored.", st.chunks);
  w.Gauge("primecache_stored_bytes", "Bytes the byte budget counts: distinct chunk bytes and metadata.",
          st.stored_bytes);
  w.Gauge("primecache_logical_bytes", "Bytes the entries would take without deduplication.", st.logical_bytes);
  w.Gauge("primecache_raw_bytes", "Decoded bytes of every entry's layers.", st.raw_bytes);
  w.Gauge("primecache_dedup_saved_bytes", "Chunk bytes deduplication saves.", st.dedup_saved_bytes);
  w.Gauge("primecache_disk_bytes", "Bytes of every file of the store's directory.", st.disk_bytes);
  w.Gauge("primecache_staged_bytes", "Chunk bytes written by publishes not committed yet.", st.staged_bytes);
  w.Gauge("primecache_group_publishes_open", "Group publishes (tensor-parallel entries) waiting for their ranks.",
          st.group_publishes_open);
  w.Counter("primecache_group_publishes_aborted_total",
            "Group publishes aborted: a part abandoned, the group timeout or a close.", st.group_publishes_aborted);
  w.Gauge("primecache_capacity_bytes", "The store's byte budget (0: unlimited).", st.byte_budget);
  w.Counter("primecache_evictions_total", "Entries evicted to keep the budget (kept across restarts).",
            st.evictions);
  w.Counter("primecache_admission_refusals_total",
            "Publishes the admission policy did not store (kept across restarts).", st.admission_refusals);
  w.Gauge("primecache_active_leases", "Entries held by fetches in progress.", st.active_leases);
  w.Gauge("primecache_store_writes_refused", "1 while the store refuses writes after a failed write, else 0.",
          st.write_error.empty() ? 0 : 1);
}

// Where the daemon's memory goes (docs/operations.md "Memory").
void WriteMemory(ExpositionWriter& w, const StoreStats& st) {
  DaemonStats d;
  AddProcessMemory(&d);
  w.Gauge("primecache_resident_bytes", "The daemon's resident set.", d.rss_bytes);
  w.Gauge("primecache_heap_in_use_bytes", "Bytes the allocator has handed out (mallinfo2).",
          d.heap_in_use_bytes);
  w.Gauge("primecache_heap_free_bytes", "Bytes freed but kept in the allocator's arenas (mallinfo2).",
          d.heap_free_bytes);
  w.Gauge("primecache_block_cache_used_bytes",
          "Bytes in RocksDB's block cache, the memtables' share included.", st.block_cache_used_bytes);
  w.Gauge("primecache_block_cache_capacity_bytes", "The block cache's capacity (--block-cache).",
          st.block_cache_capacity_bytes);
  w.Gauge("primecache_memtable_bytes", "Bytes of RocksDB's memtables, active and immutable (--memtables).",
          st.memtable_bytes);
  w.Gauge("primecache_table_reader_bytes", "Bytes of RocksDB's table indexes and filters outside the cache.",
          st.table_reader_bytes);
}

void WriteRemote(ExpositionWriter& w, const RemoteStats& r) {
  w.Family("primecache_remote_lookups_total", Type::kCounter,
           "Lookups the local store did not cover whole that the remote tier answered: hit (extended from the "
           "cluster), miss, or miss_cached (not asked: it missed there within --remote-miss-ttl).");
  w.Sample("primecache_remote_lookups_total", {{"result", "hit"}}, r.hits);
  w.Sample("primecache_remote_lookups_total", {{"result", "miss"}}, r.misses);
  w.Sample("primecache_remote_lookups_total", {{"result", "miss_cached"}}, r.misses_cached);
  w.Counter("primecache_remote_errors_total",
            "Cluster operations that failed: lookups (answered from the local store) and write-behind puts.",
            r.errors);
  w.Counter("primecache_remote_fetched_bytes_total", "Chunk bytes brought from the cluster.", r.fetched_bytes);
  w.Family("primecache_remote_writes_total", Type::kCounter,
           "Committed entries for write-behind to the cluster: queued, put (written) or dropped (queue full).");
  w.Sample("primecache_remote_writes_total", {{"result", "queued"}}, r.queued);
  w.Sample("primecache_remote_writes_total", {{"result", "put"}}, r.put);
  w.Sample("primecache_remote_writes_total", {{"result", "dropped"}}, r.dropped);
  w.Counter("primecache_remote_written_bytes_total", "Bytes written to the cluster.", r.put_bytes);
  w.Gauge("primecache_remote_write_queue_depth", "Entries waiting or being written to the cluster.",
          r.queue_depth);
  w.Counter("primecache_remote_evicted_total", "Remote entries found evicted (each a miss).", r.evicted);
  w.Counter("primecache_remote_damaged_total", "Remote entries found damaged (each a miss, removed).", r.damaged);
  w.Counter("primecache_remote_refused_total",
            "Remote entries whose layers the local checks refused (each a miss, removed, never kept).", r.refused);
  w.Gauge("primecache_remote_breaker_open", "1 while the cluster client's circuit breaker is open.",
          r.breaker_open ? 1 : 0);
  w.Counter("primecache_remote_breaker_opens_total", "Times the circuit breaker opened.", r.breaker_opens);
  w.Counter("primecache_remote_fast_failures_total", "Cluster commands refused while the breaker was open.",
            r.fast_failures);
  w.Family("primecache_remote_redirects_total", Type::kCounter, "Cluster redirections followed, by kind.");
  w.Sample("primecache_remote_redirects_total", {{"kind", "moved"}}, r.moved);
  w.Sample("primecache_remote_redirects_total", {{"kind", "ask"}}, r.asked);
}

}  // namespace

Result<std::string> RenderMetrics(Store& store, const std::function<std::optional<RemoteStats>()>& remote_stats,
                                  const ServerCounters& counters) {
  PC_ASSIGN_OR_RETURN(StoreStats st, store.Stat());
  ExpositionWriter w;
  WriteLookups(w, st, counters);
  WriteRequests(w, counters);
  WriteStore(w, st);
  WriteMemory(w, st);
  if (remote_stats) {
    if (auto remote = remote_stats()) WriteRemote(w, *remote);
  }
  return w.Take();
}

}  // namespace primecache::ipc

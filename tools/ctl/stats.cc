// stats: the store's totals and, through the daemon, its own figures.
#include <cstdio>

#include "tools/ctl/commands.h"

namespace primecache::ctl {

namespace {

nlohmann::json RemoteStatsJson(const std::optional<RemoteStats>& r) {
  if (!r.has_value()) return nullptr;
  return {{"hits", r->hits},
          {"misses", r->misses},
          {"misses_cached", r->misses_cached},
          {"errors", r->errors},
          {"fetched_bytes", r->fetched_bytes},
          {"write_behind",
           {{"queued", r->queued},
            {"put", r->put},
            {"dropped", r->dropped},
            {"put_bytes", r->put_bytes},
            {"queue_depth", r->queue_depth}}},
          {"evicted", r->evicted},
          {"damaged", r->damaged},
          {"refused", r->refused},
          {"breaker", {{"open", r->breaker_open}, {"opens", r->breaker_opens}, {"refused", r->fast_failures}}},
          {"moved", r->moved},
          {"asked", r->asked}};
}

// The remote tier's rows of the `stats` table.
void AddRemoteRows(const RemoteStats& r, std::vector<std::vector<std::string>>* rows) {
  rows->push_back({"remote lookups", std::to_string(r.hits) + " hits, " + std::to_string(r.misses) + " misses, " +
                                         std::to_string(r.errors) + " errors; " + std::to_string(r.misses_cached) +
                                         " not asked (missed recently)"});
  rows->push_back({"remote bytes", HumanBytes(r.fetched_bytes) + " fetched, " + HumanBytes(r.put_bytes) + " put"});
  rows->push_back({"write-behind", std::to_string(r.queued) + " queued, " + std::to_string(r.put) + " put, " +
                                       std::to_string(r.dropped) + " dropped, " + std::to_string(r.queue_depth) +
                                       " waiting"});
  rows->push_back({"remote cleanup", std::to_string(r.evicted) + " evicted, " + std::to_string(r.damaged) +
                                         " damaged, " + std::to_string(r.refused) + " refused (removed)"});
  rows->push_back({"cluster", std::string(r.breaker_open ? "breaker OPEN" : "breaker closed") + " (" +
                                  std::to_string(r.breaker_opens) + " openings, " + std::to_string(r.fast_failures) +
                                  " refused), " + std::to_string(r.moved) + " MOVED, " + std::to_string(r.asked) +
                                  " ASK"});
}

// The daemon's own rows of the `stats` table, its remote tier's included.
void AddDaemonRows(const DaemonStats& s, std::vector<std::vector<std::string>>* rows) {
  rows->push_back({"daemon", std::to_string(s.connections) + " connections, " +
                                 std::to_string(s.publishes_in_flight) + " publishes in flight (" +
                                 HumanBytes(s.uncommitted_bytes) + " uncommitted), " +
                                 std::to_string(s.fetch_window_waits) + " fetch window waits"});
  rows->push_back({"daemon memory", HumanBytes(s.rss_bytes) + " resident; heap " +
                                        HumanBytes(s.heap_in_use_bytes) + " in use, " +
                                        HumanBytes(s.heap_free_bytes) + " free but kept"});
  if (s.remote.has_value()) {
    AddRemoteRows(*s.remote, rows);
  } else {
    rows->push_back({"remote tier", "none"});
  }
}

}  // namespace

int Stats(Target& access, const Output& out) {
  auto s = StatOf(access);
  if (!s.ok()) return out.Error(s.status());
  const StoreStats& st = s->store;
  const std::uint64_t lookups = st.hits + st.misses;
  const nlohmann::json hit_rate =
      lookups == 0 ? nlohmann::json(nullptr) : nlohmann::json(static_cast<double>(st.hits) / lookups);
  // What the entries would take without sharing chunks, per byte stored.
  const double dedup_ratio =
      st.stored_bytes == 0 ? 1.0 : static_cast<double>(st.logical_bytes) / static_cast<double>(st.stored_bytes);
  nlohmann::json daemon = nullptr;
  if ((access.daemon != nullptr)) {
    daemon = {{"connections", s->connections},
              {"publishes_in_flight", s->publishes_in_flight},
              {"uncommitted_bytes", s->uncommitted_bytes},
              {"fetch_window_waits", s->fetch_window_waits},
              {"rss_bytes", s->rss_bytes},
              {"heap_in_use_bytes", s->heap_in_use_bytes},
              {"heap_free_bytes", s->heap_free_bytes}};
  }
  out.Json({{"source", access.where},
            {"entries", st.entries},
            {"quarantined", st.quarantined},
            {"chunks", st.chunks},
            {"stored_bytes", st.stored_bytes},
            {"logical_bytes", st.logical_bytes},
            {"raw_bytes", st.raw_bytes},
            {"dedup_saved_bytes", st.dedup_saved_bytes},
            {"dedup_ratio", dedup_ratio},
            {"hits", st.hits},
            {"misses", st.misses},
            {"hit_rate", hit_rate},
            {"evictions", st.evictions},
            {"admission_refusals", st.admission_refusals},
            {"active_leases", st.active_leases},
            {"capacity_bytes", st.byte_budget},
            {"disk_bytes", st.disk_bytes},
            {"block_cache_used_bytes", st.block_cache_used_bytes},
            {"block_cache_capacity_bytes", st.block_cache_capacity_bytes},
            {"memtable_bytes", st.memtable_bytes},
            {"table_reader_bytes", st.table_reader_bytes},
            {"daemon", daemon},
            {"remote", RemoteStatsJson(s->remote)}});
  char rate[32] = "n/a";
  if (lookups > 0) std::snprintf(rate, sizeof rate, "%.1f%%", 100.0 * static_cast<double>(st.hits) / lookups);
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", dedup_ratio);
  std::vector<std::vector<std::string>> rows = {
      {"entries", std::to_string(st.entries) + " (" + std::to_string(st.quarantined) + " quarantined)"},
      {"chunks", std::to_string(st.chunks)},
      {"stored", HumanBytes(st.stored_bytes) +
                     (st.byte_budget > 0 ? " of " + HumanBytes(st.byte_budget) + " budget" : " (no budget)")},
      {"raw (decoded)", HumanBytes(st.raw_bytes)},
      {"dedup savings", HumanBytes(st.dedup_saved_bytes) + " (" + ratio + ")"},
      {"on disk", HumanBytes(st.disk_bytes)},
      {"lookups",
       std::to_string(st.hits) + " hits, " + std::to_string(st.misses) + " misses, hit rate " + rate},
      {"evictions", std::to_string(st.evictions)},
      {"admission refusals", std::to_string(st.admission_refusals)},
      {"leases held", std::to_string(st.active_leases)},
      {"rocksdb memory", HumanBytes(st.block_cache_used_bytes) + " of " +
                             HumanBytes(st.block_cache_capacity_bytes) + " block cache (" +
                             HumanBytes(st.memtable_bytes) + " memtables charged to it), " +
                             HumanBytes(st.table_reader_bytes) + " table readers"}};
  if ((access.daemon != nullptr)) AddDaemonRows(*s, &rows);
  out.Line(RenderTable({"STORE", access.where}, rows));
  return kExitOk;
}

}  // namespace primecache::ctl

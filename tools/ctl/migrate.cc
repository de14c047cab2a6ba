// primecachectl migrate: brings a store of an older schema (chunk bytes in
// RocksDB) to this build's (chunk bytes in segment files), with the daemon
// stopped. Opening the store for writing is what migrates it (crash-safe and
// resumable: statestore/migrate.cc); this command does that and reports.
#include <chrono>
#include <cstdio>

#include "primecache/internal/codec.h"
#include "primecache/internal/statestore.h"
#include "tools/ctl/access.h"
#include "tools/ctl/commands.h"

namespace primecache::ctl {

int Migrate(const AccessOptions& access, const std::string& store_path, const Output& out) {
  if (!access.offline) {
    if (Status s = EnsureNoDaemon(access); !s.ok()) return out.Error(s);
  }
  StoreOptions so;
  so.validator = CodecLayerValidator();
  so.path = store_path;
  so.create_if_missing = false;
  so.read_only = true;
  auto current = LocalStore::Open(so);
  if (current.ok()) {
    out.Json({{"path", store_path}, {"migrated", false}});
    out.Line("the store at " + store_path + " already has this build's schema; nothing to migrate");
    return kExitOk;
  }
  if (current.status().code() != StatusCode::kFailedPrecondition) return out.Error(current.status());
  so.read_only = false;
  const auto start = std::chrono::steady_clock::now();
  auto migrated = LocalStore::Open(so);
  if (!migrated.ok()) return out.Error(migrated.status());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto st = (*migrated)->Stat();
  if (!st.ok()) return out.Error(st.status());
  out.Json({{"path", store_path},
            {"migrated", true},
            {"entries", st->entries},
            {"chunks", st->chunks},
            {"seconds", seconds}});
  char took[32];
  std::snprintf(took, sizeof took, "%.2f s", seconds);
  out.Line("migrated the store at " + store_path + ": " + std::to_string(st->entries) + " entries, " +
           std::to_string(st->chunks) + " chunks moved into segment files in " + took);
  return kExitOk;
}

}  // namespace primecache::ctl

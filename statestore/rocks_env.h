// RocksDB's file I/O routed through primecache::Env, and its log through spdlog.
//
// EnvFileSystem implements rocksdb::FileSystem on top of a primecache::Env, so
// that every byte RocksDB reads or writes passes the same seam as the rest of
// primecache: tests run the store on the in-memory Env, or under a
// FaultInjectionEnv that fails chosen writes and syncs, runs out of space, or
// drops unsynced data as a power loss would. Kill points ("fs.append",
// "fs.sync", "fs.rename", "fs.dirsync", "fs.delete", "fs.create") sit on
// every mutating operation.
//
// Thread-safety: as rocksdb::FileSystem requires (the Env is thread-safe).
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "primecache/internal/env.h"

namespace primecache::statestore_internal {

struct EnvFileSystemOptions {
  // Also take RocksDB's own POSIX lock on LOCK files (cross-process
  // exclusion); only meaningful when the Env is the real file system.
  bool posix_locks = false;
  // When set and true, every mutating operation fails with no effect (a test
  // freezes the disk at a simulated power loss).
  std::shared_ptr<std::atomic<bool>> frozen;
  // See TestHooks::freeze_countdown (requires frozen).
  std::shared_ptr<std::atomic<std::int64_t>> freeze_countdown;
};

std::shared_ptr<rocksdb::FileSystem> NewEnvFileSystem(Env* env, EnvFileSystemOptions options);

// The rocksdb::Env RocksDB runs on: that file system, the default threads and
// clock. short_sleeps (tests only) caps RocksDB's own back-off sleeps (a
// second after each failed flush) at a millisecond.
std::unique_ptr<rocksdb::Env> NewRocksEnv(const std::shared_ptr<rocksdb::FileSystem>& fs, bool short_sleeps);

// A rocksdb::Logger that forwards to spdlog (RocksDB's INFO as debug).
std::shared_ptr<rocksdb::Logger> NewSpdlogRocksLogger();

// primecache Status <-> RocksDB status.
Status FromRocks(const rocksdb::Status& s, std::string_view context);

}  // namespace primecache::statestore_internal

// The KV-kinds part of primecache-engine-bench (kv_kinds_bench.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "primecache/internal/engine.h"

namespace primecache::engine {

// Prints, per KV storage kind at `tokens` tokens, the bytes booked, captured
// and stored per token, the capture time and the restore rate from pinned
// memory (median of `reps`); with `csv_dir`, the same rows as
// csv_dir/`csv_name`.csv (tools/bench/plot.py). Returns 1 when a restored
// cache does not equal its snapshot.
int KvKindsBench(const std::shared_ptr<Device>& device, std::uint64_t tokens, std::uint32_t reps,
                 const std::string& csv_dir = "", const std::string& csv_name = "kv-kinds");

}  // namespace primecache::engine

// The KV-kinds part of primecache-engine-bench (kv_kinds_bench.cc).
#pragma once

#include <cstdint>
#include <memory>

#include "primecache/engine.h"

namespace primecache::engine {

// Prints, per KV storage kind at `tokens` tokens, the bytes booked, captured
// and stored per token, the capture time and the restore rate from pinned
// memory (median of `reps`); returns 1 when a restored cache does not equal
// its snapshot.
int KvKindsBench(const std::shared_ptr<Device>& device, std::uint64_t tokens, std::uint32_t reps);

}  // namespace primecache::engine

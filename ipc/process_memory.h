// The daemon process's own memory, for its stats: the resident set and what
// glibc's allocator holds (docs/metrics.md, docs/operations.md "Memory").
#pragma once

#include "primecache/entry.h"

namespace primecache::ipc {

// Sets d's rss_bytes (from /proc/self/statm), heap_in_use_bytes and
// heap_free_bytes (mallinfo2, which walks every arena under its lock: for a
// stats request, not a hot path; under a sanitizer, its allocator's own
// figures). A figure that cannot be read stays 0.
void AddProcessMemory(DaemonStats* d);

}  // namespace primecache::ipc

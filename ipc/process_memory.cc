#include "ipc/process_memory.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

// A sanitizer replaces glibc's malloc with its own allocator, and mallinfo2
// then reports nothing: the heap figures come from that allocator instead.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PRIMECACHE_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PRIMECACHE_SANITIZER_ALLOCATOR 1
#endif
#endif

#ifdef PRIMECACHE_SANITIZER_ALLOCATOR
#include <sanitizer/allocator_interface.h>
#endif

namespace primecache::ipc {

void AddProcessMemory(DaemonStats* d) {
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;  // in pages
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2) {
      d->rss_bytes = resident * static_cast<unsigned long long>(sysconf(_SC_PAGESIZE));
    }
    std::fclose(f);
  }
#ifdef PRIMECACHE_SANITIZER_ALLOCATOR
  d->heap_in_use_bytes = __sanitizer_get_current_allocated_bytes();
  d->heap_free_bytes = __sanitizer_get_free_bytes();
#else
  const struct mallinfo2 m = mallinfo2();
  // In use: allocated from the arenas, and the large blocks glibc maps apart.
  d->heap_in_use_bytes = m.uordblks + m.hblkhd;
  d->heap_free_bytes = m.fordblks;
#endif
}

}  // namespace primecache::ipc

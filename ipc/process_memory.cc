#include "ipc/process_memory.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

namespace primecache::ipc {

void AddProcessMemory(DaemonStats* d) {
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;  // in pages
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2) {
      d->rss_bytes = resident * static_cast<unsigned long long>(sysconf(_SC_PAGESIZE));
    }
    std::fclose(f);
  }
  const struct mallinfo2 m = mallinfo2();
  // In use: allocated from the arenas, and the large blocks glibc maps apart.
  d->heap_in_use_bytes = m.uordblks + m.hblkhd;
  d->heap_free_bytes = m.fordblks;
}

}  // namespace primecache::ipc

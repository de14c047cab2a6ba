// An in-process StoreBackend kept in memory: no durability, linear lookup.
// For the fuzzer (fast, no disk per input) and for unit tests of the session;
// the daemon and the ipc tests serve the real store.
#pragma once

#include <memory>

#include "ipc/backend.h"

namespace primecache::ipc {

std::unique_ptr<StoreBackend> NewMemoryBackend();

}  // namespace primecache::ipc

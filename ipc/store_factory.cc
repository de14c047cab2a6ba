#include "ipc/store_factory.h"

#include "ipc/memory_backend.h"

namespace primecache::ipc {

// Until the statestore lands this serves memory; replaced by the real store.
Result<std::unique_ptr<StoreBackend>> OpenStore(const StoreConfig&) { return NewMemoryBackend(); }

}  // namespace primecache::ipc

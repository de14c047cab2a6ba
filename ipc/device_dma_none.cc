// DeviceDma in a build without CUDA: never available.
#include "ipc/device_dma.h"

namespace primecache::ipc {

Result<std::unique_ptr<DeviceDma>> DeviceDma::Create(std::uint64_t, std::size_t) {
  return Status::NotSupported("device copies: this daemon was built without CUDA");
}

}  // namespace primecache::ipc

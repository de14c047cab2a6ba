// DeviceDma: the daemon's copies from host memory it holds (segment files
// mapped read-only, served from the page cache) into device memory that an
// engine exported to it (a CUDA IPC handle), done by the GPU's copy engines,
// so that no CPU copies the bytes of a restored chunk.
//
// Host ranges must lie in a MappedRegion (primecache/env.h). A mapping is registered with the
// driver (read-only) on its first copy and stays registered, and alive,
// while it is among the most recently used within the byte budget; past the
// budget the least recently used are unregistered and let go. Registering
// costs about 30 ms per GiB on an H200 host, which is why it is kept.
//
// Built without CUDA, Create answers kNotSupported and the daemon offers
// only its shared-memory path.
//
// Thread-safety: every method may be called from many threads at once;
// each calling thread copies on a stream of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "primecache/client.h"
#include "primecache/env.h"
#include "primecache/status.h"

namespace primecache::ipc {

// What an engine exports (primecache/client.h, the wire's attachDevice).
using client::DeviceWindowSpec;
using client::kDeviceHandleBytes;

// An engine's exported device buffer, opened in this process. Closed when
// the last holder lets it go.
class DeviceWindow {
 public:
  virtual ~DeviceWindow() = default;
  virtual std::uint64_t size() const = 0;
};

class DeviceDma {
 public:
  // kNotSupported without CUDA; kUnavailable without a device.
  static Result<std::unique_ptr<DeviceDma>> Create(std::uint64_t registered_budget_bytes);
  virtual ~DeviceDma() = default;

  // Opens an exported buffer (checked: the handle's size, a known device).
  virtual Result<std::shared_ptr<DeviceWindow>> Open(const DeviceWindowSpec& spec) = 0;

  // Copies `src`, which must lie inside `mapping`, to `window` at `offset`;
  // returns once the bytes are on the device. kInvalidArgument: outside the
  // window or the mapping.
  virtual Status Copy(DeviceWindow& window, std::uint64_t offset, std::span<const std::byte> src,
                      const MappedRegion& mapping) = 0;

  // Bytes of mappings registered now.
  virtual std::uint64_t registered_bytes() const = 0;
};

}  // namespace primecache::ipc

// DeviceDma: the daemon's copies from host memory it holds (segment files
// mapped read-only, served from the page cache) into device memory that an
// engine exported to it (a CUDA IPC handle), done by the GPU's copy engines,
// so that no CPU copies the bytes of a restored chunk.
//
// Host ranges must lie in a MappedRegion (primecache/internal/env.h). A mapping is registered with the
// driver (read-only) on its first pin or copy and stays registered, and
// alive, while it is among the most recently used within the byte budget;
// past the budget the least recently used are unregistered and let go
// (RegistrationLedger: counted once per file). Registering
// costs about 30 ms per GiB on an H200 host, which is why it is kept.
//
// Built without CUDA, Create answers kNotSupported and the daemon offers
// only its shared-memory path.
//
// Thread-safety: DeviceDma's methods may be called from many threads at
// once; each DeviceCopyQueue is used by one thread and copies on one of
// the daemon's streams of its device: an idle one, else a new one, else
// (past `max_streams`) the one the fewest queues use, shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "primecache/client.h"
#include "primecache/internal/env.h"
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

// Copies into one window, on a stream of the DeviceDma's (maybe shared with
// other queues), completed in the order they were enqueued: the copy engines run back to back while the
// caller goes on with the next chunk. A copy's host mapping stays
// registered until the copy completed. Used by one thread; the destructor
// waits for every copy enqueued.
class DeviceCopyQueue {
 public:
  virtual ~DeviceCopyQueue() = default;

  // Enqueues one copy of `pieces`, each inside `mapping`, landing side by
  // side in the window from `offset` (a run of chunks whose segment frames
  // put headers between them). It completes as one: Completed counts it
  // once. kInvalidArgument: outside the window or the mapping; on any
  // error no part of it is left in flight.
  virtual Status Enqueue(std::uint64_t offset, std::span<const std::span<const std::byte>> pieces,
                         const MappedRegion& mapping) = 0;
  // A copy of one piece.
  Status Enqueue(std::uint64_t offset, std::span<const std::byte> src, const MappedRegion& mapping) {
    return Enqueue(offset, std::span(&src, 1), mapping);
  }
  // Copies enqueued so far.
  virtual std::uint64_t enqueued() const = 0;
  // Queues copying into this queue's device now, this one included: the
  // fetches its copy engines are shared among.
  virtual std::size_t sharers() const = 0;
  // How many copies have completed (always the first ones), after waiting
  // until at least `at_least` have (0: no wait). An error: a copy failed on
  // the device.
  virtual Result<std::uint64_t> Completed(std::uint64_t at_least) = 0;
};

class DeviceDma {
 public:
  // kNotSupported without CUDA; kUnavailable without a device. Copies go
  // on `max_streams` streams per device at most (`--copy-streams`). One by
  // default: the copy engines run one stream's queued copies before
  // another's, so concurrent fetches on streams of their own do not share
  // the link; on one stream their copies run in the order queued, and take
  // turns (FetchSender's copy depth).
  static constexpr std::size_t kDefaultMaxStreams = 1;
  static Result<std::unique_ptr<DeviceDma>> Create(std::uint64_t registered_budget_bytes,
                                                   std::size_t max_streams = kDefaultMaxStreams);
  virtual ~DeviceDma() = default;

  // Opens an exported buffer (checked: the handle's size, a known device).
  virtual Result<std::shared_ptr<DeviceWindow>> Open(const DeviceWindowSpec& spec) = 0;

  // A queue of copies into `window` (which it keeps open).
  virtual Result<std::unique_ptr<DeviceCopyQueue>> NewQueue(std::shared_ptr<DeviceWindow> window) = 0;

  // Nonzero while `mapping` is registered (its pages pinned): a number
  // that stays the same exactly as long as this registration lasts.
  virtual std::uint64_t PinnedAs(const MappedRegion& mapping) const = 0;
  // Registers `mapping` (when it is not) and holds the registration until
  // the pin's hold is let go: its serial is PinnedAs(mapping) meanwhile
  // (FetchSink::Pin).
  virtual Result<MappingPin> Pin(const MappedRegion& mapping) = 0;

  // Bytes of mappings registered now, counted once per file
  // (MappedRegion::file: a longer mapping of a file replaces the shorter
  // one's registration, let go once no copy uses it).
  virtual std::uint64_t registered_bytes() const = 0;
};

}  // namespace primecache::ipc

// The device seam: everything the engine does to memory goes through a Device.
// Internal to the build, beside its library because it names the kernels'
// argument types; who includes it, and why, is in
// include/primecache/internal/engine.h ("devices").
//
// Two backends implement it:
//  - the CPU reference (NewCpuDevice): "device" memory is host memory, every
//    operation runs to completion inside the call, and the kernels are the CPU
//    twins in kernels/*_cpu.cc;
//  - CUDA (NewCudaDevice): cudaMalloc'd memory, two streams (one per Lane),
//    page-locked staging from cudaMallocHost, asynchronous copies, and the
//    kernels in kernels/*.cu.
//
// Ordering. Each Lane is an in-order queue (a CUDA stream): work enqueued on
// one lane runs in the order it was enqueued; two lanes are ordered only
// through events (Record on one, Wait on the other). The engine enqueues cache
// work on kCompute and the snapshot slots' trip to host memory on kTransfer.
//
// Host memory. Upload and Download return once the host buffer may be reused
// (Download: once it holds the data). UploadAsync and DownloadAsync need
// pinned memory (IsPinned; on the CPU backend all host memory qualifies) and
// keep using it until the lane has passed the copy.
//
// Registered host memory. RegisterHost makes memory the caller owns (e.g. a
// client's shared region) count as pinned for UploadAsync / DownloadAsync, so
// the device's DMA reads it where it lies; it must stay mapped until
// UnregisterHost.
//
// Exported memory. Export names a whole Allocate block to another process
// (CUDA: an IPC handle of its cudaMalloc allocation, which is the block: IPC
// handles name allocations, so only whole blocks are exported), e.g. the
// device window a daemon copies fetched chunks into.
//
// Thread-safety: a Device is used by one thread at a time, except that
// allocation accounting is atomic and UploadAsync, DownloadAsync,
// CopyOnDevice, CopyOnDevice2D, IsPinned, Record and Synchronize(Event) may be called from
// several threads at once (they keep no host-side state). Memory objects must not outlive their device.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/conv_ring.h"
#include "kernels/kda_scan.h"
#include "kernels/pool_keys.h"
#include "kernels/ring_rows.h"
#include "primecache/internal/engine.h"
#include "primecache/status.h"

namespace primecache::engine {

enum class DeviceKind : std::uint8_t { kCpu, kCuda };
std::string_view DeviceKindName(DeviceKind kind);

enum class Lane : std::uint8_t { kCompute = 0, kTransfer = 1 };

// What another process needs to map a block of device memory (Device::Export).
struct DeviceExport {
  std::string pci_bus_id;  // the device, as cudaDeviceGetPCIBusId writes it
  std::string handle;      // the cudaIpcMemHandle_t bytes (64)
};

// Owned memory of one kind (device or pinned host), freed through its device
// when destroyed. Move-only.
class Memory {
 public:
  Memory() = default;
  ~Memory() { Reset(); }
  Memory(Memory&& o) noexcept : owner_(o.owner_), data_(o.data_), bytes_(o.bytes_), pinned_(o.pinned_) {
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  Memory& operator=(Memory&& o) noexcept;
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }
  // A typed pointer `byte_offset` bytes into the block.
  template <typename T>
  T* at(std::uint64_t byte_offset) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(data_) + byte_offset);
  }
  void Reset();

 private:
  friend class Device;
  Memory(Device* owner, void* data, std::size_t bytes, bool pinned)
      : owner_(owner), data_(data), bytes_(bytes), pinned_(pinned) {}
  Device* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool pinned_ = false;
};

// A point in one lane's queue. Move-only; released through its device.
class Event {
 public:
  Event() = default;
  ~Event() { Reset(); }
  Event(Event&& o) noexcept : owner_(o.owner_), handle_(o.handle_) {
    o.owner_ = nullptr;
    o.handle_ = nullptr;
  }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  bool valid() const { return owner_ != nullptr; }
  void* handle() const { return handle_; }
  void Reset();

 private:
  friend class Device;
  Event(Device* owner, void* handle) : owner_(owner), handle_(handle) {}
  Device* owner_ = nullptr;
  void* handle_ = nullptr;  // backend-specific; null on the CPU backend
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // ---- memory ----
  // Device memory of exactly `bytes` bytes (0 gives an empty block), zeroed.
  // ResourceExhausted when the device cannot hold it.
  Result<Memory> Allocate(std::size_t bytes);
  // Page-locked host memory (CPU backend: ordinary host memory), zeroed.
  Result<Memory> AllocatePinned(std::size_t bytes);
  // Device bytes held by live Allocate blocks (pinned memory is not counted).
  std::uint64_t allocated_bytes() const { return allocated_.load(); }
  // What the device could still allocate.
  virtual Result<std::uint64_t> FreeBytes() const = 0;
  // Whether a host pointer may be used with UploadAsync / DownloadAsync.
  virtual bool IsPinned(const void* host) const = 0;
  // Registers [host, host + bytes) for asynchronous copies (CUDA:
  // cudaHostRegister; CPU: nothing, all host memory qualifies). Registering
  // costs tens of ms per GiB: do it once for a long-lived region.
  virtual Status RegisterHost(void* host, std::size_t bytes) = 0;
  // Undoes RegisterHost(host, ...); call it before the memory is unmapped.
  virtual Status UnregisterHost(void* host) = 0;
  // `m` (a whole block from this device's Allocate) for another process to
  // map. kNotSupported where the backend cannot share memory (the CPU
  // backend); kInvalidArgument for an empty, pinned or foreign block.
  virtual Result<DeviceExport> Export(const Memory& m) = 0;
  // The backend's native queue behind a lane (a cudaStream_t on CUDA; null on
  // the CPU backend), for code that launches its own kernels in lane order.
  virtual void* native_stream(Lane lane) const = 0;

  // ---- transfers and fills, in lane order ----
  virtual Status Upload(void* dst, const void* host_src, std::size_t bytes, Lane lane) = 0;
  virtual Status UploadAsync(void* dst, const void* pinned_src, std::size_t bytes, Lane lane) = 0;
  virtual Status Download(void* host_dst, const void* src, std::size_t bytes, Lane lane) = 0;
  virtual Status DownloadAsync(void* pinned_dst, const void* src, std::size_t bytes, Lane lane) = 0;
  virtual Status CopyOnDevice(void* dst, const void* src, std::size_t bytes, Lane lane) = 0;
  // `rows` rows of `width` bytes, from rows `src_pitch` bytes apart to rows
  // `dst_pitch` bytes apart (a column block of a row-major plane): how the
  // head-group parts of a tensor-parallel layer are laid side by side.
  // InvalidArgument for a pitch smaller than the width.
  virtual Status CopyOnDevice2D(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                std::size_t width, std::size_t rows, Lane lane) = 0;
  virtual Status Zero(void* dst, std::size_t bytes, Lane lane) = 0;
  // A 32-bit value written to device memory in lane order (the len mirrors).
  virtual Status WriteI32(std::int32_t* dst, std::int32_t value, Lane lane) = 0;
  Result<std::int32_t> ReadI32(const std::int32_t* src, Lane lane);

  // ---- kernels (kernels/), in lane order ----
  virtual Status AppendRows(const kernels::AppendRowsArgs& args, Lane lane) = 0;
  virtual Status GatherRows(const kernels::RingRowsArgs& args, Lane lane) = 0;
  virtual Status ScatterRows(const kernels::RingRowsArgs& args, Lane lane) = 0;
  virtual Status BuildPoolKeys(const kernels::PoolKeyArgs& args, Lane lane) = 0;
  virtual Status PushConvRing(const kernels::ConvRingPushArgs& args, Lane lane) = 0;
  // The KDA scan (the model's own kernel): a round rollback replays the kept
  // tokens through it.
  virtual Status KdaScan(const kernels::KdaScanArgs& args, Lane lane) = 0;

  // ---- ordering ----
  // An event at the current end of `lane`.
  virtual Result<Event> Record(Lane lane) = 0;
  // Work enqueued on `lane` after this call waits for `event`.
  virtual Status Wait(Lane lane, const Event& event) = 0;
  // Blocks until the event has passed; reports errors of the work before it.
  virtual Status Synchronize(const Event& event) = 0;
  // True once the event has passed (never blocks).
  virtual Result<bool> Query(const Event& event) = 0;
  // Blocks until everything enqueued on `lane` has run.
  virtual Status Synchronize(Lane lane) = 0;

 protected:
  Device() = default;
  // Backend hooks. DoAllocate returns zeroed memory or null with *status set.
  virtual void* DoAllocate(std::size_t bytes, Status* status) = 0;
  virtual void DoFree(void* p) = 0;
  virtual void* DoAllocatePinned(std::size_t bytes, Status* status) = 0;
  virtual void DoFreePinned(void* p) = 0;
  virtual void DoReleaseEvent(void* handle) = 0;
  Event MakeEvent(void* handle) { return Event(this, handle); }
  // Whether `m` is a non-empty device block allocated by this device.
  bool OwnsDeviceBlock(const Memory& m) const { return m.owner_ == this && !m.pinned_ && !m.empty(); }

 private:
  friend class Memory;
  friend class Event;
  void Free(Memory& m);
  std::atomic<std::uint64_t> allocated_{0};
};

// The CUDA backend's factory, defined in cuda_device.cc (NotSupported without CUDA).
Result<std::shared_ptr<Device>> NewCudaDeviceImpl(const CudaDeviceOptions& options);

}  // namespace primecache::engine

// The few CUDA runtime calls the binding makes for device copies, resolved at
// run time from the libcudart the process already has (torch's), so that the
// module links no CUDA library and imports on machines without one
// (docs/python.md, "Device windows").
//
// CudaRuntime::Get() is null where no libcudart loads; every call returns a
// Status naming the call and the runtime's message. Thread-safety: the
// functions are the runtime's, callable from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "primecache/status.h"

namespace primecache::python {

class CudaRuntime {
 public:
  using Stream = void*;
  using Event = void*;

  // The loaded runtime, or null (then `why` says why).
  static const CudaRuntime* Get(std::string* why = nullptr);

  Status SetDevice(int device) const;
  // A whole allocation (an IPC handle names one) and its IPC handle bytes.
  Status Malloc(std::size_t bytes, void** out) const;
  Status Free(void* p) const;
  Status IpcHandle(void* p, std::string* handle) const;  // cudaIpcMemHandle_t's 64 bytes
  Status PciBusId(int device, std::string* out) const;
  Status CopyDeviceToDeviceAsync(void* dst, const void* src, std::size_t bytes, Stream stream) const;
  // From pageable host memory: returns once the bytes are read.
  Status CopyHostToDevice(void* dst, const void* src, std::size_t bytes) const;
  Status CreateEvent(Event* out) const;  // timing off
  Status DestroyEvent(Event e) const;
  Status Record(Event e, Stream stream) const;
  Status Wait(Event e) const;  // host waits for the work recorded before it
  Status Synchronize(Stream stream) const;

 private:
  CudaRuntime() = default;
  Status Check(int code, const char* call) const;

  const char* (*error_string_)(int) = nullptr;
  int (*set_device_)(int) = nullptr;
  int (*malloc_)(void**, std::size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*ipc_handle_)(void*, void*) = nullptr;
  int (*pci_bus_id_)(char*, int, int) = nullptr;
  int (*memcpy_async_)(void*, const void*, std::size_t, int, Stream) = nullptr;
  int (*memcpy_)(void*, const void*, std::size_t, int) = nullptr;
  int (*event_create_)(Event*, unsigned) = nullptr;
  int (*event_destroy_)(Event) = nullptr;
  int (*event_record_)(Event, Stream) = nullptr;
  int (*event_sync_)(Event) = nullptr;
  int (*stream_sync_)(Stream) = nullptr;
};

}  // namespace primecache::python

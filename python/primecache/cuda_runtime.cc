#include "python/primecache/cuda_runtime.h"

#include <dlfcn.h>

namespace primecache::python {
namespace {

// cudaMemcpyKind and cudaEventDisableTiming, as the runtime's headers define them.
constexpr int kHostToDevice = 1;
constexpr int kDeviceToDevice = 3;
constexpr unsigned kDisableTiming = 2;
constexpr std::size_t kIpcHandleBytes = 64;

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

const CudaRuntime* CudaRuntime::Get(std::string* why) {
  static const CudaRuntime* runtime = [] () -> const CudaRuntime* {
    // The one the process has already (torch's) is found by its soname first.
    void* lib = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) return nullptr;
    auto* r = new CudaRuntime();
    const bool all = Resolve(lib, "cudaGetErrorString", &r->error_string_) &&
                     Resolve(lib, "cudaSetDevice", &r->set_device_) && Resolve(lib, "cudaMalloc", &r->malloc_) &&
                     Resolve(lib, "cudaFree", &r->free_) && Resolve(lib, "cudaIpcGetMemHandle", &r->ipc_handle_) &&
                     Resolve(lib, "cudaDeviceGetPCIBusId", &r->pci_bus_id_) &&
                     Resolve(lib, "cudaMemcpyAsync", &r->memcpy_async_) && Resolve(lib, "cudaMemcpy", &r->memcpy_) &&
                     Resolve(lib, "cudaEventCreateWithFlags", &r->event_create_) &&
                     Resolve(lib, "cudaEventDestroy", &r->event_destroy_) &&
                     Resolve(lib, "cudaEventRecord", &r->event_record_) &&
                     Resolve(lib, "cudaEventSynchronize", &r->event_sync_) &&
                     Resolve(lib, "cudaStreamSynchronize", &r->stream_sync_);
    if (!all) {
      delete r;
      return nullptr;
    }
    return r;  // never freed: the library stays loaded with it
  }();
  if (runtime == nullptr && why != nullptr) *why = "no CUDA runtime (libcudart) loads in this process";
  return runtime;
}

Status CudaRuntime::Check(int code, const char* call) const {
  if (code == 0) return Status::Ok();
  return Status::Unavailable(std::string(call) + ": " + error_string_(code));
}

Status CudaRuntime::SetDevice(int device) const {
  return Check(set_device_(device), "cudaSetDevice");
}
Status CudaRuntime::Malloc(std::size_t bytes, void** out) const {
  return Check(malloc_(out, bytes), "cudaMalloc");
}
Status CudaRuntime::Free(void* p) const {
  return Check(free_(p), "cudaFree");
}
Status CudaRuntime::IpcHandle(void* p, std::string* handle) const {
  char bytes[kIpcHandleBytes] = {};
  PC_RETURN_IF_ERROR(Check(ipc_handle_(bytes, p), "cudaIpcGetMemHandle"));
  handle->assign(bytes, sizeof bytes);
  return Status::Ok();
}
Status CudaRuntime::PciBusId(int device, std::string* out) const {
  char id[64] = {};
  PC_RETURN_IF_ERROR(Check(pci_bus_id_(id, sizeof id, device), "cudaDeviceGetPCIBusId"));
  *out = id;
  return Status::Ok();
}
Status CudaRuntime::CopyDeviceToDeviceAsync(void* dst, const void* src, std::size_t bytes, Stream stream) const {
  return Check(memcpy_async_(dst, src, bytes, kDeviceToDevice, stream), "cudaMemcpyAsync");
}
Status CudaRuntime::CopyHostToDevice(void* dst, const void* src, std::size_t bytes) const {
  return Check(memcpy_(dst, src, bytes, kHostToDevice), "cudaMemcpy");
}
Status CudaRuntime::CreateEvent(Event* out) const {
  return Check(event_create_(out, kDisableTiming), "cudaEventCreateWithFlags");
}
Status CudaRuntime::DestroyEvent(Event e) const {
  return Check(event_destroy_(e), "cudaEventDestroy");
}
Status CudaRuntime::Record(Event e, Stream stream) const {
  return Check(event_record_(e, stream), "cudaEventRecord");
}
Status CudaRuntime::Wait(Event e) const {
  return Check(event_sync_(e), "cudaEventSynchronize");
}
Status CudaRuntime::Synchronize(Stream stream) const {
  return Check(stream_sync_(stream), "cudaStreamSynchronize");
}

}  // namespace primecache::python

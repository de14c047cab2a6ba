// The CUDA backend: cudaMalloc'd memory, one non-blocking stream per lane,
// two page-locked staging buffers for transfers from and to pageable host
// memory (double-buffered, so the host copy of one chunk overlaps the DMA of
// the other), and the kernels of kernels/*.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "engine/device.h"

namespace primecache::engine {
namespace {

__global__ void WriteI32Kernel(std::int32_t* dst, std::int32_t value) {
  *dst = value;
}

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();  // clear a sticky-free error so later calls do not see it
  std::string msg = std::string("cuda: ") + what + ": " + cudaGetErrorString(err);
  if (err == cudaErrorMemoryAllocation) return Status::ResourceExhausted(msg);
  return Status::Internal(msg);
}

#define PC_CUDA_RETURN(expr, what) PC_RETURN_IF_ERROR(CudaStatus((expr), (what)))

class CudaDevice final : public Device {
 public:
  static Result<std::shared_ptr<Device>> Open(const CudaDeviceOptions& o) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      return Status::Unavailable("no CUDA device");
    }
    if (o.ordinal < 0 || o.ordinal >= n) {
      return Status::InvalidArgument("CUDA device " + std::to_string(o.ordinal) + " of " + std::to_string(n));
    }
    if (o.staging_chunk_bytes == 0) return Status::InvalidArgument("staging chunk of 0 bytes");
    auto d = std::shared_ptr<CudaDevice>(new CudaDevice(o));
    PC_RETURN_IF_ERROR(d->Init());
    return std::shared_ptr<Device>(std::move(d));
  }

  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    for (auto& s : streams_) {
      if (s != nullptr) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    }
    for (int k = 0; k < 2; ++k) {
      if (staging_event_[k] != nullptr) cudaEventDestroy(staging_event_[k]);
      if (staging_[k] != nullptr) cudaFreeHost(staging_[k]);
    }
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  Result<std::uint64_t> FreeBytes() const override {
    cudaSetDevice(ordinal_);
    std::size_t free_b = 0, total = 0;
    PC_CUDA_RETURN(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
    return static_cast<std::uint64_t>(free_b);
  }

  bool IsPinned(const void* host) const override {
    if (host == nullptr) return false;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attr.type == cudaMemoryTypeHost;
  }

  Status RegisterHost(void* host, std::size_t bytes) override {
    if (host == nullptr || bytes == 0) return Status::InvalidArgument("register: empty range");
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaHostRegister(host, bytes, cudaHostRegisterPortable), "cudaHostRegister");
    return Status::Ok();
  }
  Status UnregisterHost(void* host) override {
    if (host == nullptr) return Status::InvalidArgument("unregister: null pointer");
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaHostUnregister(host), "cudaHostUnregister");
    return Status::Ok();
  }

  Result<DeviceExport> Export(const Memory& m) override {
    if (!OwnsDeviceBlock(m)) return Status::InvalidArgument("export: not a device block of this device");
    cudaSetDevice(ordinal_);
    cudaIpcMemHandle_t h{};
    PC_CUDA_RETURN(cudaIpcGetMemHandle(&h, m.data()), "cudaIpcGetMemHandle");
    char bus[64] = {};
    PC_CUDA_RETURN(cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal_), "cudaDeviceGetPCIBusId");
    DeviceExport e;
    e.pci_bus_id = bus;
    e.handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
    return e;
  }

  Status Upload(void* dst, const void* src, std::size_t bytes, Lane lane) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("upload: null pointer");
    cudaSetDevice(ordinal_);
    cudaStream_t s = stream(lane);
    if (IsPinned(src)) {
      PC_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "upload");
      PC_CUDA_RETURN(cudaStreamSynchronize(s), "upload sync");
      return Status::Ok();
    }
    const auto* from = static_cast<const std::byte*>(src);
    auto* to = static_cast<std::byte*>(dst);
    for (std::size_t off = 0; off < bytes;) {
      const int k = next_staging_;
      next_staging_ ^= 1;
      PC_RETURN_IF_ERROR(ReclaimStaging(k));
      const std::size_t n = std::min(chunk_, bytes - off);
      std::memcpy(staging_[k], from + off, n);
      PC_CUDA_RETURN(cudaMemcpyAsync(to + off, staging_[k], n, cudaMemcpyHostToDevice, s), "staged upload");
      PC_CUDA_RETURN(cudaEventRecord(staging_event_[k], s), "staging event");
      staging_busy_[k] = true;
      off += n;
    }
    return Status::Ok();
  }

  Status UploadAsync(void* dst, const void* src, std::size_t bytes, Lane lane) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("async upload: null pointer");
    if (!IsPinned(src)) return Status::InvalidArgument("async upload: source is not pinned host memory");
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(lane)), "async upload");
    return Status::Ok();
  }

  Status Download(void* dst, const void* src, std::size_t bytes, Lane lane) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("download: null pointer");
    cudaSetDevice(ordinal_);
    cudaStream_t s = stream(lane);
    if (IsPinned(dst)) {
      PC_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "download");
      PC_CUDA_RETURN(cudaStreamSynchronize(s), "download sync");
      return Status::Ok();
    }
    const auto* from = static_cast<const std::byte*>(src);
    auto* to = static_cast<std::byte*>(dst);
    const std::size_t chunks = (bytes + chunk_ - 1) / chunk_;
    auto issue = [&](std::size_t i) -> Status {
      const int k = static_cast<int>(i % 2);
      PC_RETURN_IF_ERROR(ReclaimStaging(k));
      const std::size_t off = i * chunk_, n = std::min(chunk_, bytes - off);
      PC_CUDA_RETURN(cudaMemcpyAsync(staging_[k], from + off, n, cudaMemcpyDeviceToHost, s),
                     "staged download");
      PC_CUDA_RETURN(cudaEventRecord(staging_event_[k], s), "staging event");
      staging_busy_[k] = true;
      return Status::Ok();
    };
    PC_RETURN_IF_ERROR(issue(0));
    if (chunks > 1) PC_RETURN_IF_ERROR(issue(1));
    for (std::size_t i = 0; i < chunks; ++i) {
      const int k = static_cast<int>(i % 2);
      PC_RETURN_IF_ERROR(ReclaimStaging(k));
      const std::size_t off = i * chunk_, n = std::min(chunk_, bytes - off);
      std::memcpy(to + off, staging_[k], n);
      if (i + 2 < chunks) PC_RETURN_IF_ERROR(issue(i + 2));
    }
    return Status::Ok();
  }

  Status DownloadAsync(void* dst, const void* src, std::size_t bytes, Lane lane) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("async download: null pointer");
    if (!IsPinned(dst))
      return Status::InvalidArgument("async download: destination is not pinned host memory");
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(lane)), "async download");
    return Status::Ok();
  }

  Status CopyOnDevice(void* dst, const void* src, std::size_t bytes, Lane lane) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("device copy: null pointer");
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(lane)), "device copy");
    return Status::Ok();
  }

  Status CopyOnDevice2D(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                        std::size_t width, std::size_t rows, Lane lane) override {
    if (width == 0 || rows == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("2D device copy: null pointer");
    if (dst_pitch < width || src_pitch < width) {
      return Status::InvalidArgument("2D device copy: a pitch below the width");
    }
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                     stream(lane)),
                   "2D device copy");
    return Status::Ok();
  }

  Status Zero(void* dst, std::size_t bytes, Lane lane) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr) return Status::InvalidArgument("zero: null pointer");
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaMemsetAsync(dst, 0, bytes, stream(lane)), "memset");
    return Status::Ok();
  }

  Status WriteI32(std::int32_t* dst, std::int32_t value, Lane lane) override {
    if (dst == nullptr) return Status::InvalidArgument("write i32: null pointer");
    cudaSetDevice(ordinal_);
    WriteI32Kernel<<<1, 1, 0, stream(lane)>>>(dst, value);
    PC_CUDA_RETURN(cudaGetLastError(), "write i32 launch");
    return Status::Ok();
  }

  // The kernel entry points: each selects this device and runs the kernel on
  // the lane's stream. They are alike on purpose; the Device interface names
  // each op so that the CPU twin (cpu_device.cc) implements the same list.
  Status AppendRows(const kernels::AppendRowsArgs& a, Lane lane) override {
    cudaSetDevice(ordinal_);
    return kernels::AppendRowsCuda(a, stream(lane));
  }
  Status GatherRows(const kernels::RingRowsArgs& a, Lane lane) override {
    cudaSetDevice(ordinal_);
    return kernels::GatherRowsCuda(a, stream(lane));
  }
  Status ScatterRows(const kernels::RingRowsArgs& a, Lane lane) override {
    cudaSetDevice(ordinal_);
    return kernels::ScatterRowsCuda(a, stream(lane));
  }
  Status BuildPoolKeys(const kernels::PoolKeyArgs& a, Lane lane) override {
    cudaSetDevice(ordinal_);
    return kernels::BuildPoolKeysCuda(a, stream(lane));
  }
  Status PushConvRing(const kernels::ConvRingPushArgs& a, Lane lane) override {
    cudaSetDevice(ordinal_);
    return kernels::PushConvRingCuda(a, stream(lane));
  }
  Status KdaScan(const kernels::KdaScanArgs& a, Lane lane) override {
    cudaSetDevice(ordinal_);
    return kernels::KdaScanCuda(a, stream(lane));
  }

  Result<Event> Record(Lane lane) override {
    cudaSetDevice(ordinal_);
    cudaEvent_t e = nullptr;
    PC_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event create");
    Event ev = MakeEvent(e);
    PC_CUDA_RETURN(cudaEventRecord(e, stream(lane)), "event record");
    return Result<Event>(std::move(ev));
  }
  Status Wait(Lane lane, const Event& e) override {
    PC_RETURN_IF_ERROR(CheckEvent(e));
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaStreamWaitEvent(stream(lane), static_cast<cudaEvent_t>(e.handle()), 0), "stream wait");
    return Status::Ok();
  }
  Status Synchronize(const Event& e) override {
    PC_RETURN_IF_ERROR(CheckEvent(e));
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaEventSynchronize(static_cast<cudaEvent_t>(e.handle())), "event sync");
    return Status::Ok();
  }
  Result<bool> Query(const Event& e) override {
    PC_RETURN_IF_ERROR(CheckEvent(e));
    cudaSetDevice(ordinal_);
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(e.handle()));
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    PC_CUDA_RETURN(err, "event query");
    return true;
  }
  Status Synchronize(Lane lane) override {
    cudaSetDevice(ordinal_);
    PC_CUDA_RETURN(cudaStreamSynchronize(stream(lane)), "stream sync");
    return Status::Ok();
  }

 protected:
  void* DoAllocate(std::size_t bytes, Status* st) override {
    cudaSetDevice(ordinal_);
    void* p = nullptr;
    (void)(*st = CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc"));
    if (!st->ok()) return nullptr;
    Status z = CudaStatus(cudaMemsetAsync(p, 0, bytes, streams_[0]), "zeroing an allocation");
    if (z.ok()) (void)(z = CudaStatus(cudaStreamSynchronize(streams_[0]), "zeroing an allocation"));
    if (!z.ok()) {
      cudaFree(p);
      (void)(*st = z);
      return nullptr;
    }
    return p;
  }
  void DoFree(void* p) override {
    cudaSetDevice(ordinal_);
    cudaFree(p);
  }
  void* DoAllocatePinned(std::size_t bytes, Status* st) override {
    cudaSetDevice(ordinal_);
    void* p = nullptr;
    (void)(*st = CudaStatus(cudaMallocHost(&p, bytes), "cudaMallocHost"));
    if (!st->ok()) return nullptr;
    std::memset(p, 0, bytes);
    return p;
  }
  void DoFreePinned(void* p) override { cudaFreeHost(p); }
  void DoReleaseEvent(void* handle) override {
    if (handle != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(handle));
  }

 private:
  explicit CudaDevice(const CudaDeviceOptions& o) : ordinal_(o.ordinal), chunk_(o.staging_chunk_bytes) {}

  Status Init() {
    PC_CUDA_RETURN(cudaSetDevice(ordinal_), "cudaSetDevice");
    cudaDeviceProp prop{};
    PC_CUDA_RETURN(cudaGetDeviceProperties(&prop, ordinal_), "device properties");
    name_ = std::string(prop.name) + " (cuda " + std::to_string(ordinal_) + ")";
    for (auto& s : streams_)
      PC_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream create");
    for (int k = 0; k < 2; ++k) {
      PC_CUDA_RETURN(cudaMallocHost(&staging_[k], chunk_), "staging allocation");
      PC_CUDA_RETURN(cudaEventCreateWithFlags(&staging_event_[k], cudaEventDisableTiming), "staging event");
    }
    return Status::Ok();
  }

  cudaStream_t stream(Lane lane) const { return streams_[static_cast<int>(lane)]; }
  void* native_stream(Lane lane) const override { return stream(lane); }

  // Waits until staging buffer k's last copy has run.
  Status ReclaimStaging(int k) {
    if (!staging_busy_[k]) return Status::Ok();
    PC_CUDA_RETURN(cudaEventSynchronize(staging_event_[k]), "staging wait");
    staging_busy_[k] = false;
    return Status::Ok();
  }

  static Status CheckEvent(const Event& e) {
    return e.valid() && e.handle() != nullptr ? Status::Ok()
                                              : Status::InvalidArgument("cuda device: invalid event");
  }

  int ordinal_;
  std::size_t chunk_;
  std::string name_;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staging_event_[2] = {nullptr, nullptr};
  bool staging_busy_[2] = {false, false};
  int next_staging_ = 0;
};

}  // namespace

Result<std::shared_ptr<Device>> NewCudaDeviceImpl(const CudaDeviceOptions& options) {
  return CudaDevice::Open(options);
}

bool CudaDeviceAvailable() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

}  // namespace primecache::engine

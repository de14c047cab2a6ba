// The CPU reference backend: host memory stands in for device memory, every
// call completes before it returns, and the kernels are the CPU twins.
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/device.h"

namespace primecache::engine {
namespace {

constexpr std::size_t kAlign = 256;

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& o) : limit_(o.memory_bytes) {}

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu reference"; }

  Result<std::uint64_t> FreeBytes() const override {
    const std::uint64_t used = allocated_bytes();
    return used >= limit_ ? 0 : limit_ - used;
  }
  bool IsPinned(const void*) const override { return true; }
  Status RegisterHost(void* host, std::size_t) override {
    return host != nullptr ? Status::Ok() : Status::InvalidArgument("register: null pointer");
  }
  Status UnregisterHost(void* host) override {
    return host != nullptr ? Status::Ok() : Status::InvalidArgument("unregister: null pointer");
  }
  Result<DeviceExport> Export(const Memory&) override {
    return Status::NotSupported("the CPU reference device cannot export memory to another process");
  }
  void* native_stream(Lane) const override { return nullptr; }

  Status Upload(void* dst, const void* src, std::size_t bytes, Lane) override {
    return Copy(dst, src, bytes);
  }
  Status UploadAsync(void* dst, const void* src, std::size_t bytes, Lane) override {
    return Copy(dst, src, bytes);
  }
  Status Download(void* dst, const void* src, std::size_t bytes, Lane) override {
    return Copy(dst, src, bytes);
  }
  Status DownloadAsync(void* dst, const void* src, std::size_t bytes, Lane) override {
    return Copy(dst, src, bytes);
  }
  Status CopyOnDevice(void* dst, const void* src, std::size_t bytes, Lane) override {
    return Copy(dst, src, bytes);
  }
  Status CopyOnDevice2D(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                        std::size_t width, std::size_t rows, Lane) override {
    if (width == 0 || rows == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("2D copy: null pointer");
    if (dst_pitch < width || src_pitch < width)
      return Status::InvalidArgument("2D copy: a pitch below the width");
    for (std::size_t r = 0; r < rows; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                   width);
    }
    return Status::Ok();
  }
  Status Zero(void* dst, std::size_t bytes, Lane) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr) return Status::InvalidArgument("zero: null pointer");
    std::memset(dst, 0, bytes);
    return Status::Ok();
  }
  Status WriteI32(std::int32_t* dst, std::int32_t value, Lane) override {
    if (dst == nullptr) return Status::InvalidArgument("write i32: null pointer");
    *dst = value;
    return Status::Ok();
  }

  Status AppendRows(const kernels::AppendRowsArgs& a, Lane) override { return kernels::AppendRowsCpu(a); }
  Status GatherRows(const kernels::RingRowsArgs& a, Lane) override { return kernels::GatherRowsCpu(a); }
  Status ScatterRows(const kernels::RingRowsArgs& a, Lane) override { return kernels::ScatterRowsCpu(a); }
  Status BuildPoolKeys(const kernels::PoolKeyArgs& a, Lane) override { return kernels::BuildPoolKeysCpu(a); }
  Status PushConvRing(const kernels::ConvRingPushArgs& a, Lane) override {
    return kernels::PushConvRingCpu(a);
  }
  Status KdaScan(const kernels::KdaScanArgs& a, Lane) override { return kernels::KdaScanCpu(a); }

  Result<Event> Record(Lane) override { return MakeEvent(nullptr); }
  Status Wait(Lane, const Event& e) override { return CheckEvent(e); }
  Status Synchronize(const Event& e) override { return CheckEvent(e); }
  Result<bool> Query(const Event& e) override {
    PC_RETURN_IF_ERROR(CheckEvent(e));
    return true;
  }
  Status Synchronize(Lane) override { return Status::Ok(); }

 protected:
  void* DoAllocate(std::size_t bytes, Status* st) override {
    if (bytes > limit_ || allocated_bytes() > limit_ - bytes) {
      *st = Status::ResourceExhausted("cpu device: " + std::to_string(bytes) + " bytes requested, " +
                                      std::to_string(limit_ - allocated_bytes()) + " of " +
                                      std::to_string(limit_) + " free");
      return nullptr;
    }
    return Raw(bytes, st);
  }
  void DoFree(void* p) override { std::free(p); }
  void* DoAllocatePinned(std::size_t bytes, Status* st) override { return Raw(bytes, st); }
  void DoFreePinned(void* p) override { std::free(p); }
  void DoReleaseEvent(void*) override {}

 private:
  static Status Copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("copy: null pointer");
    std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  static Status CheckEvent(const Event& e) {
    return e.valid() ? Status::Ok() : Status::InvalidArgument("cpu device: invalid event");
  }
  static void* Raw(std::size_t bytes, Status* st) {
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      *st = Status::ResourceExhausted("cpu device: host allocation of " + std::to_string(bytes) +
                                      " bytes failed");
      return nullptr;
    }
    std::memset(p, 0, rounded);
    return p;
  }

  std::uint64_t limit_;
};

}  // namespace

std::shared_ptr<Device> NewCpuDevice(const CpuDeviceOptions& options) {
  return std::make_shared<CpuDevice>(options);
}

#ifndef PRIMECACHE_HAVE_CUDA
Result<std::shared_ptr<Device>> NewCudaDeviceImpl(const CudaDeviceOptions&) {
  return Status::NotSupported("primecache was built without CUDA");
}
bool CudaDeviceAvailable() {
  return false;
}
#endif

}  // namespace primecache::engine

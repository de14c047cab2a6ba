#include "engine/device.h"

#include <string>

namespace primecache::engine {

std::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

Memory& Memory::operator=(Memory&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = o.owner_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    pinned_ = o.pinned_;
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Memory::Reset() {
  if (owner_ != nullptr) owner_->Free(*this);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = o.owner_;
    handle_ = o.handle_;
    o.owner_ = nullptr;
    o.handle_ = nullptr;
  }
  return *this;
}

void Event::Reset() {
  if (owner_ != nullptr) owner_->DoReleaseEvent(handle_);
  owner_ = nullptr;
  handle_ = nullptr;
}

Result<Memory> Device::Allocate(std::size_t bytes) {
  if (bytes == 0) return Memory();
  Status st;
  void* p = DoAllocate(bytes, &st);
  if (p == nullptr) {
    if (st.ok()) st = Status::ResourceExhausted("allocation of " + std::to_string(bytes) + " bytes failed");
    return st;
  }
  allocated_ += bytes;
  return Memory(this, p, bytes, false);
}

Result<Memory> Device::AllocatePinned(std::size_t bytes) {
  if (bytes == 0) return Memory();
  Status st;
  void* p = DoAllocatePinned(bytes, &st);
  if (p == nullptr) {
    if (st.ok())
      st = Status::ResourceExhausted("pinned allocation of " + std::to_string(bytes) + " bytes failed");
    return st;
  }
  return Memory(this, p, bytes, true);
}

void Device::Free(Memory& m) {
  if (m.data_ == nullptr) return;
  if (m.pinned_) {
    DoFreePinned(m.data_);
  } else {
    DoFree(m.data_);
    allocated_ -= m.bytes_;
  }
}

Result<std::int32_t> Device::ReadI32(const std::int32_t* src, Lane lane) {
  std::int32_t v = 0;
  PC_RETURN_IF_ERROR(Download(&v, src, sizeof v, lane));
  return v;
}

Result<std::shared_ptr<Device>> NewCudaDevice(const CudaDeviceOptions& options) {
  return NewCudaDeviceImpl(options);
}

}  // namespace primecache::engine

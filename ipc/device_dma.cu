// DeviceDma on CUDA: IPC-opened windows, read-only host registrations kept
// within a budget, and a pool of streams the copy queues borrow.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <vector>

#include "ipc/device_dma.h"
#include "ipc/registration_ledger.h"

namespace primecache::ipc {
namespace {

Status Cuda(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();  // clear a non-sticky error so later calls do not see it
  return Status::Internal("cuda: " + what + ": " + cudaGetErrorString(err));
}

// The bytes of the allocation `base` starts, from the driver (asked through
// the runtime's entry point, so the daemon does not link libcuda itself).
Result<std::uint64_t> AllocationBytes(void* base) {
  using RangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  PC_RETURN_IF_ERROR(Cuda(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                                            &found),
                          "find cuMemGetAddressRange"));
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return Status::Internal("cuda: the driver has no cuMemGetAddressRange");
  }
  CUdeviceptr start = 0;
  size_t bytes = 0;
  const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(base));
  if (reinterpret_cast<RangeFn>(fn)(&start, &bytes, ptr) != CUDA_SUCCESS) {
    return Status::Internal("cuda: cuMemGetAddressRange failed on an opened IPC handle");
  }
  return static_cast<std::uint64_t>(bytes - (ptr - start));
}

// The largest source pitch of a 2D copy (the driver's limit is 2^31 - 1).
constexpr std::size_t kMaxCopyPitch = std::size_t{1} << 30;

class CudaWindow final : public DeviceWindow {
 public:
  CudaWindow(int device, void* base, std::uint64_t size) : device_(device), base_(base), size_(size) {}
  ~CudaWindow() override {
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(base_);
  }
  std::uint64_t size() const override { return size_; }
  int device() const { return device_; }
  std::byte* base() const { return static_cast<std::byte*>(base_); }

 private:
  int device_;
  void* base_;
  std::uint64_t size_;
};

// One registered (or registering) mapping. Once ready, its users (copies
// and pins) and its place in the budget are the ledger's; `waiting`
// counts the callers waiting for it to be registered.
struct Registration {
  MappedRegion mapping;
  std::uint64_t serial = 0;  // unique to this registration
  bool ready = false;
  Status failed;
  int waiting = 0;
};

class CudaDma final : public DeviceDma {
 public:
  CudaDma(std::uint64_t budget, std::size_t max_streams)
      : ledger_(budget), max_streams_(std::max<std::size_t>(max_streams, 1)) {}
  ~CudaDma() override;

  Result<std::shared_ptr<DeviceWindow>> Open(const DeviceWindowSpec& spec) override;
  Result<std::unique_ptr<DeviceCopyQueue>> NewQueue(std::shared_ptr<DeviceWindow> window) override;
  std::uint64_t registered_bytes() const override {
    std::lock_guard g(mu_);
    return ledger_.counted_bytes();
  }
  std::uint64_t PinnedAs(const MappedRegion& mapping) const override {
    std::lock_guard g(mu_);
    auto it = regs_.find(mapping.id);
    if (it == regs_.end() || !it->second.ready || it->second.mapping.data != mapping.data) return 0;
    return it->second.serial;
  }
  Result<MappingPin> Pin(const MappedRegion& mapping) override;

  // For the queues.
  Result<Registration*> Use(const MappedRegion& mapping);
  void Unuse(Registration* r);
  Result<cudaStream_t> TakeStream(int device);
  void GiveStream(int device, cudaStream_t s);
  // Queues open on `device` now.
  std::size_t QueuesOn(int device) const;

 private:
  void EvictLocked();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Registration> regs_;  // by mapping id
  RegistrationLedger ledger_;                   // of the ready ones
  std::uint64_t serials_ = 0;
  std::map<std::string, std::weak_ptr<CudaWindow>> windows_;  // by handle bytes
  // A device's copy streams, made as queues need them, max_streams_ at
  // most; past that, queues share the least used.
  struct SharedStream {
    cudaStream_t stream = nullptr;
    std::size_t users = 0;
  };
  const std::size_t max_streams_;
  std::map<int, std::vector<SharedStream>> streams_;  // by device
};

CudaDma::~CudaDma() {
  for (auto& [id, r] : regs_) {
    if (r.ready) cudaHostUnregister(const_cast<std::byte*>(r.mapping.data));
  }
  for (auto& [device, list] : streams_) {
    cudaSetDevice(device);
    for (const SharedStream& s : list) cudaStreamDestroy(s.stream);
  }
}

Result<std::shared_ptr<DeviceWindow>> CudaDma::Open(const DeviceWindowSpec& spec) {
  if (spec.handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return Status::InvalidArgument("device window: a handle of " + std::to_string(spec.handle.size()) +
                                   " bytes, not " + std::to_string(sizeof(cudaIpcMemHandle_t)));
  }
  if (spec.size == 0) return Status::InvalidArgument("device window of 0 bytes");
  // The device first: a known handle named with another bus id is refused,
  // not answered from the table.
  int device = 0;
  PC_RETURN_IF_ERROR(Cuda(cudaDeviceGetByPCIBusId(&device, spec.pci_bus_id.c_str()),
                          "no device at PCI bus id '" + spec.pci_bus_id + "'"));
  std::lock_guard g(mu_);
  if (auto it = windows_.find(spec.handle); it != windows_.end()) {
    auto w = it->second.lock();
    if (w && w->device() == device) {
      if (w->size() < spec.size) return Status::InvalidArgument("device window reopened larger than it was");
      return std::shared_ptr<DeviceWindow>(w);
    }
  }
  PC_RETURN_IF_ERROR(Cuda(cudaSetDevice(device), "set device"));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, spec.handle.data(), sizeof h);
  void* base = nullptr;
  PC_RETURN_IF_ERROR(Cuda(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess), "open IPC handle"));
  // The size is the client's word: a window past its allocation would let
  // copies land in whatever else this process has mapped there.
  auto bytes = AllocationBytes(base);
  if (!bytes.ok() || *bytes < spec.size) {
    cudaIpcCloseMemHandle(base);
    if (!bytes.ok()) return bytes.status();
    return Status::InvalidArgument("device window of " + std::to_string(spec.size) + " bytes over its allocation of " +
                                   std::to_string(*bytes));
  }
  auto w = std::make_shared<CudaWindow>(device, base, spec.size);
  windows_[spec.handle] = w;
  return std::shared_ptr<DeviceWindow>(std::move(w));
}

// Registers the mapping on first use (one thread does; others of the same
// mapping wait) and counts this caller as a user.
Result<Registration*> CudaDma::Use(const MappedRegion& mapping) {
  std::unique_lock g(mu_);
  auto [it, fresh] = regs_.try_emplace(mapping.id);
  Registration& r = it->second;
  if (!fresh) {
    if (r.mapping.data != mapping.data || r.mapping.size != mapping.size) {
      return Status::Internal("device copy: two live mappings share id " + std::to_string(mapping.id));
    }
    if (r.ready) {
      ledger_.Used(mapping.id);
      return &r;
    }
    // Counted as a user by the registering thread once it is ready, so
    // that it cannot be let go before this one wakes.
    ++r.waiting;
    cv_.wait(g, [&] { return r.ready || !r.failed.ok(); });
    --r.waiting;
    if (!r.failed.ok()) {
      Status s = r.failed;
      if (r.waiting == 0) regs_.erase(it);
      return s;
    }
    return &r;
  }
  r.mapping = mapping;
  g.unlock();
  Status s = Cuda(cudaHostRegister(const_cast<std::byte*>(mapping.data), mapping.size, cudaHostRegisterReadOnly),
                  "register " + std::to_string(mapping.size) + " mapped bytes");
  g.lock();
  if (!s.ok()) {
    r.failed = s;
    cv_.notify_all();
    if (r.waiting == 0) regs_.erase(it);
    return s;
  }
  r.ready = true;
  r.serial = ++serials_;
  // Counted once per file: a longer mapping of a segment that grew takes
  // the place of the shorter one's registration in the budget.
  ledger_.Added(mapping.id, mapping.file, mapping.size);
  for (int i = 0; i < r.waiting; ++i) ledger_.Used(mapping.id);
  EvictLocked();
  cv_.notify_all();
  return &r;
}

void CudaDma::Unuse(Registration* r) {
  std::lock_guard g(mu_);
  ledger_.Unused(r->mapping.id);
  EvictLocked();
}

// A pin is one more user of the registration: it is not unregistered (and
// its serial stays) until the pin's holder lets go.
Result<MappingPin> CudaDma::Pin(const MappedRegion& mapping) {
  PC_ASSIGN_OR_RETURN(Registration * r, Use(mapping));
  MappingPin pin;
  pin.serial = r->serial;
  pin.hold = std::shared_ptr<const void>(r, [this](const void* p) {
    Unuse(static_cast<Registration*>(const_cast<void*>(p)));
  });
  return pin;
}

// Unregisters what the ledger lets go: replaced registrations no copy uses,
// and the least recently used ones past the budget.
void CudaDma::EvictLocked() {
  for (std::uint64_t id : ledger_.TakeEvictable()) {
    auto it = regs_.find(id);
    if (it == regs_.end()) continue;
    cudaHostUnregister(const_cast<std::byte*>(it->second.mapping.data));
    regs_.erase(it);
  }
}

Result<cudaStream_t> CudaDma::TakeStream(int device) {
  std::lock_guard g(mu_);
  auto& list = streams_[device];
  SharedStream* least = nullptr;
  for (SharedStream& s : list) {
    if (least == nullptr || s.users < least->users) least = &s;
  }
  if (least != nullptr && (least->users == 0 || list.size() >= max_streams_)) {
    ++least->users;
    return least->stream;
  }
  cudaStream_t s = nullptr;
  PC_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "create stream"));
  list.push_back({s, 1});
  return s;
}

void CudaDma::GiveStream(int device, cudaStream_t s) {
  std::lock_guard g(mu_);
  for (SharedStream& x : streams_[device]) {
    if (x.stream == s) {
      --x.users;
      return;
    }
  }
}

std::size_t CudaDma::QueuesOn(int device) const {
  std::lock_guard g(mu_);
  auto it = streams_.find(device);
  std::size_t n = 0;
  if (it != streams_.end()) {
    for (const SharedStream& s : it->second) n += s.users;
  }
  return n;
}

// One fetch's copies: each is followed by an event on the queue's stream;
// its registration is let go once the event has passed.
class CudaCopyQueue final : public DeviceCopyQueue {
 public:
  CudaCopyQueue(CudaDma& dma, std::shared_ptr<CudaWindow> window, cudaStream_t stream)
      : dma_(dma), window_(std::move(window)), stream_(stream) {}
  ~CudaCopyQueue() override;

  using DeviceCopyQueue::Enqueue;
  Status Enqueue(std::uint64_t offset, std::span<const std::span<const std::byte>> pieces,
                 const MappedRegion& mapping) override;
  std::uint64_t enqueued() const override { return completed_ + pending_.size(); }
  std::size_t sharers() const override { return dma_.QueuesOn(window_->device()); }
  Result<std::uint64_t> Completed(std::uint64_t at_least) override;

 private:
  struct Pending {
    cudaEvent_t done;
    Registration* reg;
  };
  Result<cudaEvent_t> TakeEvent();
  void Retire();

  CudaDma& dma_;
  const std::shared_ptr<CudaWindow> window_;
  const cudaStream_t stream_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_;
  std::uint64_t completed_ = 0;
};

CudaCopyQueue::~CudaCopyQueue() {
  cudaSetDevice(window_->device());
  // Its own last copy, not the stream: other queues may share it.
  if (!pending_.empty()) cudaEventSynchronize(pending_.back().done);
  while (!pending_.empty()) Retire();
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  dma_.GiveStream(window_->device(), stream_);
}

Result<cudaEvent_t> CudaCopyQueue::TakeEvent() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  PC_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "create event"));
  return e;
}

// The oldest copy is done: its registration and event go back.
void CudaCopyQueue::Retire() {
  Pending p = pending_.front();
  pending_.pop_front();
  dma_.Unuse(p.reg);
  spare_.push_back(p.done);
  ++completed_;
}

// Whether `pieces` lie in `mapping` and land inside the window from `offset`.
Status CheckPieces(const CudaWindow& w, std::uint64_t offset, std::span<const std::span<const std::byte>> pieces,
                   const MappedRegion& mapping) {
  std::uint64_t total = 0;
  for (std::span<const std::byte> src : pieces) {
    if (src.data() < mapping.data || src.size() > mapping.size ||
        static_cast<std::size_t>(src.data() - mapping.data) > mapping.size - src.size()) {
      return Status::InvalidArgument("device copy from outside its host mapping");
    }
    total += src.size();  // no wrap: each is at most the mapping's size
  }
  if (offset > w.size() || total > w.size() - offset) {
    return Status::InvalidArgument("device copy of " + std::to_string(total) + " bytes at " + std::to_string(offset) +
                                   " outside a window of " + std::to_string(w.size()));
  }
  return Status::Ok();
}

// The pieces from `first` on that have its size and follow it at one
// stride in the source (a layer's chunks in their segment frames): how many,
// and the stride.
std::pair<std::size_t, std::size_t> StridedRun(std::span<const std::span<const std::byte>> pieces, std::size_t first) {
  const std::span<const std::byte> a = pieces[first];
  if (first + 1 >= pieces.size() || pieces[first + 1].size() != a.size() || pieces[first + 1].data() < a.data() + a.size()) {
    return {1, a.size()};
  }
  const auto stride = static_cast<std::size_t>(pieces[first + 1].data() - a.data());
  if (stride > kMaxCopyPitch) return {1, a.size()};
  std::size_t n = 2;
  while (first + n < pieces.size() && pieces[first + n].size() == a.size() &&
         pieces[first + n].data() == pieces[first + n - 1].data() + stride) {
    ++n;
  }
  return {n, stride};
}

// Each run of equal pieces at one stride goes as one 2D copy (one plain
// copy when they touch): the copy engines pay about 2.6 us a copy, a
// quarter of a 0.6 MiB chunk's time at 55 GB/s (primecache-gpu-probe).
Status CopyPieces(std::byte* dst, std::span<const std::span<const std::byte>> pieces, cudaStream_t stream) {
  for (std::size_t i = 0; i < pieces.size();) {
    const auto [n, stride] = StridedRun(pieces, i);
    const std::size_t width = pieces[i].size();
    const cudaError_t err =
        n == 1 || stride == width
            ? cudaMemcpyAsync(dst, pieces[i].data(), width * n, cudaMemcpyHostToDevice, stream)
            : cudaMemcpy2DAsync(dst, width, pieces[i].data(), stride, width, n, cudaMemcpyHostToDevice, stream);
    PC_RETURN_IF_ERROR(Cuda(err, "copy to the device"));
    dst += width * n;
    i += n;
  }
  return Status::Ok();
}

Status CudaCopyQueue::Enqueue(std::uint64_t offset, std::span<const std::span<const std::byte>> pieces,
                              const MappedRegion& mapping) {
  const CudaWindow& w = *window_;
  PC_RETURN_IF_ERROR(CheckPieces(w, offset, pieces, mapping));
  PC_RETURN_IF_ERROR(Cuda(cudaSetDevice(w.device()), "set device"));
  PC_ASSIGN_OR_RETURN(cudaEvent_t done, TakeEvent());
  auto reg = dma_.Use(mapping);
  const Status copied = reg.ok() ? CopyPieces(w.base() + offset, pieces, stream_) : reg.status();
  const Status s = copied.ok() ? Cuda(cudaEventRecord(done, stream_), "record a copy's event") : copied;
  if (!s.ok()) {
    // Parts enqueued without an event are waited for here, so that their
    // registration is not let go under them.
    if (reg.ok()) {
      cudaStreamSynchronize(stream_);
      dma_.Unuse(*reg);
    }
    spare_.push_back(done);
    return s;
  }
  pending_.push_back({done, *reg});
  return Status::Ok();
}

Result<std::uint64_t> CudaCopyQueue::Completed(std::uint64_t at_least) {
  if (at_least > enqueued()) {
    return Status::InvalidArgument("waiting for " + std::to_string(at_least) + " of " + std::to_string(enqueued()) +
                                   " device copies");
  }
  PC_RETURN_IF_ERROR(Cuda(cudaSetDevice(window_->device()), "set device"));
  while (!pending_.empty()) {
    const cudaEvent_t e = pending_.front().done;
    const cudaError_t err = completed_ < at_least ? cudaEventSynchronize(e) : cudaEventQuery(e);
    if (err == cudaErrorNotReady) break;
    PC_RETURN_IF_ERROR(Cuda(err, "a copy to the device"));
    Retire();
  }
  return completed_;
}

Result<std::unique_ptr<DeviceCopyQueue>> CudaDma::NewQueue(std::shared_ptr<DeviceWindow> window) {
  if (window == nullptr) return Status::InvalidArgument("device copy queue without a window");
  auto w = std::static_pointer_cast<CudaWindow>(std::move(window));
  PC_RETURN_IF_ERROR(Cuda(cudaSetDevice(w->device()), "set device"));
  PC_ASSIGN_OR_RETURN(cudaStream_t stream, TakeStream(w->device()));
  return std::unique_ptr<DeviceCopyQueue>(new CudaCopyQueue(*this, std::move(w), stream));
}

}  // namespace

Result<std::unique_ptr<DeviceDma>> DeviceDma::Create(std::uint64_t registered_budget_bytes, std::size_t max_streams) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return Status::Unavailable("device copies: no CUDA device");
  }
  return std::unique_ptr<DeviceDma>(new CudaDma(registered_budget_bytes, max_streams));
}

}  // namespace primecache::ipc

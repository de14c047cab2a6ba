// The NCCL collective group (collective.h): one communicator per CUDA
// device, made together by ncclCommInitAll, each rank's sums enqueued on its
// compute stream by its own thread.
//
// Abort aborts every communicator (ncclCommAbort ends the operations in
// flight, so a rank blocked on its stream returns); Reset makes them anew.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "core/mutex.h"
#include "engine/model/collective.h"

namespace primecache::model {
namespace {

Status NcclError(ncclResult_t r, const char* what) {
  return Status::Internal(std::string(what) + ": " + ncclGetErrorString(r));
}

class NcclGroup;

class NcclCollective final : public Collective {
 public:
  NcclCollective(NcclGroup* group, std::uint32_t rank) : group_(group), rank_(rank) {}
  std::uint32_t size() const override;
  std::uint32_t rank() const override { return rank_; }
  engine::DeviceKind memory() const override { return engine::DeviceKind::kCuda; }
  Status AllReduceSum(float* data, std::size_t count) override;
  void Abort(const Status& why) override;

 private:
  NcclGroup* group_;
  std::uint32_t rank_;
};

class NcclGroup final : public CollectiveGroup {
 public:
  NcclGroup(std::vector<int> devices, std::vector<void*> streams)
      : devices_(std::move(devices)), streams_(std::move(streams)) {
    for (std::uint32_t r = 0; r < devices_.size(); ++r)
      ranks_.push_back(std::make_unique<NcclCollective>(this, r));
  }
  ~NcclGroup() override {
    MutexLock l(&mu_);
    Destroy();
  }

  Status Init() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return InitLocked();
  }

  std::uint32_t size() const override { return static_cast<std::uint32_t>(devices_.size()); }
  Collective& rank(std::uint32_t r) override { return *ranks_.at(r); }

  void Reset() override EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (aborted_.ok()) return;
    Destroy();
    aborted_ = InitLocked();  // Ok, or why the group stays unusable
  }

  Status AllReduceSum(std::uint32_t rank, float* data, std::size_t count) EXCLUDES(mu_) {
    ncclComm_t comm = nullptr;
    {
      MutexLock l(&mu_);
      if (!aborted_.ok()) return aborted_;
      comm = comms_[rank];
    }
    if (cudaSetDevice(devices_[rank]) != cudaSuccess) return Status::Internal("cudaSetDevice for a TP rank");
    const ncclResult_t r =
        ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm, static_cast<cudaStream_t>(streams_[rank]));
    return r == ncclSuccess ? Status::Ok() : NcclError(r, "ncclAllReduce");
  }

  void Abort(const Status& why) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (!aborted_.ok()) return;
    aborted_ = Status::Aborted("TP group aborted: " + why.ToString());
    for (ncclComm_t& c : comms_) {
      if (c != nullptr) ncclCommAbort(c);
      c = nullptr;
    }
  }

 private:
  Status InitLocked() REQUIRES(mu_) {
    comms_.assign(devices_.size(), nullptr);
    const ncclResult_t r = ncclCommInitAll(comms_.data(), static_cast<int>(devices_.size()), devices_.data());
    if (r != ncclSuccess) {
      comms_.assign(devices_.size(), nullptr);
      return NcclError(r, "ncclCommInitAll");
    }
    return Status::Ok();
  }

  void Destroy() REQUIRES(mu_) {
    for (ncclComm_t& c : comms_) {
      if (c != nullptr) ncclCommDestroy(c);
      c = nullptr;
    }
  }

  const std::vector<int> devices_;
  const std::vector<void*> streams_;
  std::vector<std::unique_ptr<NcclCollective>> ranks_;
  Mutex mu_;
  std::vector<ncclComm_t> comms_ GUARDED_BY(mu_);
  Status aborted_ GUARDED_BY(mu_);
};

std::uint32_t NcclCollective::size() const {
  return group_->size();
}
Status NcclCollective::AllReduceSum(float* data, std::size_t count) {
  return group_->AllReduceSum(rank_, data, count);
}
void NcclCollective::Abort(const Status& why) {
  group_->Abort(why);
}

}  // namespace

Result<std::unique_ptr<CollectiveGroup>> NewNcclGroup(const std::vector<int>& cuda_devices,
                                                      const std::vector<void*>& streams) {
  if (cuda_devices.empty() || cuda_devices.size() != streams.size()) {
    return Status::InvalidArgument("NCCL group: " + std::to_string(cuda_devices.size()) + " devices and " +
                                   std::to_string(streams.size()) + " streams");
  }
  auto group = std::make_unique<NcclGroup>(cuda_devices, streams);
  PC_RETURN_IF_ERROR(group->Init());
  return std::unique_ptr<CollectiveGroup>(std::move(group));
}

}  // namespace primecache::model

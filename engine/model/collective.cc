// The in-process collective group (NewInProcessGroup); the NCCL one is in
// collective_nccl.cc.
#include "engine/model/collective.h"

#include <string>
#include <vector>

#include "core/mutex.h"

namespace primecache::model {
namespace {

constexpr std::uint32_t kMaxTp = 1024;

// The state the ranks of one in-process group share. A call is one phase:
// every rank posts its pointer and waits; the last to arrive sums every
// rank's floats in rank order into sum_ and opens the phase; each rank then
// copies sum_ out. sum_ is rewritten only when every rank has arrived at the
// next phase, so by then every rank has finished copying the last one.
class InProcessState {
 public:
  explicit InProcessState(std::uint32_t tp) : size_(tp), posted_(tp, nullptr) {}

  std::uint32_t size() const { return size_; }

  Status AllReduceSum(std::uint32_t rank, float* data, std::size_t count) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (!aborted_.ok()) return aborted_;
    if (arrived_ == 0) {
      count_ = count;
    } else if (count != count_) {
      Fail(Status::Internal("TP all-reduce: rank " + std::to_string(rank) + " sums " + std::to_string(count) +
                            " floats, another rank " + std::to_string(count_)));
      return aborted_;
    }
    posted_[rank] = data;
    const std::uint64_t phase = phase_;
    if (++arrived_ == size()) {
      SumPosted();
      arrived_ = 0;
      ++phase_;
      cv_.SignalAll();
    } else {
      while (phase_ == phase && aborted_.ok()) cv_.Wait(&mu_);
      if (phase_ == phase) return aborted_;
    }
    std::copy(sum_.begin(), sum_.begin() + static_cast<std::ptrdiff_t>(count), data);
    return Status::Ok();
  }

  void Abort(const Status& why) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    Fail(why);
  }

  void Reset() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    aborted_ = Status::Ok();
    arrived_ = 0;
  }

 private:
  void Fail(const Status& why) REQUIRES(mu_) {
    if (aborted_.ok()) aborted_ = Status::Aborted("TP group aborted: " + why.ToString());
    cv_.SignalAll();
  }

  // One thread, rank order: the same sum bit for bit on every run.
  void SumPosted() REQUIRES(mu_) {
    sum_.assign(posted_[0], posted_[0] + count_);
    for (std::size_t r = 1; r < posted_.size(); ++r) {
      const float* p = posted_[r];
      for (std::size_t i = 0; i < count_; ++i) sum_[i] += p[i];
    }
  }

  const std::uint32_t size_;
  Mutex mu_;
  CondVar cv_;
  std::vector<float*> posted_ GUARDED_BY(mu_);
  std::vector<float> sum_ GUARDED_BY(mu_);
  std::size_t count_ GUARDED_BY(mu_) = 0;
  std::uint32_t arrived_ GUARDED_BY(mu_) = 0;
  std::uint64_t phase_ GUARDED_BY(mu_) = 0;
  Status aborted_ GUARDED_BY(mu_);
};

class InProcessCollective final : public Collective {
 public:
  InProcessCollective(InProcessState* state, std::uint32_t rank) : state_(state), rank_(rank) {}
  std::uint32_t size() const override { return state_->size(); }
  std::uint32_t rank() const override { return rank_; }
  engine::DeviceKind memory() const override { return engine::DeviceKind::kCpu; }
  Status AllReduceSum(float* data, std::size_t count) override {
    if (size() == 1) return Status::Ok();  // TP 1: nothing to sum, nothing touched
    return state_->AllReduceSum(rank_, data, count);
  }
  void Abort(const Status& why) override { state_->Abort(why); }

 private:
  InProcessState* state_;
  std::uint32_t rank_;
};

class InProcessGroup final : public CollectiveGroup {
 public:
  explicit InProcessGroup(std::uint32_t tp) : state_(tp) {
    for (std::uint32_t r = 0; r < tp; ++r)
      ranks_.push_back(std::make_unique<InProcessCollective>(&state_, r));
  }
  std::uint32_t size() const override { return state_.size(); }
  Collective& rank(std::uint32_t r) override { return *ranks_.at(r); }
  void Reset() override { state_.Reset(); }

 private:
  InProcessState state_;
  std::vector<std::unique_ptr<InProcessCollective>> ranks_;
};

}  // namespace

Result<std::unique_ptr<CollectiveGroup>> NewInProcessGroup(std::uint32_t tp) {
  if (tp == 0 || tp > kMaxTp) {
    return Status::InvalidArgument("TP size " + std::to_string(tp) + " is outside 1.." +
                                   std::to_string(kMaxTp));
  }
  return std::unique_ptr<CollectiveGroup>(new InProcessGroup(tp));
}


namespace {

// Sums `values` across the ranks, staged through device memory when the
// group sums there.
Status SumHostValues(Collective& c, engine::Device& device, std::vector<float>& values) {
  if (c.memory() == engine::DeviceKind::kCpu) return c.AllReduceSum(values.data(), values.size());
  const std::size_t bytes = values.size() * sizeof(float);
  PC_ASSIGN_OR_RETURN(engine::Memory staged, device.Allocate(bytes));
  PC_RETURN_IF_ERROR(device.Upload(staged.at<float>(0), values.data(), bytes, engine::Lane::kCompute));
  PC_RETURN_IF_ERROR(c.AllReduceSum(staged.at<float>(0), values.size()));
  PC_RETURN_IF_ERROR(device.Download(values.data(), staged.at<float>(0), bytes, engine::Lane::kCompute));
  return device.Synchronize(engine::Lane::kCompute);
}

}  // namespace

Status BroadcastWords(Collective& c, engine::Device& device, std::span<std::uint64_t> words) {
  std::vector<float> pieces(words.size() * 4, 0.0F);
  if (c.rank() == 0) {
    for (std::size_t i = 0; i < words.size(); ++i) {
      for (std::size_t p = 0; p < 4; ++p) pieces[i * 4 + p] = static_cast<float>((words[i] >> (16 * p)) & 0xffff);
    }
  }
  PC_RETURN_IF_ERROR(SumHostValues(c, device, pieces));
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::uint64_t w = 0;
    for (std::size_t p = 0; p < 4; ++p) {
      const float piece = pieces[i * 4 + p];
      // Exact by construction; anything else means a rank sent a piece too.
      if (!(piece >= 0.0F && piece <= 65535.0F) || piece != static_cast<float>(static_cast<std::uint32_t>(piece))) {
        return Status::Internal("TP broadcast: a piece summed to " + std::to_string(piece));
      }
      w |= std::uint64_t{static_cast<std::uint32_t>(piece)} << (16 * p);
    }
    words[i] = w;
  }
  return Status::Ok();
}

Result<bool> AllRanksOk(Collective& c, engine::Device& device, bool ok) {
  std::vector<float> refusals = {ok ? 0.0F : 1.0F};
  PC_RETURN_IF_ERROR(SumHostValues(c, device, refusals));
  return refusals[0] == 0.0F;
}

}  // namespace primecache::model

#ifndef PRIMECACHE_HAVE_NCCL
namespace primecache::model {
Result<std::unique_ptr<CollectiveGroup>> NewNcclGroup(const std::vector<int>&, const std::vector<void*>&) {
  return Status::NotSupported("built without NCCL: a TP group on CUDA needs it");
}
}  // namespace primecache::model
#endif

// Collective: what the ranks of a tensor-parallel model share, the sum of
// their partial block outputs (an all-reduce), as one rank sees it.
//
// Two implementations:
//  - NewInProcessGroup: n ranks that are threads of one process on the CPU
//    backend. The sum runs once, on one thread, in rank order
//    (((r0 + r1) + r2) + ...), and every rank copies that one result, so a run
//    at TP n is deterministic and every rank holds bit-identical sums.
//  - NewNcclGroup: one rank per CUDA device through NCCL (ncclAllReduce on
//    each rank's compute stream); NotSupported when built without CUDA.
//
// A rank that fails calls Abort: every rank waiting in AllReduceSum, and
// every later call, returns Aborted with the reason, so a failure on one rank
// never leaves the others hanging. Reset makes a group usable again once no
// rank is inside a call (the caller joins its rank threads first).
//
// Thread-safety: each rank's Collective is used by that rank's thread only;
// Abort may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/device.h"
#include "primecache/status.h"

namespace primecache::model {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual std::uint32_t size() const = 0;
  virtual std::uint32_t rank() const = 0;
  // Where the data of AllReduceSum lives: host memory (kCpu) or this rank's
  // CUDA device.
  virtual engine::DeviceKind memory() const = 0;
  // Sums `count` floats at `data` across the ranks, in place; every rank
  // passes the same count. On CUDA the sum is enqueued on the rank's compute
  // stream, after what is already there.
  virtual Status AllReduceSum(float* data, std::size_t count) = 0;
  // Fails every rank's current and later calls with Aborted(why).
  virtual void Abort(const Status& why) = 0;
};

// The ranks of one group, rank r at index r, and the group's reset.
class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual std::uint32_t size() const = 0;
  virtual Collective& rank(std::uint32_t r) = 0;
  // Clears an abort. Only while no rank is inside a call.
  virtual void Reset() = 0;
};

// Agreement between the ranks on host values, built on AllReduceSum (so it
// works on every group, each rank calling it at the same point of its
// sequence of collective calls). `device` is the rank's, where the sum's
// data is staged when the group sums in device memory.
//  - BroadcastWords: rank 0's `words` on every rank (the others' are
//    overwritten). Each word travels as four 16-bit pieces in floats; one
//    rank adds a piece and the others add zero, so the sum is exact.
//  - AllRanksOk: whether every rank passed true (each adds 1 for false).
Status BroadcastWords(Collective& c, engine::Device& device, std::span<std::uint64_t> words);
Result<bool> AllRanksOk(Collective& c, engine::Device& device, bool ok);

// InvalidArgument unless 1 <= tp <= 1024.
Result<std::unique_ptr<CollectiveGroup>> NewInProcessGroup(std::uint32_t tp);

// One NCCL communicator per device in `cuda_devices` (rank r on device
// cuda_devices[r]), each rank's sums on streams[r] (its cudaStream_t).
// NCCL needs distinct devices.
Result<std::unique_ptr<CollectiveGroup>> NewNcclGroup(const std::vector<int>& cuda_devices,
                                                      const std::vector<void*>& streams);

}  // namespace primecache::model

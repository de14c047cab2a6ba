// The KDA short-conv ring push, on the CPU (the reference twin) and on CUDA.
//
// The ring holds, per channel, the last kernel-1 pre-conv inputs, oldest
// first: ring[c * (kernel-1) + i]. The channels are the three fused planes
// (q, k, v), 3 * heads * head_dim of them. Pushing `count` token inputs
// (token-major, inputs[t * channels + c]) leaves the last kernel-1 values of
// (old ring ++ inputs) in the ring, in place.
#pragma once

#include <cstddef>

#include "primecache/status.h"

namespace primecache::kernels {

struct ConvRingPushArgs {
  float* ring = nullptr;          // [channels, kernel - 1]
  const float* inputs = nullptr;  // [count, channels]
  std::size_t channels = 0;
  std::size_t kernel = 0;  // >= 2
  std::size_t count = 0;
};

Status ValidateConvRingPushArgs(const ConvRingPushArgs& args);
Status PushConvRingCpu(const ConvRingPushArgs& args);
// Device pointers, enqueued on `stream`; NotSupported without CUDA.
Status PushConvRingCuda(const ConvRingPushArgs& args, void* stream);

}  // namespace primecache::kernels

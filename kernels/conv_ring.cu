// CUDA conv-ring push: one thread per channel, the CPU twin's slot order.
#include <cuda_runtime.h>

#include <string>

#include "kernels/conv_ring.h"

namespace primecache::kernels {
namespace {

using u64 = unsigned long long;

__global__ void ConvRingPushKernel(float* __restrict__ ring, const float* __restrict__ inputs, u64 channels,
                                   u64 keep, u64 count) {
  const u64 c = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  float* r = ring + c * keep;
  for (u64 i = 0; i < keep; ++i) {
    const u64 p = count + i;
    r[i] = p < keep ? r[p] : inputs[(p - keep) * channels + c];
  }
}

}  // namespace

Status PushConvRingCuda(const ConvRingPushArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateConvRingPushArgs(a));
  if (a.count == 0) return Status::Ok();
  constexpr unsigned kBlock = 256;
  const u64 blocks = (a.channels + kBlock - 1) / kBlock;
  ConvRingPushKernel<<<static_cast<unsigned>(blocks), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      a.ring, a.inputs, a.channels, a.kernel - 1, a.count);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status::Internal(std::string("conv ring push launch: ") + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace primecache::kernels

// CUDA row movement: grid-stride loops over every float that moves, with the
// CPU twins' addressing (logical row r at r % ring_rows in a ring).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/ring_rows.h"

namespace primecache::kernels {
namespace {

using u64 = unsigned long long;

__device__ __forceinline__ u64 PhysicalRow(u64 logical, u64 ring_rows) {
  return ring_rows != 0 ? logical % ring_rows : logical;
}

__global__ void AppendRowsKernel(float* __restrict__ latent, const float* __restrict__ latent_src, u64 width,
                                 float* __restrict__ index, const float* __restrict__ index_src,
                                 u64 index_width, u64 ring_rows, u64 first_row, u64 count) {
  const u64 latent_n = count * width;
  const u64 total = latent_n + count * index_width;
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<u64>(gridDim.x) * blockDim.x) {
    if (i < latent_n) {
      const u64 t = i / width, c = i % width;
      latent[(first_row + t) * width + c] = latent_src[i];
    } else {
      const u64 j = i - latent_n;
      const u64 t = j / index_width, c = j % index_width;
      index[PhysicalRow(first_row + t, ring_rows) * index_width + c] = index_src[j];
    }
  }
}

// gather: linear <- plane; scatter: plane <- linear.
template <bool kGather>
__global__ void RingRowsKernel(float* __restrict__ plane, float* __restrict__ linear, u64 width,
                               u64 ring_rows, u64 first_row, u64 count) {
  const u64 total = count * width;
  for (u64 i = blockIdx.x * static_cast<u64>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<u64>(gridDim.x) * blockDim.x) {
    const u64 t = i / width, c = i % width;
    const u64 p = PhysicalRow(first_row + t, ring_rows) * width + c;
    if (kGather) {
      linear[i] = plane[p];
    } else {
      plane[p] = linear[i];
    }
  }
}

constexpr unsigned kBlock = 256;

unsigned Blocks(u64 elements) {
  const u64 b = (elements + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::min<u64>(std::max<u64>(b, 1), 1u << 16));
}

Status LaunchStatus(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Internal(std::string(what) + " launch: " + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace

Status AppendRowsCuda(const AppendRowsArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateAppendRowsArgs(a));
  if (a.count == 0) return Status::Ok();
  const u64 total = static_cast<u64>(a.count) * (a.width + a.index_width);
  AppendRowsKernel<<<Blocks(total), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      a.latent, a.latent_src, a.width, a.index, a.index_src, a.index_width, a.ring_rows, a.first_row,
      a.count);
  return LaunchStatus("row append");
}

Status GatherRowsCuda(const RingRowsArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateRingRowsArgs(a));
  if (a.count == 0) return Status::Ok();
  RingRowsKernel<true>
      <<<Blocks(static_cast<u64>(a.count) * a.width), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
          a.plane, a.linear, a.width, a.ring_rows, a.first_row, a.count);
  return LaunchStatus("tail-ring gather");
}

Status ScatterRowsCuda(const RingRowsArgs& a, void* stream) {
  PC_RETURN_IF_ERROR(ValidateRingRowsArgs(a));
  if (a.count == 0) return Status::Ok();
  RingRowsKernel<false>
      <<<Blocks(static_cast<u64>(a.count) * a.width), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
          a.plane, a.linear, a.width, a.ring_rows, a.first_row, a.count);
  return LaunchStatus("restore scatter");
}

}  // namespace primecache::kernels

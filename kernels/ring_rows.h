// Row movement between the engine's planes and contiguous row buffers, on the
// CPU (the reference twins) and on CUDA.
//
// A plane holds rows of `width` floats. It is either flat (ring_rows == 0:
// logical row r at physical row r) or a tail ring of ring_rows rows (logical
// row r at physical row r % ring_rows). Three operations:
//  - AppendRows: the engine's append, one launch writing t tokens' latent rows
//    (always flat) and, when the layer has an indexer, their index rows (flat
//    or ring) at logical rows [first_row, first_row + count).
//  - GatherRows: logical rows [first_row, first_row + count) of a plane into
//    a contiguous buffer, in logical order (the capture of a tail ring).
//  - ScatterRows: a contiguous buffer, in logical order, to logical rows
//    [first_row, first_row + count) of a plane (the restore of a tail).
// With a ring, count must not exceed ring_rows: one launch never laps itself.
#pragma once

#include <cstddef>

#include "primecache/status.h"

namespace primecache::kernels {

struct AppendRowsArgs {
  float* latent = nullptr;            // flat latent plane, `width` floats per row
  const float* latent_src = nullptr;  // [count * width]
  std::size_t width = 0;
  float* index = nullptr;            // index plane; null with index_width == 0
  const float* index_src = nullptr;  // [count * index_width]
  std::size_t index_width = 0;       // 0: no index plane
  std::size_t ring_rows = 0;         // index plane: 0 flat, else its ring size
  std::size_t first_row = 0;         // logical row of the first token
  std::size_t count = 0;
};

struct RingRowsArgs {
  float* plane = nullptr;   // flat or ring plane
  float* linear = nullptr;  // [count * width], logical order
  std::size_t width = 0;
  std::size_t ring_rows = 0;  // 0: flat
  std::size_t first_row = 0;
  std::size_t count = 0;
};

// Geometry checks shared by both twins: non-null pointers where rows move,
// widths > 0, and count <= ring_rows with a ring.
Status ValidateAppendRowsArgs(const AppendRowsArgs& args);
Status ValidateRingRowsArgs(const RingRowsArgs& args);

// The CPU twins: host pointers.
Status AppendRowsCpu(const AppendRowsArgs& args);
Status GatherRowsCpu(const RingRowsArgs& args);
Status ScatterRowsCpu(const RingRowsArgs& args);

// CUDA: device pointers, enqueued on `stream` (a cudaStream_t). NotSupported
// when built without CUDA.
Status AppendRowsCuda(const AppendRowsArgs& args, void* stream);
Status GatherRowsCuda(const RingRowsArgs& args, void* stream);
Status ScatterRowsCuda(const RingRowsArgs& args, void* stream);

}  // namespace primecache::kernels

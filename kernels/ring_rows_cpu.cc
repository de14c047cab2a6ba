#include <algorithm>
#include <string>

#include "kernels/ring_rows.h"

namespace primecache::kernels {
namespace {

Status CheckRingCount(std::size_t ring_rows, std::size_t count, const char* what) {
  if (ring_rows != 0 && count > ring_rows) {
    return Status::InvalidArgument(std::string(what) + ": " + std::to_string(count) +
                                   " rows exceed the ring of " + std::to_string(ring_rows) + " rows");
  }
  return Status::Ok();
}

std::size_t Physical(std::size_t logical, std::size_t ring_rows) {
  return ring_rows != 0 ? logical % ring_rows : logical;
}

}  // namespace

Status ValidateAppendRowsArgs(const AppendRowsArgs& a) {
  if (a.count == 0) return Status::Ok();
  if (a.latent == nullptr || a.latent_src == nullptr)
    return Status::InvalidArgument("row append: null latent pointer");
  if (a.width == 0) return Status::InvalidArgument("row append: width must be > 0");
  if (a.index_width != 0) {
    if (a.index == nullptr || a.index_src == nullptr) {
      return Status::InvalidArgument("row append: null index pointer");
    }
    PC_RETURN_IF_ERROR(CheckRingCount(a.ring_rows, a.count, "row append"));
  }
  return Status::Ok();
}

Status ValidateRingRowsArgs(const RingRowsArgs& a) {
  if (a.count == 0) return Status::Ok();
  if (a.plane == nullptr || a.linear == nullptr) return Status::InvalidArgument("ring rows: null pointer");
  if (a.width == 0) return Status::InvalidArgument("ring rows: width must be > 0");
  return CheckRingCount(a.ring_rows, a.count, "ring rows");
}

Status AppendRowsCpu(const AppendRowsArgs& a) {
  PC_RETURN_IF_ERROR(ValidateAppendRowsArgs(a));
  for (std::size_t i = 0; i < a.count; ++i) {
    const std::size_t row = a.first_row + i;
    std::copy_n(a.latent_src + i * a.width, a.width, a.latent + row * a.width);
    if (a.index_width != 0) {
      std::copy_n(a.index_src + i * a.index_width, a.index_width,
                  a.index + Physical(row, a.ring_rows) * a.index_width);
    }
  }
  return Status::Ok();
}

Status GatherRowsCpu(const RingRowsArgs& a) {
  PC_RETURN_IF_ERROR(ValidateRingRowsArgs(a));
  for (std::size_t i = 0; i < a.count; ++i) {
    std::copy_n(a.plane + Physical(a.first_row + i, a.ring_rows) * a.width, a.width, a.linear + i * a.width);
  }
  return Status::Ok();
}

Status ScatterRowsCpu(const RingRowsArgs& a) {
  PC_RETURN_IF_ERROR(ValidateRingRowsArgs(a));
  for (std::size_t i = 0; i < a.count; ++i) {
    std::copy_n(a.linear + i * a.width, a.width, a.plane + Physical(a.first_row + i, a.ring_rows) * a.width);
  }
  return Status::Ok();
}

#ifndef PRIMECACHE_HAVE_CUDA
Status AppendRowsCuda(const AppendRowsArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
Status GatherRowsCuda(const RingRowsArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
Status ScatterRowsCuda(const RingRowsArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
#endif

}  // namespace primecache::kernels

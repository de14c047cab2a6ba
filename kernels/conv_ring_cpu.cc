#include <string>

#include "kernels/conv_ring.h"

namespace primecache::kernels {

Status ValidateConvRingPushArgs(const ConvRingPushArgs& a) {
  if (a.kernel < 2) return Status::InvalidArgument("conv ring push: kernel must be >= 2");
  if (a.channels == 0) return Status::InvalidArgument("conv ring push: channels must be > 0");
  if (a.count == 0) return Status::Ok();
  if (a.ring == nullptr || a.inputs == nullptr)
    return Status::InvalidArgument("conv ring push: null pointer");
  return Status::Ok();
}

Status PushConvRingCpu(const ConvRingPushArgs& a) {
  PC_RETURN_IF_ERROR(ValidateConvRingPushArgs(a));
  const std::size_t keep = a.kernel - 1;
  for (std::size_t c = 0; c < a.channels; ++c) {
    float* r = a.ring + c * keep;
    // New slot i holds element count + i of (old ring ++ inputs). Reading
    // index count + i >= i before writing slot i never clobbers a value that
    // a later slot still needs.
    for (std::size_t i = 0; i < keep; ++i) {
      const std::size_t p = a.count + i;
      r[i] = p < keep ? r[p] : a.inputs[(p - keep) * a.channels + c];
    }
  }
  return Status::Ok();
}

#ifndef PRIMECACHE_HAVE_CUDA
Status PushConvRingCuda(const ConvRingPushArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
#endif

}  // namespace primecache::kernels

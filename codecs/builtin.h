// The built-in storage kinds and transforms the default registry holds.
// Internal to primecache_codecs. Each returned object lives for the process.
#pragma once

#include <vector>

#include "primecache/internal/codec.h"

namespace primecache::codecs {

// mla-latent/v1, kda-recurrent/v1, kv-plain/v1 (kinds.cc).
std::vector<const LayerCodec*> BuiltinKinds();

// raw/v1, shuffle-zstd/v1, bf16/v1, q8_0/v1 (transforms.cc).
std::vector<const Transform*> BuiltinTransforms();

}  // namespace primecache::codecs

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kv_attention.h"

namespace primecache::kernels {
namespace {

const float* Levels(std::uint32_t bits) { return bits == 2 ? kTurboQuant2Levels : kTurboQuant4Levels; }

// The butterfly of the header, in place, then the division by sqrt(n).
void Butterfly(float* y, std::size_t n) {
  for (std::size_t h = 1; h < n; h *= 2) {
    for (std::size_t i = 0; i < n; i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
    }
  }
  const float root = std::sqrt(static_cast<float>(n));
  for (std::size_t i = 0; i < n; ++i) y[i] /= root;
}

void Rotate(float* x, const float* signs, std::size_t n, bool inverse) {
  if (!inverse)
    for (std::size_t i = 0; i < n; ++i) x[i] *= signs[i];
  Butterfly(x, n);
  if (inverse)
    for (std::size_t i = 0; i < n; ++i) x[i] *= signs[i];
}

// One head entry: the norm, then the packed codes.
void EncodeEntry(const float* x, const float* signs, std::size_t n, std::uint32_t bits, std::vector<float>& y,
                 std::uint32_t* out) {
  float ss = 0.0f;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float norm = std::sqrt(ss);
  out[0] = std::bit_cast<std::uint32_t>(norm);
  std::uint32_t* codes = out + 1;
  std::fill(codes, codes + n * bits / 32, 0u);
  if (norm == 0.0f) return;
  y.assign(x, x + n);
  Rotate(y.data(), signs, n, /*inverse=*/false);
  const float root = std::sqrt(static_cast<float>(n));
  const float* c = Levels(bits);
  const std::uint32_t levels = 1u << bits;
  for (std::size_t i = 0; i < n; ++i) {
    const float z = y[i] * root / norm;
    std::uint32_t best = 0;
    float best_d = std::fabs(z - c[0]);
    for (std::uint32_t j = 1; j < levels; ++j) {
      const float d = std::fabs(z - c[j]);
      if (d < best_d) {  // strict: ties stay with the lower index
        best = j;
        best_d = d;
      }
    }
    codes[i * bits / 32] |= best << ((i * bits) % 32);
  }
}

// ŷ of one TurboQuant entry (rotated domain), or the f32 entry itself.
void ReadEntry(const void* rows, std::uint64_t row, std::size_t g, const KvAttentionArgs& a, float* y) {
  const std::size_t n = a.head_dim, words = KvEntryWords(n, a.bits);
  const auto* base = static_cast<const std::uint32_t*>(rows) + (row * a.kv_heads + g) * words;
  if (a.bits == 0) {
    std::memcpy(y, base, n * sizeof(float));
    return;
  }
  const float norm = std::bit_cast<float>(base[0]);
  const float root = std::sqrt(static_cast<float>(n));
  const float* c = Levels(a.bits);
  const std::uint32_t mask = (1u << a.bits) - 1;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t code = (base[1 + i * a.bits / 32] >> ((i * a.bits) % 32)) & mask;
    y[i] = norm * c[code] / root;
  }
}

}  // namespace

std::size_t KvEntryWords(std::size_t head_dim, std::uint32_t bits) {
  return bits == 0 ? head_dim : 1 + head_dim * bits / 32;
}

bool TurboQuantGeometryOk(std::size_t head_dim, std::uint32_t bits) {
  return (bits == 2 || bits == 4) && head_dim >= 16 && std::has_single_bit(head_dim);
}

Status HadamardRowsCpu(const HadamardArgs& a) {
  if (a.rows == 0) return Status::Ok();
  if (a.x == nullptr || a.signs == nullptr || !std::has_single_bit(a.head_dim) || a.stride < a.heads * a.head_dim) {
    return Status::InvalidArgument("Hadamard rows: null pointer, head_dim not a power of two, or stride too small");
  }
  for (std::size_t r = 0; r < a.rows; ++r)
    for (std::size_t h = 0; h < a.heads; ++h) Rotate(a.x + r * a.stride + h * a.head_dim, a.signs, a.head_dim, a.inverse);
  return Status::Ok();
}

Status TurboQuantEncodeCpu(const TurboQuantEncodeArgs& a) {
  if (a.rows == 0) return Status::Ok();
  if (a.x == nullptr || a.out == nullptr || a.signs == nullptr || !TurboQuantGeometryOk(a.head_dim, a.bits) ||
      a.src_stride < a.heads * a.head_dim) {
    return Status::InvalidArgument("TurboQuant encode: null pointer, bad geometry (head_dim " +
                                   std::to_string(a.head_dim) + ", bits " + std::to_string(a.bits) + ") or stride");
  }
  const std::size_t words = KvEntryWords(a.head_dim, a.bits);
  std::vector<float> y;
  for (std::size_t r = 0; r < a.rows; ++r)
    for (std::size_t h = 0; h < a.heads; ++h)
      EncodeEntry(a.x + r * a.src_stride + h * a.head_dim, a.signs, a.head_dim, a.bits, y,
                  a.out + (r * a.heads + h) * words);
  return Status::Ok();
}

Status ValidateKvAttentionArgs(const KvAttentionArgs& a) {
  if (a.count == 0) return Status::Ok();
  if (!a.q || !a.out || !a.new_k || !a.new_v || (a.first_pos > 0 && (!a.cache_k || !a.cache_v))) {
    return Status::InvalidArgument("KV attention: null pointer");
  }
  if (a.heads == 0 || a.kv_heads == 0 || a.head_dim == 0 || a.heads % a.kv_heads != 0) {
    return Status::InvalidArgument("KV attention: heads must be a positive multiple of kv_heads, head_dim > 0");
  }
  if (a.bits != 0 && !TurboQuantGeometryOk(a.head_dim, a.bits)) {
    return Status::InvalidArgument("KV attention: TurboQuant rows need bits 2 or 4 and a power-of-two head_dim >= 16");
  }
  // Every cached row a query reads must still be held.
  const std::uint64_t oldest = KvWindowStart(a.first_pos, a.window);
  if (a.first_pos > 0 && a.first_pos - oldest > a.cache_rows) {
    return Status::InvalidArgument("KV attention: the cache holds " + std::to_string(a.cache_rows) +
                                   " rows; the window reads " + std::to_string(a.first_pos - oldest));
  }
  return Status::Ok();
}

Status KvAttentionCpu(const KvAttentionArgs& a) {
  PC_RETURN_IF_ERROR(ValidateKvAttentionArgs(a));
  const std::size_t n = a.head_dim, width = a.heads * n;
  std::vector<float> score, k(n), v(n);
  for (std::size_t i = 0; i < a.count; ++i) {
    const std::uint64_t pos = a.first_pos + i, lo = KvWindowStart(pos, a.window);
    score.resize(pos + 1 - lo);
    for (std::size_t h = 0; h < a.heads; ++h) {
      const std::size_t g = h * a.kv_heads / a.heads;
      const float* q = a.q + i * width + h * n;
      auto read = [&](bool key, std::uint64_t s, float* y) {
        if (s < a.first_pos) {
          ReadEntry(key ? a.cache_k : a.cache_v, s % a.cache_rows, g, a, y);
        } else {
          ReadEntry(key ? a.new_k : a.new_v, s - a.first_pos, g, a, y);
        }
      };
      float mx = -INFINITY;
      for (std::uint64_t s = lo; s <= pos; ++s) {
        read(true, s, k.data());
        float dot = 0.0f;
        for (std::size_t j = 0; j < n; ++j) dot += q[j] * k[j];
        score[s - lo] = dot * a.scale;
        mx = std::max(mx, score[s - lo]);
      }
      float sum = 0.0f;
      for (float& e : score) {
        e = std::exp(e - mx);
        sum += e;
      }
      float* o = a.out + i * width + h * n;
      std::fill(o, o + n, 0.0f);
      for (std::uint64_t s = lo; s <= pos; ++s) {
        read(false, s, v.data());
        const float p = score[s - lo] / sum;
        for (std::size_t j = 0; j < n; ++j) o[j] += p * v[j];
      }
    }
  }
  return Status::Ok();
}

#ifndef PRIMECACHE_HAVE_CUDA
Status HadamardRowsCuda(const HadamardArgs&, void*) { return Status::NotSupported("primecache was built without CUDA"); }
Status TurboQuantEncodeCuda(const TurboQuantEncodeArgs&, void*) {
  return Status::NotSupported("primecache was built without CUDA");
}
Status KvAttentionCuda(const KvAttentionArgs&, void*) { return Status::NotSupported("primecache was built without CUDA"); }
#endif

}  // namespace primecache::kernels

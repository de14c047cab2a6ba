// Grouped-query attention over plain or rotating KV rows, f32 or TurboQuant,
// on the CPU (the reference twins) and on CUDA; and the TurboQuant row
// encoder and the rotation it uses.
//
// Rows. A token's K (or V) row is kv_heads head entries side by side. An f32
// entry is head_dim floats. A TurboQuant entry (bits 2 or 4) is 32-bit words:
// the norm n as f32, then head_dim codes of `bits` bits packed little-endian
// (code i in byte i*bits/8 at bit (i*bits) % 8), so 1 + head_dim*bits/32
// words (head_dim a power of two >= 16). The words are the cache's storage;
// nothing but the encoder writes them and nothing but the attention reads
// them.
//
// The rotation R = Hd · diag(signs) / sqrt(hd) (Hd the Sylvester Hadamard
// matrix) is computed with the fast Walsh-Hadamard butterfly in f32: strides
// 1, 2, 4, ... (the smallest blocks first, as H2n = [[Hn, Hn], [Hn, -Hn]]
// builds them), each pair (a, b) becoming (a + b, a - b); then each value is
// divided by sqrt(hd) (f32). The inverse is Rᵀ = diag(signs) · Hd / sqrt(hd).
//
// Attention. Query i of a call sits at position p = first_pos + i; head h
// reads kv head g = h*kv_heads/heads and attends to S(p) = {max(0, p-W+1) ..
// p} with a window W, {0 .. p} without. Rows of positions below first_pos
// come from the cache (physical row pos % cache_rows: a rotating buffer of W
// rows, or a flat plane when cache_rows >= every position); rows of the
// call's own positions come from new_k/new_v, so a rotating buffer is written
// only after the call's queries have read it. score = q·k̂ · scale, softmax
// (max first, each weight e/sum), out = Σ weight · v̂, in ascending s on the
// CPU. With TurboQuant rows q must already be rotated (R·q per head) and the
// output is in the rotated domain (the caller applies Rᵀ): q·x̂ = (R q)·ŷ with
// ŷ_i = n·C[code_i]/sqrt(hd).
#pragma once

#include <cstddef>
#include <cstdint>

#include "primecache/status.h"

namespace primecache::kernels {

// Lloyd-Max levels of a unit Gaussian, as the model specification lists them.
inline constexpr float kTurboQuant2Levels[4] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
inline constexpr float kTurboQuant4Levels[16] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f,
                                                 -0.3881f, -0.1284f, 0.1284f,  0.3881f,  0.6568f,  0.9424f,
                                                 1.2562f,  1.6181f,  2.0690f,  2.7326f};

// Words of one head entry: head_dim for f32 rows, 1 + head_dim*bits/32 for TurboQuant.
std::size_t KvEntryWords(std::size_t head_dim, std::uint32_t bits);
// Whether (head_dim, bits) is a TurboQuant geometry this code supports.
bool TurboQuantGeometryOk(std::size_t head_dim, std::uint32_t bits);

// x[t, h] <- R·x[t, h] (forward) or Rᵀ·x[t, h] (inverse), in place, for
// `rows` rows of `heads` head_dim-wide groups (row r at x + r*stride).
struct HadamardArgs {
  float* x = nullptr;
  const float* signs = nullptr;  // [head_dim], each +1 or -1
  std::size_t rows = 0, heads = 0, head_dim = 0, stride = 0;
  bool inverse = false;
};
Status HadamardRowsCpu(const HadamardArgs& a);
Status HadamardRowsCuda(const HadamardArgs& a, void* stream);

// Encodes rows of f32 head groups into TurboQuant entries.
struct TurboQuantEncodeArgs {
  const float* x = nullptr;       // [rows, heads*head_dim] at src_stride floats per row
  std::uint32_t* out = nullptr;   // [rows, heads*KvEntryWords] words
  const float* signs = nullptr;   // [head_dim]
  std::size_t rows = 0, heads = 0, head_dim = 0, src_stride = 0;
  std::uint32_t bits = 0;
};
Status TurboQuantEncodeCpu(const TurboQuantEncodeArgs& a);
Status TurboQuantEncodeCuda(const TurboQuantEncodeArgs& a, void* stream);

struct KvAttentionArgs {
  const float* q = nullptr;  // [count, heads*head_dim] (rotated for TurboQuant)
  const void* cache_k = nullptr;  // rows of positions < first_pos, row pos at pos % cache_rows
  const void* cache_v = nullptr;
  std::uint64_t cache_rows = 0;
  const void* new_k = nullptr;  // [count] rows of positions first_pos ..
  const void* new_v = nullptr;
  float* out = nullptr;  // [count, heads*head_dim]
  std::size_t count = 0;
  std::uint64_t first_pos = 0;
  std::size_t heads = 0, kv_heads = 0, head_dim = 0;
  std::uint64_t window = 0;  // 0: full causal attention
  std::uint32_t bits = 0;    // 0: f32 rows; 2 or 4: TurboQuant rows
  float scale = 1.0f;
};
Status ValidateKvAttentionArgs(const KvAttentionArgs& a);
// The first position query i attends to.
inline std::uint64_t KvWindowStart(std::uint64_t pos, std::uint64_t window) {
  return window == 0 || pos + 1 <= window ? 0 : pos + 1 - window;
}
Status KvAttentionCpu(const KvAttentionArgs& a);
Status KvAttentionCuda(const KvAttentionArgs& a, void* stream);

}  // namespace primecache::kernels

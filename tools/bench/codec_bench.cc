// codec_bench: encode/decode throughput and ratio of every storage kind x
// transform on synthetic planes shaped like GLM-5-class state, against memcpy
// of the same bytes in the same run. Not a test: it prints a Markdown table
// for docs/BENCHMARKS.md.
//
//   codec_bench [--tokens N] [--reps R] [--level L] [--chunk-bytes B]
//
// Throughput is raw (decoded f32) bytes over the best of R wall-clock runs,
// single thread. "pass" rows time a transform's own work over the same
// chunks (no checksums, no allocation): the figure the 0.8 x memcpy target is
// about. "layer" rows time EncodeLayer / LayerDecoder::DecodeInto end to end
// (chunking, both XXH3 checksums, the transform).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "codecs/shuffle.h"
#include "primecache/checksum.h"
#include "primecache/codec.h"

using namespace primecache;

namespace {

// Smooth-ish planes: low-frequency waves along tokens and channels, a
// per-channel scale (as a norm weight gives), and a little noise.
std::vector<float> SyntheticRows(std::uint64_t rows, std::uint64_t width, std::uint64_t seed) {
  std::vector<float> out(rows * width);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::uint64_t t = 0; t < rows; ++t) {
    for (std::uint64_t c = 0; c < width; ++c) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      const double noise = static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5;
      const double scale = 0.5 + static_cast<double>((c * 2654435761u) % 1000) / 1000.0;
      const double v = std::sin(0.011 * static_cast<double>(t) + 0.29 * static_cast<double>(c)) +
                       0.3 * std::cos(0.0017 * static_cast<double>(t * (c % 7 + 1))) + 0.08 * noise;
      out[t * width + c] = static_cast<float>(scale * v);
    }
  }
  return out;
}

double Seconds(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The best of `reps` timings of fn, each run right after a timing of the
// baseline, so both see the same machine (this host is shared): returns
// {fn, baseline} best seconds. Both are warmed up first (pages faulted in,
// per-thread contexts made).
std::pair<double, double> BestAgainst(int reps, const std::function<void()>& fn,
                                      const std::function<void()>& baseline) {
  fn();
  baseline();
  double best = 1e30, best_base = 1e30;
  for (int r = 0; r < reps; ++r) {
    best_base = std::min(best_base, Seconds(baseline));
    best = std::min(best, Seconds(fn));
  }
  return {best, best_base};
}

double Gbps(std::uint64_t bytes, double seconds) {
  return static_cast<double>(bytes) / seconds / 1e9;
}

struct Case {
  std::string kind;
  LayerSnapshot layer;
};

std::vector<Case> Cases(std::uint64_t tokens) {
  const std::uint32_t kv_rank = 512, rope = 64, index_head_dim = 128, pool = 4;
  LatentPlaneSnapshot l;
  l.len = tokens;
  l.width = kv_rank + rope;
  l.index_width = 2 * index_head_dim;
  l.pool = pool;
  l.pools_ready = tokens / pool;
  l.index_is_ring = true;
  l.index_ring_rows = 1024;
  l.latent_rows = SyntheticRows(tokens, l.width, 1);
  l.index_tail_rows = SyntheticRows(tokens - l.pools_ready * pool, l.index_width, 2);
  l.pool_keys = SyntheticRows(l.pools_ready, index_head_dim, 3);

  RecurrentSnapshot r{32, 128, 4, SyntheticRows(3 * 32 * 128, 3, 4), SyntheticRows(32 * 128, 128, 5)};
  KvSnapshot kv{tokens, 512, 512, SyntheticRows(tokens, 512, 6), SyntheticRows(tokens, 512, 7)};
  return {{"mla-latent", std::move(l)}, {"kda-recurrent", std::move(r)}, {"kv-plain", std::move(kv)}};
}

struct Row {
  std::string what, transform;
  std::uint64_t raw_bytes = 0, encoded_bytes = 0;
  double enc = 0, dec = 0, memcpy = 0;
};

void Print(const std::vector<Row>& rows) {
  std::printf(
      "| kind | what | transform | raw MiB | ratio | encode GB/s | decode GB/s | memcpy GB/s | enc/memcpy | "
      "dec/memcpy |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    std::printf(
        "| %s | %s | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r.what.c_str(), r.transform.c_str(),
        static_cast<double>(r.raw_bytes) / (1 << 20),
        static_cast<double>(r.raw_bytes) / static_cast<double>(std::max<std::uint64_t>(r.encoded_bytes, 1)),
        r.enc, r.dec, r.memcpy, r.enc / r.memcpy, r.dec / r.memcpy);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"codec_bench: encode/decode GB/s and ratio per kind x transform, against memcpy"};
  std::uint64_t tokens = 8192;
  int reps = 5;
  int level = 1;
  std::uint64_t chunk_bytes = kDefaultChunkBytes;
  app.add_option("--tokens", tokens, "boundary length of the latent and KV layers");
  app.add_option("--reps", reps, "timed repetitions; the best is reported");
  app.add_option("--level", level, "zstd level of shuffle-zstd");
  app.add_option("--chunk-bytes", chunk_bytes, "target raw bytes per chunk");
  CLI11_PARSE(app, argc, argv);

  const CodecRegistry& reg = CodecRegistry::Default();
  std::vector<std::pair<std::string, EncodeOptions>> variants;
  for (auto [name, spec] : std::vector<std::pair<std::string, TransformSpec>>{
           {"raw/v1", {"raw/v1", 0}},
           {"shuffle-zstd/v1 L" + std::to_string(level), {"shuffle-zstd/v1", level}},
           {"shuffle-zstd/v1 L" + std::to_string(level + 2), {"shuffle-zstd/v1", level + 2}}}) {
    EncodeOptions o;
    o.all_planes = spec;
    o.target_chunk_bytes = chunk_bytes;
    variants.emplace_back(name, o);
  }
  for (auto id : {kBf16Transform, kQ8_0Transform}) {
    EncodeOptions o;
    o.all_planes = TransformSpec{"raw/v1", 0};
    o.plane_transforms = {{PlaneId::kLatentRows, {std::string(id), 0}}};
    o.target_chunk_bytes = chunk_bytes;
    variants.emplace_back(std::string(id) + " latent rows (rest raw)", o);
  }

  std::vector<Row> rows;
  for (Case& c : Cases(tokens)) {
    const LayerCodec* codec = *reg.KindFor(ShapeOf(c.layer));
    const auto src = codec->PlaneData(c.layer);
    std::vector<std::vector<float>> dst;
    std::uint64_t raw = 0;
    for (auto s : src) {
      dst.emplace_back(s.size());
      raw += s.size_bytes();
    }
    // The baseline: memcpy of the same bytes, source planes into destination planes.
    const std::function<void()> copy = [&] {
      for (std::size_t p = 0; p < src.size(); ++p)
        std::memcpy(dst[p].data(), src[p].data(), src[p].size_bytes());
    };

    for (const auto& variant : variants) {
      const std::string& name = variant.first;
      const EncodeOptions& options = variant.second;  // a plain reference: clang 14 cannot capture bindings
      if (!options.plane_transforms.empty() && c.kind != "mla-latent") continue;
      EncodedLayer enc;
      const auto [enc_s, copy_enc_s] = BestAgainst(
          reps, [&] { enc = *EncodeLayer(c.layer, options); }, copy);
      std::uint64_t encoded = 0;
      for (const auto& ch : enc.chunks) encoded += ch.size();
      LayerDecoder decoder = *LayerDecoder::Create(enc.header);
      std::vector<std::span<float>> spans(dst.begin(), dst.end());
      Status st;
      const auto [dec_s, copy_dec_s] = BestAgainst(
          reps, [&] { st = decoder.DecodeInto(enc.chunks, spans); }, copy);
      const double memcpy_s = std::min(copy_enc_s, copy_dec_s);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        return 1;
      }
      rows.push_back(
          {c.kind + " | layer", name, raw, encoded, Gbps(raw, enc_s), Gbps(raw, dec_s), Gbps(raw, memcpy_s)});
    }

    // The transforms' own passes over the same chunks, reading the source
    // planes and writing the destination planes exactly as memcpy does:
    // raw (a checked copy) and the byte shuffle each way; XXH3 for scale.
    EncodedLayer enc = *EncodeLayer(c.layer, variants[0].second);
    LayerDecoder decoder = *LayerDecoder::Create(enc.header);
    std::vector<std::pair<std::span<const float>, std::span<float>>> chunks;
    for (std::size_t i = 0; i < decoder.chunk_count(); ++i) {
      const ChunkLocation& loc = decoder.chunk(i);
      chunks.emplace_back(src[loc.plane].subspan(loc.value_offset, loc.value_count),
                          std::span<float>(dst[loc.plane]).subspan(loc.value_offset, loc.value_count));
    }
    const Transform* rawt = *reg.FindTransform(kRawTransform);
    const auto [raw_pass, copy_raw] = BestAgainst(
        reps,
        [&] {
          for (auto& [in, out] : chunks) (void)rawt->Decode(std::as_bytes(in), out);
        },
        copy);
    rows.push_back({c.kind + " | pass", "raw (checked copy)", raw, raw, Gbps(raw, raw_pass),
                    Gbps(raw, raw_pass), Gbps(raw, copy_raw)});
    const auto [sh, copy_sh] = BestAgainst(
        reps,
        [&] {
          for (auto& [in, out] : chunks) {
            codecs::ShuffleBytes4(reinterpret_cast<const std::byte*>(in.data()), in.size(),
                                  reinterpret_cast<std::byte*>(out.data()));
          }
        },
        copy);
    const auto [unsh, copy_unsh] = BestAgainst(
        reps,
        [&] {
          for (auto& [in, out] : chunks) {
            codecs::UnshuffleBytes4(reinterpret_cast<const std::byte*>(in.data()), in.size(),
                                    reinterpret_cast<std::byte*>(out.data()));
          }
        },
        copy);
    rows.push_back({c.kind + " | pass", "byte shuffle / unshuffle", raw, raw, Gbps(raw, sh), Gbps(raw, unsh),
                    Gbps(raw, std::min(copy_sh, copy_unsh))});
    std::uint64_t sink = 0;
    const auto [xxh, copy_xxh] = BestAgainst(
        reps,
        [&] {
          for (auto& [in, out] : chunks) sink += Checksum64(std::as_bytes(in));
        },
        copy);
    rows.push_back({c.kind + " | pass", "xxh3-64 (read only)", raw, raw, Gbps(raw, xxh), Gbps(raw, xxh),
                    Gbps(raw, copy_xxh)});
    if (sink == 42) std::printf(" ");
  }
  Print(rows);
  return 0;
}

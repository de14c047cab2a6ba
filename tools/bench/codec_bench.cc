// codec_bench: encode/decode throughput and ratio of every storage kind x
// transform on synthetic planes shaped like GLM-5-class state, against memcpy
// of the same bytes in the same run. Not a test: it prints a Markdown table
// for docs/BENCHMARKS.md.
//
//   codec_bench [--tokens N] [--reps R] [--level L] [--chunk-bytes B] [--csv FILE]
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
#include "primecache/internal/codec.h"
#include "tools/common/csv.h"

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
  LatentSnapshot l;
  l.shape.len = tokens;
  l.shape.width = kv_rank + rope;
  l.shape.index_width = 2 * index_head_dim;
  l.shape.pool = pool;
  l.shape.pools_ready = tokens / pool;
  l.shape.index_is_ring = true;
  l.shape.index_ring_rows = 1024;
  l.latent_rows = SyntheticRows(tokens, l.shape.width, 1);
  l.index_tail_rows = SyntheticRows(tokens - l.shape.pools_ready * pool, l.shape.index_width, 2);
  l.pool_keys = SyntheticRows(l.shape.pools_ready, index_head_dim, 3);

  RecurrentSnapshot r{{32, 128, 4}, SyntheticRows(3 * 32 * 128, 3, 4), SyntheticRows(32 * 128, 128, 5)};
  KvSnapshot kv{{tokens, 512, 512}, SyntheticRows(tokens, 512, 6), SyntheticRows(tokens, 512, 7)};
  return {{"mla-latent", std::move(l)}, {"kda-recurrent", std::move(r)}, {"kv-plain", std::move(kv)}};
}

struct Row {
  std::string kind, what, transform;
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
        "| %s | %s | %s | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r.kind.c_str(), r.what.c_str(),
        r.transform.c_str(),
        static_cast<double>(r.raw_bytes) / (1 << 20),
        static_cast<double>(r.raw_bytes) / static_cast<double>(std::max<std::uint64_t>(r.encoded_bytes, 1)),
        r.enc, r.dec, r.memcpy, r.enc / r.memcpy, r.dec / r.memcpy);
  }
}

// The same rows as a tidy CSV (tools/bench/plot.py draws it).
Status WriteCsv(const std::vector<Row>& rows, std::uint64_t tokens, const std::string& path) {
  bench::CsvTable t({"kind", "what", "transform", "tokens", "raw_bytes", "encoded_bytes", "ratio", "encode_gbps",
                     "decode_gbps", "memcpy_gbps"});
  for (const Row& r : rows) {
    PC_RETURN_IF_ERROR(t.Add({r.kind, r.what, r.transform, tokens, r.raw_bytes, r.encoded_bytes,
                              static_cast<double>(r.raw_bytes) /
                                  static_cast<double>(std::max<std::uint64_t>(r.encoded_bytes, 1)),
                              r.enc, r.dec, r.memcpy}));
  }
  return t.WriteTo(path);
}

// The command line.
struct Options {
  std::uint64_t tokens = 8192;
  int reps = 5;
  int level = 1;
  std::uint64_t chunk_bytes = kDefaultChunkBytes;
  std::string csv;
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--tokens", o.tokens, "boundary length of the latent and KV layers");
  app.add_option("--reps", o.reps, "timed repetitions; the best is reported");
  app.add_option("--level", o.level, "zstd level of shuffle-zstd");
  app.add_option("--chunk-bytes", o.chunk_bytes, "target raw bytes per chunk");
  app.add_option("--csv", o.csv, "also write the rows as CSV to this file (tools/bench/plot.py)");
}

using Variant = std::pair<std::string, EncodeOptions>;  // a row's name, how it encodes

// Raw, shuffle-zstd at two levels, and the lossy latent-row transforms.
std::vector<Variant> Variants(const Options& opt) {
  std::vector<Variant> variants;
  for (auto [name, spec] : std::vector<std::pair<std::string, TransformSpec>>{
           {"raw/v1", {"raw/v1", 0}},
           {"shuffle-zstd/v1 L" + std::to_string(opt.level), {"shuffle-zstd/v1", opt.level}},
           {"shuffle-zstd/v1 L" + std::to_string(opt.level + 2), {"shuffle-zstd/v1", opt.level + 2}}}) {
    EncodeOptions o;
    o.all_planes = spec;
    o.target_chunk_bytes = opt.chunk_bytes;
    variants.emplace_back(name, o);
  }
  for (auto id : {kBf16Transform, kQ8_0Transform}) {
    EncodeOptions o;
    o.all_planes = TransformSpec{"raw/v1", 0};
    o.plane_transforms = {{PlaneId::kLatentRows, {std::string(id), 0}}};
    o.target_chunk_bytes = opt.chunk_bytes;
    variants.emplace_back(std::string(id) + " latent rows (rest raw)", o);
  }
  return variants;
}

// One case's source planes and destination planes of the same sizes. The
// baseline, copy: memcpy of the same bytes, source planes into destination
// planes.
struct Planes {
  std::vector<std::span<const float>> src;
  std::vector<std::vector<float>> dst;
  std::uint64_t raw = 0;
  std::function<void()> copy = [this] {
    for (std::size_t i = 0; i < src.size(); ++i)
      std::memcpy(dst[i].data(), src[i].data(), src[i].size_bytes());
  };

  Planes() = default;
  Planes(const Planes&) = delete;  // `copy` holds `this`
  Planes& operator=(const Planes&) = delete;
};

void FillPlanes(const LayerCodec& codec, const LayerSnapshot& layer, Planes& p) {
  for (auto s : codec.PlaneData(layer)) {
    p.src.push_back(s);
    p.dst.emplace_back(s.size());
    p.raw += s.size_bytes();
  }
}

// "layer" rows: EncodeLayer and DecodeInto end to end, one row per variant.
Status LayerRows(const Case& c, Planes& p, const std::vector<Variant>& variants, int reps,
                 std::vector<Row>& rows) {
  for (const auto& variant : variants) {
    const std::string& name = variant.first;
    const EncodeOptions& options = variant.second;  // a plain reference: clang 14 cannot capture bindings
    if (!options.plane_transforms.empty() && c.kind != "mla-latent") continue;
    EncodedLayer enc;
    const auto [enc_s, copy_enc_s] = BestAgainst(
        reps, [&] { enc = *EncodeLayer(c.layer, options); }, p.copy);
    std::uint64_t encoded = 0;
    for (const auto& ch : enc.chunks) encoded += ch.size();
    LayerDecoder decoder = *LayerDecoder::Create(enc.header);
    std::vector<std::span<float>> spans(p.dst.begin(), p.dst.end());
    Status st;
    const auto [dec_s, copy_dec_s] = BestAgainst(
        reps, [&] { st = decoder.DecodeInto(enc.chunks, spans); }, p.copy);
    const double memcpy_s = std::min(copy_enc_s, copy_dec_s);
    PC_RETURN_IF_ERROR(st);
    rows.push_back({c.kind, "layer", name, p.raw, encoded, Gbps(p.raw, enc_s), Gbps(p.raw, dec_s),
                    Gbps(p.raw, memcpy_s)});
  }
  return Status::Ok();
}

// "pass" rows: the transforms' own passes over the same chunks, reading the
// source planes and writing the destination planes exactly as memcpy does:
// raw (a checked copy) and the byte shuffle each way; XXH3 for scale.
void PassRows(const Case& c, Planes& p, const EncodeOptions& raw_options, int reps, std::vector<Row>& rows) {
  const std::uint64_t raw = p.raw;
  EncodedLayer enc = *EncodeLayer(c.layer, raw_options);
  LayerDecoder decoder = *LayerDecoder::Create(enc.header);
  std::vector<std::pair<std::span<const float>, std::span<float>>> chunks;
  for (std::size_t i = 0; i < decoder.chunk_count(); ++i) {
    const ChunkLocation& loc = decoder.chunk(i);
    chunks.emplace_back(p.src[loc.plane].subspan(loc.value_offset, loc.value_count),
                        std::span<float>(p.dst[loc.plane]).subspan(loc.value_offset, loc.value_count));
  }
  const Transform* rawt = *CodecRegistry::Default().FindTransform(kRawTransform);
  const auto [raw_pass, copy_raw] = BestAgainst(
      reps,
      [&] {
        for (auto& [in, out] : chunks) (void)rawt->Decode(std::as_bytes(in), out);
      },
      p.copy);
  rows.push_back({c.kind, "pass", "raw (checked copy)", raw, raw, Gbps(raw, raw_pass),
                  Gbps(raw, raw_pass), Gbps(raw, copy_raw)});
  // One byte-shuffle direction over every chunk, against memcpy.
  const auto shuffle_pass = [&](auto* shuffle) {
    return BestAgainst(
        reps,
        [&] {
          for (auto& [in, out] : chunks) {
            shuffle(reinterpret_cast<const std::byte*>(in.data()), in.size(),
                    reinterpret_cast<std::byte*>(out.data()));
          }
        },
        p.copy);
  };
  const auto [sh, copy_sh] = shuffle_pass(&codecs::ShuffleBytes4);
  const auto [unsh, copy_unsh] = shuffle_pass(&codecs::UnshuffleBytes4);
  rows.push_back({c.kind, "pass", "byte shuffle / unshuffle", raw, raw, Gbps(raw, sh), Gbps(raw, unsh),
                  Gbps(raw, std::min(copy_sh, copy_unsh))});
  std::uint64_t sink = 0;
  const auto [xxh, copy_xxh] = BestAgainst(
      reps,
      [&] {
        for (auto& [in, out] : chunks) sink += Checksum64(std::as_bytes(in));
      },
      p.copy);
  rows.push_back({c.kind, "pass", "xxh3-64 (read only)", raw, raw, Gbps(raw, xxh), Gbps(raw, xxh),
                  Gbps(raw, copy_xxh)});
  if (sink == 42) std::printf(" ");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"codec_bench: encode/decode GB/s and ratio per kind x transform, against memcpy"};
  Options opt;
  AddOptions(app, opt);
  CLI11_PARSE(app, argc, argv);

  const std::vector<Variant> variants = Variants(opt);
  std::vector<Row> rows;
  for (Case& c : Cases(opt.tokens)) {
    const LayerCodec* codec = *CodecRegistry::Default().KindFor(ShapeOf(c.layer));
    Planes planes;
    FillPlanes(*codec, c.layer, planes);
    if (Status st = LayerRows(c, planes, variants, opt.reps, rows); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    PassRows(c, planes, variants[0].second, opt.reps, rows);
  }
  Print(rows);
  if (opt.csv.empty()) return 0;
  if (Status st = WriteCsv(rows, opt.tokens, opt.csv); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

// primecache-model-bench's reporting (model_bench.h): the compression
// ratios, one line per case, each ratio against its target, and the CSV
// tables.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "primecache/internal/codec.h"
#include "tools/bench/model_bench.h"

namespace primecache::model_bench {

void ReportRatios(const std::vector<LayerSnapshot>& layers) {
  struct Choice {
    const char* name;
    TransformSpec spec;
  };
  const Choice choices[] = {{"raw", {"raw/v1", 0}},
                            {"shuffle-zstd-1", {"shuffle-zstd/v1", 1}},
                            {"shuffle-zstd-3", {"shuffle-zstd/v1", 3}},
                            {"bf16 (latent only)", {"bf16/v1", 0}},
                            {"q8_0 (latent only)", {"q8_0/v1", 0}}};
  for (const Choice& c : choices) {
    EncodeOptions opt;
    const bool lossy = c.spec.id == "bf16/v1" || c.spec.id == "q8_0/v1";
    if (lossy) {
      opt.plane_transforms.push_back({PlaneId::kLatentRows, c.spec});
    } else {
      opt.all_planes = c.spec;
    }
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> per_plane;  // raw, encoded
    double enc_s = 0, dec_s = 0;
    std::uint64_t raw_total = 0;
    for (const LayerSnapshot& layer : layers) {
      auto t0 = Clock::now();
      auto enc = EncodeLayer(layer, opt);
      enc_s += Ms(t0) / 1e3;
      if (!enc.ok()) {
        std::printf("model-bench: ratios: %s: %s\n", c.name, enc.status().ToString().c_str());
        return;
      }
      for (const PlaneRecord& p : enc->header.planes) {
        auto& acc = per_plane[std::string(PlaneName(p.id)) +
                              (lossy && p.id != PlaneId::kLatentRows ? " (default)" : "")];
        for (const ChunkRecord& ch : p.chunks) {
          acc.first += ch.raw_bytes;
          acc.second += ch.encoded_bytes;
          raw_total += ch.raw_bytes;
        }
      }
      // Decode into planes allocated and touched beforehand, as a restore
      // decodes into its staging: the rate is the codec's, not the allocator's.
      auto dst = MakeSnapshot(ShapeOf(layer));
      auto codec = CodecRegistry::Default().KindFor(ShapeOf(layer));
      if (!dst.ok() || !codec.ok()) return;
      const std::vector<std::span<float>> spans = (*codec)->MutablePlaneData(*dst);
      t0 = Clock::now();
      Status dec = DecodeLayerInto(*enc, spans);
      dec_s += Ms(t0) / 1e3;
      if (!dec.ok()) {
        std::printf("model-bench: ratios: %s decode: %s\n", c.name, dec.ToString().c_str());
        return;
      }
    }
    std::string planes;
    for (const auto& [name, v] : per_plane) {
      if (v.first == 0) continue;  // an empty plane (the index tail at a pool multiple)
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.3f", name.c_str(),
                    double(v.first) / double(std::max<std::uint64_t>(v.second, 1)));
      planes += buf;
    }
    std::printf("model-bench: ratios %-19s encode %5.2f GB/s decode %5.2f GB/s |%s\n", c.name,
                double(raw_total) / 1e9 / enc_s, double(raw_total) / 1e9 / dec_s, planes.c_str());
  }
}

double Gbs(std::uint64_t bytes, double ms) {
  return double(bytes) / 1e6 / ms;
}

namespace {

void Ratio(const char* what, double ratio, const char* cmp, double target) {
  const bool met = cmp[0] == '>' ? ratio >= target : ratio <= target;
  std::printf("model-bench: ratio %-52s %6.2fx (target %s %.2fx: %s)\n", what, ratio, cmp, target,
              met ? "met" : "MISSED");
}

// "default (raw/v1)" or the transform named.
std::string Label(const DaemonPath& path) {
  return path.transform ? path.name : path.name + " (" + DefaultTransform(PlaneId::kLatentRows).id + ")";
}

}  // namespace

void ReportDaemon(const DaemonPath& path, const DaemonRun& d, const InProcess& ref, const BusRates& bus,
                  const DiskRates& disk) {
  const std::uint64_t b = d.hot.restored_bytes;
  std::printf(
      "model-bench: daemon %-24s publish %.1f ms (%.3f GB encoded, %.2f GB/s; %llu of %llu layers encoded in "
      "place) | "
      "hot: restore %.1f ms = %.2f GB/s "
      "(lookup %.1f, fetch %.1f, validate+copy %.1f ms; %llu raw chunks straight from the region, "
      "%llu = %.3f GB as device chunks%s), ttft %.1f ms | "
      "cold: restore %.1f ms = %.2f GB/s, ttft %.1f ms | restored == continued: %s\n",
      Label(path).c_str(), d.publish_ms, d.publish_bytes / 1e9, Gbs(d.publish_bytes, d.publish_ms),
      static_cast<unsigned long long>(d.in_place_layers), static_cast<unsigned long long>(d.layers),
      d.hot.restore_ms, Gbs(b, d.hot.restore_ms), d.hot.lookup_ms, d.hot.fetch_ms, d.hot.copy_ms,
      static_cast<unsigned long long>(d.hot.direct_chunks),
      static_cast<unsigned long long>(d.hot.device_chunks), d.hot.device_chunk_bytes / 1e9,
      d.device_window ? "" : ", no device window", d.hot.ttft_ms, d.cold.restore_ms,
      Gbs(b, d.cold.restore_ms), d.cold.ttft_ms, d.exact ? "bit-identical" : "DIFFERENT");
  if (path.transform) return;  // the targets hold the default path to the machine
  const double disk_read = Gbs(b, disk.read_ms), disk_write = Gbs(d.publish_bytes, disk.write_ms);
  Ratio("restore from the daemon, hot / pinned H2D", Gbs(b, d.hot.restore_ms) / bus.h2d_gbs, ">=", 0.8);
  Ratio("TTFT through the daemon / TTFT from pinned in process", d.hot.ttft_ms / ref.ttft_ms, "<=", 1.05);
  Ratio("restore from the daemon, cold / O_DIRECT read", Gbs(b, d.cold.restore_ms) / disk_read, ">=", 0.8);
  Ratio("publish / fsync'd sequential write", Gbs(d.publish_bytes, d.publish_ms) / disk_write, ">=", 0.8);
  (void)ref;
}

void ReportInProcess(std::size_t P, std::size_t suffix, const InProcess& r, const BusRates& bus) {
  std::printf(
      "model-bench: prefix %6zu + %zu: ttft full %9.1f ms | restore from pinned %7.1f ms (%.3f GB at %.1f "
      "GB/s) + "
      "suffix = ttft %7.1f ms | speedup %.1fx | full snapshot %.1f ms = %.2f GB/s | pinned H2D %.1f GB/s, "
      "D2H %.1f "
      "GB/s | restored == continued: %s\n",
      P, suffix, r.full_ms, r.restore_ms, r.bytes / 1e9, Gbs(r.bytes, r.restore_ms), r.ttft_ms,
      r.full_ms / r.ttft_ms, r.snapshot_ms, Gbs(r.bytes, r.snapshot_ms), bus.h2d_gbs, bus.d2h_gbs,
      r.exact ? "bit-identical" : "DIFFERENT");
  Ratio("restore in process / pinned H2D", Gbs(r.bytes, r.restore_ms) / bus.h2d_gbs, ">=", 0.8);
  Ratio("full snapshot / pinned D2H", Gbs(r.bytes, r.snapshot_ms) / bus.d2h_gbs, ">=", 0.5);
}

void RecordInProcess(Figures& f, std::size_t P, std::size_t suffix, const InProcess& r, const BusRates& bus) {
  (void)f.ttft.Add({f.config, f.device, P, suffix, "full prefill", r.full_ms});
  (void)f.ttft.Add({f.config, f.device, P, suffix, "restore in process", r.ttft_ms});
  (void)f.restore.Add({f.config, f.device, P, "in process, pinned", r.bytes, r.restore_ms,
                       Gbs(r.bytes, r.restore_ms), bus.h2d_gbs});
}

void RecordDaemon(Figures& f, std::size_t P, std::size_t suffix, const DaemonPath& path, const DaemonRun& d,
                  const BusRates& bus) {
  const std::uint64_t b = d.hot.restored_bytes;
  for (const auto& [temp, req] :
       {std::pair<const char*, const model::Request*>{"hot", &d.hot}, {"cold", &d.cold}}) {
    const std::string name = "daemon " + Label(path) + ", " + temp;
    (void)f.ttft.Add({f.config, f.device, P, suffix, name, req->ttft_ms});
    (void)f.restore.Add(
        {f.config, f.device, P, name, b, req->restore_ms, Gbs(b, req->restore_ms), bus.h2d_gbs});
  }
}

}  // namespace primecache::model_bench

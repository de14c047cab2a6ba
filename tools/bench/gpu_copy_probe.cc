// primecache-gpu-probe: measures host<->device copy rates, pinned and pageable,
// so that restore and capture figures can be read against what the bus gives.
// Prints one line per (direction, memory kind) with the median and best GB/s,
// then the host-to-device cases of the daemon's device path (a registered
// file mapping, copied whole, in 8 MiB pieces and in chunks of 0.6 MiB one by
// one, batched or as one 2D copy).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace {

bool Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gpu-probe: %s: %s\n", what, cudaGetErrorString(err));
    return false;
  }
  return true;
}

struct Rate {
  double median_gbs, best_gbs;
};

Rate TimeCopies(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, int reps) {
  std::vector<double> gbs;
  for (int i = 0; i < reps + 1; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    cudaMemcpy(dst, src, bytes, kind);
    cudaDeviceSynchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) gbs.push_back(static_cast<double>(bytes) / s / 1e9);  // first one warms up
  }
  std::sort(gbs.begin(), gbs.end());
  return {gbs[gbs.size() / 2], gbs.back()};
}

// ---- Copies from a registered file mapping, the daemon's device path ----------
//
// The daemon copies restored chunks from segment files it maps read-only and
// registers with the driver (ipc/device_dma.cu). These cases measure that
// source against cudaMallocHost memory, and what the number of copies costs:
// a segment frame puts a 40-byte header before each chunk, so a layer's
// chunks are never byte-adjacent and cannot go as one plain copy.

struct MappedFile {
  void* data = MAP_FAILED;
  std::size_t bytes = 0;
  ~MappedFile() {
    if (data != MAP_FAILED) munmap(data, bytes);
  }
};

// A file of `bytes` in `dir`, written (so its pages are in the page cache),
// unlinked and mapped read-only.
bool MapFile(const std::string& dir, std::size_t bytes, MappedFile* m) {
  std::string path = dir + "/gpu-probe-XXXXXX";
  int fd = mkstemp(path.data());
  if (fd < 0) return false;
  unlink(path.c_str());
  std::vector<char> block(1 << 20, 7);
  bool ok = true;
  for (std::size_t done = 0; ok && done < bytes; done += block.size()) {
    ok = write(fd, block.data(), std::min(block.size(), bytes - done)) > 0;
  }
  if (ok) m->data = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  m->bytes = bytes;
  return ok && m->data != MAP_FAILED;
}

// One piece of a chunked copy: `bytes` from `src` to `dst`.
struct Piece {
  void* dst;
  const void* src;
  std::size_t bytes;
};

enum class Submit { kOneEach, kEventEach, kBatch, k2D, k2DThenOnDevice };

// What the chunked cases copy on: the copy stream with its events, and for
// k2DThenOnDevice a second stream that copies each 2D copy's bytes on the
// device once its event passed, as an engine takes an extent out of its
// device window (where the copies could contend for the copy engines).
// Made and let go as one.
struct CopyLanes {
  cudaStream_t copy = nullptr, on_device = nullptr;
  std::vector<cudaEvent_t> events = std::vector<cudaEvent_t>(64);
  std::byte* on_device_dst = nullptr;

  bool Make(std::size_t bytes) {
    for (cudaEvent_t& e : events) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    return Check(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking), "stream") &&
           Check(cudaStreamCreateWithFlags(&on_device, cudaStreamNonBlocking), "stream") &&
           Check(cudaMalloc(&on_device_dst, bytes), "cudaMalloc");
  }
  ~CopyLanes() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    cudaStreamDestroy(copy);
    cudaStreamDestroy(on_device);
    cudaFree(on_device_dst);
  }
};

// Submits the pieces on `lanes` the way `how` says and returns the seconds
// until the last one landed (with the seconds of submitting alone).
double TimePieces(const std::vector<Piece>& pieces, Submit how, CopyLanes& lanes, std::size_t src_pitch,
                  std::size_t rows, double* submit_s) {
  cudaStream_t s = lanes.copy;
  std::vector<cudaEvent_t>& events = lanes.events;
  auto t0 = std::chrono::steady_clock::now();
  if (how == Submit::kBatch) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    for (const Piece& p : pieces) dsts.push_back(p.dst), srcs.push_back(p.src), sizes.push_back(p.bytes);
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeHost;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    std::size_t idx = 0;
    Check(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), pieces.size(), &attr, &idx, 1, s), "batch copy");
  } else if (how == Submit::k2D || how == Submit::k2DThenOnDevice) {
    // The pieces have one size and lie at one pitch: `rows` of them a copy
    // (an extent's worth), each copy followed by an event as the daemon's.
    for (std::size_t i = 0; i < pieces.size(); i += rows) {
      const Piece& first = pieces[i];
      Check(cudaMemcpy2DAsync(first.dst, first.bytes, first.src, src_pitch, first.bytes,
                              std::min(rows, pieces.size() - i), cudaMemcpyHostToDevice, s),
            "2D copy");
      cudaEvent_t e = events[(i / rows) % events.size()];
      cudaEventRecord(e, s);
      if (how == Submit::k2DThenOnDevice) {
        const std::size_t n = std::min(rows, pieces.size() - i) * first.bytes;
        cudaStreamWaitEvent(lanes.on_device, e, 0);
        cudaMemcpyAsync(lanes.on_device_dst + i * first.bytes, first.dst, n, cudaMemcpyDeviceToDevice, lanes.on_device);
      }
    }
  } else {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      Check(cudaMemcpyAsync(pieces[i].dst, pieces[i].src, pieces[i].bytes, cudaMemcpyHostToDevice, s), "copy");
      if (how == Submit::kEventEach) cudaEventRecord(events[i % events.size()], s);
    }
  }
  *submit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cudaStreamSynchronize(s);
  if (how == Submit::k2DThenOnDevice) cudaStreamSynchronize(lanes.on_device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `count` pieces of `piece` bytes, `gap` bytes apart in the source, side by
// side in the destination.
std::vector<Piece> Pieces(std::byte* dst, const std::byte* src, std::size_t piece, std::size_t gap, std::size_t count) {
  std::vector<Piece> out;
  for (std::size_t i = 0; i < count; ++i) out.push_back({dst + i * piece, src + i * (piece + gap), piece});
  return out;
}

void ProbeMapped(const std::string& dir, std::size_t mib, int reps, void* dev) {
  const std::size_t bytes = mib << 20;
  MappedFile m;
  if (!MapFile(dir, bytes + (8 << 20), &m) ||
      !Check(cudaHostRegister(m.data, m.bytes, cudaHostRegisterReadOnly), "register the mapping")) {
    std::printf("gpu-probe: no registered file mapping in %s; mapped cases skipped\n", dir.c_str());
    return;
  }
  CopyLanes lanes;
  if (!lanes.Make(bytes)) {
    cudaHostUnregister(m.data);
    return;
  }
  struct Case {
    const char* name;
    const void* src;
    std::size_t piece, gap;
    Submit how;
    std::size_t rows = 0;  // k2D: pieces a copy (0: all)
  };
  const std::size_t chunk = 600 << 10;  // the glm5-class model's chunk
  const Case cases[] = {
      {"mapped, one copy", m.data, bytes, 0, Submit::kOneEach},
      {"mapped, 8 MiB copies", m.data, 8 << 20, 0, Submit::kOneEach},
      {"mapped, 0.6 MiB copies", m.data, chunk, 40, Submit::kOneEach},
      {"mapped, 0.6 MiB copies + event", m.data, chunk, 40, Submit::kEventEach},
      {"mapped, 0.6 MiB batched", m.data, chunk, 40, Submit::kBatch},
      {"mapped, 0.6 MiB as one 2D", m.data, chunk, 40, Submit::k2D},
      {"mapped, 0.6 MiB as 2D of 13 rows", m.data, chunk, 40, Submit::k2D, 13},
      {"mapped, 0.6 MiB as 2D of 26 rows", m.data, chunk, 40, Submit::k2D, 26},
      {"mapped, 2D of 13 rows, then on device", m.data, chunk, 40, Submit::k2DThenOnDevice, 13},
  };
  for (const Case& c : cases) {
    auto pieces = Pieces(static_cast<std::byte*>(dev), static_cast<const std::byte*>(c.src), c.piece, c.gap,
                         bytes / c.piece);
    std::size_t moved = 0;
    for (const Piece& p : pieces) moved += p.bytes;
    std::vector<double> gbs, submit_us;
    for (int i = 0; i < reps + 1; ++i) {
      double submit = 0;
      double t = TimePieces(pieces, c.how, lanes, c.piece + c.gap, c.rows == 0 ? pieces.size() : c.rows, &submit);
      if (i == 0) continue;  // warms up
      gbs.push_back(static_cast<double>(moved) / t / 1e9);
      submit_us.push_back(submit * 1e6 / static_cast<double>(pieces.size()));
    }
    std::sort(gbs.begin(), gbs.end());
    std::sort(submit_us.begin(), submit_us.end());
    std::printf("gpu-probe: h2d %-31s %5zu pieces  median %6.2f GB/s  best %6.2f GB/s  submit %5.2f us a piece\n",
                c.name, pieces.size(), gbs[gbs.size() / 2], gbs.back(), submit_us[submit_us.size() / 2]);
  }
  cudaHostUnregister(m.data);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measure pinned and pageable host<->device copy rates"};
  std::size_t mib = 256;
  int reps = 5;
  app.add_option("--mib", mib, "bytes per copy, in MiB")->check(CLI::Range(1, 16384));
  app.add_option("--reps", reps, "timed copies per case")->check(CLI::Range(1, 1000));
  std::string dir = ".";
  app.add_option("--dir", dir, "where the mapped cases' file is written (unlinked at once)");
  CLI11_PARSE(app, argc, argv);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu-probe: no CUDA device; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  if (!Check(cudaGetDeviceProperties(&prop, 0), "device properties")) return 1;
  std::printf("gpu-probe: device 0: %s, %.1f GiB, sm_%d%d\n", prop.name,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30), prop.major, prop.minor);

  const std::size_t bytes = mib << 20;
  void* dev = nullptr;
  void* pinned = nullptr;
  if (!Check(cudaMalloc(&dev, bytes), "cudaMalloc")) return 1;
  if (!Check(cudaMallocHost(&pinned, bytes), "cudaMallocHost")) return 1;
  std::vector<char> pageable(bytes);
  std::memset(pinned, 1, bytes);
  std::memset(pageable.data(), 1, bytes);  // touch every page

  struct Case {
    const char* name;
    void* dst;
    const void* src;
    cudaMemcpyKind kind;
  } cases[] = {
      {"h2d pinned", dev, pinned, cudaMemcpyHostToDevice},
      {"h2d pageable", dev, pageable.data(), cudaMemcpyHostToDevice},
      {"d2h pinned", pinned, dev, cudaMemcpyDeviceToHost},
      {"d2h pageable", pageable.data(), dev, cudaMemcpyDeviceToHost},
  };
  std::printf("gpu-probe: %zu MiB per copy, %d timed copies each\n", mib, reps);
  for (const Case& c : cases) {
    Rate r = TimeCopies(c.dst, c.src, bytes, c.kind, reps);
    std::printf("gpu-probe: %-13s median %6.2f GB/s  best %6.2f GB/s\n", c.name, r.median_gbs, r.best_gbs);
  }
  ProbeMapped(dir, mib, reps, dev);
  if (!Check(cudaGetLastError(), "copies")) return 1;
  cudaFreeHost(pinned);
  cudaFree(dev);
  return 0;
}

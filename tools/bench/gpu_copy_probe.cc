// primecache-gpu-probe: measures host<->device copy rates, pinned and pageable,
// so that restore and capture figures can be read against what the bus gives.
// Prints one line per (direction, memory kind) with the median and best GB/s.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measure pinned and pageable host<->device copy rates"};
  std::size_t mib = 256;
  int reps = 5;
  app.add_option("--mib", mib, "bytes per copy, in MiB")->check(CLI::Range(1, 16384));
  app.add_option("--reps", reps, "timed copies per case")->check(CLI::Range(1, 1000));
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
  if (!Check(cudaGetLastError(), "copies")) return 1;
  cudaFreeHost(pinned);
  cudaFree(dev);
  return 0;
}

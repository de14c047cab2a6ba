// The engine's side of the DeviceDma test, in a process of its own (a CUDA
// IPC handle cannot be opened by the process that made it): allocates a
// zeroed device buffer, prints its PCI bus id and IPC handle, then answers
// "sum OFFSET LENGTH" with the XXH3-64 of those device bytes, until "quit".
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "primecache/checksum.h"

namespace {

int Die(const char* what, cudaError_t e) {
  std::printf("ERROR %s: %s\n", what, cudaGetErrorString(e));
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::size_t size = std::strtoull(argv[1], nullptr, 10);
  void* dev = nullptr;
  if (cudaError_t e = cudaMalloc(&dev, size); e != cudaSuccess) return Die("malloc", e);
  if (cudaError_t e = cudaMemset(dev, 0, size); e != cudaSuccess) return Die("memset", e);
  cudaIpcMemHandle_t h;
  if (cudaError_t e = cudaIpcGetMemHandle(&h, dev); e != cudaSuccess) return Die("handle", e);
  int device = 0;
  cudaGetDevice(&device);
  char bus[64] = {};
  if (cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof bus, device); e != cudaSuccess) return Die("bus id", e);
  std::printf("BUS %s\nHANDLE ", bus);
  for (std::size_t i = 0; i < sizeof h; ++i) std::printf("%02x", static_cast<unsigned char>(h.reserved[i]));
  std::printf("\n");
  std::fflush(stdout);
  std::string cmd;
  std::vector<std::byte> host;
  while (std::cin >> cmd && cmd == "sum") {
    std::size_t off = 0, len = 0;
    std::cin >> off >> len;
    if (off > size || len > size - off) return 3;
    host.resize(len);
    if (cudaError_t e = cudaMemcpy(host.data(), static_cast<char*>(dev) + off, len, cudaMemcpyDeviceToHost);
        e != cudaSuccess) {
      return Die("copy back", e);
    }
    std::printf("SUM %016llx\n", static_cast<unsigned long long>(primecache::Checksum64(host)));
    std::fflush(stdout);
  }
  cudaFree(dev);
  return 0;
}

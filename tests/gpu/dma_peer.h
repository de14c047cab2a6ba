// The engine's side of the device-copy tests: device_dma_peer (beside the
// test binary) in a process of its own, on two pipes. It exports a zeroed
// device buffer (its spec is read with ReadSpec) and answers checksums of
// ranges of it (Sum), so a test sees what landed in another process's memory.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "primecache/client.h"

namespace primecache::gpu_test {

using client::DeviceWindowSpec;

class Peer {
 public:
  explicit Peer(std::size_t size) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return;
    const std::string exe = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "device_dma_peer");
    const std::string arg = std::to_string(size);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      execl(exe.c_str(), exe.c_str(), arg.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~Peer() {
    if (to_ != nullptr) std::fputs("quit\n", to_), std::fclose(to_);
    if (from_ != nullptr) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  std::string Line() {
    char buf[512] = {};
    if (from_ == nullptr || std::fgets(buf, sizeof buf, from_) == nullptr) return "";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  // The spec the peer printed.
  bool ReadSpec(DeviceWindowSpec* spec, std::size_t size) {
    const std::string bus = Line(), handle = Line();
    if (bus.rfind("BUS ", 0) != 0 || handle.rfind("HANDLE ", 0) != 0) return false;
    spec->pci_bus_id = bus.substr(4);
    const std::string hex = handle.substr(7);
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
      spec->handle.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    spec->size = size;
    return true;
  }
  std::string Sum(std::size_t off, std::size_t len) {
    std::fprintf(to_, "sum %zu %zu\n", off, len);
    std::fflush(to_);
    return Line();
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

}  // namespace primecache::gpu_test

// The primecached binary the GPU tests start, for tests/ipc/daemon_harness.h:
// $PRIMECACHED, else one beside the test binary (tools/gpu-check ships the
// daemon there, in the bundle's bin/), else the build tree's. Include this
// before daemon_harness.h.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

inline std::string GpuTestDaemonBinary() {
  if (const char* env = std::getenv("PRIMECACHED")) return env;
  std::error_code ec;
  const auto beside = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "primecached";
  if (!ec && std::filesystem::exists(beside, ec)) return beside.string();
  return PRIMECACHED_BUILD_PATH;
}
#define PRIMECACHED_PATH GpuTestDaemonBinary()

// libFuzzer target: speculative round sequences (tests/engine/round_program.h
// says what a program is and what it checks). Any violation traps.
#include <cstdio>

#include "tests/engine/round_program.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto errors = primecache::engine::testing::RoundProgram().Run(data, size);
  if (!errors.empty()) {
    std::fprintf(stderr, "round program: %s\n", errors.front().c_str());
    __builtin_trap();
  }
  return 0;
}

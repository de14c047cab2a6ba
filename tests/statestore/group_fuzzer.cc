// libFuzzer target: group publish programs (tests/statestore/group_program.h
// says what a program is and what it checks). Any violation traps.
#include <cstdio>

#include "group_program.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto errors = primecache::store_test::GroupProgram().Run(data, size);
  if (!errors.empty()) {
    std::fprintf(stderr, "group program: %s\n", errors.front().c_str());
    __builtin_trap();
  }
  return 0;
}

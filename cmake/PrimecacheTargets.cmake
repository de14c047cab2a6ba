# Helpers shared by every component's CMakeLists.

# Fuzz targets need clang's libFuzzer runtime.
set(PRIMECACHE_HAVE_FUZZ OFF)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(PRIMECACHE_HAVE_FUZZ ON)
endif()

# Warnings as errors and the chosen sanitizers, for project code only.
function(primecache_target_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra>)
  if(PRIMECACHE_SANITIZE)
    list(JOIN PRIMECACHE_SANITIZE "," san)
    target_compile_options(${target} PRIVATE -fsanitize=${san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${san})
  endif()
endfunction()

# primecache_library(NAME SOURCES ... DEPS ...)
function(primecache_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  primecache_target_options(${name})
endfunction()

# primecache_gtest(NAME LABELS l1 l2 SOURCES ... DEPS ...): a gtest binary whose
# tests are registered one by one with ctest, carrying the given labels.
function(primecache_gtest name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS;SOURCES;DEPS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  primecache_target_options(${name})
  # Listing a binary's tests runs it once at ctest start; on a loaded
  # 2-core machine that has taken over gtest's default 5 s.
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 120
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
  if("gpu" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY PRIMECACHE_GPU_TESTS ${name})
  endif()
endfunction()

# primecache_gpu_bench(TARGET [ARGS...]): a program tools/gpu-check runs on the
# GPU machine after the GPU tests, with these arguments (@CSV_DIR@ in them
# becomes the runner's $OUT/csv, where benchmarks write their CSV figures).
function(primecache_gpu_bench target)
  list(JOIN ARGN " " args)
  set_property(GLOBAL APPEND PROPERTY PRIMECACHE_GPU_BENCHES "$<TARGET_FILE_NAME:${target}> ${args}")
  set_property(GLOBAL APPEND PROPERTY PRIMECACHE_GPU_BENCH_TARGETS ${target})
endfunction()

# primecache_gpu_bundle(TARGET): a program the GPU benchmarks need beside them
# (shipped by tools/gpu-check, not run by itself).
function(primecache_gpu_bundle target)
  set_property(GLOBAL APPEND PROPERTY PRIMECACHE_GPU_BENCH_TARGETS ${target})
endfunction()

# Writes gpu-manifest.txt in the build tree: what tools/gpu-check ships.
#   test <path>            a gtest binary labelled gpu
#   bench <path>           a benchmark binary
#   run <name> <args...>   a benchmark command line
function(primecache_write_gpu_manifest)
  get_property(tests GLOBAL PROPERTY PRIMECACHE_GPU_TESTS)
  get_property(bench_targets GLOBAL PROPERTY PRIMECACHE_GPU_BENCH_TARGETS)
  get_property(benches GLOBAL PROPERTY PRIMECACHE_GPU_BENCHES)
  set(content "")
  foreach(t IN LISTS tests)
    string(APPEND content "test $<TARGET_FILE:${t}>\n")
  endforeach()
  foreach(t IN LISTS bench_targets)
    string(APPEND content "bench $<TARGET_FILE:${t}>\n")
  endforeach()
  foreach(b IN LISTS benches)
    string(APPEND content "run ${b}\n")
  endforeach()
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/gpu-manifest.txt CONTENT "${content}")
endfunction()

# primecache_fuzzer(NAME SOURCES ... DEPS ... CORPUS dir RUNS n LABELS ...):
# a libFuzzer target, and a test that runs it for RUNS inputs from its seed corpus.
function(primecache_fuzzer name)
  cmake_parse_arguments(ARG "" "CORPUS;RUNS;COST" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_COST)
    set(ARG_COST 20)
  endif()
  if(NOT PRIMECACHE_HAVE_FUZZ)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  # "fuzzers" builds every fuzz target and nothing else (the fuzz preset's build).
  if(NOT TARGET fuzzers)
    add_custom_target(fuzzers)
  endif()
  add_dependencies(fuzzers ${name})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  primecache_target_options(${name})
  target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  set(work ${CMAKE_CURRENT_BINARY_DIR}/${name}-corpus)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
      $<TARGET_FILE:${name}> -runs=${ARG_RUNS} -seed=1 -max_len=65536 ${work} ${ARG_CORPUS})
  # COST: a fuzz run is among the longest tests; ctest starts the costliest
  # first, so a long one overlaps the many short ones instead of ending the
  # run alone (without it a clean CI run has no timings to go by).
  set_tests_properties(${name} PROPERTIES LABELS "fuzz;${ARG_LABELS}" TIMEOUT 600
    FIXTURES_REQUIRED ${name}-corpus COST ${ARG_COST})
  add_test(NAME ${name}-corpus-dir COMMAND ${CMAKE_COMMAND} -E make_directory ${work})
  set_tests_properties(${name}-corpus-dir PROPERTIES FIXTURES_SETUP ${name}-corpus LABELS "fuzz;${ARG_LABELS}")
endfunction()

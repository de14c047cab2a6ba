#!/usr/bin/env bash
# Proves that the thread-safety check cannot silently stop working: the
# probe's correct case (CASE 0) passes and each planted violation (CASE 1..5)
# fails, both through the project's clang-tidy configuration (what tools/lint
# runs: .clang-tidy's ExtraArgs and WarningsAsErrors) and through clang++
# with -Wthread-safety -Wthread-safety-beta -Werror.
# Usage: thread_safety_check.sh SOURCE_DIR CLANG_TIDY CLANGXX
set -uo pipefail
src="$1" tidy="$2" cxx="$3"
probe="$src/tests/core/thread_safety_probe.cc"
flags=(-std=c++20 -I"$src" -I"$src/include")
fail=0
for case in 0 1 2 3 4 5; do
  # clang-tidy reads tests/.clang-tidy, which inherits the project's.
  out=$("$tidy" --quiet "$probe" -- "${flags[@]}" -DCASE=$case 2>&1)
  tidy_rc=$?
  cxx_out=$("$cxx" -fsyntax-only -Wthread-safety -Wthread-safety-beta -Werror "${flags[@]}" -DCASE=$case "$probe" 2>&1)
  cxx_rc=$?
  if [ "$case" = 0 ]; then
    if [ $tidy_rc -ne 0 ] || [ $cxx_rc -ne 0 ]; then
      echo "FAIL: the correct probe is rejected (clang-tidy $tidy_rc, clang++ $cxx_rc):"
      printf '%s\n' "$out" "$cxx_out"
      fail=1
    fi
  else
    if [ $tidy_rc -eq 0 ] || ! grep -q 'clang-diagnostic-thread-safety' <<<"$out"; then
      echo "FAIL: planted violation $case passes the lint's clang-tidy (rc $tidy_rc):"
      printf '%s\n' "$out"
      fail=1
    fi
    if [ $cxx_rc -eq 0 ] || ! grep -q 'Wthread-safety' <<<"$cxx_out"; then
      echo "FAIL: planted violation $case compiles under -Wthread-safety -Werror"
      fail=1
    fi
  fi
done
[ $fail -eq 0 ] && echo "thread-safety check: the correct probe passes, 5 planted violations fail"
exit $fail

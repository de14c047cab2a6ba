#!/usr/bin/env bash
# tools/lint-lengths, the file-length rule of tools/lint: a planted 601-line
# library file fails it (named with its length), 600 lines pass, tests are
# exempt, a listed file passes only with a reason and only while it is long;
# and the real tree passes.
set -euo pipefail
src="$1"
lint="$src/tools/lint-lengths"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
lines() { yes 'int x;' | head -n "$1" || true; }

mkdir -p "$tmp/ipc" "$tmp/tools" "$tmp/include/primecache"
lines 600 > "$tmp/ipc/at_bound.cc"
lines 700 > "$tmp/ipc/long_test.cc"  # a test: exempt
"$lint" --root "$tmp" >/dev/null || fail "600 lines and a long test were refused"

lines 601 > "$tmp/include/primecache/planted.h"
if "$lint" --root "$tmp" 2>"$tmp/err"; then fail "a 601-line header passed"; fi
grep -q '^include/primecache/planted.h: 601 lines' "$tmp/err" || fail "the offender was not named: $(cat "$tmp/err")"

echo 'include/primecache/planted.h   planted by the test' > "$tmp/tools/lint-long-files.txt"
"$lint" --root "$tmp" >/dev/null || fail "a listed file was refused"

echo 'include/primecache/planted.h' > "$tmp/tools/lint-long-files.txt"
if "$lint" --root "$tmp" 2>/dev/null; then fail "an entry without a reason passed"; fi

printf '%s\n' 'include/primecache/planted.h   planted' 'ipc/at_bound.cc   not long' > "$tmp/tools/lint-long-files.txt"
if "$lint" --root "$tmp" 2>"$tmp/err"; then fail "a listed file under the bound passed"; fi
grep -q 'ipc/at_bound.cc: 600 lines, no longer over' "$tmp/err" || fail "the stale entry was not named"

"$lint" --root "$src" || fail "the tree itself is over the bound"
echo "lint_lengths: ok"

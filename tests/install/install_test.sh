#!/usr/bin/env bash
# The install tree and its users (ctest label install): installs the build
# into a temporary prefix, checks what went where, builds tests/install/consumer
# against that prefix through the CMake package (shared and static) and
# through pkg-config, starts the installed primecached and runs each build of
# the consumer against it, then stops the daemon.
#
#   install_test.sh BUILD_DIR CONSUMER_SOURCE_DIR LIBDIR
set -euo pipefail
build=$1 consumer_src=$2 libdir=$3

work=$(mktemp -d "${TMPDIR:-/tmp}/primecache-install.XXXXXX")
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then kill -KILL "$daemon_pid"; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

prefix=$work/prefix
echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }

for f in bin/primecached bin/primecachectl bin/primecache-run include/primecache/client.h \
         "$libdir/libprimecache_client.a" "$libdir/libprimecache_client.so" \
         "$libdir/cmake/primecache/primecacheConfig.cmake" "$libdir/cmake/primecache/primecacheConfigVersion.cmake" \
         "$libdir/pkgconfig/primecache.pc" share/primecache/configs/hrm-tiny.json; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done
# What is installed is what is public, and the folder says which
# (docs/DEVELOPING.md, "Public headers"): the installed headers are exactly
# include/primecache's top level, and each compiles on its own against the
# installed tree (so none reaches into include/primecache/internal/).
src_headers=$(cd "$consumer_src/../../../include/primecache" && ls -- *.h | sort | tr '\n' ' ')
inst_headers=$(cd "$prefix/include/primecache" && ls | sort | tr '\n' ' ')
[ "$src_headers" = "$inst_headers" ] || fail "installed headers ($inst_headers) are not include/primecache's top level ($src_headers)"
for h in $inst_headers; do
  printf '#include <primecache/%s>\n' "$h" | c++ -std=c++20 -fsyntax-only -Wall -Werror -x c++ -I"$prefix/include" - \
    || fail "primecache/$h does not compile on its own against the installed tree"
done
so=$prefix/$libdir/libprimecache_client.so
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" == libprimecache_client.so.* ]] || fail "shared client has SONAME '$soname'"
[ -e "$prefix/$libdir/$soname" ] || fail "no $soname beside the library"
# Only primecache's own symbols are exported: not the Cap'n Proto, kj, fmt
# or xxhash code linked into it.
exported=$(nm -DC --defined-only "$so")
grep -q 'primecache::client::Client::Connect' <<<"$exported" || fail "Client::Connect is not exported"
if leaked=$(grep -E '^[0-9a-f]+ [A-Za-z] ((kj|capnp|fmt|spdlog)::|XXH)' <<<"$exported"); then
  fail "exported: $(head -3 <<<"$leaked")"
fi

echo "== consumer through the CMake package"
cmake -S "$consumer_src" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" || { cat "$work/configure.log"; fail "configure"; }
cmake --build "$work/consumer" -j 2 || fail "build against the CMake package"

echo "== consumer through pkg-config"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
pc_libdir=$(pkg-config --variable=libdir primecache)
[ "$(realpath "$pc_libdir")" = "$(realpath "$prefix/$libdir")" ] || fail "primecache.pc's libdir is $pc_libdir"
# shellcheck disable=SC2046  # pkg-config's words are meant to split
c++ -std=c++20 -Wall -Werror "$consumer_src/main.cc" -o "$work/consumer-pc" \
    $(pkg-config --cflags --libs primecache) -Wl,-rpath,"$pc_libdir" || fail "build through pkg-config"

echo "== the installed daemon"
data=$work/data sock=$work/d.sock admin=$work/a.sock
"$prefix/bin/primecached" --data-dir "$data" --socket "$sock" --admin-socket "$admin" \
    --ready-file "$work/ready" --device-copies off 2>"$work/daemon.log" &
daemon_pid=$!
for _ in $(seq 300); do [ -e "$work/ready" ] && break; kill -0 "$daemon_pid" || break; sleep 0.1; done
[ -e "$work/ready" ] || { cat "$work/daemon.log"; fail "the installed daemon did not start"; }

for c in "$work/consumer/primecache-consumer" "$work/consumer/primecache-consumer-static" "$work/consumer-pc"; do
  echo "== $(basename "$c")"
  "$c" "$sock" "$admin" || fail "$(basename "$c") against the daemon"
done
# (ldd's output is read whole first: grep -q may stop reading early, and
# pipefail would count ldd's SIGPIPE as a failure.)
loads=$(ldd "$work/consumer/primecache-consumer")
grep -q "$prefix/$libdir/$soname" <<<"$loads" || fail "consumer does not load $soname"
budget=$("$prefix/bin/primecachectl" --data-dir "$data" --socket "$admin" stats --json |
         python3 -c 'import json,sys; print(json.load(sys.stdin)["capacity_bytes"])')
[ "$budget" = $((3 << 30)) ] || fail "primecachectl stats shows capacity $budget"

kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "the daemon exited with status $?"
daemon_pid=""
echo "install_test: ok"

#!/usr/bin/env bash
# Checks packaging/systemd/primecached.service with systemd-analyze verify:
# every directive known, every command present. The unit names the installed
# daemon; the copy checked here names the built one in its place. Then
# systemd-sysusers applies the sysusers.d file to a scratch root: the user
# and group the unit runs as come out of it.
#
#   verify_unit.sh UNIT INSTALLED_BIN_DIR BUILT_DAEMON_DIR SYSUSERS_FILE
set -euo pipefail
unit=$1 bindir=$2 built=$3 sysusers=$4
if ! command -v systemd-analyze >/dev/null; then
  echo "verify_unit: SKIP: systemd-analyze is not installed (Debian package systemd; tools/setup installs it)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/primecache-unit.XXXXXX")
trap 'rm -rf "$work"' EXIT
sed "s|$bindir/primecached|$built/primecached|g" "$unit" >"$work/primecached.service"
grep -q "^ExecStart=$built/primecached " "$work/primecached.service" || { echo "verify_unit: no ExecStart of $bindir/primecached"; exit 1; }
# verify prints a line for each problem (an unknown key is only a warning
# with exit status 0): any output fails the test.
out=$(systemd-analyze verify "$work/primecached.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "$out"; exit 1; fi
grep -q '^Type=notify$' "$unit"
mkdir -p "$work/root/etc"
systemd-sysusers --root="$work/root" "$(realpath "$sysusers")" >/dev/null
grep -q '^primecache:x:[0-9]*:[0-9]*:.*:/var/lib/primecache:' "$work/root/etc/passwd" || { echo "verify_unit: no primecache user"; exit 1; }
grep -q '^primecache:x:' "$work/root/etc/group" || { echo "verify_unit: no primecache group"; exit 1; }
version=$(systemd-analyze --version)
echo "verify_unit: ok (${version%%$'\n'*})"

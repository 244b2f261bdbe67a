#!/usr/bin/env bash
# Provide promtool (Prometheus's rule and config checker) for the tests, from Debian's
# prometheus package: downloaded and unpacked into a cache (never installed, so no
# Prometheus server is started). Idempotent and quick when present; fails loudly when it
# cannot be had.
#
#   scripts/promtool.sh        # prints promtool's path on its last line
set -euo pipefail

CACHE="${A2A_GATEWAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/a2a-gateway}/promtool"
TOOL="$CACHE/root/usr/bin/promtool"

die() { echo "promtool: ERROR: $*" >&2; exit 1; }

if command -v promtool >/dev/null; then
    command -v promtool
    exit 0
fi
command -v flock >/dev/null || die "flock not found (util-linux)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ ! -x "$TOOL" ]; then
    command -v apt-get >/dev/null || die "no promtool on PATH and no apt-get to fetch Debian's prometheus package"
    command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
    work="$(mktemp -d "$CACHE/download.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    echo "promtool: fetching Debian's prometheus package (promtool only is unpacked)" >&2
    (cd "$work" && apt-get download prometheus >&2) \
        || { apt-get update >&2 && (cd "$work" && apt-get download prometheus >&2); } \
        || die "apt-get download prometheus failed"
    rm -rf "$CACHE/root"
    dpkg-deb -x "$work"/prometheus_*.deb "$CACHE/root" || die "cannot unpack the prometheus package"
fi
"$TOOL" --version >&2 || die "$TOOL does not run"
echo "$TOOL"

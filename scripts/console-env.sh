#!/usr/bin/env bash
# Set up what the browser tests of the console need: console/node_modules (esbuild,
# playwright-core; `npm ci` from the lock file) and Debian's Chromium. Idempotent and quick
# when present: a stamp holds the lock file's sha256. Fails loudly when something cannot
# be installed.
#
#   scripts/console-env.sh        # prints the browser's path on its last line
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="$ROOT/console"
LOCK="$PKG/package-lock.json"
STAMP="$PKG/node_modules/.package-lock.sha256"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

die() { echo "console-env: ERROR: $*" >&2; exit 1; }

command -v node >/dev/null || die "node not found (install Node.js >= 20)"
command -v npm >/dev/null || die "npm not found"
command -v flock >/dev/null || die "flock not found (util-linux)"
mkdir -p "$ROOT/target"
exec 9>"$ROOT/target/.console-env.lock"
flock 9

want="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    (cd "$PKG" && npm ci --no-audit --no-fund --loglevel=error) >&2 \
        || die "npm ci in console/ failed"
    echo "$want" > "$STAMP"
fi

if [ ! -x "$CHROMIUM" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "console-env: installing Debian's chromium" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >&2 \
            || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >&2; } \
            || die "apt-get install chromium failed"
    else
        die "no browser at $CHROMIUM: install Debian's chromium (apt-get install chromium) or set CHROMIUM"
    fi
fi
"$CHROMIUM" --version >&2 || die "$CHROMIUM does not start"
echo "$CHROMIUM"

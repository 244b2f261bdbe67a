#!/usr/bin/env bash
# Set up the Node packages for the A2A interop tests (official @a2a-js/sdk as
# client and as reference agent) in tests/interop/js/node_modules. Idempotent:
# a stamp inside node_modules holds the sha256 of package-lock.json, so a
# repeat run is a no-op until the lock file changes. Works from any cwd.
#
#   scripts/interop-node.sh            # prints the package dir on its last line
#   NODE=/opt/node22/bin/node NPM=/opt/node22/bin/npm scripts/interop-node.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="$ROOT/tests/interop/js"
LOCK="$PKG/package-lock.json"
MODULES="$PKG/node_modules"
STAMP="$MODULES/.package-lock.sha256"
NODE_BIN="${NODE:-node}"
NPM_BIN="${NPM:-npm}"
MIN_NODE_MAJOR=20 # @a2a-js/sdk 1.3.0: engines.node >= 20

die() { echo "interop-node: ERROR: $*" >&2; exit 1; }

[ -f "$PKG/package.json" ] || die "missing $PKG/package.json"
[ -f "$LOCK" ] || die "missing $LOCK"
command -v "$NODE_BIN" >/dev/null || die "'$NODE_BIN' not found (install Node.js >= $MIN_NODE_MAJOR, or set NODE=...)"
command -v "$NPM_BIN" >/dev/null || die "'$NPM_BIN' not found (install npm, or set NPM=...)"
command -v flock >/dev/null || die "'flock' not found (util-linux)"

mkdir -p "$ROOT/target/interop"
# Serialise concurrent runs (e.g. two test jobs starting at once). The lock
# lives outside node_modules, which `npm ci` deletes.
exec 9>"$ROOT/target/interop/.node.lock"
flock 9

want="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    echo "interop node packages: $PKG"
    exit 0
fi

"$NODE_BIN" -e "process.exit(+process.versions.node.split('.')[0] < $MIN_NODE_MAJOR ? 1 : 0)" \
    || die "@a2a-js/sdk needs node >= $MIN_NODE_MAJOR; '$NODE_BIN' is $("$NODE_BIN" --version 2>&1)"

echo "interop-node: npm ci in $PKG" >&2
# `npm ci` installs exactly the lock file and removes node_modules first.
(cd "$PKG" && "$NPM_BIN" ci --no-audit --no-fund --loglevel=error >&2) \
    || die "npm ci failed in $PKG (see npm output above)"
(cd "$PKG" && "$NODE_BIN" --input-type=module -e "
    await import('@a2a-js/sdk');
    await import('@a2a-js/sdk/client');
    await import('@a2a-js/sdk/server');
    await import('@a2a-js/sdk/server/express');
    await import('express');
") || die "@a2a-js/sdk import smoke test failed"

echo "$want" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
echo "interop node packages: $PKG"

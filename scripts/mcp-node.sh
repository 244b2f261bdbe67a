#!/usr/bin/env bash
# Set up the MCP Inspector (npm, @modelcontextprotocol/inspector) for the MCP tests in
# tests/interop/mcp/inspector/node_modules. Idempotent: a stamp holds the lock file's sha256.
#
#   scripts/mcp-node.sh            # prints the inspector's path on its last line
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="$ROOT/tests/interop/mcp/inspector"
LOCK="$PKG/package-lock.json"
STAMP="$PKG/node_modules/.package-lock.sha256"
BIN="$PKG/node_modules/.bin/mcp-inspector"

die() { echo "mcp-node: ERROR: $*" >&2; exit 1; }

command -v node >/dev/null || die "node not found (install Node.js >= 20)"
command -v npm >/dev/null || die "npm not found"
command -v flock >/dev/null || die "flock not found (util-linux)"
mkdir -p "$ROOT/target"
exec 9>"$ROOT/target/.mcp-node.lock"
flock 9
want="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ] || [ ! -x "$BIN" ]; then
    echo "mcp-node: npm ci in $PKG" >&2
    (cd "$PKG" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed in $PKG"
    echo "$want" > "$STAMP"
fi
"$BIN" --version >&2 || die "$BIN does not run"
echo "$BIN"

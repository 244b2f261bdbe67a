#!/usr/bin/env bash
# Install buf (the protobuf tool whose `buf curl` calls gRPC servers through reflection) from
# the npm registry, for the tests that run examples/grpc/buf-curl.sh. Idempotent and shared
# by every clone on the machine (~/.cache/a2a-gateway/buf-VERSION); prints the binary's path
# on its last line.
set -euo pipefail
VERSION=1.75.0
CACHE="${A2A_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/a2a-gateway}/buf-$VERSION"
BIN="$CACHE/node_modules/.bin/buf"
die() { echo "buf: ERROR: $*" >&2; exit 1; }
command -v npm >/dev/null || die "'npm' not found (install Node.js and npm)"
command -v flock >/dev/null || die "'flock' not found (util-linux)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if ! "$BIN" --version >/dev/null 2>&1; then
    echo "buf: npm install @bufbuild/buf@$VERSION in $CACHE" >&2
    (cd "$CACHE" && npm install --no-save --no-audit --no-fund --loglevel=error \
        "@bufbuild/buf@$VERSION" >&2) || die "npm install @bufbuild/buf@$VERSION failed"
    "$BIN" --version >/dev/null || die "$BIN does not run"
fi
echo "$BIN"

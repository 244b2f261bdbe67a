#!/usr/bin/env bash
# Set up the Python venv for the A2A interop tests (official a2a-sdk as client
# and as reference agent). Idempotent: a stamp holding the sha256 of the
# requirements file makes a repeat run a no-op. Works from any cwd.
#
#   scripts/interop-venv.sh            # prints the python path on its last line
#   PYTHON=python3.12 scripts/interop-venv.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="$ROOT/tests/interop/requirements.txt"
OUT="$ROOT/target/interop"
VENV="$OUT/venv"
STAMP="$VENV/.requirements.sha256"
PY_BIN="$VENV/bin/python"
BASE_PY="${PYTHON:-python3}"

die() { echo "interop-venv: ERROR: $*" >&2; exit 1; }

[ -f "$REQ" ] || die "missing $REQ"
command -v "$BASE_PY" >/dev/null || die "'$BASE_PY' not found (set PYTHON=... to a python >= 3.10)"

mkdir -p "$OUT"
# Serialise concurrent runs (e.g. two test jobs starting at once).
exec 9>"$OUT/.venv.lock"
flock 9

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ -x "$PY_BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    echo "interop python: $PY_BIN"
    exit 0
fi

"$BASE_PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "a2a-sdk needs python >= 3.10; '$BASE_PY' is $("$BASE_PY" --version 2>&1)"

echo "interop-venv: creating $VENV" >&2
rm -rf "$VENV"
"$BASE_PY" -m venv "$VENV" \
    || die "'$BASE_PY -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"

echo "interop-venv: installing $REQ" >&2
"$PY_BIN" -m pip install --disable-pip-version-check --no-input -q -r "$REQ" \
    || die "pip install -r $REQ failed"
"$PY_BIN" -m pip check --disable-pip-version-check >&2 \
    || die "installed packages are inconsistent (pip check)"
"$PY_BIN" -c 'import a2a.client, a2a.server.routes, a2a.compat.v0_3.jsonrpc_transport, uvicorn, sse_starlette' \
    || die "a2a-sdk import smoke test failed"

echo "$want" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
echo "interop python: $PY_BIN"

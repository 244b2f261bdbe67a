#!/usr/bin/env bash
# Set up the Python venv for the A2A interop tests (official a2a-sdk as client
# and as reference agent). Idempotent: a stamp holding the sha256 of the
# requirements file makes a repeat run a no-op. Works from any cwd.
#
#   scripts/interop-venv.sh            # prints the python path on its last line
#   PYTHON=python3.12 scripts/interop-venv.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/venv-lib.sh
source "$ROOT/scripts/venv-lib.sh"
ensure_venv interop-venv "$ROOT/tests/interop/requirements.txt" "$ROOT/target/interop" 10 \
    'import a2a.client, a2a.server.routes, a2a.utils.signing, jwcrypto.jws, rfc8785, a2a.compat.v0_3.jsonrpc_transport, a2a.client.transports.grpc, grpc, uvicorn, sse_starlette'
echo "interop python: $PY_BIN"

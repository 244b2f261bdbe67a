#!/usr/bin/env bash
# Set up the Python venv of the a2a-sdk 0.3.x upstream agent (tests/interop/sdk03_agent.py).
# Idempotent: a stamp holding the sha256 of the requirements file makes a repeat run a
# no-op. Works from any cwd.
#
#   scripts/sdk03-venv.sh            # prints the python path on its last line
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/venv-lib.sh
source "$ROOT/scripts/venv-lib.sh"
ensure_venv sdk03-venv "$ROOT/tests/interop/sdk03/requirements.txt" "$ROOT/target/sdk03" 10 \
    'import a2a.server.apps, a2a.server.request_handlers, a2a.grpc.a2a_pb2_grpc, grpc, uvicorn'
echo "sdk03 python: $PY_BIN"

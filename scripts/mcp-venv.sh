#!/usr/bin/env bash
# Set up the Python venv of the MCP tests' client (the official MCP Python SDK,
# tests/interop/mcp_client.py). Idempotent: made once per machine, then linked.
#
#   scripts/mcp-venv.sh            # prints the python path on its last line
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/venv-lib.sh
source "$ROOT/scripts/venv-lib.sh"
ensure_venv mcp-venv "$ROOT/tests/interop/mcp/requirements.txt" "$ROOT/target/mcp" 10 \
    'from mcp import Client, StdioServerParameters; from mcp.client.streamable_http import streamable_http_client; import openapi_spec_validator'
echo "mcp python: $PY_BIN"
echo "$PY_BIN"

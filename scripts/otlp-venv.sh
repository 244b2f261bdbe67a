#!/usr/bin/env bash
# Set up the Python venv of the OTLP receiver the trace tests export to
# (tests/interop/otlp_receiver.py). Idempotent: made once per machine, then linked.
#
#   scripts/otlp-venv.sh            # prints the python path on its last line
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/venv-lib.sh
source "$ROOT/scripts/venv-lib.sh"
ensure_venv otlp-venv "$ROOT/tests/interop/otlp/requirements.txt" "$ROOT/target/otlp" 10 \
    'from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc; import grpc'
echo "otlp python: $PY_BIN"
echo "$PY_BIN"

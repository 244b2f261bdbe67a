#!/usr/bin/env bash
# Offline validation of deploy/: the Kubernetes manifests against the Kubernetes schemas
# (kubernetes-validate, strict), the compose file, the Dockerfile and the systemd unit, and
# their agreement with each other and with the gateway's defaults (port, probe paths).
# Sets up (idempotently: a stamp holding the sha256 of the requirements file makes a repeat
# run quick) a venv under target/deploy-check/, then runs tests/deploy/check_deploy.py.
# Works from any cwd. A missing prerequisite fails loudly; nothing is skipped silently.
#
#   scripts/deploy-check.sh PORT HEALTH_PATH READY_PATH METRICS_PATH [CHECKER OPTIONS...]
#   scripts/deploy-check.sh 8080 /a2a/health /a2a/ready /metrics
#   scripts/deploy-check.sh 8080 /a2a/health /a2a/ready /metrics \
#       --gateway-bin target/debug/a2a-gateway     # also `a2a-gateway check` every config
#   PYTHON=python3.12 scripts/deploy-check.sh ...
# Checker options: python3 tests/deploy/check_deploy.py --help
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHECKER="$ROOT/tests/deploy/check_deploy.py"

die() { echo "deploy-check: ERROR: $*" >&2; exit 1; }

[ "$#" -ge 4 ] || die "usage: $0 PORT HEALTH_PATH READY_PATH METRICS_PATH [checker options...]"
PORT="$1" HEALTH="$2" READY="$3" METRICS="$4"
shift 4
[ -f "$CHECKER" ] || die "missing $CHECKER"

# tomllib (the checker reads gateway.toml) is in the standard library from 3.11.
# shellcheck source=scripts/venv-lib.sh
source "$ROOT/scripts/venv-lib.sh"
ensure_venv deploy-check "$ROOT/tests/deploy/requirements.txt" "$ROOT/target/deploy-check" 11 \
    'import kubernetes_validate, yaml, tomllib'

exec "$PY_BIN" "$CHECKER" --port "$PORT" --health-path "$HEALTH" --ready-path "$READY" \
    --metrics-path "$METRICS" "$@"

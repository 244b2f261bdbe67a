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
REQ="$ROOT/tests/deploy/requirements.txt"
CHECKER="$ROOT/tests/deploy/check_deploy.py"
OUT="$ROOT/target/deploy-check"
VENV="$OUT/venv"
STAMP="$VENV/.requirements.sha256"
PY_BIN="$VENV/bin/python"
BASE_PY="${PYTHON:-python3}"

die() { echo "deploy-check: ERROR: $*" >&2; exit 1; }

[ "$#" -ge 4 ] || die "usage: $0 PORT HEALTH_PATH READY_PATH METRICS_PATH [checker options...]"
PORT="$1" HEALTH="$2" READY="$3" METRICS="$4"
shift 4

[ -f "$REQ" ] || die "missing $REQ"
[ -f "$CHECKER" ] || die "missing $CHECKER"
command -v "$BASE_PY" >/dev/null || die "'$BASE_PY' not found (set PYTHON=... to a python >= 3.11)"
command -v flock >/dev/null || die "'flock' not found (util-linux)"

mkdir -p "$OUT"
# Serialise concurrent runs (e.g. two test jobs starting at once).
exec 9>"$OUT/.venv.lock"
flock 9

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if ! { [ -x "$PY_BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; }; then
    # tomllib (the checker reads gateway.toml) is in the standard library from 3.11.
    "$BASE_PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "the checker needs python >= 3.11; '$BASE_PY' is $("$BASE_PY" --version 2>&1)"

    echo "deploy-check: creating $VENV" >&2
    rm -rf "$VENV"
    "$BASE_PY" -m venv "$VENV" \
        || die "'$BASE_PY -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"

    echo "deploy-check: installing $REQ" >&2
    "$PY_BIN" -m pip install --disable-pip-version-check --no-input -q -r "$REQ" \
        || die "pip install -r $REQ failed"
    "$PY_BIN" -m pip check --disable-pip-version-check >&2 \
        || die "installed packages are inconsistent (pip check)"
    "$PY_BIN" -c 'import kubernetes_validate, yaml, tomllib' \
        || die "kubernetes-validate / PyYAML import smoke test failed"

    echo "$want" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
fi
exec 9>&-   # the venv is ready: release the lock

exec "$PY_BIN" "$CHECKER" --port "$PORT" --health-path "$HEALTH" --ready-path "$READY" \
    --metrics-path "$METRICS" "$@"

#!/usr/bin/env bash
# Set up the Python venv for the third-party interop peers: LiteLLM's proxy
# (tests/interop/litellm_proxy.py) and pydantic-ai's A2A server through FastA2A
# (tests/interop/fasta2a_agent.py). Idempotent: a stamp holding the sha256 of the
# requirements file makes a repeat run a no-op. Works from any cwd. A first run
# downloads and installs ~120 packages (about 2 minutes, ~0.8 GB).
#
#   scripts/thirdparty-venv.sh            # prints the python path on its last line
#   PYTHON=python3.12 scripts/thirdparty-venv.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/venv-lib.sh
source "$ROOT/scripts/venv-lib.sh"
# The smoke test imports the proxy app as the wrapper does, offline (no fetch of
# the model cost map, no .env); that import alone takes ~15 s, so only on install.
LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_MODE=PRODUCTION \
ensure_venv thirdparty-venv "$ROOT/tests/interop/thirdparty/requirements.txt" "$ROOT/target/thirdparty" 11 \
    'import fasta2a, fasta2a.pydantic_ai, pydantic_ai, pydantic_ai.models.function, uvicorn, litellm, prisma.errors, litellm.proxy.proxy_server'
echo "thirdparty python: $PY_BIN"

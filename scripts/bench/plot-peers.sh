#!/usr/bin/env bash
# Draws the peer comparison's pictures from a `scripts/bench.sh peers` run's figures:
#   scripts/bench/plot-peers.sh FIGURES_DIR IMAGE_DIR
# matplotlib lives in a venv of its own (target/bench/venv), made on first use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/target/bench/venv"
if ! "$VENV/bin/python" -c 'import matplotlib' 2> /dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet 'matplotlib>=3.8,<4'
fi
mkdir -p "$2"
MPLBACKEND=Agg "$VENV/bin/python" "$ROOT/scripts/bench/plot_peers.py" "$1" "$2"

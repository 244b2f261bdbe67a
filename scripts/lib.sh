# Shared by bench.sh and soak.sh (sourced, not run): a scratch folder and the processes
# started, both cleaned up on exit, and small helpers for loopback servers.
TMP="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"; }
trap cleanup EXIT

need_wrk() { command -v wrk >/dev/null || { echo "$1: wrk is required (apt-get install wrk)" >&2; exit 1; }; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_up URL [SECONDS]: until URL answers (10 s by default).
wait_up() { for _ in $(seq $(( ${2:-10} * 20 ))); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done; echo "$1 never came up" >&2; exit 1; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

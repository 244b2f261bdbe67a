#!/usr/bin/env bash
# Load benchmark for the gateway core (a benchmark, not a test: numbers vary per machine).
#
#   scripts/bench.sh            # DURATION=10s CONNECTIONS=50 WORKERS=2 by default
#
# 1. Throughput: A2A 1.0 SendMessage to the echo agent through the gateway, against a bare
#    actix-web handler returning a fixed JSON-RPC result (examples/bare_jsonrpc.rs), in the
#    same run, and the ratio. Targets: >= 0.70x.
# 2. Memory per stored completed task (one-line message): RSS growth / tasks stored, with the
#    store sized to keep every task. Target: < 4 KiB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DURATION="${DURATION:-10s}"
CONNECTIONS="${CONNECTIONS:-50}"
WORKERS="${WORKERS:-2}"
WRK_THREADS="${WRK_THREADS:-2}"
LUA="$ROOT/scripts/bench/send_message.lua"

command -v wrk >/dev/null || { echo "bench: wrk is required (apt-get install wrk)" >&2; exit 1; }
cargo build --release --quiet --bin a2a-gateway --example bare_jsonrpc
BIN="$ROOT/target/release/a2a-gateway"
BARE="$ROOT/target/release/examples/bare_jsonrpc"

TMP="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done; echo "bench: $1 never came up" >&2; exit 1; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
rps() { awk '/Requests\/sec/ {print $2}'; }

start_gateway() { # port [max_tasks]
    printf 'default_agent = "echo"\n[limits]\nmax_tasks = %s\n' "${2:-100000}" > "$TMP/gateway-$1.toml"
    A2A_GATEWAY_LOG=warn "$BIN" serve --config "$TMP/gateway-$1.toml" --agents-dir "$ROOT/agents.d" \
        --port "$1" --workers "$WORKERS" > "$TMP/gw-$1.log" 2>&1 &
    PIDS+=($!)
    wait_up "http://127.0.0.1:$1/a2a/health"
}

echo "== throughput: SendMessage, $CONNECTIONS connections, $DURATION, $WORKERS workers =="
P_BARE=$(free_port); "$BARE" "127.0.0.1:$P_BARE" "$WORKERS" & PIDS+=($!)
wait_up "http://127.0.0.1:$P_BARE/" || true
# Default store size: past 100k tasks every insert also evicts, the steady state.
P_GW=$(free_port); start_gateway "$P_GW"
run() { wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$LUA" "$1"; }
run "http://127.0.0.1:$P_BARE/" > /dev/null  # warm-up
bare_out=$(run "http://127.0.0.1:$P_BARE/")
gw_out=$(run "http://127.0.0.1:$P_GW/a2a/agents/echo")
bare=$(echo "$bare_out" | rps); gw=$(echo "$gw_out" | rps)
p99() { echo "$1" | awk '/ 99%/ {print $2}'; }
printf '%-34s %12s req/s  p99 %s\n' "bare actix-web handler" "$bare" "$(p99 "$bare_out")"
printf '%-34s %12s req/s  p99 %s\n' "gateway -> echo agent" "$gw" "$(p99 "$gw_out")"
awk -v g="$gw" -v b="$bare" 'BEGIN { printf "ratio gateway/bare: %.2fx (target >= 0.70x)\n", g / b }'

echo "== memory per stored completed task =="
P_MEM=$(free_port); start_gateway "$P_MEM" 100000000
GW_PID="${PIDS[-1]}"
wrk -t1 -c4 -d1s -s "$LUA" "http://127.0.0.1:$P_MEM/a2a/agents/echo" > /dev/null  # warm allocator
before_tasks=$(curl -s "http://127.0.0.1:$P_MEM/a2a/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tasks"])')
before_rss=$(rss_kib "$GW_PID")
wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"${MEM_DURATION:-5s}" -s "$LUA" "http://127.0.0.1:$P_MEM/a2a/agents/echo" > /dev/null
after_tasks=$(curl -s "http://127.0.0.1:$P_MEM/a2a/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tasks"])')
after_rss=$(rss_kib "$GW_PID")
awk -v r0="$before_rss" -v r1="$after_rss" -v t0="$before_tasks" -v t1="$after_tasks" 'BEGIN {
    n = t1 - t0; per = (r1 - r0) * 1024 / n
    printf "tasks stored: %d, RSS growth: %.1f MiB, per task: %.0f bytes (target < 4096)\n", n, (r1 - r0) / 1024, per }'

#!/usr/bin/env bash
# Instructions per echo request, counted by callgrind (repeatable where wall-clock
# benchmarks are not): the gateway on 1 worker takes N1 and then N2 SendMessage calls on one
# keep-alive connection, in two runs; the difference over N2 - N1 leaves start-up out. The
# clock calibration of the rate limiter's `quanta`, which varies from start to start, is
# subtracted.
#
#   scripts/callgrind.sh [BIN ...]     (default: target/release/a2a-gateway)
#
# Extra gateway.toml lines: GATEWAY_TOML (e.g. '[metrics]\nenabled = false'). Needs valgrind.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N1="${N1:-1000}"
N2="${N2:-4000}"
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 1; }
[ $# -gt 0 ] || set -- "$ROOT/target/release/a2a-gateway"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
printf 'default_agent = "echo"\n%b\n' "${GATEWAY_TOML:-}" > "$TMP/gw.toml"

# One run: the gateway under callgrind, N requests, then SIGTERM. Prints the instructions.
run() {
    local bin=$1 n=$2 port out
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    out="$TMP/cg.$n.$$"
    A2A_GATEWAY_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$bin" serve --config "$TMP/gw.toml" --agents-dir "$ROOT/agents.d" --port "$port" --workers 1 \
        > "$TMP/gw.log" 2>&1 &
    local pid=$!
    python3 - "$port" "$n" <<'PY'
import http.client, json, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(600):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60); c.request("GET", "/a2a/health"); c.getresponse().read(); break
    except OSError:
        time.sleep(0.1)
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
    "role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hello"}]}}})
headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}
for _ in range(n):
    c.request("POST", "/a2a/agents/echo", body, headers)
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
PY
    kill -TERM "$pid"; wait "$pid" || true
    local total calib
    total=$(grep -m1 '^summary:' "$out" | awk '{print $2}')
    calib=$(callgrind_annotate --inclusive=yes "$out" 2>/dev/null \
        | grep -m1 'quanta::Calibration::calibrate' | awk '{gsub(",","",$1); print $1}')
    echo $(( total - ${calib:-0} ))
}

for bin in "$@"; do
    a=$(run "$bin" "$N1"); b=$(run "$bin" "$N2")
    awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) -v bin="$bin" \
        'BEGIN { printf "%-60s %.1fk instructions per echo request\n", bin, (b - a) / n / 1000 }'
done

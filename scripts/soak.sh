#!/usr/bin/env bash
# Soak: mixed load against the release gateway for SOAK_SECS (default 600), printing its
# RSS, open descriptors, stored tasks and the error counts of every kind of client each
# minute, then whether RSS and descriptors ended flat (the last minute within 10% and 64
# descriptors of the second). Loopback only; every loop stops by itself.
#
#   scripts/soak.sh            (needs wrk and curl; builds the release binary)
#
# The load, all at once:
#   - keep-alive sends to the echo agent (wrk, 8 connections);
#   - sends to an upstream agent (a second gateway as the upstream), reconnecting per call;
#   - streamed sends and subscriptions that end, and streams the client drops midway;
#   - /delay tasks canceled from another connection;
#   - the command agent `shout` (a process per task);
#   - bad requests: broken JSON, unknown methods, wrong content types, oversized bodies,
#     unknown paths, silent connections.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SOAK_SECS="${SOAK_SECS:-600}"
source "$ROOT/scripts/lib.sh"
need_wrk soak
cargo build --release --quiet --bin a2a-gateway
BIN="$ROOT/target/release/a2a-gateway"

# The upstream: a gateway of its own serving the echo agent.
UP=$(free_port); mkdir -p "$TMP/up.d"; cp agents.d/echo.toml "$TMP/up.d/"
A2A_GATEWAY_LOG=warn "$BIN" serve --agents-dir "$TMP/up.d" --port "$UP" --config /dev/null > "$TMP/up.log" 2>&1 &
PIDS+=($!)
# The gateway under test: the shipped agents plus the upstream.
GW=$(free_port); mkdir -p "$TMP/gw.d"; cp agents.d/*.toml "$TMP/gw.d/"; cp -r agents.d/scripts "$TMP/gw.d/"
printf 'name = "far"\n[backend]\nkind = "a2a"\nurl = "http://127.0.0.1:%s/a2a/agents/echo"\nprotocol = "1.0"\n' "$UP" > "$TMP/gw.d/far.toml"
printf 'default_agent = "echo"\n[limits]\nmax_tasks = 20000\nheader_timeout_secs = 5\nbody_timeout_secs = 2\n' > "$TMP/gw.toml"
A2A_GATEWAY_LOG=warn "$BIN" serve --agents-dir "$TMP/gw.d" --port "$GW" --config "$TMP/gw.toml" > "$TMP/gw.log" 2>&1 &
GW_PID=$!; PIDS+=("$GW_PID")
wait_up "http://127.0.0.1:$UP/a2a/health"; wait_up "http://127.0.0.1:$GW/a2a/health"
BASE="http://127.0.0.1:$GW"
END=$(( $(date +%s) + SOAK_SECS ))

msg() { printf '{"jsonrpc":"2.0","id":1,"method":"%s","params":{"message":{"messageId":"m%s","role":"ROLE_USER","parts":[{"text":"%s"}]}%s}}' "$1" "$RANDOM$RANDOM" "$2" "${3:-}"; }
post() { curl -s -o /dev/null -w '%{http_code}\n' -m 10 -H 'A2A-Version: 1.0' "$@" || echo 000; }
json() { post -H 'content-type: application/json' "$@"; }
# loop NAME CMD...: runs CMD until the end, counting each status code it prints.
loop() {
    local name=$1; shift
    while [ "$(date +%s)" -lt "$END" ]; do "$@"; done > "$TMP/$name.codes" 2>/dev/null
}

wrk -t1 -c8 -d"${SOAK_SECS}s" -s scripts/bench/send_message.lua "$BASE/a2a/agents/echo" > "$TMP/wrk.out" 2>&1 &
PIDS+=($!)
upstream() { json -d "$(msg SendMessage "far away")" "$BASE/a2a/agents/far"; }
loop upstream upstream & PIDS+=($!)
streamed() { curl -sN -m 10 -o /dev/null -w '%{http_code}\n' -H 'A2A-Version: 1.0' -H 'content-type: application/json' -d "$(msg SendStreamingMessage "one two three")" "$BASE/a2a/agents/greeter" || echo 000; }
loop streams streamed & PIDS+=($!)
dropped() { curl -sN -m 1 -o /dev/null -H 'A2A-Version: 1.0' -H 'content-type: application/json' -d "$(msg SendStreamingMessage "/delay 5 dropped")" "$BASE/a2a/agents/echo" || true; echo drop; }
loop dropped dropped & PIDS+=($!)
cancel() {
    local id
    id=$(curl -s -m 10 -H 'A2A-Version: 1.0' -H 'content-type: application/json' -d "$(msg SendMessage "/delay 5 x" ',"configuration":{"returnImmediately":true}')" "$BASE/a2a/agents/echo" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["task"]["id"])' 2>/dev/null) || { echo 000; return; }
    json -d "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"CancelTask\",\"params\":{\"id\":\"$id\"}}" "$BASE/a2a/agents/echo"
}
loop cancels cancel & PIDS+=($!)
command_agent() { json -d "$(msg SendMessage "shout this")" "$BASE/a2a/agents/shout"; }
loop command command_agent & PIDS+=($!)
bad() {
    json -d '{"jsonrpc":' "$BASE/a2a/agents/echo"
    json -d '{"jsonrpc":"2.0","id":1,"method":"Nope"}' "$BASE/a2a"
    post -H 'content-type: text/plain' -d 'x' "$BASE/a2a/agents/echo"
    head -c 1100000 /dev/zero | tr '\0' 'a' | json --data-binary @- "$BASE/a2a/agents/echo"
    json -d '{}' "$BASE/no/such/path"
    # A connection that says nothing: the gateway closes it after header_timeout_secs.
    python3 -c "import socket; s=socket.create_connection(('127.0.0.1', $GW)); s.settimeout(10); print('silent-closed' if s.recv(1) == b'' else 'silent-answered')" 2>/dev/null || echo silent-open
}
loop bad bad & PIDS+=($!)

counts() { for f in "$TMP"/*.codes; do printf '%s:' "$(basename "$f" .codes)"; sort "$f" | uniq -c | awk '{printf " %s=%s", $2, $1}'; printf '  '; done; }
rss() { rss_kib "$GW_PID"; }
fds() { ls "/proc/$GW_PID/fd" | wc -l; }
printf 'minute  RSS(MiB)  fds  tasks  errors so far (status=count per client)\n'
first_rss=0; first_fds=0; minute=0
while [ "$(date +%s)" -lt "$END" ]; do
    sleep 60; minute=$((minute + 1))
    r=$(rss); f=$(fds)
    t=$(curl -s "$BASE/a2a/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tasks"])' 2>/dev/null || echo "?")
    printf '%6d  %8.1f  %3d  %5s  %s\n' "$minute" "$(echo "$r / 1024" | bc -l)" "$f" "$t" "$(counts)"
    if [ "$minute" -eq 2 ]; then first_rss=$r; first_fds=$f; fi
    last_rss=$r; last_fds=$f
done
wait_for_loops=5; sleep "$wait_for_loops"
echo "wrk: $(grep -E 'Requests/sec|Non-2xx|Socket errors' "$TMP/wrk.out" | tr -s ' ' | tr '\n' ';')"
curl -sf "$BASE/a2a/health" > /dev/null && echo "health: ok after the soak" || { echo "health: FAILED after the soak"; exit 1; }
if [ "$first_rss" -gt 0 ]; then
    awk -v a="$first_rss" -v b="$last_rss" -v fa="$first_fds" -v fb="$last_fds" 'BEGIN {
        flat = (b <= a * 1.10) && (fb <= fa + 64)
        printf "RSS minute 2 -> last: %.1f -> %.1f MiB; descriptors %d -> %d: %s\n", a/1024, b/1024, fa, fb, flat ? "flat" : "GROWING"
        exit flat ? 0 : 1 }'
fi

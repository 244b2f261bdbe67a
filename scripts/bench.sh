#!/usr/bin/env bash
# Load benchmarks (benchmarks, not tests: absolute numbers vary with the machine and its
# neighbours, so every figure is a ratio against a baseline measured in the same run).
#
#   scripts/bench.sh [core|proxy|grpc|tls|auth|streams|burst|agents|ops|otel|policy|store|peers|all]  (default: all)
#
# core    SendMessage to the echo agent through the gateway vs a bare actix-web handler
#         returning a fixed result (examples/bare_jsonrpc.rs), and the same gateway with a
#         store small enough to stay in cache (max_tasks 1000: what the store at capacity
#         costs); then vs the handler that also parses the request (target >= 0.75x); the
#         same for a message the agent runs as a scheduled execution ("/delay 0"); memory
#         per stored task.
# proxy   SendMessage through the gateway to a fast upstream (bare_jsonrpc) vs a plain
#         pooled actix+reqwest forwarder (examples/plain_forwarder.rs) to the same upstream;
#         then p99 latency at a fixed moderate rate: direct, via forwarder, via gateway.
# grpc    SendMessage to the echo agent over gRPC vs over JSON-RPC, the same gateway and one
#         load client for both (examples/loadgen.rs closed / grpc: a connection per client).
# tls     SendMessage to the echo agent over HTTPS ([server.tls], keep-alive: the handshake
#         once per connection) vs plain HTTP, the same build, in alternating rounds.
# auth    the core benchmark with auth off, with an API-key caller and with an RS256 JWT
#         caller (rate limiting on, with a tier too generous to refuse anything).
# streams SendStreamingMessage vs SendMessage latency at a fixed rate (RATE); then N SSE
#         streams (default 10000) held open through the gateway to an upstream gateway
#         over h2c; gateway memory per open stream.
# agents  AGENTS (10000) generated echo agents: SendMessage to the last agent vs the first
#         (target >= 0.95x), and the aggregated card asked for with gzip vs one agent's card
#         (target >= 0.15x).
# ops     the core benchmark with metrics off, on (the default; target >= 0.95x of off),
#         and on with the access log written (info, JSON, to a file).
# otel    the core benchmark with span export off, on at sample ratio 1.0 (to a local OTLP
#         sink that takes every batch), and on with the collector away (a closed port: every
#         span dropped and counted); target: export on >= 0.85x off.
# policy  the core benchmark with no policy and with one simple one (a deny rule on the
#         method, evaluated on every call and never holding); the difference in CPU time
#         per request (WORKERS cores busy / throughput).
# store   the echo benchmark with the memory, SQLite, Redis and PostgreSQL task stores
#         (targets: SQLite >= 0.9x memory, Redis >= 0.8x; SQLite adds < 0.1 ms to the
#         unloaded p50); memory per stored task in each. PostgreSQL: POSTGRES_URL (default
#         the local server's database test), in a schema of the run's own, dropped after.
# peers   the official A2A SDK servers (Python a2a-sdk, JavaScript @a2a-js/sdk; the interop
#         tests' echo agents) served directly and behind the gateway: throughput in ROUNDS
#         alternating rounds, then latency at a fixed rate (PEER_RATE_PY 100/s, PEER_RATE_JS
#         700/s: about a quarter of each one's most) and what the gateway adds at p50 and p99; draws docs/img/peers-*.png (PEERS_IMG) from the run's figures,
#         kept in target/bench/peers (PEERS_OUT).
# burst   BURST (500) bodies of 1 MiB held at once, then answered: the gateway's RSS before,
#         at its peak, and 5 s after (freed memory goes back to the system).
#
# core and proxy alternate baseline and gateway for ROUNDS rounds and report every round's
# ratio and their median: on a shared machine one round can be off by 10% either way.
#
# Knobs: DURATION (10s) CONNECTIONS (50) WORKERS (2) RATE (2000/s) STREAMS (10000) ROUNDS (3).
# BASELINE_BIN=path/to/an/older/a2a-gateway adds that build to the core and proxy rounds, so a
# change is measured before and after in the same run (build it from a git worktree).
# Needs wrk (apt-get install wrk).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECTION="${1:-all}"
DURATION="${DURATION:-10s}"
CONNECTIONS="${CONNECTIONS:-50}"
WORKERS="${WORKERS:-2}"
RATE="${RATE:-2000}"
STREAMS="${STREAMS:-10000}"
BURST="${BURST:-500}"
AGENTS="${AGENTS:-10000}"
ROUNDS="${ROUNDS:-3}"
LUA="$ROOT/scripts/bench/send_message.lua"
BODY="$ROOT/scripts/bench/send_message.json"

source "$ROOT/scripts/lib.sh"
need_wrk bench
cargo build --release --quiet --bin a2a-gateway --examples
BIN="$ROOT/target/release/a2a-gateway"
BASELINE_BIN="${BASELINE_BIN:-}"
EX="$ROOT/target/release/examples"

rps() { awk '/Requests\/sec/ {print $2}'; }
p99() { echo "$1" | awk '/ 99%/ {print $2}'; }
health() { curl -s "http://127.0.0.1:$1/a2a/health" | python3 -c "import json,sys; print(json.load(sys.stdin)[\"$2\"])"; }
wrk_run() { wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$LUA" "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# rounds LABEL URL [LABEL URL]...: the first URL is the baseline; each round runs them all
# in turn and prints req/s and p99; then each gateway's median ratio to the baseline. The
# baseline goes first in every round; the others take turns in the order they run, since
# the same binary measured twice ran ~1.5% faster second than first (an A/A run).
rounds() {
    local -a labels=() urls=()
    while [ $# -gt 0 ]; do labels+=("$1"); urls+=("$2"); shift 2; done
    local n=${#urls[@]} r i out rps0 rps_i
    local -a ratios=()
    for i in $(seq 0 $((n - 1))); do wrk -t2 -c"$CONNECTIONS" -d2s -s "$LUA" "${urls[$i]}" > /dev/null; done # warm-up
    for r in $(seq "$ROUNDS"); do
        local -a order=(0)
        if [ $((r % 2)) -eq 1 ]; then order+=($(seq 1 $((n - 1)))); else order+=($(seq $((n - 1)) -1 1)); fi
        for i in "${order[@]}"; do
            out=$(wrk_run "${urls[$i]}")
            rps_i=$(echo "$out" | rps)
            printf 'round %d  %-36s %10s req/s  p99 %s\n' "$r" "${labels[$i]}" "$rps_i" "$(p99 "$out")"
            if [ "$i" -eq 0 ]; then rps0=$rps_i; else ratios[$i]+="$(awk -v g="$rps_i" -v b="$rps0" 'BEGIN { printf "%.3f ", g / b }')"; fi
        done
    done
    for i in $(seq 1 $((n - 1))); do
        printf 'ratio %s / %s: rounds %s-> median %.2fx\n' "${labels[$i]}" "${labels[0]}" "${ratios[$i]}" \
            "$(echo "${ratios[$i]}" | tr ' ' '\n' | grep . | median)"
    done
}

# gateway PORT AGENTS_DIR [extra gateway.toml lines]; sets GW_PID. GW_BIN picks the binary.
gateway() {
    printf '%b\n' "${3:-}" > "$TMP/gw-$1.toml"
    A2A_GATEWAY_LOG=warn "${GW_BIN:-$BIN}" serve --config "$TMP/gw-$1.toml" --agents-dir "$2" \
        --port "$1" --workers "$WORKERS" > "$TMP/gw-$1.log" 2>&1 &
    GW_PID=$!; PIDS+=("$GW_PID")
    wait_up "${GW_SCHEME:-http}://127.0.0.1:$1/a2a/health"
}

bench_core() {
    echo "== core: SendMessage to the echo agent, $CONNECTIONS connections, $DURATION, $WORKERS workers =="
    local pb pg
    pb=$(free_port); "$EX/bare_jsonrpc" "127.0.0.1:$pb" "$WORKERS" & PIDS+=($!)
    wait_up "http://127.0.0.1:$pb/.well-known/agent-card.json"
    pg=$(free_port); gateway "$pg" "$ROOT/agents.d" 'default_agent = "echo"'
    local -a older=()
    if [ -n "$BASELINE_BIN" ]; then
        local po; po=$(free_port); GW_BIN="$BASELINE_BIN" gateway "$po" "$ROOT/agents.d" 'default_agent = "echo"'
        older=("baseline build -> echo agent" "http://127.0.0.1:$po/a2a/agents/echo")
    fi
    # The same gateway with a store small enough to stay in cache: how much of the ratio is
    # the store at capacity (every send evicts a task last touched 100,000 sends ago).
    local pc; pc=$(free_port); gateway "$pc" "$ROOT/agents.d" 'default_agent = "echo"\n[limits]\nmax_tasks = 1000'
    rounds "bare actix-web handler (fixed bytes)" "http://127.0.0.1:$pb/" \
        "gateway -> echo agent" "http://127.0.0.1:$pg/a2a/agents/echo" "${older[@]}" \
        "gateway, store in cache (max_tasks 1000)" "http://127.0.0.1:$pc/a2a/agents/echo"
    # The target is against the handler that parses the request: the anchor the instruction
    # budget uses too. The fixed-bytes rounds above are context: that handler reads
    # nothing of the request.
    echo "and against a baseline that parses the request and echoes its id:"
    rounds "bare JSON-RPC handler (parses)" "http://127.0.0.1:$pb/jsonrpc" \
        "gateway -> echo agent" "http://127.0.0.1:$pg/a2a/agents/echo"
    echo "(target >= 0.75x)"
    echo "and for a message the echo agent cannot answer at once (scheduled on its actor):"
    LUA="$ROOT/scripts/bench/send_message_scheduled.lua" rounds \
        "bare actix-web handler (fixed bytes)" "http://127.0.0.1:$pb/" \
        "gateway -> echo agent, /delay 0" "http://127.0.0.1:$pg/a2a/agents/echo"

    echo "== core: memory per stored completed task =="
    local pm before_t before_r after_t after_r
    pm=$(free_port); gateway "$pm" "$ROOT/agents.d" 'default_agent = "echo"\n[limits]\nmax_tasks = 100000000'
    wrk -t1 -c4 -d1s -s "$LUA" "http://127.0.0.1:$pm/a2a/agents/echo" > /dev/null
    before_t=$(health "$pm" tasks); before_r=$(rss_kib "$GW_PID")
    wrk -t2 -c"$CONNECTIONS" -d5s -s "$LUA" "http://127.0.0.1:$pm/a2a/agents/echo" > /dev/null
    after_t=$(health "$pm" tasks); after_r=$(rss_kib "$GW_PID")
    awk -v r0="$before_r" -v r1="$after_r" -v t0="$before_t" -v t1="$after_t" 'BEGIN {
        n = t1 - t0; printf "tasks stored: %d, RSS growth %.1f MiB, per task %.0f bytes (target < 4096)\n", n, (r1 - r0) / 1024, (r1 - r0) * 1024 / n }'
}

bench_proxy() {
    echo "== proxy: SendMessage to a fast upstream, $CONNECTIONS connections, $DURATION, $WORKERS workers each =="
    local pu pf pg agents
    pu=$(free_port); "$EX/bare_jsonrpc" "127.0.0.1:$pu" 1 & PIDS+=($!)
    wait_up "http://127.0.0.1:$pu/.well-known/agent-card.json"
    pf=$(free_port); "$EX/plain_forwarder" "127.0.0.1:$pf" "http://127.0.0.1:$pu/" "$WORKERS" & PIDS+=($!)
    agents="$TMP/proxy.d"; mkdir -p "$agents"
    printf 'name = "fast"\n[backend]\nkind = "a2a"\nurl = "http://127.0.0.1:%s"\n' "$pu" > "$agents/fast.toml"
    pg=$(free_port); gateway "$pg" "$agents"
    local -a older=()
    if [ -n "$BASELINE_BIN" ]; then
        local po; po=$(free_port); GW_BIN="$BASELINE_BIN" gateway "$po" "$agents"
        older=("baseline build (a2a backend)" "http://127.0.0.1:$po/a2a/agents/fast")
    fi
    rounds "plain actix+reqwest forwarder" "http://127.0.0.1:$pf/" \
        "gateway (a2a backend)" "http://127.0.0.1:$pg/a2a/agents/fast" "${older[@]}"
    echo "(target >= 1.05x)"

    echo "== proxy: latency at a fixed $RATE req/s for 10 s =="
    local h="A2A-Version:1.0" direct via_fwd via_gw
    direct=$("$EX/loadgen" rate "http://127.0.0.1:$pu/" "$BODY" "$RATE" 10 "$h")
    via_fwd=$("$EX/loadgen" rate "http://127.0.0.1:$pf/" "$BODY" "$RATE" 10 "$h")
    via_gw=$("$EX/loadgen" rate "http://127.0.0.1:$pg/a2a/agents/fast" "$BODY" "$RATE" 10 "$h")
    printf '%-20s %s\n' "direct" "$direct" "via forwarder" "$via_fwd" "via gateway" "$via_gw"
    local p_f p_g
    p_f=$(echo "$via_fwd" | sed -E 's/.*p99 ([0-9.]+)ms.*/\1/'); p_g=$(echo "$via_gw" | sed -E 's/.*p99 ([0-9.]+)ms.*/\1/')
    awk -v g="$p_g" -v f="$p_f" 'BEGIN { printf "p99 added by the gateway over the forwarder: %.2f ms (target < 1 ms)\n", g - f }'
}

bench_streams() {
    # A streamed call beside a unary one on the same gateway, at a fixed rate: a stream's
    # events and its closing chunk go out as written (TCP_NODELAY), rather than each waiting
    # for the client to acknowledge the write before it (delayed up to 40 ms).
    echo "== streams: SendStreamingMessage vs SendMessage to the echo agent, $RATE req/s for 10 s =="
    local pe h="A2A-Version:1.0" stream="$ROOT/scripts/bench/send_streaming_message.json"
    pe=$(free_port); gateway "$pe" "$ROOT/agents.d"
    printf '%-20s %s\n' "unary" "$("$EX/loadgen" rate "http://127.0.0.1:$pe/a2a/agents/echo" "$BODY" "$RATE" 10 "$h")" \
        "streamed" "$("$EX/loadgen" rate "http://127.0.0.1:$pe/a2a/agents/echo" "$stream" "$RATE" 10 "$h")"
    if [ -n "$BASELINE_BIN" ]; then
        local po; po=$(free_port); GW_BIN="$BASELINE_BIN" gateway "$po" "$ROOT/agents.d"
        printf '%-20s %s\n' "baseline, streamed" "$("$EX/loadgen" rate "http://127.0.0.1:$po/a2a/agents/echo" "$stream" "$RATE" 10 "$h")"
    fi

    echo "== streams: $STREAMS SSE streams held open through the gateway (upstream over h2c) =="
    local pu pg agents before after
    agents="$TMP/up.d"; mkdir -p "$agents"; cp "$ROOT/agents.d/echo.toml" "$agents/"
    pu=$(free_port)
    gateway "$pu" "$agents" "[limits]\nagent_max_concurrency = 50000\nagent_mailbox = 50000\nmax_open_streams = 50000"
    agents="$TMP/front.d"; mkdir -p "$agents"
    printf 'name = "relay"\n[backend]\nkind = "a2a"\nurl = "http://127.0.0.1:%s/a2a/agents/echo"\nhttp2 = true\n[limits]\nmax_concurrency = 50000\nmailbox = 50000\n' "$pu" > "$agents/relay.toml"
    pg=$(free_port)
    gateway "$pg" "$agents" "[limits]\nmax_open_streams = 15000"
    local front="$GW_PID"
    "$EX/loadgen" streams "http://127.0.0.1:$pg/a2a/agents/relay" "$ROOT/scripts/bench/hold_stream.json" 50 1 "A2A-Version:1.0" > /dev/null # warm-up
    sleep 1
    before=$(rss_kib "$front")
    "$EX/loadgen" streams "http://127.0.0.1:$pg/a2a/agents/relay" "$ROOT/scripts/bench/hold_stream.json" "$STREAMS" 30 "A2A-Version:1.0" > "$TMP/streams.out" &
    local lg=$!; PIDS+=("$lg")
    for _ in $(seq 600); do grep -q READY "$TMP/streams.out" 2>/dev/null && break; sleep 0.2; done
    sleep 2
    after=$(rss_kib "$front")
    local open fds
    open=$(health "$pg" openStreams); fds=$(ls "/proc/$front/fd" | wc -l)
    echo "$(cat "$TMP/streams.out"); gateway reports $open open streams, $fds descriptors"
    awk -v r0="$before" -v r1="$after" -v n="$open" 'BEGIN {
        printf "gateway RSS %.1f -> %.1f MiB: %.1f KiB per open stream (target < 20 KiB)\n", r0/1024, r1/1024, (r1 - r0) / n }'
    kill "$lg" 2>/dev/null || true
}

bench_auth() {
    echo "== auth: SendMessage to the echo agent, auth off vs API key vs RS256 JWT, $DURATION =="
    local off on token key="bench-api-key-0123456789"
    local sha; sha=$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)
    off=$(free_port); gateway "$off" "$ROOT/agents.d" 'default_agent = "echo"'
    on=$(free_port)
    gateway "$on" "$ROOT/agents.d" "default_agent = \"echo\"
[auth]
default_access = \"authenticated\"
[[auth.api_keys]]
id = \"bench\"
secret_sha256 = \"$sha\"
[[auth.jwt]]
id = \"bench\"
algorithm = \"RS256\"
public_key_file = \"$ROOT/tests/fixtures/jwt/rs256-public.pem\"
issuer = \"https://issuer.bench\"
audience = \"a2a-gateway\"
[rate_limits.tiers.default]
requests_per_minute = 1000000000
burst = 1000000000"
    token=$("$EX/mint_jwt" "$ROOT/tests/fixtures/jwt/rs256-private.pem" https://issuer.bench a2a-gateway '*')
    { cat "$LUA"; echo "wrk.headers[\"X-API-Key\"] = \"$key\""; } > "$TMP/key.lua"
    { cat "$LUA"; echo "wrk.headers[\"Authorization\"] = \"Bearer $token\""; } > "$TMP/jwt.lua"
    local url_off="http://127.0.0.1:$off/a2a/agents/echo" url_on="http://127.0.0.1:$on/a2a/agents/echo"
    wrk_run "$url_off" > /dev/null # warm-up
    local o k j
    o=$(wrk_run "$url_off" | rps)
    k=$(wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$TMP/key.lua" "$url_on" | rps)
    j=$(wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$TMP/jwt.lua" "$url_on" | rps)
    printf '%-40s %10s req/s\n' "auth off" "$o" "API key + rate limit" "$k" "RS256 JWT + rate limit" "$j"
    awk -v o="$o" -v k="$k" -v j="$j" 'BEGIN { printf "ratio API key/off: %.2fx, JWT/off: %.2fx (target >= 0.85x)\n", k / o, j / o }'
}

# agents_dir DIR N: N echo agents a00000..., each with a skill, as a large deployment has.
agents_dir() {
    mkdir -p "$1"
    python3 - "$1" "$2" <<'PY'
import pathlib, sys
d, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    (d / f"a{i:05d}.toml").write_text(
        f'name = "a{i:05d}"\ndescription = "Generated agent {i}"\n'
        f'[[skills]]\nid = "echo"\nname = "Echo {i}"\ndescription = "Echoes what it is sent"\n'
        f'tags = ["echo"]\nexamples = ["hello"]\n[backend]\nkind = "echo"\n')
PY
}

bench_agents() {
    echo "== agents: $AGENTS echo agents, $CONNECTIONS connections, $DURATION, $WORKERS workers =="
    local dir="$TMP/many.d" pg last
    agents_dir "$dir" "$AGENTS"
    last=$(printf 'a%05d' $((AGENTS - 1)))
    pg=$(free_port); gateway "$pg" "$dir"
    echo "gateway RSS with $AGENTS agents: $(( $(rss_kib "$GW_PID") / 1024 )) MiB"
    local -a older_send=() older_card=()
    if [ -n "$BASELINE_BIN" ]; then
        local po; po=$(free_port); GW_BIN="$BASELINE_BIN" gateway "$po" "$dir"
        older_send=("baseline build -> last agent" "http://127.0.0.1:$po/a2a/agents/$last")
        older_card=("baseline build, aggregated card (gzip)" "http://127.0.0.1:$po/.well-known/agent-card.json")
    fi
    rounds "gateway -> first agent" "http://127.0.0.1:$pg/a2a/agents/a00000" \
        "gateway -> last agent" "http://127.0.0.1:$pg/a2a/agents/$last"
    echo "(target >= 0.95x)"
    if [ -n "$BASELINE_BIN" ]; then
        rounds "baseline build -> first agent" "http://127.0.0.1:$po/a2a/agents/a00000" "${older_send[@]}"
    fi
    echo "aggregated card: $(curl -s -H 'Accept-Encoding: gzip' "http://127.0.0.1:$pg/.well-known/agent-card.json" | wc -c) bytes gzip, $(curl -s "http://127.0.0.1:$pg/.well-known/agent-card.json" | wc -c) plain"
    LUA="$ROOT/scripts/bench/get_gzip.lua" rounds \
        "one agent's card" "http://127.0.0.1:$pg/a2a/agents/a00000/card" \
        "aggregated card (gzip)" "http://127.0.0.1:$pg/.well-known/agent-card.json" "${older_card[@]}"
    echo "(target >= 0.15x)"
}

bench_burst() {
    echo "== burst: $BURST concurrent 1 MiB bodies, then idle: does memory go back? =="
    local pb
    pb=$(free_port)
    gateway "$pb" "$ROOT/agents.d" "default_agent = \"echo\"\n[limits]\nmax_body_bytes = 2000000\nmax_buffered_body_bytes = 2000000000\nmax_connections_per_ip = 100000"
    local before peak=0 after
    before=$(rss_kib "$GW_PID")
    python3 - "$pb" "$BURST" > "$TMP/burst.out" <<'PY' &
import socket, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
# A task id nobody has: read whole, answered, and nothing of it stored.
body = b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"' + b'x' * 1000000 + b'"}}'
head = b'POST /a2a/agents/echo HTTP/1.1\r\nhost: x\r\na2a-version: 1.0\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n' % len(body)
socks = [socket.create_connection(('127.0.0.1', port)) for _ in range(n)]
for s in socks:
    s.sendall(head + body[:-1])      # all but the last byte: every body held at once
for s in socks:
    s.sendall(body[-1:])
ok = sum(1 for s in socks if s.recv(12).startswith(b'HTTP/1.1 200'))
print(f'{ok} of {n} answered 200')
PY
    local client=$!
    while kill -0 "$client" 2>/dev/null; do
        local r; r=$(rss_kib "$GW_PID"); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.2
    done
    sleep 5
    after=$(rss_kib "$GW_PID")
    echo "$(cat "$TMP/burst.out"); gateway RSS before $((before / 1024)) MiB, peak $((peak / 1024)) MiB, 5 s after $((after / 1024)) MiB"
}

bench_ops() {
    echo "== ops: SendMessage to the echo agent with metrics off, on, and with the access log =="
    local poff pon plog
    poff=$(free_port); gateway "$poff" "$ROOT/agents.d" 'default_agent = "echo"\n[metrics]\nenabled = false'
    pon=$(free_port); gateway "$pon" "$ROOT/agents.d" 'default_agent = "echo"'
    plog=$(free_port)
    printf 'default_agent = "echo"\n' > "$TMP/gw-$plog.toml"
    A2A_GATEWAY_LOG=info "$BIN" serve --config "$TMP/gw-$plog.toml" --agents-dir "$ROOT/agents.d" \
        --port "$plog" --workers "$WORKERS" --log-format json > "$TMP/gw-$plog.log" 2>&1 &
    PIDS+=($!)
    wait_up "http://127.0.0.1:$plog/a2a/health"
    rounds "gateway, metrics off" "http://127.0.0.1:$poff/a2a/agents/echo" \
        "gateway, metrics on (default)" "http://127.0.0.1:$pon/a2a/agents/echo" \
        "gateway, metrics on + access log" "http://127.0.0.1:$plog/a2a/agents/echo"
    echo "(metrics on: target >= 0.95x of off)"
}

bench_otel() {
    echo "== otel: SendMessage to the echo agent with span export off, on (ratio 1.0), and on with the collector away =="
    local sink away poff pon paway
    sink=$(free_port); away=$(free_port)
    # The sink: answers every OTLP/HTTP export 200 and keeps nothing.
    python3 "$ROOT/scripts/bench/otlp_sink.py" "$sink" &
    PIDS+=($!)
    poff=$(free_port); gateway "$poff" "$ROOT/agents.d" 'default_agent = "echo"'
    pon=$(free_port); gateway "$pon" "$ROOT/agents.d" "default_agent = \"echo\"\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:$sink\""
    paway=$(free_port); gateway "$paway" "$ROOT/agents.d" "default_agent = \"echo\"\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:$away\""
    rounds "gateway, export off" "http://127.0.0.1:$poff/a2a/agents/echo" \
        "gateway, export on (ratio 1.0)" "http://127.0.0.1:$pon/a2a/agents/echo" \
        "gateway, export on, collector away" "http://127.0.0.1:$paway/a2a/agents/echo"
    echo "(target: export on >= 0.85x off)"
    echo "spans dropped with the collector away: $(curl -s "http://127.0.0.1:$paway/metrics" | awk '/^a2a_trace_spans_dropped_total/ {print $2}')"
}

bench_policy() {
    echo "== policy: SendMessage to the echo agent with no policy and with one =="
    local pnone pone out
    pnone=$(free_port); gateway "$pnone" "$ROOT/agents.d" 'default_agent = "echo"'
    pone=$(free_port); gateway "$pone" "$ROOT/agents.d" "default_agent = \"echo\"\n[[auth.policies]]\nid = \"no-cancel\"\neffect = \"deny\"\nwhen = \"a2a.method == 'CancelTask'\""
    out=$(rounds "gateway, no policy" "http://127.0.0.1:$pnone/a2a/agents/echo" \
        "gateway, one policy" "http://127.0.0.1:$pone/a2a/agents/echo")
    echo "$out"
    # An upper bound: wrk shares the machine's cores with the gateway.
    echo "$out" | awk -v w="$WORKERS" '/req\/s/ { for (i = 1; i <= NF; i++) if ($i == "req/s") v = $(i - 1)
            if (/no policy/) { n += v; cn++ } else { o += v; co++ } }
        END { a = w * 1e6 * cn / n; b = w * 1e6 * co / o
              printf "CPU per request (at most %d cores / throughput): no policy %.2f us, one policy %.2f us (%+.2f us)\n", w, a, b, b - a }'
}

# p50 PORT: the median latency of one connection sending one request at a time.
p50_unloaded() {
    wrk -t1 -c1 -d"$DURATION" --latency -s "$LUA" "http://127.0.0.1:$1/a2a/agents/echo" | awk '/ 50%/ {print $2}'
}

# per_task PORT: RSS growth per task stored by 5 s of load.
per_task() {
    local t0 r0 t1 r1
    t0=$(health "$1" tasks); r0=$(rss_kib "$2")
    wrk -t2 -c"$CONNECTIONS" -d5s -s "$LUA" "http://127.0.0.1:$1/a2a/agents/echo" > /dev/null
    t1=$(health "$1" tasks); r1=$(rss_kib "$2")
    awk -v r0="$r0" -v r1="$r1" -v t0="$t0" -v t1="$t1" 'BEGIN { n = t1 - t0; printf "%d tasks, %.0f bytes of gateway RSS per task", n, (r1 - r0) * 1024 / n }'
}

# redis_used: bytes Redis holds (INFO memory used_memory).
redis_used() { redis-cli -u "$REDIS_URL" info memory | awk -F: '/^used_memory:/ {print $2+0}'; }

bench_store() {
    echo "== store: SendMessage to the echo agent with each task store, $CONNECTIONS connections, $DURATION =="
    local REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}" prefix="a2a-bench-$$:"
    redis-cli -u "$REDIS_URL" ping > /dev/null || { echo "bench store: no Redis at $REDIS_URL (set REDIS_URL)" >&2; exit 1; }
    local pm ps pss pr pm_pid ps_pid pr_pid big='[limits]\nmax_tasks = 100000000'
    pm=$(free_port); gateway "$pm" "$ROOT/agents.d" "default_agent = \"echo\"\n$big"; pm_pid=$GW_PID
    ps=$(free_port); gateway "$ps" "$ROOT/agents.d" "default_agent = \"echo\"\n$big\n[store]\nkind = \"sqlite\"\ndata_dir = \"data-$ps\""; ps_pid=$GW_PID
    # durability = "sync": each answer waits for the group commit that holds it.
    pss=$(free_port); gateway "$pss" "$ROOT/agents.d" "default_agent = \"echo\"\n$big\n[store]\nkind = \"sqlite\"\ndurability = \"sync\"\ndata_dir = \"data-$pss\""
    pr=$(free_port); gateway "$pr" "$ROOT/agents.d" "default_agent = \"echo\"\n$big\n[store]\nkind = \"redis\"\nurl = \"$REDIS_URL\"\nkey_prefix = \"$prefix\""; pr_pid=$GW_PID
    local POSTGRES_URL="${POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}" pp pps pp_pid pps_pid pr2 pr2_pid
    psql "$POSTGRES_URL" -Atc "select 1" > /dev/null || { echo "bench store: no PostgreSQL at $POSTGRES_URL (set POSTGRES_URL)" >&2; exit 1; }
    pp=$(free_port); gateway "$pp" "$ROOT/agents.d" "default_agent = \"echo\"\n$big\n[store]\nkind = \"postgres\"\nurl = \"$POSTGRES_URL\"\nschema = \"a2a_bench_$pp\""; pp_pid=$GW_PID
    pps=$(free_port); gateway "$pps" "$ROOT/agents.d" "default_agent = \"echo\"\n$big\n[store]\nkind = \"postgres\"\ndurability = \"sync\"\nurl = \"$POSTGRES_URL\"\nschema = \"a2a_bench_$pps\""; pps_pid=$GW_PID
    # Shared by replicas (one here): answers wait for their batch, as with Redis.
    pr2=$(free_port); gateway "$pr2" "$ROOT/agents.d" "default_agent = \"echo\"\n$big\n[store]\nkind = \"postgres\"\nshared = true\nurl = \"$POSTGRES_URL\"\nschema = \"a2a_bench_$pr2\""; pr2_pid=$GW_PID
    rounds "memory store" "http://127.0.0.1:$pm/a2a/agents/echo" \
        "sqlite store" "http://127.0.0.1:$ps/a2a/agents/echo" \
        "sqlite store, sync" "http://127.0.0.1:$pss/a2a/agents/echo" \
        "redis store" "http://127.0.0.1:$pr/a2a/agents/echo" \
        "postgres store" "http://127.0.0.1:$pp/a2a/agents/echo" \
        "postgres store, sync" "http://127.0.0.1:$pps/a2a/agents/echo" \
        "postgres store, shared" "http://127.0.0.1:$pr2/a2a/agents/echo"
    echo "(targets: sqlite >= 0.9x memory, redis >= 0.8x memory)"
    echo "unloaded p50 (1 connection): memory $(p50_unloaded "$pm"), sqlite $(p50_unloaded "$ps"), sqlite sync $(p50_unloaded "$pss"), redis $(p50_unloaded "$pr"), postgres $(p50_unloaded "$pp"), postgres sync $(p50_unloaded "$pps"), postgres shared $(p50_unloaded "$pr2") (target: sqlite adds < 0.1 ms)"
    echo "postgres store: $(per_task "$pp" "$pp_pid"); $(psql "$POSTGRES_URL" -Atc "select pg_size_pretty(sum(pg_total_relation_size(c.oid))::bigint) || ' in the schema, ' || (sum(pg_total_relation_size(c.oid)) / greatest((select count(*) from a2a_bench_$pp.tasks), 1))::bigint || ' bytes per task' from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'a2a_bench_$pp' and c.relkind = 'r'")"
    echo "memory store: $(per_task "$pm" "$pm_pid")"
    echo "sqlite store: $(per_task "$ps" "$ps_pid"); database $(du -sh "$TMP/data-$ps" | cut -f1)"
    local r0 keys0 keys1 r1
    r0=$(redis_used); keys0=$(redis-cli -u "$REDIS_URL" --scan --pattern "${prefix}task:*" | wc -l)
    echo "redis store: $(per_task "$pr" "$pr_pid")"
    r1=$(redis_used); keys1=$(redis-cli -u "$REDIS_URL" --scan --pattern "${prefix}task:*" | wc -l)
    awk -v a="$r0" -v b="$r1" -v k0="$keys0" -v k1="$keys1" 'BEGIN { printf "redis store: %.0f bytes of Redis memory per task\n", (b - a) / (k1 - k0) }'
    # Only this run's keys and schemas (their gateways stop first: they hold the schemas).
    redis-cli -u "$REDIS_URL" --scan --pattern "${prefix}*" | xargs -r -n 1000 redis-cli -u "$REDIS_URL" del > /dev/null
    kill "$pp_pid" "$pps_pid" "$pr2_pid"; wait "$pp_pid" "$pps_pid" "$pr2_pid" 2>/dev/null || true
    psql "$POSTGRES_URL" -qc "set client_min_messages to warning; drop schema if exists a2a_bench_$pp cascade; drop schema if exists a2a_bench_$pps cascade; drop schema if exists a2a_bench_$pr2 cascade"
}

bench_grpc() {
    echo "== grpc: SendMessage to the echo agent over gRPC vs JSON-RPC, $CONNECTIONS clients, $DURATION, $WORKERS workers =="
    local pg pr secs r j g ratios=""
    pg=$(free_port); pr=$(free_port)
    gateway "$pg" "$ROOT/agents.d" "[server]\ngrpc_port = $pr"
    secs=${DURATION%s}
    "$EX/loadgen" grpc "127.0.0.1:$pr" "$ROOT/scripts/bench/send_message_grpc.json" "$CONNECTIONS" 2 > /dev/null # warm-up
    for r in $(seq "$ROUNDS"); do
        j=$("$EX/loadgen" closed "http://127.0.0.1:$pg/a2a/agents/echo" "$BODY" "$CONNECTIONS" "$secs" "A2A-Version:1.0" | awk '{print $2}')
        g=$("$EX/loadgen" grpc "127.0.0.1:$pr" "$ROOT/scripts/bench/send_message_grpc.json" "$CONNECTIONS" "$secs" | awk '{print $2}')
        printf 'round %d  JSON-RPC %10s req/s   gRPC %10s req/s\n' "$r" "$j" "$g"
        ratios+="$(awk -v g="$g" -v j="$j" 'BEGIN { printf "%.3f ", g / j }')"
    done
    printf 'ratio gRPC / JSON-RPC: rounds %s-> median %.2fx\n' "$ratios" "$(echo "$ratios" | tr ' ' '\n' | grep . | median)"
}

# peer PROGRAM SCRIPT: an official SDK's echo agent (A2A 1.0, JSON-RPC on /) on a free
# port; sets PEER_PORT.
peer() {
    local ready="$TMP/peer-$RANDOM"
    "$1" "$2" --port 0 --dialects 1.0 --ready-file "$ready" > "$ready.log" 2>&1 & PIDS+=($!)
    for _ in $(seq 600); do [ -s "$ready" ] && break; sleep 0.1; done
    PEER_PORT=$(cat "$ready" 2> /dev/null) || { echo "$2 did not start:" >&2; cat "$ready.log" >&2; exit 1; }
    wait_up "http://127.0.0.1:$PEER_PORT/.well-known/agent-card.json"
}

bench_peers() {
    echo "== peers: the official SDK servers (Python, JavaScript) served directly and behind the gateway, $CONNECTIONS connections, $DURATION, $WORKERS workers =="
    local out="${PEERS_OUT:-$ROOT/target/bench/peers}" py js pg agents name
    mkdir -p "$out"; rm -f "$out"/*.lat "$out/rounds.txt"
    bash "$ROOT/scripts/interop-venv.sh" > /dev/null
    bash "$ROOT/scripts/interop-node.sh" > /dev/null
    peer "$ROOT/target/interop/venv/bin/python" "$ROOT/tests/interop/echo_reference_agent.py"; py=$PEER_PORT
    peer node "$ROOT/tests/interop/js/echo_agent.mjs"; js=$PEER_PORT
    agents="$TMP/peers.d"; mkdir -p "$agents"
    for name in py js; do
        local port; [ "$name" = py ] && port=$py || port=$js
        printf 'name = "%s"\n[backend]\nkind = "a2a"\nurl = "http://127.0.0.1:%s/"\n' "$name" "$port" > "$agents/$name.toml"
    done
    pg=$(free_port); gateway "$pg" "$agents"
    # First, while the servers hold few tasks: both SDKs keep every task in memory, and
    # a heap of a few hundred thousand (Node after the rounds) stalls for ~400 ms at a time.
    # About a quarter of what each server takes at most: latency, not queueing.
    local rate_py="${PEER_RATE_PY:-100}" rate_js="${PEER_RATE_JS:-700}" h="A2A-Version:1.0" label url file rate line
    echo "== peers: latency at a fixed rate ($rate_py req/s Python, $rate_js req/s JavaScript) for 10 s, each request timed from its scheduled start =="
    while read -r file rate url label; do
        line=$(LATENCY_FILE="$out/$file.lat" "$EX/loadgen" rate "$url" "$BODY" "$rate" 10 "$h")
        printf '%-36s %s\n' "$label" "$line"
    done <<EOT
py-direct $rate_py http://127.0.0.1:$py/ Python SDK, direct
py-gateway $rate_py http://127.0.0.1:$pg/a2a/agents/py Python SDK, behind the gateway
js-direct $rate_js http://127.0.0.1:$js/ JavaScript SDK, direct
js-gateway $rate_js http://127.0.0.1:$pg/a2a/agents/js JavaScript SDK, behind the gateway
EOT
    local sdk at
    for sdk in py js; do
        for at in 50.0 99.0; do
            awk -v at="$at" -v sdk="$sdk" 'FNR == 1 { f++ } $1 == at { v[f] = $2 } END {
                printf "%s: the gateway adds %.2f ms at p%d\n", (sdk == "py" ? "Python SDK" : "JavaScript SDK"), v[2] - v[1], at }' \
                "$out/$sdk-direct.lat" "$out/$sdk-gateway.lat"
        done
    done
    {
        rounds "Python SDK, direct" "http://127.0.0.1:$py/" \
            "Python SDK, behind the gateway" "http://127.0.0.1:$pg/a2a/agents/py"
        rounds "JavaScript SDK, direct" "http://127.0.0.1:$js/" \
            "JavaScript SDK, behind the gateway" "http://127.0.0.1:$pg/a2a/agents/js"
    } | tee "$out/rounds.txt"

    "$ROOT/scripts/bench/plot-peers.sh" "$out" "${PEERS_IMG:-$ROOT/docs/img}"
}

bench_tls() {
    echo "== tls: SendMessage to the echo agent over HTTPS vs plain HTTP, $CONNECTIONS connections, $DURATION, $WORKERS workers =="
    local pp pt
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
        -addext subjectAltName=IP:127.0.0.1 -keyout "$TMP/tls.key" -out "$TMP/tls.crt" 2> /dev/null
    pp=$(free_port); gateway "$pp" "$ROOT/agents.d" 'default_agent = "echo"'
    pt=$(free_port)
    GW_SCHEME=https CURL_CA_BUNDLE="$TMP/tls.crt" gateway "$pt" "$ROOT/agents.d" \
        "default_agent = \"echo\"\n[server.tls]\ncert_file = \"$TMP/tls.crt\"\nkey_file = \"$TMP/tls.key\""
    rounds "gateway over HTTP" "http://127.0.0.1:$pp/a2a/agents/echo" \
        "gateway over HTTPS" "https://127.0.0.1:$pt/a2a/agents/echo"
}

case "$SECTION" in
    core) bench_core ;;
    tls) bench_tls ;;
    peers) bench_peers ;;
    grpc) bench_grpc ;;
    store) bench_store ;;
    ops) bench_ops ;;
    otel) bench_otel ;;
    policy) bench_policy ;;
    proxy) bench_proxy ;;
    streams) bench_streams ;;
    auth) bench_auth ;;
    burst) bench_burst ;;
    agents) bench_agents ;;
    all) bench_core; bench_ops; bench_store; bench_proxy; bench_grpc; bench_tls; bench_auth; bench_streams; bench_agents; bench_peers ;;
    *) echo "usage: scripts/bench.sh [core|proxy|grpc|tls|auth|streams|burst|agents|ops|otel|policy|store|peers|all]" >&2; exit 2 ;;
esac

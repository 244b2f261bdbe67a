#!/usr/bin/env bash
# Instructions per request, counted by callgrind: repeatable where wall-clock benchmarks are
# not (the same binary, inputs and environment give the same count on a busy machine).
#
#   scripts/callgrind.sh                 the gateway and its anchors, built from this tree
#   scripts/callgrind.sh --check FILE    the same, then fails when a figure is over its
#                                        budget in FILE (perf-budget.toml) by more than 2%,
#                                        after scaling it by its anchor (see the check)
#   scripts/callgrind.sh BIN [BIN ...]   only the gateway figures, for each binary given
#   ONLY=echo,echo_usage scripts/callgrind.sh ...   only the figures named
#
# Each figure: one server under callgrind on 1 worker takes N1 and then N2 calls on one
# keep-alive connection, in two runs (two at a time, one per core); the difference over N2 - N1
# leaves start-up and shut-down out. Every call must answer a result. What is measured:
#   bare        examples/bare_jsonrpc.rs /jsonrpc: actix-web parsing the JSON-RPC envelope
#               and writing a fixed result around its id (the anchor for the JSON-RPC paths)
#   bare_grpc   examples/bare_grpc.rs: a tonic unary handler decoding SendMessageRequest into
#               prost structs and answering a fixed message (the anchor for gRPC)
#   forwarder   examples/plain_forwarder.rs: actix-web and a pooled reqwest client relaying
#               to bare_jsonrpc (the anchor for relay)
#   echo        the gateway -> the echo agent (memory store, metrics on, no Origin, push off)
#   echo_sqlite, echo_redis   the same on the shipped gateway.toml's SQLite store, and on
#               the local Redis (a key prefix of the run's own, its keys deleted after)
#   echo_postgres   the same on the local PostgreSQL shared by replicas (`shared = true`;
#               a schema of the run's own, dropped after)
#   echo_grpc   SendMessage -> echo over gRPC (examples/loadgen.rs grpc-calls, its debug build)
#   echo_mcp    MCP tools/call of the echo tool, in one session (2025-11-25)
#   echo_otel   echo with every span exported over OTLP/HTTP (sample ratio 1.0) to a sink
#   echo_usage  echo with usage counted ([usage] enabled: every call tallied per caller,
#               agent and day, written to the store every second)
#   relay       the gateway -> a 1.0 upstream (bare_jsonrpc), relayed; relay_sqlite on SQLite
#   echo_policy with POLICY=1: echo with one simple policy (a deny rule on the method,
#               evaluated on every call and never holding); reported, not budgeted
# None of the measured configurations has a rate limit, so the rate limiter's clock
# (`quanta`), whose calibration at start varies from start to start, is never made. Needs
# valgrind (installed with apt-get when missing and run as root) and, for echo_redis, the
# Redis at 127.0.0.1:6379 with redis-cli; for echo_postgres, PostgreSQL at POSTGRES_URL
# (default postgres://postgres@127.0.0.1:5432/test) with psql.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N1="${N1:-1000}"
N2="${N2:-4000}"
TOLERANCE="${TOLERANCE:-0.02}"
CHECK=""
if [ "${1:-}" = "--check" ]; then CHECK="$2"; shift 2; fi

if ! command -v valgrind >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "callgrind: installing valgrind" >&2
        apt-get install -y -q valgrind >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q valgrind >/dev/null 2>&1; } \
            || { echo "callgrind: valgrind is required and could not be installed" >&2; exit 1; }
    else
        echo "callgrind: valgrind is required (apt-get install valgrind)" >&2; exit 1
    fi
fi

TMP="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

if [ $# -gt 0 ]; then
    BINS=("$@")
    ANCHORS=false
else
    (cd "$ROOT" && cargo build --release --quiet --bin a2a-gateway --example bare_jsonrpc --example bare_grpc --example plain_forwarder)
    BINS=("$ROOT/target/release/a2a-gateway")
    ANCHORS=true
fi
EX="$ROOT/target/release/examples"
# The gRPC calls' client runs outside callgrind, so its speed counts for nothing: the debug
# build (the one `cargo test` leaves; a release one adds a minute of linking to CI's run).
LOADGEN="$ROOT/target/debug/examples/loadgen"
(cd "$ROOT" && cargo build --quiet --example loadgen)

# The fixed-answer upstream the relays and the forwarder call (not under callgrind).
UP_PORT=$(free_port)
if [ ! -x "$EX/bare_jsonrpc" ]; then
    (cd "$ROOT" && cargo build --release --quiet --example bare_jsonrpc --example plain_forwarder)
fi
"$EX/bare_jsonrpc" "127.0.0.1:$UP_PORT" 1 > "$TMP/upstream.log" 2>&1 &
PIDS+=($!)

mkdir -p "$TMP/relay.d"
printf 'name = "fast"\n[backend]\nkind = "a2a"\nurl = "http://127.0.0.1:%s"\n' "$UP_PORT" > "$TMP/relay.d/fast.toml"

# The OTLP sink the spans go to (not under callgrind): answers every export 200.
SINK_PORT=$(free_port)
python3 "$ROOT/scripts/bench/otlp_sink.py" "$SINK_PORT" &
PIDS+=($!)

# The configurations, each a template: @RUN@ becomes the run's own directory (its SQLite
# file, its Redis key prefix) and @GRPC_PORT@ a free port, so two runs can go at once.
# The echo runs serve agents.d/ with echo as the default agent; the relays one agent.
sqlite='[store]\nkind = "sqlite"\ndata_dir = "@RUN@/data"\ncommit_interval_ms = 20'
redis='[store]\nkind = "redis"\nurl = "redis://127.0.0.1:6379/0"\nkey_prefix = "a2a-callgrind:@RUN@:"'
printf 'default_agent = "echo"\n' > "$TMP/echo.toml"
printf 'default_agent = "echo"\n%b\n' "$sqlite" > "$TMP/echo-sqlite.toml"
printf 'default_agent = "echo"\n%b\n' "$redis" > "$TMP/echo-redis.toml"
PG_URL="${POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
postgres="[store]\nkind = \"postgres\"\nurl = \"$PG_URL\"\nschema = \"@SCHEMA@\"\nshared = true"
printf 'default_agent = "echo"\n%b\n' "$postgres" > "$TMP/echo-postgres.toml"
printf 'default_agent = "echo"\n[usage]\nenabled = true\n' > "$TMP/echo-usage.toml"
printf 'default_agent = "echo"\n[server]\ngrpc_port = @GRPC_PORT@\n' > "$TMP/echo-grpc.toml"
printf 'default_agent = "echo"\n[telemetry]\notlp_endpoint = "http://127.0.0.1:%s"\nsample_ratio = 1.0\n' "$SINK_PORT" > "$TMP/echo-otel.toml"
printf 'default_agent = "echo"\n[[auth.policies]]\nid = "no-cancel"\neffect = "deny"\nwhen = "a2a.method == \x27CancelTask\x27"\n' > "$TMP/echo-policy.toml"
: > "$TMP/relay.toml"
printf '%b\n' "$sqlite" > "$TMP/relay-sqlite.toml"

# count KIND N PORT PATH PID: N calls once PORT answers (while PID, the server, lives).
# jsonrpc: `SendMessage` on one keep-alive connection; mcp: a session opened, then
# `tools/call` of the echo tool; grpc: `SendMessage` on one HTTP/2 connection. Each call
# must answer a result: an error is not a request measured.
count() {
    local kind=$1
    shift
    if [ "$kind" = grpc ]; then
        "$LOADGEN" grpc-calls "127.0.0.1:$2" "$ROOT/scripts/bench/send_message_grpc.json" "$1"
        return
    fi
    python3 - "$kind" "$2" "$1" "$3" "$4" <<'PY'
import http.client, json, os, sys, time
kind, port, n, path, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
    "role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hello"}]}}})
if kind == "mcp":
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "callgrind", "version": "1"}}})
c = None
for _ in range(1200):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", path, body, headers)
        r = c.getresponse(); data = r.read()
        if r.status == 200:
            # A JSON-RPC error travels with 200 too: only a result is a request measured.
            if b'"result"' not in data:
                sys.exit("the first call did not answer with a result: %r" % data[:300])
            break
    except OSError:
        pass
    if not os.path.exists("/proc/%d" % pid):
        sys.exit("the server exited before answering")
    time.sleep(0.1)
else:
    sys.exit("no answer on port %d" % port)
if kind == "mcp":
    headers["Mcp-Session-Id"] = r.getheader("mcp-session-id")
    c.request("POST", path, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}), headers)
    r = c.getresponse(); r.read()
    assert r.status == 202, r.status
    body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"message": "hello"}}})
for _ in range(n - 1):
    c.request("POST", path, body, headers)
    r = c.getresponse(); data = r.read()
    ok = r.status == 200 and b'"result"' in data and b'"isError":true' not in data
    assert ok, (r.status, data[:300])
PY
}

# run N KIND PATH CMD...: CMD under callgrind (@PORT@ and @GRPC_PORT@ in its arguments made
# free ports, a configuration template made the run's own), N calls, then SIGTERM; prints
# the instructions.
run() {
    local n=$1 kind=$2 path=$3; shift 3
    local port grpc_port target dir pid
    port=$(free_port); grpc_port=$(free_port)
    dir=$(mktemp -d "$TMP/run.XXXXXX")
    # A PostgreSQL schema of the run's own: lowercase letters, digits and _.
    local schema; schema="a2a_callgrind_$(tr 'A-Z' 'a-z' <<< "${dir##*.}")"
    local -a cmd=()
    for arg in "$@"; do
        arg=${arg//@PORT@/$port}; arg=${arg//@GRPC_PORT@/$grpc_port}
        if [[ $arg == "$TMP"/*.toml ]]; then
            sed "s|@RUN@|$dir|g; s|@GRPC_PORT@|$grpc_port|g; s|@SCHEMA@|$schema|g" "$arg" > "$dir/config.toml"
            arg="$dir/config.toml"
        fi
        cmd+=("$arg")
    done
    target=$port
    [ "$kind" = grpc ] && target=$grpc_port
    A2A_GATEWAY_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" "${cmd[@]}" > "$dir/server.log" 2>&1 &
    pid=$!
    if ! count "$kind" "$n" "$target" "$path" "$pid" >&2; then
        kill -TERM "$pid" 2>/dev/null || true
        cat "$dir/server.log" >&2
        return 1
    fi
    kill -TERM "$pid"; wait "$pid" || true
    # The run's Redis keys, and nothing else's.
    if grep -q 'kind = "redis"' "$dir/config.toml" 2>/dev/null; then
        redis-cli --scan --pattern "a2a-callgrind:$dir:*" | xargs -r redis-cli del > /dev/null
    fi
    # The run's schema, and nothing else's.
    if grep -q 'kind = "postgres"' "$dir/config.toml" 2>/dev/null; then
        local schema; schema=$(sed -n 's/^schema = "\(.*\)"$/\1/p' "$dir/config.toml")
        psql -q "$PG_URL" -c "SET client_min_messages TO warning; DROP SCHEMA IF EXISTS \"$schema\" CASCADE" > /dev/null
    fi
    grep -m1 '^summary:' "$dir/cg.out" | awk '{print $2}'
    rm -rf "$dir"
}

# figure NAME KIND PATH CMD...: schedules NAME's two runs (N1 and N2 calls); `collect`
# prints its instructions per request and keeps them for the check. Runs go two at a time
# (one on each core: callgrind counts the same either way) in the order scheduled, so a
# short run shares the machine with another figure's long one rather than with an idle core.
declare -A FIGURES
STEPS=()   # what `collect` prints, in order: figures, comparisons, binaries' names
LABEL=""   # the binary's number, where several are counted
RUNS=()
figure() {
    local name=$1 kind=$2 path=$3; shift 3
    [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$name,"* ]] || return 0
    STEPS+=("figure $LABEL$name")
    start "$TMP/$LABEL$name.a" "$N1" "$kind" "$path" "$@"
    start "$TMP/$LABEL$name.b" "$N2" "$kind" "$path" "$@"
}
# start OUT N KIND PATH CMD...: one run, in the background once fewer than two go; its
# count in OUT, and OUT.failed if it failed.
start() {
    local out=$1; shift
    while :; do
        local alive=() p
        for p in "${RUNS[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        RUNS=("${alive[@]}")
        [ ${#RUNS[@]} -lt 2 ] && break
        wait -n "${RUNS[@]}" || true
    done
    { run "$@" > "$out" || touch "$out.failed"; } &
    RUNS+=($!)
}
# more NAME BASE WHAT: NAME's cost over BASE's, as a percentage, once both are counted.
more() { STEPS+=("more $LABEL$1 $LABEL$2 $3"); }
collect() {
    [ ${#RUNS[@]} -eq 0 ] || wait "${RUNS[@]}" || true
    local step kind name base what a b
    for step in "${STEPS[@]}"; do
        read -r kind name base what <<< "$step"
        case $kind in
        binary) echo "$name" ;;
        figure)
            if [ -e "$TMP/$name.a.failed" ] || [ -e "$TMP/$name.b.failed" ]; then
                echo "callgrind: ${name#*:} failed" >&2; exit 1
            fi
            a=$(cat "$TMP/$name.a"); b=$(cat "$TMP/$name.b")
            [ -n "$a" ] && [ -n "$b" ] || { echo "callgrind: ${name#*:} counted nothing" >&2; exit 1; }
            FIGURES[$name]=$(( (b - a) / (N2 - N1) ))
            awk -v n="${name#*:}" -v v="${FIGURES[$name]}" 'BEGIN { printf "%-14s %7.1fk instructions per request\n", n, v / 1000 }'
            ;;
        more)
            [ -n "${FIGURES[$name]:-}" ] && [ -n "${FIGURES[$base]:-}" ] || continue
            awk -v x="${FIGURES[$name]}" -v e="${FIGURES[$base]}" -v w="$what" \
                'BEGIN { printf "%-14s %+7.1f%% instructions per request\n", w, (x - e) * 100 / e }'
            ;;
        esac
    done
}

if $ANCHORS; then
    figure bare jsonrpc /jsonrpc "$EX/bare_jsonrpc" "127.0.0.1:@PORT@" 1
    figure bare_grpc grpc / "$EX/bare_grpc" "127.0.0.1:@GRPC_PORT@"
    figure forwarder jsonrpc / "$EX/plain_forwarder" "127.0.0.1:@PORT@" "http://127.0.0.1:$UP_PORT/" 1
fi
for i in "${!BINS[@]}"; do
    bin=${BINS[$i]}
    if [ ${#BINS[@]} -gt 1 ]; then LABEL="$i:"; STEPS+=("binary $bin"); fi
    serve=("$bin" serve --agents-dir "$ROOT/agents.d" --workers 1 --port @PORT@ --config)
    figure echo jsonrpc /a2a/agents/echo "${serve[@]}" "$TMP/echo.toml"
    figure echo_sqlite jsonrpc /a2a/agents/echo "${serve[@]}" "$TMP/echo-sqlite.toml"
    figure echo_redis jsonrpc /a2a/agents/echo "${serve[@]}" "$TMP/echo-redis.toml"
    figure echo_postgres jsonrpc /a2a/agents/echo "${serve[@]}" "$TMP/echo-postgres.toml"
    figure echo_grpc grpc / "${serve[@]}" "$TMP/echo-grpc.toml"
    figure echo_mcp mcp /mcp "${serve[@]}" "$TMP/echo.toml"
    figure echo_otel jsonrpc /a2a/agents/echo "${serve[@]}" "$TMP/echo-otel.toml"
    figure echo_usage jsonrpc /a2a/agents/echo "${serve[@]}" "$TMP/echo-usage.toml"
    more echo_usage echo "usage counted"
    more echo_otel echo "spans exported"
    if [ "${POLICY:-0}" = 1 ]; then
        figure echo_policy jsonrpc /a2a/agents/echo "${serve[@]}" "$TMP/echo-policy.toml"
        more echo_policy echo "one policy"
    fi
    relay=("$bin" serve --agents-dir "$TMP/relay.d" --workers 1 --port @PORT@ --config)
    figure relay jsonrpc /a2a/agents/fast "${relay[@]}" "$TMP/relay.toml"
    figure relay_sqlite jsonrpc /a2a/agents/fast "${relay[@]}" "$TMP/relay-sqlite.toml"
done
collect
if $ANCHORS && [ -z "${ONLY:-}" ]; then
    awk -v e="${FIGURES[echo]}" -v s="${FIGURES[echo_sqlite]}" -v b="${FIGURES[bare]}" \
        -v r="${FIGURES[relay]}" -v f="${FIGURES[forwarder]}" \
        -v g="${FIGURES[echo_grpc]}" -v bg="${FIGURES[bare_grpc]}" \
        'BEGIN { printf "ratios         echo / bare %.2fx, echo_sqlite / bare %.2fx, relay / forwarder %.2fx, echo_grpc / bare_grpc %.2fx, echo_grpc / echo %.2fx\n", e / b, s / b, r / f, g / bg, g / e }'
fi
if [ -n "$CHECK" ]; then
    # The same binary counts differently on another CPU (glibc picks its memcpy, strlen
    # and the like for the CPU it runs on), and the anchors move with it. So each figure
    # is scaled by its anchor's budget over its anchor measured here, before it is
    # compared: a change of machine is not a regression, a change of code is.
    # (An anchor missing from FILE is left unscaled, not a failure of the script.)
    anchor_budget() { sed -n '/^\[anchors\]/,/^\[/p' "$CHECK" | { grep -E "^$1 *=" || true; } | sed 's/.*= *//; s/#.*//' | tr -d ' _'; }
    declare -A SCALE
    for a in bare bare_grpc forwarder; do
        want=$(anchor_budget "$a")
        if [ -n "$want" ] && [ -n "${FIGURES[$a]:-}" ]; then
            SCALE[$a]=$(awk -v w="$want" -v g="${FIGURES[$a]}" 'BEGIN { printf "%.6f", w / g }')
        else
            SCALE[$a]=1
        fi
    done
    failed=0
    allowed=$(awk -v t="$TOLERANCE" 'BEGIN { print t * 100 }')
    while IFS='=' read -r key value; do
        key=$(echo "$key" | tr -d ' '); value=$(echo "$value" | sed 's/#.*//' | tr -d ' _')
        [ -n "${FIGURES[$key]:-}" ] || { echo "budget: $key was not measured" >&2; failed=1; continue; }
        case "$key" in relay*) anchor=forwarder ;; *_grpc) anchor=bare_grpc ;; *) anchor=bare ;; esac
        scaled=$(awk -v g="${FIGURES[$key]}" -v s="${SCALE[$anchor]}" 'BEGIN { printf "%d", g * s }')
        note="${FIGURES[$key]} here, $scaled scaled by $anchor"
        if awk -v got="$scaled" -v budget="$value" -v tol="$TOLERANCE" 'BEGIN { exit !(got > budget * (1 + tol)) }'; then
            echo "over budget: $key $note, budget $value (+$allowed% allowed)" >&2
            failed=1
        else
            echo "within budget: $key $note (budget $value, +$allowed% allowed)"
        fi
    done < <(sed -n '/^\[budget\]/,/^\[/p' "$CHECK" | grep -E '^[a-z_]+ *= *[0-9_]+')
    exit "$failed"
fi

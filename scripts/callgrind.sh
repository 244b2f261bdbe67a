#!/usr/bin/env bash
# Instructions per request, counted by callgrind: repeatable where wall-clock benchmarks are
# not (the same binary, inputs and environment give the same count on a busy machine).
#
#   scripts/callgrind.sh                 the gateway and its anchors, built from this tree
#   scripts/callgrind.sh --check FILE    the same, then fails when a figure is over its
#                                        budget in FILE (perf-budget.toml) by more than 2%,
#                                        after scaling it by its anchor (see the check)
#   scripts/callgrind.sh BIN [BIN ...]   only the gateway figures, for each binary given
#
# Each figure: one server under callgrind on 1 worker takes N1 and then N2 `SendMessage`
# calls on one keep-alive connection, in two runs; the difference over N2 - N1 leaves
# start-up and shut-down out. What is measured:
#   bare        examples/bare_jsonrpc.rs /jsonrpc: actix-web parsing the JSON-RPC envelope
#               and answering fixed bytes (the anchor for echo)
#   forwarder   examples/plain_forwarder.rs: actix-web and a pooled reqwest client relaying
#               to bare_jsonrpc (the anchor for relay)
#   echo        the gateway -> the echo agent (memory store, metrics on, no Origin, push off)
#   relay       the gateway -> a 1.0 upstream (bare_jsonrpc), relayed
#   echo_sqlite, relay_sqlite   the same with the shipped gateway.toml's SQLite store
#   echo_usage  echo with usage counted ([usage] enabled: every call tallied per caller,
#               agent and day, written to the store every second)
#   echo_policy with POLICY=1: echo with one simple policy (a deny rule on the method,
#               evaluated on every call and never holding); reported, not budgeted
# None of the measured configurations has a rate limit, so the rate limiter's clock
# (`quanta`), whose calibration at start varies from start to start, is never made. Needs
# valgrind (installed with apt-get when missing and run as root).
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
    (cd "$ROOT" && cargo build --release --quiet --bin a2a-gateway --example bare_jsonrpc --example plain_forwarder)
    BINS=("$ROOT/target/release/a2a-gateway")
    ANCHORS=true
fi
EX="$ROOT/target/release/examples"

# The fixed-answer upstream the relays and the forwarder call (not under callgrind).
UP_PORT=$(free_port)
if [ ! -x "$EX/bare_jsonrpc" ]; then
    (cd "$ROOT" && cargo build --release --quiet --example bare_jsonrpc --example plain_forwarder)
fi
"$EX/bare_jsonrpc" "127.0.0.1:$UP_PORT" 1 > "$TMP/upstream.log" 2>&1 &
PIDS+=($!)

mkdir -p "$TMP/relay.d"
printf 'name = "fast"\n[backend]\nkind = "a2a"\nurl = "http://127.0.0.1:%s"\n' "$UP_PORT" > "$TMP/relay.d/fast.toml"
# The echo runs serve agents.d/ with echo as the default agent; the relays one agent.
# Each with the memory store, and with the shipped gateway.toml's [store] (SQLite).
sqlite=$(printf '[store]\nkind = "sqlite"\ndata_dir = "%s"\ncommit_interval_ms = 20\n' "$TMP/data")
printf 'default_agent = "echo"\n' > "$TMP/echo.toml"
printf 'default_agent = "echo"\n%s\n' "$sqlite" > "$TMP/echo-sqlite.toml"
printf 'default_agent = "echo"\n[usage]\nenabled = true\n' > "$TMP/echo-usage.toml"
printf 'default_agent = "echo"\n[[auth.policies]]\nid = "no-cancel"\neffect = "deny"\nwhen = "a2a.method == \x27CancelTask\x27"\n' > "$TMP/echo-policy.toml"
: > "$TMP/relay.toml"
printf '%s\n' "$sqlite" > "$TMP/relay-sqlite.toml"

# count N PORT PATH PID: N SendMessage calls on one keep-alive connection once PORT
# answers (while PID, the server, lives).
count() {
    python3 - "$2" "$1" "$3" "$4" <<'PY'
import http.client, json, os, sys, time
port, n, path, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
    "role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hello"}]}}})
headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}
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
for _ in range(n - 1):
    c.request("POST", path, body, headers)
    r = c.getresponse(); data = r.read()
    assert r.status == 200 and b'"result"' in data, (r.status, data[:300])
PY
}

# run N PATH CMD...: CMD (with @PORT@ in its arguments made a free port) under callgrind, N
# calls, then SIGTERM; prints the instructions.
run() {
    local n=$1 path=$2; shift 2
    local port out pid
    port=$(free_port)
    out="$TMP/cg.$n.$RANDOM"
    local -a cmd=("$@")
    cmd=("${cmd[@]//@PORT@/$port}")
    A2A_GATEWAY_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out" "${cmd[@]}" > "$TMP/server.log" 2>&1 &
    pid=$!
    count "$n" "$port" "$path" "$pid" || { cat "$TMP/server.log" >&2; exit 1; }
    kill -TERM "$pid"; wait "$pid" || true
    rm -f "$TMP"/data/gateway.db*
    grep -m1 '^summary:' "$out" | awk '{print $2}'
}

# figure NAME PATH CMD...: instructions per request, printed and kept for the check.
declare -A FIGURES
figure() {
    local name=$1 path=$2; shift 2
    local a b
    a=$(run "$N1" "$path" "$@"); b=$(run "$N2" "$path" "$@")
    FIGURES[$name]=$(( (b - a) / (N2 - N1) ))
    awk -v n="$name" -v v="${FIGURES[$name]}" 'BEGIN { printf "%-14s %7.1fk instructions per request\n", n, v / 1000 }'
}

if $ANCHORS; then
    figure bare /jsonrpc "$EX/bare_jsonrpc" "127.0.0.1:@PORT@" 1
    figure forwarder / "$EX/plain_forwarder" "127.0.0.1:@PORT@" "http://127.0.0.1:$UP_PORT/" 1
fi
for bin in "${BINS[@]}"; do
    [ ${#BINS[@]} -gt 1 ] && echo "$bin"
    serve=("$bin" serve --agents-dir "$ROOT/agents.d" --workers 1 --port @PORT@ --config)
    figure echo /a2a/agents/echo "${serve[@]}" "$TMP/echo.toml"
    figure echo_sqlite /a2a/agents/echo "${serve[@]}" "$TMP/echo-sqlite.toml"
    figure echo_usage /a2a/agents/echo "${serve[@]}" "$TMP/echo-usage.toml"
    awk -v u="${FIGURES[echo_usage]}" -v e="${FIGURES[echo]}" \
        'BEGIN { printf "usage counted  %+7.1f%% instructions per request\n", (u - e) * 100 / e }'
    if [ "${POLICY:-0}" = 1 ]; then
        figure echo_policy /a2a/agents/echo "${serve[@]}" "$TMP/echo-policy.toml"
        awk -v p="${FIGURES[echo_policy]}" -v e="${FIGURES[echo]}" \
            'BEGIN { printf "one policy     %+7.1fk instructions per request\n", (p - e) / 1000 }'
    fi
    relay=("$bin" serve --agents-dir "$TMP/relay.d" --workers 1 --port @PORT@ --config)
    figure relay /a2a/agents/fast "${relay[@]}" "$TMP/relay.toml"
    figure relay_sqlite /a2a/agents/fast "${relay[@]}" "$TMP/relay-sqlite.toml"
done
if $ANCHORS; then
    awk -v e="${FIGURES[echo]}" -v b="${FIGURES[bare]}" -v r="${FIGURES[relay]}" -v f="${FIGURES[forwarder]}" \
        'BEGIN { printf "ratios         echo / bare %.2fx, relay / forwarder %.2fx\n", e / b, r / f }'
fi

if [ -n "$CHECK" ]; then
    # The same binary counts differently on another CPU (glibc picks its memcpy, strlen
    # and the like for the CPU it runs on), and the anchors move with it. So each figure
    # is scaled by its anchor's budget over its anchor measured here, before it is
    # compared: a change of machine is not a regression, a change of code is.
    anchor_budget() { sed -n '/^\[anchors\]/,/^\[/p' "$CHECK" | grep -E "^$1 *=" | sed 's/.*= *//; s/#.*//' | tr -d ' _'; }
    declare -A SCALE
    for a in bare forwarder; do
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
        case "$key" in relay*) anchor=forwarder ;; *) anchor=bare ;; esac
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

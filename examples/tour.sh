#!/usr/bin/env bash
# The README's tour as a script: run it against a gateway serving the shipped agents.d/
# (`cargo run --release -- serve` in another terminal). Every call must succeed (curl -f).
#
#   examples/tour.sh                      # http://127.0.0.1:8080
#   GATEWAY=http://127.0.0.1:9090 examples/tour.sh
set -euo pipefail
gw=${GATEWAY:-http://127.0.0.1:8080}
step() { printf '\n## %s\n' "$*"; }
post() { curl -fsS "$@" -H 'Content-Type: application/json'; }

step "health"
curl -fsS "$gw/a2a/health"

step "the agents behind the gateway"
curl -fsS "$gw/a2a/agents"

step "echo's card: its URLs point back at the gateway"
curl -fsS "$gw/a2a/agents/echo/card"

step "an A2A 1.0 call to echo (JSON-RPC)"
post "$gw/a2a/agents/echo" -H 'A2A-Version: 1.0' -d '
  {"jsonrpc":"2.0","id":1,"method":"SendMessage",
   "params":{"message":{"role":"ROLE_USER","messageId":"tour-1","parts":[{"text":"hello"}]}}}'

step "the same call as a 0.3 client makes it, on the shared endpoint, streamed (SSE)"
post -N "$gw/a2a" -d '
  {"jsonrpc":"2.0","id":2,"method":"message/stream",
   "params":{"message":{"kind":"message","role":"user","messageId":"tour-2","parts":[{"kind":"text","text":"one two three"}]}}}'

step "the HTTP+JSON binding"
post "$gw/a2a/agents/echo/rest/message:send" -H 'A2A-Version: 1.0' -d '
  {"message":{"role":"ROLE_USER","messageId":"tour-3","parts":[{"text":"over REST"}]}}'

step "routing: a rule in gateway.toml sends \"shout ...\" to the shout agent (see the headers)"
post -i "$gw/a2a" -H 'A2A-Version: 1.0' -d '
  {"jsonrpc":"2.0","id":3,"method":"SendMessage",
   "params":{"message":{"role":"ROLE_USER","messageId":"tour-4","parts":[{"text":"shout hello"}]}}}'

step "metrics: calls by agent, method, dialect, binding and outcome"
curl -fsS "$gw/metrics" | grep '^a2a_requests_total' | head -5

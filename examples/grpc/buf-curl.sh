#!/usr/bin/env bash
# Call the gateway's gRPC binding with `buf curl`, which reads the service from the gateway
# (gRPC server reflection): no proto files needed. grpcurl works the same way:
#   grpcurl -plaintext 127.0.0.1:50051 list
#   grpcurl -plaintext -d @ 127.0.0.1:50051 lf.a2a.v1.A2AService/SendMessage < message.json
#
#   cargo run --release -- serve --grpc-port 50051     # in another terminal
#   npm install -g @bufbuild/buf                        # or any buf release
#   examples/grpc/buf-curl.sh [127.0.0.1:50051] [agent] [text]
set -euo pipefail
target=${1:-127.0.0.1:50051}
agent=${2:-echo}
text=${3:-hello over gRPC}
buf=${BUF:-buf}

# What the port serves (reflection): lf.a2a.v1.A2AService and its methods.
"$buf" curl --protocol grpc --http2-prior-knowledge --list-methods "http://$target"

# A message to one agent: its name goes in `tenant`, as the agent's card says.
"$buf" curl --protocol grpc --http2-prior-knowledge \
    -d "{\"tenant\": \"$agent\", \"message\": {\"role\": \"ROLE_USER\", \"messageId\": \"m-$$\",
         \"parts\": [{\"text\": \"$text\"}]}}" \
    "http://$target/lf.a2a.v1.A2AService/SendMessage"

"""Call an agent through the gateway with the official A2A Python SDK (a2a-sdk 1.x).

The agent's card is read from the gateway and the SDK's ClientFactory picks the transport
it lists: JSON-RPC by default, gRPC with --grpc (the gateway started with `--grpc-port`).

    pip install -r requirements.txt
    python client.py                                   # echo, "hello", JSON-RPC
    python client.py --agent shout --text 'hello'      # another agent
    python client.py --stream --text 'one two three'   # events as they come
    python client.py --grpc                            # gRPC (serve --grpc-port 50051)
    GATEWAY=https://127.0.0.1:8080 SSL_CERT_FILE=dev-certs/ca.pem python client.py
"""

import argparse
import asyncio
import os
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import AgentCard, Message, Part, Role, SendMessageRequest, TaskState


def text_of(parts) -> str:
    return ''.join(p.text for p in parts if p.HasField('text'))


def describe(event) -> str:
    """One line per event the SDK hands back (a StreamResponse)."""
    kind = event.WhichOneof('payload')
    if kind == 'task':
        task = event.task
        said = ''.join(text_of(a.parts) for a in task.artifacts)
        return f'task {task.id}: {_state(task.status.state)} {said!r}'
    if kind == 'message':
        return f'message: {text_of(event.message.parts)!r}'
    if kind == 'status_update':
        return f'status: {_state(event.status_update.status.state)}'
    if kind == 'artifact_update':
        return f'artifact: {text_of(event.artifact_update.artifact.parts)!r}'
    return kind or 'empty event'


def _state(state) -> str:
    return TaskState.Name(state)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--gateway', default=os.environ.get('GATEWAY', 'http://127.0.0.1:8080'))
    parser.add_argument('--agent', default='echo')
    parser.add_argument('--text', default='hello')
    parser.add_argument('--stream', action='store_true', help='stream the answer (SSE or gRPC)')
    parser.add_argument('--grpc', action='store_true', help="use the card's gRPC interface")
    args = parser.parse_args()

    async with httpx.AsyncClient(timeout=30) as http:
        # Each agent's card is at /a2a/agents/<name>/card; its URLs point back at the gateway.
        resolver = A2ACardResolver(http, args.gateway)
        card: AgentCard = await resolver.get_agent_card(
            relative_card_path=f'/a2a/agents/{args.agent}/card')
        config = ClientConfig(streaming=args.stream, httpx_client=http)
        if args.grpc:
            import grpc
            # The card lists the gRPC interface as host:port; the agent travels as its tenant.
            config.grpc_channel_factory = grpc.aio.insecure_channel
            config.supported_protocol_bindings = ['GRPC']
        client = ClientFactory(config).create(card)

        message = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()),
                          parts=[Part(text=args.text)])
        async for event in client.send_message(SendMessageRequest(message=message)):
            print(describe(event))


if __name__ == '__main__':
    asyncio.run(main())

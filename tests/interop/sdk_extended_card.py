"""The official a2a-sdk (1.x) client asking the gateway for an agent's extended card.

    python sdk_extended_card.py --card-url URL [--api-key KEY] [--binding jsonrpc|grpc]

Resolves the public card with the SDK's resolver, keeps its 1.0 interface of the binding,
and calls the client's get_extended_agent_card with the key (X-API-Key, as a header or
as gRPC metadata). Prints one JSON object: {"skills": [ids]} or {"error": "..."}.
"""

import argparse
import asyncio
import json

import httpx

from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.types import AgentCard, GetExtendedAgentCardRequest

from sdk_client import resolve_card


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--card-url', required=True)
    parser.add_argument('--api-key')
    parser.add_argument('--binding', default='jsonrpc', choices=['jsonrpc', 'grpc'])
    args = parser.parse_args()
    headers = {'A2A-Version': '1.0'}
    if args.api_key:
        headers['X-API-Key'] = args.api_key
    async with httpx.AsyncClient(timeout=10, headers=headers) as http:
        public = await resolve_card(args.card_url, http)
        card = AgentCard()
        card.CopyFrom(public)
        keep = [i for i in card.supported_interfaces if i.protocol_version == '1.0'
                and (i.protocol_binding == 'GRPC') == (args.binding == 'grpc')]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(keep)
        config = ClientConfig(httpx_client=http)
        if args.binding == 'grpc':
            import grpc
            config.grpc_channel_factory = grpc.aio.insecure_channel
            config.supported_protocol_bindings = ['GRPC']
        client = ClientFactory(config).create(card)
        params = {'x-api-key': args.api_key} if args.api_key else None
        context = ClientCallContext(timeout=10, service_parameters=params)
        try:
            extended = await client.get_extended_agent_card(
                GetExtendedAgentCardRequest(), context=context)
            print(json.dumps({'skills': [s.id for s in extended.skills],
                              'description': extended.description}))
        except Exception as e:  # noqa: BLE001 - the test reads what went wrong
            print(json.dumps({'error': f'{type(e).__name__}: {e}'}))
        finally:
            await client.close()


if __name__ == '__main__':
    asyncio.run(main())

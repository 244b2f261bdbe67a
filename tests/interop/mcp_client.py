"""The official MCP Python SDK's client against the gateway's MCP endpoint, for the tests.

    python mcp_client.py URL SCENARIO [--api-key KEY] [--mode auto|legacy] [args...]

Scenarios (each prints one JSON object on its last line):
    list                         the tools: [{name, description, inputSchema}]
    call TOOL MESSAGE [ARGS]     a call (ARGS: JSON of more arguments): {content, isError, meta}
    progress TOOL MESSAGE        a call with a progress token: the result and the progress seen
    elicit TOOL MESSAGE ANSWER   a call whose question the elicitation callback answers
    noelicit TOOL MESSAGE        a call from a client that cannot elicit
    cancel TOOL MESSAGE SECS     a call given up after SECS (the client sends notifications/cancelled)
    watch SECS                   the tools, then again once the server says they changed
                                 (waiting SECS at most): {before, after, notified}
    config FILE BIN              every server of an MCP client configuration (Claude Desktop's
                                 mcpServers, VS Code's servers): stdio ones launched with BIN
                                 for `a2a-gateway`, http ones called; the gateway's address in
                                 the file is replaced by URL: {name: {tools, echoed}}
    stdio BIN                    `BIN mcp --url URL` launched over stdio (with --api-key:
                                 passed in $MCP_TEST_KEY): the tools, echo called, a question
                                 answered through elicitation
"""

import argparse
import asyncio
import json
import os
import sys

import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def dump(result):
    if hasattr(result, 'model_dump'):
        return result.model_dump(mode='json', by_alias=True, exclude_none=True)
    return result


def client_for(url, args, **kw):
    headers = {'X-API-Key': args.api_key} if args.api_key else {}
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
    return Client(transport, mode=args.mode, **kw)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument('url')
    p.add_argument('scenario')
    p.add_argument('rest', nargs='*')
    p.add_argument('--api-key')
    p.add_argument('--mode', default='auto')
    args = p.parse_args()
    rest = args.rest
    out = {}
    if args.scenario == 'config':
        with open(rest[0]) as f:
            servers = json.load(f)
        servers = servers.get('mcpServers') or servers.get('servers') or {}
        if not servers:
            raise SystemExit(f'{rest[0]}: no servers')
        here = lambda text: text.replace('http://127.0.0.1:8080', args.url.rstrip('/'))
        for name, server in servers.items():
            if server.get('type', 'stdio') == 'stdio':
                command = rest[1] if server['command'] == 'a2a-gateway' else server['command']
                params = StdioServerParameters(
                    command=command, args=[here(a) for a in server.get('args', [])],
                    env={**os.environ, **server.get('env', {})})
                client = Client(params, mode=args.mode)
            else:
                client = client_for(here(server['url']), args)
            async with client as c:
                tools = await c.list_tools()
                called = dump(await c.call_tool('echo', {'message': f'via {name}'}))
            out[name] = {'tools': [t.name for t in tools.tools],
                         'echoed': ''.join(p.get('text', '') for p in called.get('content', []))}
        print(json.dumps(out))
        return
    if args.scenario == 'stdio':
        bridge = ['mcp', '--url', args.url]
        env = dict(os.environ)
        if args.api_key:
            bridge += ['--api-key-env', 'MCP_TEST_KEY']
            env['MCP_TEST_KEY'] = args.api_key
        params = StdioServerParameters(command=rest[0], args=bridge, env=env)
        asked = []

        async def elicit(context, params):
            asked.append(params.message)
            return types.ElicitResult(action='accept', content={'answer': 'Ada'})

        seen = []

        async def progress(done, total, message):
            seen.append(message)

        async with Client(params, mode=args.mode, elicitation_callback=elicit) as c:
            tools = await c.list_tools()
            out['tools'] = [t.name for t in tools.tools]
            out['result'] = dump(await c.call_tool('echo', {'message': 'over stdio'},
                                                   progress_callback=progress))
            out['progress'] = seen
            if 'greet' in out['tools']:
                out['greeted'] = dump(await c.call_tool('greet', {'message': 'hello'}))
                out['asked'] = asked
        print(json.dumps(out))
        return
    if args.scenario == 'list':
        async with client_for(args.url, args) as c:
            tools = await c.list_tools()
            out['tools'] = [dump(t) for t in tools.tools]
    elif args.scenario == 'call':
        more = json.loads(rest[2]) if len(rest) > 2 else {}
        async with client_for(args.url, args) as c:
            out['result'] = dump(await c.call_tool(rest[0], {'message': rest[1], **more}))
    elif args.scenario == 'progress':
        seen = []

        async def progress(done, total, message):
            seen.append({'progress': done, 'message': message})

        async with client_for(args.url, args) as c:
            out['result'] = dump(await c.call_tool(rest[0], {'message': rest[1]},
                                                   progress_callback=progress))
        out['progress'] = seen
    elif args.scenario in ('elicit', 'noelicit'):
        asked = []

        async def elicit(context, params):
            asked.append(params.message)
            return types.ElicitResult(action='accept', content={'answer': rest[2]})

        kw = {'elicitation_callback': elicit} if args.scenario == 'elicit' else {}
        async with client_for(args.url, args, **kw) as c:
            out['result'] = dump(await c.call_tool(rest[0], {'message': rest[1]}))
        out['asked'] = asked
    elif args.scenario == 'cancel':
        async with client_for(args.url, args) as c:
            try:
                await c.call_tool(rest[0], {'message': rest[1]},
                                  read_timeout_seconds=float(rest[2]))
                out['outcome'] = 'answered'
            except Exception as e:  # the SDK raises on its own timeout
                out['outcome'] = f'gave up: {type(e).__name__}'
            await asyncio.sleep(1)
    elif args.scenario == 'watch':
        changed = asyncio.Event()

        async def on_message(message):
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        async with client_for(args.url, args, message_handler=on_message) as c:
            out['before'] = [t.name for t in (await c.list_tools()).tools]
            print('listening', flush=True)
            try:
                await asyncio.wait_for(changed.wait(), float(rest[0]))
                out['notified'] = True
            except asyncio.TimeoutError:
                out['notified'] = False
            out['after'] = [t.name for t in (await c.list_tools()).tools]
    else:
        sys.exit(f'unknown scenario {args.scenario}')
    print(json.dumps(out))


if __name__ == '__main__':
    asyncio.run(main())

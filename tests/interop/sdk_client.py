"""Interop checks: the official a2a-sdk client against an "echo" A2A agent.

    python sdk_client.py --card-url http://127.0.0.1:PORT/a2a/agents/echo/card --dialect 1.0|0.3

The card is resolved with the SDK's A2ACardResolver and the client is built by
the SDK's ClientFactory; every A2A call goes through the SDK transports.
--dialect 0.3 keeps only the card's 0.3 interfaces, so the factory picks its
0.3 compat transport (the factory always prefers a 1.0 interface otherwise).
--binding grpc keeps only the card's gRPC interface (1.0), so the factory picks
the SDK's gRPC transport, with the interface's tenant in every request.
--peer fasta2a runs the checks for pydantic-ai's A2A server behind the gateway
(tests/interop/fasta2a_agent.py: answers "echo: <text>", streams /chunks, cannot
continue or cancel a task) instead of those for an echo agent.
Prints "PASS name" / "FAIL name: details" per check; exit 0 only if all pass.
"""

import argparse
import asyncio
import sys
import uuid
from urllib.parse import urlsplit

import httpx

from a2a.client import A2ACardResolver, ClientCallContext, ClientConfig, ClientFactory
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    SubscribeToTaskRequest,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)

TIMEOUT = 10.0  # seconds, for every call
EXPECTED_NAME = 'echo'  # --expect-name: the gateway names a proxied agent after its file
EXPECTED_TRANSPORT = {'1.0': 'JsonRpcTransport', '0.3': 'CompatJsonRpcTransport',
                      'grpc': 'GrpcTransport'}
BINDING = 'jsonrpc'  # --binding
S = TaskState


def major_minor(version: str) -> str:
    return '.'.join(version.split('.')[:2])


def state_name(state: int) -> str:
    return TaskState.Name(state)


def text_of(parts) -> str:
    return ''.join(p.text for p in parts if p.HasField('text'))


def artifacts_text(task) -> str:
    return ''.join(text_of(a.parts) for a in task.artifacts)


def user_message(text: str, message_id: str | None = None, task=None) -> Message:
    return Message(
        role=Role.ROLE_USER,
        message_id=message_id or str(uuid.uuid4()),
        parts=[Part(text=text)],
        task_id=task.id if task else None,
        context_id=task.context_id if task else None,
    )


def expect(cond: bool, details: str) -> None:
    if not cond:
        raise AssertionError(details)


def describe(e: Exception) -> str:
    if isinstance(e, AssertionError):
        return str(e)
    if isinstance(e, asyncio.TimeoutError):
        return f'timed out after {TIMEOUT:g} s'
    return f'{type(e).__name__}: {e}'


class Checks:
    def __init__(self, card: AgentCard, dialect: str, http: httpx.AsyncClient):
        self.card, self.dialect, self.http = card, dialect, http
        self.ctx = ClientCallContext(timeout=TIMEOUT)
        self.sent_task = None  # from `send`, reused by `get`
        self.clients = {}

    def client(self, streaming: bool):
        """An SDK client for this dialect's interfaces (one per streaming mode)."""
        if streaming not in self.clients:
            card = AgentCard()
            card.CopyFrom(self.card)
            keep = [i for i in card.supported_interfaces
                    if major_minor(i.protocol_version) == self.dialect
                    and (i.protocol_binding == 'GRPC') == (BINDING == 'grpc')]
            expect(keep, f'card has no {self.dialect} interface: '
                   f'{[(i.protocol_binding, i.protocol_version) for i in card.supported_interfaces]}')
            if TRAILING_SLASH:
                # What a client sees when an operator writes the URL as a base URL.
                for i in keep:
                    if i.protocol_binding == 'JSONRPC':
                        i.url = i.url.rstrip('/') + '/'
            del card.supported_interfaces[:]
            card.supported_interfaces.extend(keep)
            config = ClientConfig(streaming=streaming, httpx_client=self.http)
            if BINDING == 'grpc':
                import grpc
                config.grpc_channel_factory = grpc.aio.insecure_channel
                config.supported_protocol_bindings = ['GRPC']
            self.clients[streaming] = ClientFactory(config).create(card)
        return self.clients[streaming]

    async def call(self, coro):
        return await asyncio.wait_for(coro, TIMEOUT)

    async def send(self, message: Message, streaming=False, return_immediately=False):
        """Sends a message; returns the list of StreamResponse events."""
        request = SendMessageRequest(message=message)
        request.configuration.return_immediately = return_immediately

        async def collect():
            return [e async for e in self.client(streaming).send_message(request, context=self.ctx)]
        return await self.call(collect())

    async def send_for_task(self, message: Message, **kw):
        events = await self.send(message, **kw)
        expect(len(events) == 1 and events[0].HasField('task'),
               f'expected one Task reply, got {events}')
        return events[0].task

    async def check_card(self):
        expect(self.card.name == EXPECTED_NAME, f'card name {self.card.name!r}')
        expect(len(self.card.skills) >= 1, 'card has no skills')
        ifaces = [(i.protocol_binding, i.protocol_version, i.url)
                  for i in self.card.supported_interfaces]
        transport = self.client(streaming=False)._transport  # noqa: SLF001
        if BINDING == 'grpc':
            # The factory wraps it to put the interface's tenant in every request.
            expect(type(transport).__name__ == 'TenantTransportDecorator',
                   f'no tenant on the gRPC interface: {ifaces}')
            transport = transport._base  # noqa: SLF001
        name = type(transport).__name__
        expect(name == EXPECTED_TRANSPORT['grpc' if BINDING == 'grpc' else self.dialect],
               f'selected {name} at {getattr(transport, "url", "?")}; interfaces {ifaces}')

    async def check_send(self):
        task = await self.send_for_task(user_message('hello interop'))
        expect(task.status.state == S.TASK_STATE_COMPLETED, f'state {state_name(task.status.state)}')
        expect(artifacts_text(task) == 'hello interop', f'artifact text {artifacts_text(task)!r}')
        self.sent_task = task

    async def check_stream(self):
        text = 'one two three four five six'
        expect(self.card.capabilities.streaming, 'card does not declare capabilities.streaming')
        events = await self.send(user_message(text), streaming=True)
        kinds = [e.WhichOneof('payload') for e in events]
        expect(kinds and kinds[0] == 'task', f'first event is {kinds[:1]}; events {kinds}')
        chunks = [e.artifact_update for e in events if e.HasField('artifact_update')]
        expect(len(chunks) >= 2, f'{len(chunks)} artifact-update events; events {kinds}')
        joined = ''.join(text_of(c.artifact.parts) for c in chunks)
        expect(joined == text, f'artifact chunks joined {joined!r}')
        expect(len({c.artifact.artifact_id for c in chunks}) == 1, 'chunks differ in artifactId')
        expect(all(c.append for c in chunks[1:]), 'a chunk after the first lacks append=true')
        expect(chunks[-1].last_chunk, 'last chunk lacks lastChunk=true')
        states = [e.status_update.status.state if e.HasField('status_update') else e.task.status.state
                  for e in events if e.HasField('status_update') or e.HasField('task')]
        expect(states[-1] == S.TASK_STATE_COMPLETED,
               f'last status {state_name(states[-1])}; events {kinds}')

    async def check_message(self):
        msg = user_message('hi', message_id=f'tck-message-response-{uuid.uuid4()}')
        events = await self.send(msg)
        expect(len(events) == 1 and events[0].HasField('message'),
               f'expected one Message reply, got {[e.WhichOneof("payload") for e in events]}')
        reply = text_of(events[0].message.parts)
        expect(reply == 'Direct message response', f'message text {reply!r}')

    async def check_input_required(self):
        task = await self.send_for_task(user_message('/input What is your name?'))
        expect(task.status.state == S.TASK_STATE_INPUT_REQUIRED, f'state {state_name(task.status.state)}')
        question = text_of(task.status.message.parts)
        expect(question == 'What is your name?', f'status message {question!r}')
        done = await self.send_for_task(user_message('Ada', task=task))
        expect(done.id == task.id, f'follow-up answered by task {done.id}, not {task.id}')
        expect(done.status.state == S.TASK_STATE_COMPLETED, f'follow-up state {state_name(done.status.state)}')
        expect(artifacts_text(done) == 'Ada', f'follow-up artifact text {artifacts_text(done)!r}')

    async def check_get(self):
        expect(self.sent_task is not None, 'no task from the send check')
        task = await self.call(self.client(False).get_task(
            GetTaskRequest(id=self.sent_task.id), context=self.ctx))
        expect(task.id == self.sent_task.id, f'got task {task.id}')
        expect(task.status.state == S.TASK_STATE_COMPLETED, f'state {state_name(task.status.state)}')

    async def check_cancel(self):
        task = await self.send_for_task(user_message('/delay 30 slow'), return_immediately=True)
        expect(task.status.state in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING),
               f'non-blocking send state {state_name(task.status.state)}')
        client = self.client(False)
        canceled = await self.call(client.cancel_task(CancelTaskRequest(id=task.id), context=self.ctx))
        expect(canceled.status.state == S.TASK_STATE_CANCELED, f'cancel state {state_name(canceled.status.state)}')
        again = await self.call(client.get_task(GetTaskRequest(id=task.id), context=self.ctx))
        expect(again.status.state == S.TASK_STATE_CANCELED, f'get-after-cancel state {state_name(again.status.state)}')


class Fasta2aChecks(Checks):
    """pydantic-ai's A2A server through the gateway: every answer the SDK parses (its
    protobuf reader refuses a timestamp without a zone, which fasta2a writes)."""

    async def check_send(self):
        task = await self.send_for_task(user_message('hello interop'))
        expect(task.status.state == S.TASK_STATE_COMPLETED, f'state {state_name(task.status.state)}')
        expect(artifacts_text(task) == 'echo: hello interop', f'artifact text {artifacts_text(task)!r}')
        self.sent_task = task

    async def check_send_now(self):
        task = await self.send_for_task(user_message('/delay 0.2 later'), return_immediately=True)
        expect(task.status.state in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING),
               f'state {state_name(task.status.state)}')
        expect(task.status.timestamp.seconds > 0, 'no status timestamp')

    async def check_stream(self):
        events = await self.send(user_message('/chunks 3 one two three'), streaming=True)
        kinds = [e.WhichOneof('payload') for e in events]
        expect(kinds and kinds[0] == 'task', f'first event is {kinds[:1]}; events {kinds}')
        built = None
        for c in (e.artifact_update for e in events if e.HasField('artifact_update')):
            expect(not c.append or built is not None,
                   f'append=true for an artifact not started; events {kinds}')
            built = (built or '') + text_of(c.artifact.parts) if c.append else text_of(c.artifact.parts)
        expect(built == 'echo: one two three', f'artifact built {built!r}')
        last = events[-1]
        expect(last.HasField('status_update')
               and last.status_update.status.state == S.TASK_STATE_COMPLETED,
               f'last event {last}')

    async def check_cancel(self):
        expect(self.sent_task is not None, 'no task from the send check')
        try:
            await self.call(self.client(False).cancel_task(
                CancelTaskRequest(id=self.sent_task.id), context=self.ctx))
        except Exception as e:  # noqa: BLE001 - the SDK's error for -32002
            expect('cancel' in str(e).lower(), f'refused with {describe(e)}')
            return
        raise AssertionError('a finished task was canceled')

    async def check_subscribe(self):
        expect(self.sent_task is not None, 'no task from the send check')
        try:
            events = await self.call(self._collect_subscription(self.sent_task.id))
        except Exception as e:  # noqa: BLE001 - the SDK's error for -32004
            expect('unsupported' in str(e).lower() or 'already' in str(e).lower(),
                   f'refused with {describe(e)}')
            return
        raise AssertionError(f'subscribed to a finished task: {events}')

    async def _collect_subscription(self, task_id: str):
        request = SubscribeToTaskRequest(id=task_id)
        return [e async for e in self.client(True).subscribe(request, context=self.ctx)]


TRAILING_SLASH = False
CHECKS = ['card', 'send', 'stream', 'message', 'input-required', 'get', 'cancel']
PEERS = {
    'echo': (Checks, CHECKS),
    'fasta2a': (Fasta2aChecks, ['card', 'send', 'send-now', 'stream', 'get', 'cancel', 'subscribe']),
}


async def resolve_card(card_url: str, http: httpx.AsyncClient) -> AgentCard:
    """Resolve the card with the SDK resolver: base URL + relative card path."""
    u = urlsplit(card_url)
    resolver = A2ACardResolver(http, f'{u.scheme}://{u.netloc}')
    path = u.path + (f'?{u.query}' if u.query else '')
    return await asyncio.wait_for(resolver.get_agent_card(relative_card_path=path), TIMEOUT)


async def run(card_url: str, dialect: str, peer: str) -> int:
    kind, names = PEERS[peer]
    results = {}
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        # ClientFactory would set this default on a shared client too; setting it
        # first makes the card request carry it as well.
        http.headers['A2A-Version'] = '1.0'
        try:
            checks = kind(await resolve_card(card_url, http), dialect, http)
        except Exception as e:  # noqa: BLE001
            checks = None
            results = {name: 'no card' for name in names}
            results['card'] = f'cannot resolve {card_url}: {describe(e)}'
        for name in names if checks else []:
            try:
                await getattr(checks, 'check_' + name.replace('-', '_'))()
                results[name] = None
            except Exception as e:  # noqa: BLE001 - report any SDK/transport error
                results[name] = describe(e)
            print(f'PASS {name}' if results[name] is None else f'FAIL {name}: {results[name]}',
                  flush=True)
        for client in checks.clients.values() if checks else []:
            await client.close()
    if not checks:
        for name in names:
            print(f'FAIL {name}: {results[name]}')
    failures = sum(r is not None for r in results.values())
    print(f'{len(names) - failures} passed, {failures} failed')
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--card-url', required=True, help='full URL of the agent card')
    parser.add_argument('--dialect', choices=['1.0', '0.3'], required=True)
    parser.add_argument('--expect-name', default='echo', help='the card name to expect')
    parser.add_argument('--peer', choices=sorted(PEERS), default='echo',
                        help='the agent behind the card, which decides the checks')
    parser.add_argument('--binding', choices=['jsonrpc', 'grpc'], default='jsonrpc',
                        help="the card's interface to call (gRPC: 1.0 only)")
    parser.add_argument('--trailing-slash', action='store_true',
                        help="end the card's JSON-RPC URLs with '/' before calling them")
    args = parser.parse_args()
    global EXPECTED_NAME, TRAILING_SLASH, BINDING
    EXPECTED_NAME = args.expect_name
    BINDING = args.binding
    TRAILING_SLASH = args.trailing_slash
    sys.exit(asyncio.run(run(args.card_url, args.dialect, args.peer)))


if __name__ == '__main__':
    main()

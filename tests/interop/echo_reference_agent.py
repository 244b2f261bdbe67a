"""Reference "echo" A2A agent built with the official a2a-sdk (1.x) server.

Mirrors the a2a-gateway built-in echo agent so the interop client can be
checked against a known-good server, and so the gateway's proxy tests have a
real upstream agent. Serves JSON-RPC at / and the card at
/.well-known/agent-card.json.

    python echo_reference_agent.py --port 9999 [--dialects 1.0,0.3] [--ready-file PATH]

--dialects picks the JSON-RPC dialects the card advertises and the server answers:
  1.0,0.3 (default) -> 1.0 plus the SDK's 0.3 compat mode on the same endpoint;
                       the SDK's hybrid card (supportedInterfaces 1.0 + 0.3 and
                       the 0.3 top-level url/protocolVersion/preferredTransport).
  1.0               -> no 0.3 compat (0.3 methods get -32601); a pure 1.0 card
                       with one JSONRPC 1.0 interface.
  0.3               -> 0.3 methods only (1.0 method names get -32601, as from a
                       0.3 server); a pure 0.3 card: top-level url,
                       protocolVersion "0.3.0", preferredTransport "JSONRPC", no
                       supportedInterfaces.
A2A-Version handling is the SDK's: a missing header counts as 0.3; a 1.0 method
needs a 1.x header (else -32009), a 0.3 method a 0.x header or none (else
-32603 "A2A version '1.0' is not supported ...").
--push turns on the SDK's push notifications (configs in memory, its own sender).
--extended-key KEY offers an extended card (capabilities.extendedAgentCard) that adds the
  skill "upstream-vip", given only to a call carrying X-API-Key: KEY (else -32007).
--sign-key PEM signs the card with the SDK's card signer (ES256, kid "upstream-key") and
  writes the public key as a JWKS to --jwks-out; --tamper changes the description after
  signing, as an attacker between the agent and the gateway would.
--tls-cert PEM --tls-key PEM serve HTTPS (the card's URLs say https); --client-ca PEM also
  requires a client certificate signed by that CA.
--grpc serves A2A 1.0 over gRPC only (the SDK's GrpcHandler on a free port of --host);
  the HTTP port serves the card alone, whose one interface is that gRPC one.
--port 0 binds a free port; --ready-file PATH gets that port (decimal, then a
newline) once the server accepts connections, written atomically.

Behaviour (text = the user message's text parts joined with ""):
  - messageId starting "tck-message-response" -> Message "Direct message response"
  - "/message <text>"     -> Message <text>
  - "/input <question>"   -> input-required, status message <question>; the next
                             message on that task completes it, echoing its text
  - "/auth <why>"         -> auth-required, status message <why>; continued like /input
  - "/fail", "/reject"    -> failed, rejected
  - "/delay <secs> <text>" -> stays working for secs, then echoes <text>; a <text> of
                             "/input <question>" then asks for input, as above
  - otherwise             -> working, one artifact "echo" holding the text, completed.
    On a streaming call the artifact arrives as 3 chunks (split on whitespace,
    separators kept, append/lastChunk set) sharing one artifactId.
"""

import argparse
import asyncio
import json
import logging
import re
import uuid

import uvicorn

from listening import bind, serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from a2a.helpers import new_task, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    TaskUpdater,
)
import httpx
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import ExtendedAgentCardNotConfiguredError

# Only after a2a.server.routes: importing the compat adapter first is a circular import.
from a2a.compat.v0_3.conversions import to_compat_agent_card  # noqa: E402, I001
from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter  # noqa: E402

STREAMING_METHODS = {'SendStreamingMessage', 'message/stream'}  # 1.0, 0.3
DIALECTS = ('1.0', '0.3')
# Interface protocolVersion per dialect. A 0.3-only card says "0.3.0" like a
# real 0.3 agent; the hybrid card keeps the SDK's "0.3".
PURE_03_VERSION = '0.3.0'
V03_METHODS = frozenset(JSONRPC03Adapter.METHOD_TO_MODEL)
TCK_MESSAGE_PREFIX = 'tck-message-response'


def split_chunks(text: str, count: int = 3) -> list[str]:
    """Split on whitespace into <= count chunks whose concatenation is text."""
    words = re.findall(r'\S+\s*', text)
    if not words:
        return [text]
    words[0] = text[: len(text) - len(text.lstrip())] + words[0]
    n = min(count, len(words))
    bounds = [i * len(words) // n for i in range(n + 1)]
    return [''.join(words[a:b]) for a, b in zip(bounds, bounds[1:])]


class EchoExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        text = ''.join(p.text for p in message.parts if p.HasField('text'))

        if message.message_id.startswith(TCK_MESSAGE_PREFIX):
            await self._reply(context, event_queue, 'Direct message response')
            return
        followup = context.current_task is not None  # answer to "/input" or "/auth"
        if not followup and text.startswith('/message'):
            await self._reply(context, event_queue, text[len('/message'):].strip())
            return

        task = context.current_task or new_task(
            context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED,
            history=[message])
        if not followup:
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)

        if not followup and text.startswith('/reject'):
            await updater.reject()
            return
        await updater.start_work()
        if followup:
            pass  # echo the answer as is
        elif text.startswith('/fail'):
            await updater.failed()
            return
        elif text.startswith('/input'):
            question = text[len('/input'):].strip()
            await updater.requires_input(updater.new_agent_message([new_text_part(question)]))
            return
        elif text.startswith('/auth'):
            why = text[len('/auth'):].strip()
            await updater.requires_auth(updater.new_agent_message([new_text_part(why)]))
            return
        elif text.startswith('/delay'):
            _, secs, text = (text.split(maxsplit=2) + ['', ''])[:3]
            await asyncio.sleep(float(secs or 0))
            if text.startswith('/input'):
                question = text[len('/input'):].strip()
                await updater.requires_input(updater.new_agent_message([new_text_part(question)]))
                return

        streaming = context.call_context.state.get('method') in STREAMING_METHODS
        chunks = split_chunks(text) if streaming else [text]
        artifact_id = str(uuid.uuid4())
        for i, chunk in enumerate(chunks):
            await updater.add_artifact(
                [new_text_part(chunk)], artifact_id=artifact_id, name='echo',
                append=True if i > 0 else None,
                last_chunk=True if i == len(chunks) - 1 else None,
            )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        await TaskUpdater(event_queue, task.id, task.context_id).cancel()

    @staticmethod
    async def _reply(context: RequestContext, event_queue: EventQueue, text: str) -> None:
        await event_queue.enqueue_event(new_text_message(text, context_id=context.context_id))


def parse_dialects(value: str) -> tuple[str, ...]:
    """"1.0,0.3" -> ('1.0', '0.3'); order kept (it is the card's preference order)."""
    out = []
    for d in (x.strip() for x in value.split(',')):
        if d not in DIALECTS:
            raise argparse.ArgumentTypeError(f'unknown dialect {d!r} (choose from 1.0, 0.3)')
        if d not in out:
            out.append(d)
    if not out:
        raise argparse.ArgumentTypeError('no dialect given')
    return tuple(out)


def agent_card(base_url: str, dialects: tuple[str, ...] = DIALECTS,
               push: bool = False, grpc_target: str | None = None) -> AgentCard:
    versions = [PURE_03_VERSION if dialects == ('0.3',) else d for d in dialects]
    interfaces = [
        AgentInterface(url=base_url, protocol_binding='JSONRPC', protocol_version=v)
        for v in versions
    ]
    if grpc_target:
        interfaces = [AgentInterface(url=grpc_target, protocol_binding='GRPC',
                                     protocol_version='1.0')]
    return AgentCard(
        name='echo',
        description='Echoes text back; A2A interop reference agent (a2a-sdk).',
        version='1.0.0',
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=True, push_notifications=push),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[AgentSkill(
            id='echo', name='Echo', description='Repeats the input text; supports '
            '/delay, /input, /auth, /fail, /reject and /message commands.',
            tags=['echo', 'test'], examples=['hello', '/delay 2 hi', '/input Your name?'],
        )],
    )


def pure_03_card_routes(card: AgentCard) -> list[Route]:
    """The card as a 0.3 agent serves it: the SDK's own 1.0 -> 0.3 conversion,
    without the 1.0 fields its hybrid card adds (no supportedInterfaces)."""
    body = to_compat_agent_card(card).model_dump(mode='json', by_alias=True, exclude_none=True)

    async def get_card(_request: Request) -> Response:
        return JSONResponse(body)
    return [Route(AGENT_CARD_WELL_KNOWN_PATH, get_card, methods=['GET'])]


def only_03_methods(route: Route) -> Route:
    """Wraps the SDK's JSON-RPC endpoint so that 1.0 method names get -32601,
    as a 0.3 server answers them. The body is read here first; Starlette caches
    it on the Request, so the SDK dispatcher still sees it."""
    sdk_endpoint = route.endpoint

    async def endpoint(request: Request) -> Response:
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001 - let the SDK produce its parse error
            body = None
        method = body.get('method') if isinstance(body, dict) else None
        if isinstance(method, str) and method not in V03_METHODS:
            request_id = body.get('id')
            if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
                request_id = None
            return JSONResponse({'jsonrpc': '2.0', 'id': request_id,
                                 'error': {'code': -32601, 'message': 'Method not found'}})
        return await sdk_endpoint(request)
    return Route(route.path, endpoint, methods=['POST'])


def extended_parts(card: AgentCard, key: str | None) -> dict:
    """The SDK's extended card, handed out only to a caller presenting `key`."""
    if not key:
        return {}
    card.capabilities.extended_agent_card = True
    extended = AgentCard()
    extended.CopyFrom(card)
    extended.description = 'Echoes text back; the extended card.'
    extended.skills.append(AgentSkill(
        id='upstream-vip', name='Upstream VIP', description='Only on the extended card',
        tags=['vip']))

    async def only_with_key(served: AgentCard, context) -> AgentCard:
        headers = {k.lower(): v for k, v in context.state.get('headers', {}).items()}
        if headers.get('x-api-key') != key:
            raise ExtendedAgentCardNotConfiguredError(message='no extended card without the key')
        return served
    return {'extended_agent_card': extended, 'extended_card_modifier': only_with_key}


def sign_card(card: AgentCard, key_file: str, jwks_out: str, tamper: bool) -> None:
    """Signs `card` as the SDK signs one, and publishes the key."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from jwt.algorithms import ECAlgorithm
    from a2a.utils.signing import create_agent_card_signer

    pem = open(key_file, 'rb').read()
    jwk = ECAlgorithm.to_jwk(load_pem_private_key(pem, None).public_key(), as_dict=True)
    jwk.update({'kid': 'upstream-key', 'alg': 'ES256', 'use': 'sig'})
    with open(jwks_out, 'w') as out:
        json.dump({'keys': [jwk]}, out)
    header = {'kid': 'upstream-key', 'alg': 'ES256', 'jku': None, 'typ': 'JOSE'}
    create_agent_card_signer(pem.decode(), header)(card)
    if tamper:
        card.description = 'Echoes text back; changed after signing.'


def build_app(base_url: str, dialects: tuple[str, ...] = DIALECTS,
              push: bool = False, extended_key: str | None = None,
              signing: tuple[str, str, bool] | None = None) -> Starlette:
    card = agent_card(base_url, dialects, push)
    if signing:
        sign_card(card, *signing)
    extras = extended_parts(card, extended_key)
    if push:
        # The SDK's own push support: configs kept in memory, sent by its sender
        # (StreamResponse bodies, the token in X-A2A-Notification-Token).
        configs = InMemoryPushNotificationConfigStore()
        extras['push_config_store'] = configs
        extras['push_sender'] = BasePushNotificationSender(httpx.AsyncClient(), configs)
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card,
        **extras,
    )
    rpc_routes = create_jsonrpc_routes(
        handler, rpc_url='/', enable_v0_3_compat='0.3' in dialects,
    )
    if dialects == ('0.3',):
        routes = pure_03_card_routes(card) + [only_03_methods(r) for r in rpc_routes]
    else:
        routes = create_agent_card_routes(card) + rpc_routes
    return Starlette(routes=routes)


async def serve_grpc_only(host: str, sock, ready_file: str | None, log_level: str) -> None:
    """The SDK's gRPC server on a free port, and the card (listing only it) over HTTP."""
    import contextvars

    import grpc

    from a2a.server.request_handlers import GrpcHandler
    from a2a.server.request_handlers.grpc_handler import DefaultGrpcServerCallContextBuilder
    from a2a.types import a2a_pb2_grpc

    # The executor tells a streaming call by its method, which the SDK's JSON-RPC routes
    # put in the call's state and its gRPC handler does not: the handler says it here.
    method = contextvars.ContextVar('method', default='SendMessage')

    class NamingHandler(GrpcHandler):
        async def SendStreamingMessage(self, request, context):  # noqa: N802 - gRPC's name
            method.set('SendStreamingMessage')
            async for response in super().SendStreamingMessage(request, context):
                yield response

    class NamingContextBuilder(DefaultGrpcServerCallContextBuilder):
        def build(self, context):
            built = super().build(context)
            built.state['method'] = method.get()
            return built

    server = grpc.aio.server()
    grpc_port = server.add_insecure_port(f'{host}:0')
    card = agent_card('', ('1.0',), grpc_target=f'{host}:{grpc_port}')
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card,
    )
    servicer = NamingHandler(handler, context_builder=NamingContextBuilder())
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(servicer, server)
    await server.start()
    config = uvicorn.Config(Starlette(routes=create_agent_card_routes(card)),
                            log_level=log_level, timeout_graceful_shutdown=2)
    try:
        await serve(uvicorn.Server(config), sock, ready_file)
    finally:
        await server.stop(1)


def logging_traceparent(app, path):
    """The app, noting the trace context each POST arrives with (for the trace tests)."""
    async def logged(scope, receive, send):
        if scope['type'] == 'http' and scope['method'] == 'POST':
            headers = dict(scope['headers'])
            with open(path, 'a') as f:
                f.write(headers.get(b'traceparent', b'-').decode() + '\n')
        await app(scope, receive, send)
    return logged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True, help='0 = any free port')
    parser.add_argument('--public-url', help='URL to advertise in the card '
                        '(default http://HOST:PORT/)')
    parser.add_argument('--dialects', type=parse_dialects, default=DIALECTS,
                        help='JSON-RPC dialects to advertise and answer: 1.0,0.3 '
                        '(default), 1.0 or 0.3')
    parser.add_argument('--ready-file', help='write the bound port here once listening')
    parser.add_argument('--log-level', default='warning')
    parser.add_argument('--push', action='store_true',
                        help='send push notifications (the card says pushNotifications: true)')
    parser.add_argument('--extended-key',
                        help='offer an extended card to callers presenting this X-API-Key')
    parser.add_argument('--sign-key', help='sign the card with this P-256 PEM key')
    parser.add_argument('--jwks-out', help='with --sign-key: write the public key here')
    parser.add_argument('--tamper', action='store_true',
                        help='with --sign-key: change the card after signing it')
    parser.add_argument('--tls-cert', help='serve HTTPS with this certificate (PEM)')
    parser.add_argument('--tls-key', help='the key of --tls-cert (PEM)')
    parser.add_argument('--client-ca', help='with --tls-cert: require client certificates '
                        'signed by this CA (PEM)')
    parser.add_argument('--log-traceparent',
                        help="append each POST's traceparent header (or '-') to this file")
    parser.add_argument('--grpc', action='store_true',
                        help='serve over gRPC only; the HTTP port serves the card')
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        parser.exit(1, f'echo agent: cannot bind {args.host}:{args.port}: {e}\n')
    port = sock.getsockname()[1]
    host = f'[{args.host}]' if ':' in args.host else args.host
    scheme = 'https' if args.tls_cert else 'http'
    base_url = args.public_url or f'{scheme}://{host}:{port}/'
    if args.grpc:
        asyncio.run(serve_grpc_only(host, sock, args.ready_file, args.log_level))
        return
    signing = (args.sign_key, args.jwks_out, args.tamper) if args.sign_key else None
    app = build_app(base_url, args.dialects, args.push, args.extended_key, signing)
    if args.log_traceparent:
        app = logging_traceparent(app, args.log_traceparent)
    tls = {}
    if args.tls_cert:
        import ssl
        tls = {'ssl_certfile': args.tls_cert, 'ssl_keyfile': args.tls_key}
        if args.client_ca:
            tls.update(ssl_ca_certs=args.client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    config = uvicorn.Config(app, log_level=args.log_level,
                            timeout_graceful_shutdown=2, **tls)
    asyncio.run(serve(uvicorn.Server(config), sock, args.ready_file))


if __name__ == '__main__':
    main()

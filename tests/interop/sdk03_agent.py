"""An A2A 0.3 agent built the way agents built on the official a2a-sdk 0.3.x are.

a2a-sdk 0.3.x is the SDK most deployed 0.3 agents run; its server differs from the 1.x
SDK's 0.3 compat layer (tests/interop/echo_reference_agent.py) in ways a gateway meets:

  - tasks/resubscribe answers -32001 "Task not found" for a task no producer is running
    for (one waiting for input), although tasks/get returns it;
  - a streamed answer to a question opens with a working status update, not the task.

    python sdk03_agent.py --port 0 --ready-file PATH

Serves JSON-RPC at / and the 0.3 card at /.well-known/agent-card.json. With --grpc it
serves the 0.3 gRPC binding (package a2a.v1, the SDK's GrpcHandler) on a free port of
--host instead, and the HTTP port serves the card alone, whose url is that gRPC target
(preferredTransport GRPC). Behaviour (text =
the user message's text parts joined):
  - "/input <question>" -> input-required, status message <question>; the next message
                           on that task completes it, echoing its text
  - otherwise           -> working, one artifact "echo" holding the text, completed.
--port 0 binds a free port; --ready-file PATH gets that port (decimal, then a newline)
once the server accepts connections, written atomically.
"""

import argparse
import asyncio
import logging

import uvicorn

from listening import bind, serve
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.apps import A2AStarletteApplication
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentSkill,
    Part,
    TaskState,
    TextPart,
)
from a2a.utils import new_agent_text_message, new_task


class Echo(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        # As the SDK's samples do: a new task is enqueued first.
        task = context.current_task
        if task is None:
            task = new_task(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if text.startswith('/input ') and context.current_task is None:
            question = new_agent_text_message(text[len('/input '):], task.context_id, task.id)
            await updater.update_status(TaskState.input_required, question, final=True)
            return
        await updater.start_work()
        await updater.add_artifact([Part(root=TextPart(text=text))], name='echo')
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is not None:
            await TaskUpdater(event_queue, task.id, task.context_id).cancel()


def card(base_url: str, transport: str = 'JSONRPC') -> AgentCard:
    return AgentCard(
        name='sdk03-echo',
        description='Echoes text back; an a2a-sdk 0.3.x agent.',
        url=base_url,
        preferred_transport=transport,
        version='1.0.0',
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        capabilities=AgentCapabilities(streaming=True),
        skills=[AgentSkill(id='echo', name='Echo', description='Echoes text', tags=['echo'])],
    )


async def serve_grpc_only(host: str, sock, ready_file: str | None, log_level: str) -> None:
    """The SDK's gRPC server on a free port, and the card (naming only it) over HTTP."""
    import grpc
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from a2a.grpc import a2a_pb2_grpc
    from a2a.server.request_handlers import GrpcHandler

    server = grpc.aio.server()
    grpc_port = server.add_insecure_port(f'{host}:0')
    served = card(f'{host}:{grpc_port}', 'GRPC')
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore())
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(served, handler), server)
    await server.start()
    document = served.model_dump(mode='json', by_alias=True, exclude_none=True)

    async def agent_card(_request):
        return JSONResponse(document)

    app = Starlette(routes=[Route('/.well-known/agent-card.json', agent_card)])
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2)
    try:
        await serve(uvicorn.Server(config), sock, ready_file)
    finally:
        await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True, help='0 = any free port')
    parser.add_argument('--ready-file', help='write the bound port here once listening')
    parser.add_argument('--log-level', default='warning')
    parser.add_argument('--grpc', action='store_true',
                        help='serve over gRPC only; the HTTP port serves the card')
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    sock = bind(args.host, args.port)
    if args.grpc:
        asyncio.run(serve_grpc_only(args.host, sock, args.ready_file, args.log_level))
        return
    base_url = f'http://{args.host}:{sock.getsockname()[1]}/'
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore())
    app = A2AStarletteApplication(agent_card=card(base_url), http_handler=handler).build()
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=2)
    asyncio.run(serve(uvicorn.Server(config), sock, args.ready_file))


if __name__ == '__main__':
    main()

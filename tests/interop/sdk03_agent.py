"""An A2A 0.3 agent built the way agents built on the official a2a-sdk 0.3.x are.

a2a-sdk 0.3.x is the SDK most deployed 0.3 agents run; its server differs from the 1.x
SDK's 0.3 compat layer (tests/interop/echo_reference_agent.py) in ways a gateway meets:

  - tasks/resubscribe answers -32001 "Task not found" for a task no producer is running
    for (one waiting for input), although tasks/get returns it;
  - a streamed answer to a question opens with a working status update, not the task.

    python sdk03_agent.py --port 0 --ready-file PATH

Serves JSON-RPC at / and the 0.3 card at /.well-known/agent-card.json. Behaviour (text =
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


def card(base_url: str) -> AgentCard:
    return AgentCard(
        name='sdk03-echo',
        description='Echoes text back; an a2a-sdk 0.3.x agent.',
        url=base_url,
        version='1.0.0',
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        capabilities=AgentCapabilities(streaming=True),
        skills=[AgentSkill(id='echo', name='Echo', description='Echoes text', tags=['echo'])],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True, help='0 = any free port')
    parser.add_argument('--ready-file', help='write the bound port here once listening')
    parser.add_argument('--log-level', default='warning')
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    sock = bind(args.host, args.port)
    base_url = f'http://{args.host}:{sock.getsockname()[1]}/'
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore())
    app = A2AStarletteApplication(agent_card=card(base_url), http_handler=handler).build()
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=2)
    asyncio.run(serve(uvicorn.Server(config), sock, args.ready_file))


if __name__ == '__main__':
    main()

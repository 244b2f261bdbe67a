"""Reference "echo" A2A agent built with the official a2a-sdk (1.x) server.

Mirrors the a2a-gateway built-in echo agent so the interop client can be
checked against a known-good server, and so the gateway's proxy tests have a
real upstream agent. Serves A2A 1.0 JSON-RPC plus the SDK's 0.3 compat mode on
the same endpoint, and the card at /.well-known/agent-card.json.

    python echo_reference_agent.py --port 9999

Behaviour (text = the user message's text parts joined with ""):
  - messageId starting "tck-message-response" -> Message "Direct message response"
  - "/message <text>"     -> Message <text>
  - "/input <question>"   -> input-required, status message <question>; the next
                             message on that task completes it, echoing its text
  - "/fail", "/reject"    -> failed, rejected
  - "/delay <secs> <text>" -> stays working for secs, then echoes <text>
  - otherwise             -> working, one artifact "echo" holding the text, completed.
    On a streaming call the artifact arrives as 3 chunks (split on whitespace,
    separators kept, append/lastChunk set) sharing one artifactId.
"""

import argparse
import asyncio
import logging
import re
import uuid

import uvicorn
from starlette.applications import Starlette

from a2a.helpers import new_task, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskState,
)

STREAMING_METHODS = {'SendStreamingMessage', 'message/stream'}  # 1.0, 0.3
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
        followup = context.current_task is not None  # answer to "/input"
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
        elif text.startswith('/delay'):
            _, secs, text = (text.split(maxsplit=2) + ['', ''])[:3]
            await asyncio.sleep(float(secs or 0))

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


def agent_card(base_url: str) -> AgentCard:
    return AgentCard(
        name='echo',
        description='Echoes text back; A2A interop reference agent (a2a-sdk).',
        version='1.0.0',
        supported_interfaces=[
            AgentInterface(url=base_url, protocol_binding='JSONRPC', protocol_version='1.0'),
            AgentInterface(url=base_url, protocol_binding='JSONRPC', protocol_version='0.3'),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[AgentSkill(
            id='echo', name='Echo', description='Repeats the input text; supports '
            '/delay, /input, /fail, /reject and /message commands.',
            tags=['echo', 'test'], examples=['hello', '/delay 2 hi', '/input Your name?'],
        )],
    )


def build_app(base_url: str) -> Starlette:
    card = agent_card(base_url)
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card,
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(
        handler, rpc_url='/', enable_v0_3_compat=True,
    )
    return Starlette(routes=routes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True)
    parser.add_argument('--public-url', help='URL to advertise in the card '
                        '(default http://HOST:PORT/)')
    parser.add_argument('--log-level', default='warning')
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    base_url = args.public_url or f'http://{args.host}:{args.port}/'
    uvicorn.run(build_app(base_url), host=args.host, port=args.port,
                log_level=args.log_level)


if __name__ == '__main__':
    main()

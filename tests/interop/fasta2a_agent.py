"""Third-party A2A agent: pydantic-ai + FastA2A, with a FunctionModel (no LLM).

A pydantic-ai Agent whose model is a FunctionModel (no network), served as an
A2A server by FastA2A's pydantic-ai bridge (fasta2a.pydantic_ai.agent_to_a2a,
the replacement of pydantic-ai 1.x's Agent.to_a2a()) under uvicorn. It is not
ours: the gateway's tests use it to see how a real third-party A2A server
behaves. JSON-RPC at /, the card at /.well-known/agent-card.json, FastA2A's
docs page at /docs.

    python fasta2a_agent.py --port 9999 [--ready-file PATH] [--public-url URL]

--port 0 binds a free port; --ready-file PATH gets that port (decimal, then a
newline) once the server accepts connections, written atomically.

Wire dialect (FastA2A's, not chosen here): objects of the A2A 1.0 shape (no
"kind", Part {"text": ...}, stream events {"statusUpdate"|"artifactUpdate"|
"task": ...}, card with supportedInterfaces JSONRPC protocolVersion "1.0"), but
method names of 0.3 ("message/send", "tasks/get", ...) answered with lower-case
enums ("working", "agent"); the 1.0 names (SendMessage, GetTask, CancelTask,
SendStreamingMessage, SubscribeToTask, ListTasks) are accepted too and answered
with TASK_STATE_* / ROLE_* enums. The A2A-Version header is ignored.

Behaviour (text = the last user message's text parts joined with ""):
  - every message/send creates a new task and returns it at once, "submitted"
    (rarely "working": the answer is the stored task, serialised after the
    worker may have started; configuration.blocking is ignored, never
    blocks); the worker then runs it: working -> completed, one
    artifact "result" holding "echo: <text>", plus an agent message in history.
    Tasks run one at a time, in order (FastA2A's in-memory broker and worker).
  - "/delay <secs> <text>" -> stays working for secs, then answers "echo: <text>"
    (and holds up every task queued behind it).
  - "/chunks <n> <text>"   -> answers "echo: <text>"; on message/stream that
    answer arrives as up to n artifactUpdate chunks, split at whitespace
    ("echo: " counts as a word) (append true, lastChunk false)
    followed by the whole artifact again (append false, lastChunk true), all
    sharing one artifactId. Any other text streams as 1 chunk + the whole.
  - "/input <question>"    -> input-required, status message <question> (agent);
    no artifact. FastA2A has no way to continue that task: a next message,
    even with its taskId, starts a new task in the same context.
  - "/fail"                -> the model raises: the task ends failed.
A follow-up message with the same contextId is answered from the last message
only, though the model sees the whole context's history.

FastA2A's own behaviour, kept as is: tasks/cancel does nothing (the bridge's
cancel is a no-op) and answers the task as it then is; a message/send,
message/stream or tasks/cancel made while another task runs waits until that
task ends (the in-memory broker hands the worker one operation at a time);
tasks/get with historyLength trims the stored history for good; tasks/list and
ListTasks get -32004, the push-config methods -32003 (0.2 names
tasks/pushNotification/{set,get}) or HTTP 500; an unknown method, a bad JSON
body or invalid params get HTTP 500 text/plain "Internal Server Error".
Timestamps are local time without a zone; SSE events are "data: ...\n\n".
"""

import argparse
import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator
from functools import partial

import uvicorn

from listening import bind, serve
from fasta2a.broker import InMemoryBroker
from fasta2a.pydantic_ai import AgentWorker, agent_to_a2a, worker_lifespan
from fasta2a.schema import Message, Part, Skill, TaskSendParams
from fasta2a.storage import InMemoryStorage
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


def last_user_text(messages: list[ModelMessage]) -> str:
    """The text of the last request that has user text (its parts joined with "")."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            texts = [p.content for p in message.parts
                     if isinstance(p, UserPromptPart) and isinstance(p.content, str)]
            if texts:
                return ''.join(texts)
    return ''


def split_chunks(text: str, count: int) -> list[str]:
    """Split on whitespace into <= count chunks whose concatenation is text."""
    words = re.findall(r'\S+\s*', text)
    if not words:
        return [text]
    words[0] = text[: len(text) - len(text.lstrip())] + words[0]
    n = max(1, min(count, len(words)))
    bounds = [i * len(words) // n for i in range(n + 1)]
    return [''.join(words[a:b]) for a, b in zip(bounds, bounds[1:])]


async def plan(messages: list[ModelMessage]) -> list[str]:
    """The answer to the last user message, as the chunks it streams in."""
    text = last_user_text(messages)
    chunks = 1
    if text.startswith('/fail'):
        raise RuntimeError('failing as asked (/fail)')
    if text.startswith('/delay'):
        _, secs, text = (text.split(maxsplit=2) + ['', ''])[:3]
        await asyncio.sleep(float(secs or 0))
    elif text.startswith('/chunks'):
        _, n, text = (text.split(maxsplit=2) + ['', ''])[:3]
        chunks = int(n) if n.isdigit() else 1
    return split_chunks(f'echo: {text}', chunks)


async def answer(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart(''.join(await plan(messages)))])


async def stream_answer(messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[str]:
    for chunk in await plan(messages):
        yield chunk


class EchoWorker(AgentWorker):
    """FastA2A's pydantic-ai worker, plus "/input": FastA2A supports the
    input-required state, the pydantic-ai bridge never enters it."""

    async def run_task(self, params: TaskSendParams) -> None:
        text = ''.join(p.get('text', '') for p in params['message'].get('parts', []))
        if not text.startswith('/input'):
            await super().run_task(params)
            return
        task_id, context_id = params['id'], params['context_id']
        question = Message(role='agent', parts=[Part(text=text[len('/input'):].strip())],
                           message_id=str(uuid.uuid4()), task_id=task_id, context_id=context_id)
        await self.storage.update_task(task_id, state='working')
        await self.publish_status(task_id, context_id, 'working')
        await self.storage.update_task(task_id, state='input-required', new_messages=[question])
        # Published with its question and the stream closed here, as FastA2A's
        # Worker allows (its own end-of-stream publish then has no subscriber).
        await self.publish_status(task_id, context_id, 'input-required', question)
        await self.broker.event_bus.close(task_id)


def build_app(base_url: str):
    agent = Agent(FunctionModel(answer, stream_function=stream_answer), name='fasta2a-echo')
    storage, broker = InMemoryStorage(), InMemoryBroker()
    worker = EchoWorker(agent=agent, broker=broker, storage=storage)
    app = agent_to_a2a(
        agent, storage=storage, broker=broker, url=base_url,
        description='Echoes text back; third-party A2A interop agent (pydantic-ai + FastA2A).',
        skills=[Skill(id='echo', name='Echo', description='Answers "echo: <text>"; supports '
                      '/delay, /chunks, /input and /fail commands.', tags=['echo', 'test'],
                      examples=['hello', '/chunks 3 one two three', '/input Your name?'],
                      input_modes=['text/plain'], output_modes=['text/plain'])],
        lifespan=partial(worker_lifespan, worker=worker, agent=agent),
    )
    # agent_to_a2a does not pass these on; FastA2A's default is application/json.
    app.default_input_modes = app.default_output_modes = ['text/plain']
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True, help='0 = any free port')
    parser.add_argument('--public-url', help='URL to advertise in the card '
                        '(default http://HOST:PORT/)')
    parser.add_argument('--ready-file', help='write the bound port here once listening')
    parser.add_argument('--log-level', default='warning')
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        parser.exit(1, f'fasta2a agent: cannot bind {args.host}:{args.port}: {e}\n')
    port = sock.getsockname()[1]
    host = f'[{args.host}]' if ':' in args.host else args.host
    base_url = args.public_url or f'http://{host}:{port}/'
    config = uvicorn.Config(build_app(base_url), log_level=args.log_level,
                            timeout_graceful_shutdown=2)
    asyncio.run(serve(uvicorn.Server(config), sock, args.ready_file))


if __name__ == '__main__':
    main()

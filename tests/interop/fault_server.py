"""Fault-injecting fake A2A upstream for the gateway's proxy fault tests.

This is NOT an A2A agent. It is a deliberately broken upstream, used only where
a real SDK server (tests/interop/echo_reference_agent.py, js/echo_agent.mjs)
cannot be made to misbehave: garbage bodies, non-JSON-RPC JSON, answers that
take too long, canned upstream errors. Python standard library only.

    python fault_server.py --port N --mode garbage|invalid|slow|error|extended|malformed|redirect|huge|legacy03 [--delay SECS]
                           [--host 127.0.0.1] [--ready-file PATH] [--extension URI]

GET /.well-known/agent-card.json is always a VALID A2A 1.0 card (name "fault",
one skill, capabilities.streaming true, one interface
{url: "http://HOST:PORT/", protocolBinding: "JSONRPC", protocolVersion: "1.0"}),
so the gateway resolves the upstream normally. Every POST (any path, any
method, any A2A-Version) is answered per --mode:

  garbage  HTTP 200, Content-Type text/plain, body "this is not json"
  invalid  HTTP 200, application/json {"hello":"world"} (not a JSON-RPC response)
  slow     sleeps --delay seconds (default 30), then a valid 1.0 JSON-RPC
           SendMessage result echoing the request id:
           {"jsonrpc":"2.0","id":ID,"result":{"task":{... "TASK_STATE_COMPLETED" ...}}}
           holding one artifact "echo" with the request message's text. For
           SendStreamingMessage / SubscribeToTask the same task is sent, after
           the delay, as a one-event SSE stream (text/event-stream, LF endings)
           that then closes.
  error    HTTP 200, {"jsonrpc":"2.0","id":ID,"error":{"code":-32001,
           "message":"Task not found: upstream says so"}}
  extended as slow without the delay, but the task also carries a field no A2A
           version defines ("x-extension": {"kept": true}), metadata
           {"upstream": "fault"}, a status message naming the task (taskId and
           referenceTaskIds) and a history of the request message and that status
           message (what a relaying gateway must keep or rewrite)
  malformed a JSON-RPC result {"task": {"contextId": "c"}}: a task without id
           or status
  redirect HTTP 307 to /moved with an empty body (POSTs to /moved answer as
           extended): a gateway must not follow it
  huge     HTTP 200, application/json, 17 MiB: a JSON-RPC result whose task
           carries one 17 MiB text artifact
  legacy03 an older 0.3 server (the card is a pure 0.3 one): message/send
           keeps tasks ("/input Q" asks Q and waits; a follow-up on the task, or
           any other text, completes with one "echo" artifact), tasks/get reads
           them, and tasks/resubscribe sends NO task snapshot: one status-update
           with the current state (final) and then closes, even when the task
           is only waiting for input; on a finished task its first SSE event is
           a -32004 error. Other methods answer -32601.

Options for hostile-card tests: --card-interface URL makes the card's interface (and
top-level url) point there instead of at this server; --card-redirect URL answers the card
GET with a 307 to URL; --log-requests FILE appends one JSON line per request received
({"method", "path", "headers"}), to see what reached this server.

ID is the request's "id" when the body is a JSON object with a string or
integer id, else null. Requests are served on separate threads, so several can
be in flight (e.g. many slow ones). --port 0 binds a free port; --ready-file
PATH then gets the bound port (decimal, then a newline) once the socket is
listening, written atomically. Other GET paths are 404.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CARD_PATH = '/.well-known/agent-card.json'
MODES = ('garbage', 'invalid', 'slow', 'error', 'extended', 'malformed', 'redirect', 'huge',
         'legacy03')
STREAMING_METHODS = {'SendStreamingMessage', 'SubscribeToTask'}


def agent_card(base_url: str) -> dict:
    return {
        'name': 'fault',
        'description': 'Deliberately broken A2A upstream (fault injector for gateway tests).',
        'version': '1.0.0',
        'supportedInterfaces': [
            {'url': base_url, 'protocolBinding': 'JSONRPC', 'protocolVersion': '1.0'},
        ],
        'capabilities': {'streaming': True, 'pushNotifications': False},
        'defaultInputModes': ['text/plain'],
        'defaultOutputModes': ['text/plain'],
        'skills': [{
            'id': 'fault', 'name': 'Fault',
            'description': 'Answers every call wrongly, slowly or with an error.',
            'tags': ['test', 'fault'],
        }],
    }


def legacy_card(base_url: str) -> dict:
    card = agent_card(base_url)
    del card['supportedInterfaces']
    card.update({'url': base_url, 'protocolVersion': '0.3.0', 'preferredTransport': 'JSONRPC'})
    return card


class Legacy03:
    """The legacy03 mode's tasks (0.3 shapes), shared by the server's threads."""

    tasks: dict = {}
    lock = threading.Lock()

    @classmethod
    def send(cls, params: dict) -> dict:
        message = params['message']
        text = ''.join(p.get('text', '') for p in message.get('parts', []))
        with cls.lock:
            task = cls.tasks.get(message.get('taskId') or '')
            if task is None:
                task = {'kind': 'task', 'id': str(uuid.uuid4()),
                        'contextId': message.get('contextId') or str(uuid.uuid4()),
                        'history': [], 'artifacts': []}
                cls.tasks[task['id']] = task
            task['history'].append(dict(message, taskId=task['id'], contextId=task['contextId']))
            waiting = task.get('status', {}).get('state') == 'input-required'
            if text.startswith('/input') and not waiting:
                question = {'kind': 'message', 'messageId': str(uuid.uuid4()), 'role': 'agent',
                            'parts': [{'kind': 'text', 'text': text[6:].strip() or '?'}],
                            'taskId': task['id'], 'contextId': task['contextId']}
                task['status'] = {'state': 'input-required', 'message': question, 'timestamp': now()}
            else:
                task['artifacts'].append({'artifactId': str(uuid.uuid4()), 'name': 'echo',
                                          'parts': [{'kind': 'text', 'text': text}]})
                task['status'] = {'state': 'completed', 'timestamp': now()}
            return json.loads(json.dumps(task))

    @classmethod
    def cancel(cls, task_id: str):
        with cls.lock:
            task = cls.tasks.get(task_id)
            if task and task['status']['state'] == 'input-required':
                task['status'] = {'state': 'canceled', 'timestamp': now()}
            return json.loads(json.dumps(task)) if task else None

    @classmethod
    def get(cls, task_id: str):
        with cls.lock:
            task = cls.tasks.get(task_id)
            return json.loads(json.dumps(task)) if task else None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec='milliseconds').replace('+00:00', 'Z')


def completed_task(params: object) -> dict:
    """A completed 1.0 Task echoing the request message's text parts."""
    message = params.get('message') if isinstance(params, dict) else None
    message = message if isinstance(message, dict) else {}
    parts = message.get('parts') if isinstance(message.get('parts'), list) else []
    text = ''.join(p['text'] for p in parts if isinstance(p, dict) and isinstance(p.get('text'), str))
    context_id = message.get('contextId')
    return {
        'id': str(uuid.uuid4()),
        'contextId': context_id if isinstance(context_id, str) and context_id else str(uuid.uuid4()),
        'status': {'state': 'TASK_STATE_COMPLETED', 'timestamp': now()},
        'artifacts': [{'artifactId': str(uuid.uuid4()), 'name': 'echo', 'parts': [{'text': text}]}],
    }


class FaultHandler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    server_version = 'a2a-fault-server/1.0'
    # Set on the class by main().
    mode = 'error'
    delay = 30.0
    base_url = 'http://127.0.0.1:0/'
    verbose = False
    card_interface = None
    card_redirect = None
    log_requests = None
    extension = None

    def log_request_seen(self) -> None:
        if self.log_requests:
            with open(self.log_requests, 'a') as f:
                f.write(json.dumps({'method': self.command, 'path': self.path,
                                    'headers': {k.lower(): v for k, v in self.headers.items()}}) + '\n')

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        if self.verbose:
            super().log_message(format, *args)

    def send_body(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header('Content-Type', content_type)
        self.activated_header()
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, obj: object, status: int = 200) -> None:
        self.send_body(status, 'application/json', json.dumps(obj).encode())

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self.log_request_seen()
        # The card itself, asked for with a query, is served: a redirect can point there.
        if self.path == CARD_PATH and self.card_redirect:
            self.send_response(307)
            self.send_header('Location', self.card_redirect)
            self.send_header('Content-Length', '0')
            self.end_headers()
        elif self.path.split('?', 1)[0] == CARD_PATH:
            card = (legacy_card if self.mode == 'legacy03' else agent_card)(
                self.card_interface or self.base_url)
            if self.extension:
                card['capabilities']['extensions'] = [
                    {'uri': self.extension, 'description': 'required by --extension',
                     'required': True}]
            self.send_json(card)
        else:
            self.send_body(404, 'text/plain', b'not found\n')

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self.log_request_seen()
        length = int(self.headers.get('Content-Length') or 0)
        raw = self.rfile.read(length) if length > 0 else b''
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        request_id = body.get('id') if isinstance(body, dict) else None
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
            request_id = None

        try:
            if self.mode == 'redirect' and self.path != '/moved':
                self.send_response(307)
                self.send_header('Location', '/moved')
                self.send_header('Content-Length', '0')
                self.end_headers()
            elif self.mode == 'huge':
                task = completed_task(body.get('params') if isinstance(body, dict) else None)
                task['artifacts'] = [{'artifactId': 'big', 'parts': [{'text': 'x' * (17 << 20)}]}]
                self.send_json({'jsonrpc': '2.0', 'id': request_id, 'result': {'task': task}})
            elif self.mode == 'legacy03':
                self.legacy03(body if isinstance(body, dict) else {}, request_id)
            elif self.mode == 'garbage':
                self.send_body(200, 'text/plain', b'this is not json')
            elif self.mode == 'invalid':
                self.send_json({'hello': 'world'})
            elif self.mode == 'error':
                self.send_json({'jsonrpc': '2.0', 'id': request_id, 'error': {
                    'code': -32001, 'message': 'Task not found: upstream says so'}})
            elif self.mode == 'malformed':
                self.send_json({'jsonrpc': '2.0', 'id': request_id,
                                'result': {'task': {'contextId': 'c'}}})
            elif self.mode in ('extended', 'redirect'):
                params = body.get('params') if isinstance(body, dict) else None
                task = completed_task(params)
                message = params.get('message') if isinstance(params, dict) else None
                reply = {'messageId': str(uuid.uuid4()), 'role': 'ROLE_AGENT', 'taskId': task['id'],
                         'contextId': task['contextId'], 'referenceTaskIds': [task['id']],
                         'parts': [{'text': 'done'}]}
                task['status']['message'] = reply
                if isinstance(message, dict):
                    task['history'] = [dict(message, taskId=task['id'], contextId=task['contextId']), reply]
                task['x-extension'] = {'kept': True}
                task['metadata'] = {'upstream': 'fault'}
                self.send_json({'jsonrpc': '2.0', 'id': request_id, 'result': {'task': task}})
            else:  # slow
                time.sleep(self.delay)
                result = {'task': completed_task(body.get('params') if isinstance(body, dict) else None)}
                reply = {'jsonrpc': '2.0', 'id': request_id, 'result': result}
                if isinstance(body, dict) and body.get('method') in STREAMING_METHODS:
                    self.send_sse([reply])
                else:
                    self.send_json(reply)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the caller gave up (e.g. a gateway timeout)

    def legacy03(self, body: dict, request_id) -> None:
        method, params = body.get('method'), body.get('params') or {}
        if method == 'message/send':
            self.send_json({'jsonrpc': '2.0', 'id': request_id, 'result': Legacy03.send(params)})
            return
        if method == 'tasks/cancel':
            # As fasta2a does: the task is answered as it is after the cancel, whether or
            # not this call canceled it (a task canceled before is answered again).
            task = Legacy03.cancel(params.get('id', ''))
            reply = {'result': task} if task else {'error': {'code': -32001, 'message': 'Task not found'}}
            self.send_json({'jsonrpc': '2.0', 'id': request_id, **reply})
            return
        task = Legacy03.get(params.get('id', '')) if method in ('tasks/get', 'tasks/resubscribe') else None
        if method == 'tasks/get' and task:
            self.send_json({'jsonrpc': '2.0', 'id': request_id, 'result': task})
        elif method == 'tasks/get':
            self.send_json({'jsonrpc': '2.0', 'id': request_id,
                            'error': {'code': -32001, 'message': 'Task not found'}})
        elif method == 'tasks/resubscribe' and task and task['status']['state'] == 'completed':
            self.send_sse([{'jsonrpc': '2.0', 'id': request_id, 'error': {
                'code': -32004, 'message': 'Task is in a terminal state and cannot be subscribed to'}}],
                event='error')
        elif method == 'tasks/resubscribe' and task:
            self.send_sse([{'jsonrpc': '2.0', 'id': request_id, 'result': {
                'kind': 'status-update', 'taskId': task['id'], 'contextId': task['contextId'],
                'status': task['status'], 'final': True}}])
        else:
            self.send_json({'jsonrpc': '2.0', 'id': request_id,
                            'error': {'code': -32601, 'message': f'Method not found: {method}'}})

    def activated_header(self) -> None:
        """With --extension: says it activated it when the request asked for it."""
        asked = self.headers.get('A2A-Extensions') or self.headers.get('X-A2A-Extensions') or ''
        if self.extension and self.extension in [a.strip() for a in asked.split(',')]:
            self.send_header('A2A-Extensions', self.extension)

    def send_sse(self, events: list, event: str = '') -> None:
        self.send_response(200)
        self.send_header('Content-Type', 'text/event-stream')
        self.activated_header()
        self.send_header('Cache-Control', 'no-cache')
        self.send_header('Connection', 'close')
        self.end_headers()
        for data in events:
            name = f'event: {event}\n' if event else ''
            self.wfile.write(f'{name}data: {json.dumps(data)}\n\n'.encode())
        self.wfile.flush()
        self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True  # in-flight slow requests do not block exit
    allow_reuse_address = True
    request_queue_size = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True, help='0 = any free port')
    parser.add_argument('--mode', choices=MODES, required=True)
    parser.add_argument('--delay', type=float, default=30.0,
                        help='seconds a slow-mode answer takes (default 30)')
    parser.add_argument('--ready-file', help='write the bound port here once listening')
    parser.add_argument('--verbose', action='store_true', help='log every request to stderr')
    parser.add_argument('--card-interface', help="the URL the card's interface names")
    parser.add_argument('--card-redirect', help='answer the card GET with a 307 to this URL')
    parser.add_argument('--log-requests', help='append one JSON line per request here')
    parser.add_argument('--extension', help='list this extension URI in the card, required, '
                        'and answer A2A-Extensions with it when a request asks for it')
    args = parser.parse_args()

    if ':' in args.host:
        Server.address_family = socket.AF_INET6
    try:
        server = Server((args.host, args.port), FaultHandler)
    except OSError as e:
        parser.exit(1, f'fault server: cannot bind {args.host}:{args.port}: {e}\n')
    port = server.server_address[1]
    host = f'[{args.host}]' if ':' in args.host else args.host
    FaultHandler.mode = args.mode
    FaultHandler.delay = args.delay
    FaultHandler.base_url = f'http://{host}:{port}/'
    FaultHandler.verbose = args.verbose
    FaultHandler.card_interface = args.card_interface
    FaultHandler.card_redirect = args.card_redirect
    FaultHandler.log_requests = args.log_requests
    FaultHandler.extension = args.extension
    if args.ready_file:
        tmp = f'{args.ready_file}.{os.getpid()}.tmp'
        with open(tmp, 'w') as f:
            f.write(f'{port}\n')
        os.replace(tmp, args.ready_file)
    print(f'fault server ({args.mode}) on {FaultHandler.base_url}', file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == '__main__':
    main()

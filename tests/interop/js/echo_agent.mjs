/**
 * Reference "echo" A2A agent built with the official JavaScript SDK
 * (@a2a-js/sdk 1.x, Express server helpers).
 *
 * Mirrors tests/interop/echo_reference_agent.py (the a2a-sdk Python agent),
 * which mirrors the a2a-gateway built-in echo agent, so the interop client can
 * be checked against a known-good JS server and the gateway's proxy tests have
 * a real JS upstream.
 *
 *   node echo_agent.mjs --port 9999 [--host 127.0.0.1] [--public-url URL]
 *                       [--dialects 1.0,0.3] [--ready-file PATH]
 *
 * Serves, all from one DefaultRequestHandler:
 *   GET  /.well-known/agent-card.json   the card (see --dialects)
 *   POST /                              JSON-RPC
 *   /rest/...                           HTTP+JSON 1.0 (`/rest/message:send`, ...)
 *                                        and/or 0.3 (`/rest/v1/message:send`, ...)
 *
 * --dialects picks the dialects the card advertises and the server answers:
 *   1.0,0.3 (default)  JSONRPC and HTTP+JSON interfaces for 1.0 and 0.3, the
 *                      SDK's `legacyCompat` on; card in 1.0 shape for
 *                      `A2A-Version: 1.0`, hybrid 0.3 shape (0.3 top-level
 *                      fields plus supportedInterfaces) when the header is
 *                      absent or 0.x; `Vary: A2A-Version`.
 *   1.0                1.0 interfaces only, no `legacyCompat`; always the 1.0 card.
 *   0.3                0.3 interfaces only, `legacyCompat` on; always a pure 0.3
 *                      card (top-level url, protocolVersion "0.3.0",
 *                      preferredTransport JSONRPC, additionalInterfaces for
 *                      HTTP+JSON, no supportedInterfaces) whatever the header.
 * In SDK 1.3.0 the servers accept an `A2A-Version` only if it equals (as a
 * string) a protocolVersion the card declares for that binding (-32009
 * otherwise), a missing header counts as "0.3", and JSON-RPC goes to the 0.3
 * handler iff the header is absent or exactly "0.3" (and legacyCompat is on).
 * So in 0.3 mode a 1.0 method name, or any request with `A2A-Version: 1.0`,
 * is refused.
 *
 * --port 0 binds a free port; --ready-file PATH gets that port (decimal, then
 * a newline) once the server is listening, written atomically.
 *
 * Behaviour (text = the user message's text parts joined with ""):
 *   - messageId starting "tck-message-response" -> Message "Direct message response"
 *   - "/message <text>"     -> Message <text>
 *   - "/input <question>"   -> input-required, status message <question>; the next
 *                              message on that task completes it, echoing its text
 *   - "/auth <why>"         -> auth-required, status message <why>; continued like /input
 *   - "/fail", "/reject"    -> failed, rejected
 *   - "/delay <secs> <text>" -> stays working for secs, then echoes <text>
 *   - otherwise             -> working, one artifact "echo" holding the text, completed.
 *     On a streaming call the artifact arrives as 3 chunks (split on whitespace,
 *     separators kept, append/lastChunk set) sharing one artifactId.
 */

import { randomUUID } from 'node:crypto';
import { renameSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import express from 'express';

import { AGENT_CARD_PATH, Role, TaskState } from '@a2a-js/sdk';
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore } from '@a2a-js/sdk/server';
import {
  UserBuilder,
  agentCardHandler,
  jsonRpcHandler,
  restHandler,
} from '@a2a-js/sdk/server/express';

const TCK_MESSAGE_PREFIX = 'tck-message-response';
const STREAMING_KEY = 'echo.streaming'; // ServerCallContext.state flag, set below
export const DIALECTS = ['1.0', '0.3'];
const PURE_03_VERSION = '0.3.0'; // card protocolVersion in 0.3-only mode

/** Split on whitespace into <= count chunks whose concatenation is text. */
export function splitChunks(text, count = 3) {
  const words = text.match(/\S+\s*/g);
  if (!words) return [text];
  words[0] = text.slice(0, text.length - text.trimStart().length) + words[0];
  const n = Math.min(count, words.length);
  const bounds = Array.from({ length: n + 1 }, (_, i) => Math.floor((i * words.length) / n));
  return bounds.slice(0, -1).map((a, i) => words.slice(a, bounds[i + 1]).join(''));
}

const textPart = (text) => ({
  content: { $case: 'text', value: text },
  metadata: undefined,
  filename: '',
  mediaType: '',
});

function agentMessage(text, { contextId = '', taskId = '' } = {}) {
  return {
    messageId: randomUUID(),
    role: Role.ROLE_AGENT,
    parts: [textPart(text)],
    contextId,
    taskId,
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  };
}

const textOf = (message) =>
  (message.parts ?? [])
    .filter((p) => p.content?.$case === 'text')
    .map((p) => p.content.value)
    .join('');

/** Resolves after secs, or early (false) when signal aborts. */
function sleep(secs, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const timer = setTimeout(() => resolve(true), secs * 1000);
    signal.addEventListener('abort', () => { clearTimeout(timer); resolve(false); }, { once: true });
  });
}

class EchoExecutor {
  /** taskId -> contextId of every task this agent created (cancel needs it). */
  contexts = new Map();
  /** taskId -> AbortController of a "/delay" that is still sleeping. */
  sleeping = new Map();

  async execute(ctx, bus) {
    const message = ctx.userMessage;
    const text = textOf(message);
    const { taskId, contextId } = ctx;

    if (message.messageId.startsWith(TCK_MESSAGE_PREFIX)) {
      bus.publish(AgentEvent.message(agentMessage('Direct message response', { contextId })));
      return;
    }
    const followup = ctx.task !== undefined; // answer to "/input" or "/auth"
    if (!followup && text.startsWith('/message')) {
      bus.publish(AgentEvent.message(agentMessage(text.slice('/message'.length).trim(), { contextId })));
      return;
    }

    if (!followup) {
      this.contexts.set(taskId, contextId);
      bus.publish(AgentEvent.task({
        id: taskId,
        contextId,
        status: { state: TaskState.TASK_STATE_SUBMITTED, message: undefined, timestamp: now() },
        artifacts: [],
        history: [message],
        metadata: undefined,
      }));
    }
    const status = (state, statusMessage) => bus.publish(AgentEvent.statusUpdate({
      taskId,
      contextId,
      status: { state, message: statusMessage, timestamp: now() },
      metadata: undefined,
    }));

    if (!followup && text.startsWith('/reject')) {
      status(TaskState.TASK_STATE_REJECTED);
      return;
    }
    status(TaskState.TASK_STATE_WORKING);
    let echo = text;
    if (followup) {
      // echo the answer as is
    } else if (text.startsWith('/fail')) {
      status(TaskState.TASK_STATE_FAILED);
      return;
    } else if (text.startsWith('/input')) {
      const question = text.slice('/input'.length).trim();
      status(TaskState.TASK_STATE_INPUT_REQUIRED, agentMessage(question, { contextId, taskId }));
      return;
    } else if (text.startsWith('/auth')) {
      const why = text.slice('/auth'.length).trim();
      status(TaskState.TASK_STATE_AUTH_REQUIRED, agentMessage(why, { contextId, taskId }));
      return;
    } else if (text.startsWith('/delay')) {
      const [, secs = '', rest = ''] = splitMax(text, 2);
      echo = rest;
      const abort = new AbortController();
      this.sleeping.set(taskId, abort);
      try {
        if (!(await sleep(Number(secs || 0) || 0, abort.signal))) return; // canceled
      } finally {
        this.sleeping.delete(taskId);
      }
    }

    const streaming = ctx.context?.state?.get(STREAMING_KEY) === true;
    const chunks = streaming ? splitChunks(echo) : [echo];
    const artifactId = randomUUID();
    chunks.forEach((chunk, i) => bus.publish(AgentEvent.artifactUpdate({
      taskId,
      contextId,
      artifact: {
        artifactId,
        name: 'echo',
        description: '',
        parts: [textPart(chunk)],
        metadata: undefined,
        extensions: [],
      },
      append: i > 0,
      lastChunk: i === chunks.length - 1,
      metadata: undefined,
    })));
    status(TaskState.TASK_STATE_COMPLETED);
  }

  /**
   * Called by DefaultRequestHandler.cancelTask while the task's event bus is
   * alive (a sleeping "/delay", or a task waiting in input-required); the
   * handler then waits on that bus for a terminal status, so always publish.
   */
  async cancelTask(taskId, bus) {
    this.sleeping.get(taskId)?.abort();
    bus.publish(AgentEvent.statusUpdate({
      taskId,
      contextId: this.contexts.get(taskId) ?? '',
      status: { state: TaskState.TASK_STATE_CANCELED, message: undefined, timestamp: now() },
      metadata: undefined,
    }));
  }
}

/** Python's str.split(maxsplit=n): whitespace-separated, rest kept whole. */
function splitMax(text, n) {
  const out = [];
  let rest = text.trimStart();
  while (rest && out.length < n) {
    const m = rest.match(/^(\S+)\s*/);
    out.push(m[1]);
    rest = rest.slice(m[0].length);
  }
  if (rest) out.push(rest);
  return out;
}

const now = () => new Date().toISOString();

/**
 * The SDK gives the executor no direct "was this a streaming call" flag; the
 * ServerCallContext given to sendMessageStream is the one the executor sees
 * as RequestContext.context, so mark it there (both 1.0 and 0.3 paths).
 */
class EchoRequestHandler extends DefaultRequestHandler {
  sendMessageStream(params, context) {
    context?.state?.set(STREAMING_KEY, true);
    return super.sendMessageStream(params, context);
  }
}

/** "1.0,0.3" -> ['1.0', '0.3'] (order kept: it is the card's preference order). */
export function parseDialects(value) {
  const out = [];
  for (const d of value.split(',').map((x) => x.trim())) {
    if (!DIALECTS.includes(d)) throw new Error(`unknown dialect '${d}' (choose from 1.0, 0.3)`);
    if (!out.includes(d)) out.push(d);
  }
  if (out.length === 0) throw new Error('no dialect given');
  return out;
}

/**
 * The 1.0-shape card the request handler works from. Its interface versions
 * are what the SDK checks `A2A-Version` against, so 0.3 stays "0.3" here.
 */
export function agentCard(baseUrl, dialects = DIALECTS) {
  const base = baseUrl.replace(/\/+$/, '');
  const iface = (url, protocolBinding, protocolVersion) =>
    ({ url, protocolBinding, protocolVersion, tenant: '' });
  return {
    name: 'echo',
    description: 'Echoes text back; A2A interop reference agent (@a2a-js/sdk).',
    version: '1.0.0',
    supportedInterfaces: [
      ...dialects.map((d) => iface(`${base}/`, 'JSONRPC', d)),
      ...dialects.map((d) => iface(`${base}/rest`, 'HTTP+JSON', d)),
    ],
    capabilities: { streaming: true, pushNotifications: false, extensions: [] },
    securitySchemes: {},
    securityRequirements: [],
    defaultInputModes: ['text/plain'],
    defaultOutputModes: ['text/plain'],
    skills: [{
      id: 'echo',
      name: 'Echo',
      description: 'Repeats the input text; supports /delay, /input, /fail, /reject and /message commands.',
      tags: ['echo', 'test'],
      examples: ['hello', '/delay 2 hi', '/input Your name?'],
      inputModes: [],
      outputModes: [],
      securityRequirements: [],
    }],
    signatures: [],
  };
}

/**
 * The card a 0.3 agent serves, for 0.3-only mode (the SDK's own 0.3 card
 * converter is not exported, and its legacy card router always embeds
 * supportedInterfaces).
 */
export function agentCard03(baseUrl) {
  const core = agentCard(baseUrl, ['0.3']);
  const [primary, ...rest] = core.supportedInterfaces;
  return {
    name: core.name,
    description: core.description,
    version: core.version,
    url: primary.url,
    preferredTransport: primary.protocolBinding,
    protocolVersion: PURE_03_VERSION,
    additionalInterfaces: rest.map((i) => ({ url: i.url, transport: i.protocolBinding })),
    capabilities: { streaming: true, pushNotifications: false },
    defaultInputModes: core.defaultInputModes,
    defaultOutputModes: core.defaultOutputModes,
    skills: core.skills.map(({ id, name, description, tags, examples }) =>
      ({ id, name, description, tags, examples })),
  };
}

export function buildApp(baseUrl, dialects = DIALECTS) {
  const requestHandler = new EchoRequestHandler(
    agentCard(baseUrl, dialects), new InMemoryTaskStore(), new EchoExecutor());
  const legacyCompat = { enabled: dialects.includes('0.3') };
  const userBuilder = UserBuilder.noAuthentication;
  const app = express();
  if (dialects.length === 1 && dialects[0] === '0.3') {
    const card = agentCard03(baseUrl);
    app.get(`/${AGENT_CARD_PATH}`, (_req, res) => res.json(card));
  } else {
    app.use(`/${AGENT_CARD_PATH}`, agentCardHandler({ agentCardProvider: requestHandler, legacyCompat }));
  }
  app.use('/rest', restHandler({ requestHandler, userBuilder, legacyCompat }));
  app.use('/', jsonRpcHandler({ requestHandler, userBuilder, legacyCompat }));
  return app;
}

function main() {
  const usage = 'usage: node echo_agent.mjs --port N [--host 127.0.0.1] [--public-url URL] '
    + '[--dialects 1.0,0.3|1.0|0.3] [--ready-file PATH]';
  let values;
  let dialects;
  try {
    ({ values } = parseArgs({
      options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string' },
        'public-url': { type: 'string' },
        dialects: { type: 'string', default: DIALECTS.join(',') },
        'ready-file': { type: 'string' },
      },
    }));
    dialects = parseDialects(values.dialects);
  } catch (err) {
    console.error(`${err.message}\n${usage}`);
    process.exit(2);
  }
  const port = Number(values.port);
  if (!values.port || !Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(usage);
    process.exit(2);
  }
  // Listen first so that --port 0 is resolved before the card (which carries
  // the port) is built; the app is attached in the listening callback, before
  // any connection can be served.
  let app;
  const server = createServer((req, res) => {
    if (app) return app(req, res);
    res.writeHead(503).end();
  });
  server.listen(port, values.host, () => {
    const bound = server.address().port;
    const host = values.host.includes(':') ? `[${values.host}]` : values.host;
    const baseUrl = values['public-url'] ?? `http://${host}:${bound}/`;
    app = buildApp(baseUrl, dialects);
    const readyFile = values['ready-file'];
    if (readyFile) {
      const tmp = `${readyFile}.${process.pid}.tmp`;
      writeFileSync(tmp, `${bound}\n`);
      renameSync(tmp, readyFile);
    }
    console.log(`echo agent (@a2a-js/sdk) on http://${host}:${bound}/ `
      + `card /${AGENT_CARD_PATH} dialects ${dialects.join(',')}`);
  });
  server.on('error', (err) => {
    console.error(`echo agent: cannot listen on ${values.host}:${port}: ${err.message}`);
    process.exit(1);
  });
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.on(sig, () => server.close(() => process.exit(0)).closeAllConnections());
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) main();

// The console's way to the gateway. A2A calls to an agent go through the official
// JavaScript client (@a2a-js/sdk: its ClientFactory and JSON-RPC transport, built from the
// agent's card), and come back as A2A 1.0 JSON (the SDK's own toJSON), which the page
// renders. The gateway's own endpoints (the agent list, health, the aggregated card) are
// plain `fetch`.

import { AgentCard, CancelTaskRequest, GetTaskRequest, ListTasksRequest, ListTasksResponse,
  SendMessageRequest, StreamResponse, SubscribeToTaskRequest, Task } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory } from '@a2a-js/sdk/client';

/** A JSON-RPC error or an HTTP failure, with what the page shows. */
export class CallError extends Error {
  constructor(message, { code = null, status = null, reason = null } = {}) {
    super(message);
    this.code = code;
    this.status = status;
    this.reason = reason;
  }
}

export class Gateway {
  /** `base`: the gateway's origin (and path prefix); `credential`: {kind, value} or null. */
  constructor(base, credential) {
    this.base = base.replace(/\/+$/, '');
    this.credential = credential;
    this.cards = new Map();
  }

  headers(extra = {}) {
    const h = { 'A2A-Version': '1.0', ...extra };
    const c = this.credential;
    if (c && c.value) {
      if (c.kind === 'bearer') h.Authorization = `Bearer ${c.value}`;
      else h['X-API-Key'] = c.value;
    }
    return h;
  }

  /** `fetch` with the credential, noting each answer's status in `seen`, and for an event
   * stream the id of the last event read (`seen.lastEventId`); a request made while
   * `seen.resume` is set carries it as `Last-Event-ID` (picking a stream up). */
  fetcher(seen = {}) {
    const auth = this.headers();
    delete auth['A2A-Version'];
    return async (input, init = {}) => {
      const headers = new Headers(init.headers || {});
      for (const [k, v] of Object.entries(auth)) headers.set(k, v);
      if (seen.resume) headers.set('Last-Event-ID', seen.resume);
      let resp;
      try {
        resp = await fetch(input, { ...init, headers });
      } catch (e) {
        if (e.name === 'AbortError') throw e;
        throw unreachable(this.base, e);
      }
      seen.status = resp.status;
      const type = resp.headers.get('content-type') || '';
      if (resp.body && type.startsWith('text/event-stream')) {
        resp = new Response(resp.body.pipeThrough(eventIds(seen)), {
          status: resp.status,
          statusText: resp.statusText,
          headers: resp.headers,
        });
      }
      return resp;
    };
  }

  async getJson(path) {
    const resp = await this.fetcher()(this.base + path, { headers: { 'A2A-Version': '1.0' } });
    const body = await resp.json().catch(() => null);
    if (!resp.ok) throw httpError(resp.status, body);
    return body;
  }

  /** An SDK client for the agent at `path` (`/a2a/agents/<name>`), from its card. */
  async client(path, seen) {
    let card = this.cards.get(path);
    if (!card) {
      const resolver = new DefaultAgentCardResolver({ fetchImpl: this.fetcher(seen) });
      try {
        card = await resolver.resolve(`${this.base}${path}/`, 'card');
      } catch (e) {
        throw asCallError(e, seen);
      }
      this.cards.set(path, card);
    }
    const options = ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl: this.fetcher(seen) })],
    });
    return new ClientFactory(options).createFromAgentCard(AgentCard.fromJSON(AgentCard.toJSON(card)));
  }

  /** One call: `GetTask`, `CancelTask` or `ListTasks`; its result as 1.0 JSON. */
  async call(path, method, params) {
    if (path === '/a2a') return this.plainCall(path, method, params);
    const seen = {};
    const client = await this.client(path, seen);
    try {
      switch (method) {
        case 'GetTask':
          return Task.toJSON(await client.getTask(GetTaskRequest.fromJSON(params)));
        case 'CancelTask':
          return Task.toJSON(await client.cancelTask(CancelTaskRequest.fromJSON(params)));
        case 'ListTasks':
          return ListTasksResponse.toJSON(await client.listTasks(ListTasksRequest.fromJSON(params)));
        default:
          throw new Error(`the console makes no ${method} call`);
      }
    } catch (e) {
      throw asCallError(e, seen);
    }
  }

  /** A streaming call (`SendStreamingMessage`, `SubscribeToTask`): each event as 1.0 JSON.
   * A stream whose connection drops is picked up where it was (a subscription to its task
   * with `Last-Event-ID`: the gateway sends what was missed, then the rest), a few times;
   * `onResume(attempt)` is told each time. */
  async *stream(path, method, params, signal, onResume = () => {}) {
    const seen = {};
    const client = await this.client(path, seen);
    let events =
      method === 'SubscribeToTask'
        ? client.resubscribeTask(SubscribeToTaskRequest.fromJSON(params), { signal })
        : client.sendMessageStream(SendMessageRequest.fromJSON(params), { signal });
    for (let attempt = 1; ; attempt++) {
      try {
        for await (const event of events) yield StreamResponse.toJSON(event);
        return;
      } catch (e) {
        if (signal && signal.aborted) return;
        // An answer (an error event, a refusal) is not a dropped connection.
        const dropped = !(e instanceof CallError) && e.envelopeCode === undefined;
        if (!dropped || !seen.lastEventId || attempt > RESUME_ATTEMPTS) throw asCallError(e, seen);
        onResume(attempt);
        await new Promise((done) => setTimeout(done, 300 * attempt));
        const id = seen.lastEventId;
        seen.resume = id;
        const task = id.slice(0, id.lastIndexOf(':'));
        events = client.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: task }), { signal });
      }
    }
  }

  /** A call on the shared endpoint, which has no card of its own: plain JSON-RPC. */
  async plainCall(path, method, params) {
    const resp = await this.fetcher()(this.base + path, {
      method: 'POST',
      headers: { 'A2A-Version': '1.0', 'Content-Type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
    });
    const answer = await resp.json().catch(() => null);
    if (answer && answer.error) {
      throw new CallError(answer.error.message, { code: answer.error.code, status: resp.status });
    }
    if (!resp.ok || !answer) throw httpError(resp.status, answer);
    return answer.result;
  }
}

/** Times a dropped stream is picked up again before the page is told it failed. */
const RESUME_ATTEMPTS = 5;

/** Passes an event stream's bytes through, noting the last `id:` in `seen.lastEventId`. */
function eventIds(seen) {
  const decoder = new TextDecoder();
  let partial = '';
  return new TransformStream({
    transform(chunk, out) {
      partial += decoder.decode(chunk, { stream: true });
      const lines = partial.split(/\r\n|\r|\n/);
      partial = lines.pop();
      for (const line of lines) {
        if (line.startsWith('id:')) seen.lastEventId = line.slice(3).trim();
      }
      out.enqueue(chunk);
    },
  });
}

function asCallError(e, seen) {
  if (e instanceof CallError) return e;
  const status = seen.status && seen.status >= 400 ? seen.status : null;
  const code = e.envelopeCode !== undefined ? e.envelopeCode : null;
  return new CallError(e.message || String(e), { code, status, reason: e.reason || null });
}

function httpError(status, body) {
  const message = (body && body.error && body.error.message) || `HTTP ${status}`;
  return new CallError(message, { status });
}

function unreachable(base, e) {
  return new CallError(
    `Cannot reach the gateway at ${base} (${e.message}). If the page is served from another origin, that origin must be in [cors] allowed_origins.`,
  );
}

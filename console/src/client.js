// A small A2A 1.0 JSON-RPC client over fetch, with a streaming SSE reader: what the
// console needs of the protocol, and nothing it does not (see README.md beside it).

/** A JSON-RPC error or an HTTP failure, with what the page shows. */
export class CallError extends Error {
  constructor(message, { code = null, status = null, reason = null } = {}) {
    super(message);
    this.code = code;
    this.status = status;
    this.reason = reason;
  }
}

let nextId = 1;

export class Gateway {
  /** `base`: the gateway's origin (and path prefix); `credential`: {kind, value} or null. */
  constructor(base, credential) {
    this.base = base.replace(/\/+$/, '');
    this.credential = credential;
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

  async getJson(path) {
    let resp;
    try {
      resp = await fetch(this.base + path, { headers: this.headers() });
    } catch (e) {
      throw unreachable(this.base, e);
    }
    const body = await resp.json().catch(() => null);
    if (!resp.ok) throw httpError(resp, body);
    return body;
  }

  /** One JSON-RPC call to `path`; its result, or a CallError. */
  async call(path, method, params) {
    const body = JSON.stringify({ jsonrpc: '2.0', id: nextId++, method, params });
    let resp;
    try {
      resp = await fetch(this.base + path, {
        method: 'POST',
        headers: this.headers({ 'Content-Type': 'application/json' }),
        body,
      });
    } catch (e) {
      throw unreachable(this.base, e);
    }
    const answer = await resp.json().catch(() => null);
    if (answer && answer.error) throw rpcError(answer.error, resp.status);
    if (!resp.ok || !answer) throw httpError(resp, answer);
    return answer.result;
  }

  /** A streaming call: yields each event's `result` as it arrives. */
  async *stream(path, method, params, signal) {
    const body = JSON.stringify({ jsonrpc: '2.0', id: nextId++, method, params });
    let resp;
    try {
      resp = await fetch(this.base + path, {
        method: 'POST',
        headers: this.headers({ 'Content-Type': 'application/json', Accept: 'text/event-stream' }),
        body,
        signal,
      });
    } catch (e) {
      if (e.name === 'AbortError') return;
      throw unreachable(this.base, e);
    }
    const type = resp.headers.get('Content-Type') || '';
    if (!type.startsWith('text/event-stream')) {
      const answer = await resp.json().catch(() => null);
      if (answer && answer.error) throw rpcError(answer.error, resp.status);
      throw httpError(resp, answer);
    }
    for await (const data of sseData(resp.body, signal)) {
      const answer = JSON.parse(data);
      if (answer.error) throw rpcError(answer.error, resp.status);
      yield answer.result;
    }
  }
}

/** The `data` of each SSE event of a byte stream (comments and other fields skipped). */
export async function* sseData(body, signal) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block
          .split('\n')
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, ''))
          .join('\n');
        if (data) yield data;
      }
    }
  } catch (e) {
    if (!(signal && signal.aborted)) throw e;
  } finally {
    reader.releaseLock();
  }
}

function rpcError(error, status) {
  const info = (error.data || []).find((d) => d && d.reason) || {};
  return new CallError(error.message || 'error', { code: error.code, status, reason: info.reason || null });
}

function httpError(resp, body) {
  const message = (body && body.error && body.error.message) || `HTTP ${resp.status} ${resp.statusText}`;
  return new CallError(message, { status: resp.status });
}

function unreachable(base, e) {
  return new CallError(
    `Cannot reach the gateway at ${base} (${e.message}). If the page is served from another origin, that origin must be in [cors] allowed_origins.`,
  );
}

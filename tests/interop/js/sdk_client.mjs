/**
 * Interop checks: the official @a2a-js/sdk client against an "echo" A2A agent.
 *
 *   node sdk_client.mjs --card-url http://127.0.0.1:PORT/a2a/agents/echo/card --dialect 1.0|0.3
 *
 * JavaScript twin of tests/interop/sdk_client.py: same checks, same output.
 * The card is resolved with the SDK's DefaultAgentCardResolver and the client
 * is built by the SDK's ClientFactory; every A2A call goes through the SDK
 * transports. The resolver and the transport factories get
 * `legacyCompat: { enabled: true }`.
 *
 * How a dialect is selected (SDK 1.3.0): ClientFactory keeps one interface per
 * binding, preferring an entry whose protocolVersion is exactly "1.0"; the
 * transport factory then looks the interface up again by binding and URL,
 * again preferring "1.0", and builds the legacy transport only if that
 * interface's protocolVersion is empty or in [0.3, 1.0). So a card offering
 * both versions at the same URL always yields the 1.0 transport, and there is
 * no option to prefer 0.3. --dialect therefore keeps only the card's
 * interfaces of that Major.Minor (as the Python client does) before
 * createFromAgentCard. The transport then fixes the wire version: 1.0 sends
 * `A2A-Version: 1.0` and PascalCase methods, 0.3 (LegacyJsonRpcTransport)
 * sends `A2A-Version: 0.3` and `message/send`-style methods.
 *
 * Prints "PASS name" / "FAIL name: details" per check, then "N passed, N failed";
 * exit 0 only if all pass.
 */

import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';

import { Role, TaskState } from '@a2a-js/sdk';
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
  RestTransportFactory,
} from '@a2a-js/sdk/client';

const TIMEOUT_MS = 10_000; // for every call
const EXPECTED_TRANSPORT = { '1.0': 'JsonRpcTransport', '0.3': 'LegacyJsonRpcTransport' };
const CHECKS = ['card', 'send', 'stream', 'message', 'input-required', 'get', 'cancel', 'list'];
const S = TaskState;
const legacyCompat = { enabled: true };

const majorMinor = (version) => (version ?? '').split('.').slice(0, 2).join('.');
const stateName = (state) => S[state] ?? String(state);
const textOf = (parts) =>
  (parts ?? []).filter((p) => p.content?.$case === 'text').map((p) => p.content.value).join('');
const artifactsText = (task) => (task.artifacts ?? []).map((a) => textOf(a.parts)).join('');
const isMessage = (result) => result && 'messageId' in result && !('status' in result);
const isTask = (result) => result && 'id' in result && 'status' in result;
const kindOf = (event) => event?.payload?.$case ?? 'none';
const ifaceList = (card) =>
  JSON.stringify((card.supportedInterfaces ?? []).map((i) => [i.protocolBinding, i.protocolVersion, i.url]));

function userMessage(text, { messageId, task } = {}) {
  return {
    messageId: messageId ?? randomUUID(),
    role: Role.ROLE_USER,
    parts: [{ content: { $case: 'text', value: text }, metadata: undefined, filename: '', mediaType: '' }],
    taskId: task?.id ?? '',
    contextId: task?.contextId ?? '',
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  };
}

class CheckFailed extends Error {}
class TimedOut extends Error {}

function expect(cond, details) {
  if (!cond) throw new CheckFailed(details);
}

function describe(e) {
  if (e instanceof CheckFailed) return e.message;
  if (e instanceof TimedOut) return `timed out after ${TIMEOUT_MS / 1000} s`;
  const code = e?.envelopeCode !== undefined ? ` (code ${e.envelopeCode})` : '';
  const cause = e?.cause && e.cause !== e ? ` [cause: ${e.cause?.name ?? 'Error'}: ${e.cause?.message ?? e.cause}]` : '';
  return `${e?.name ?? 'Error'}${code}: ${e?.message ?? e}${cause}`;
}

/**
 * Runs fn(signal) with a TIMEOUT_MS budget: the SDK call gets the signal
 * (it aborts the fetch, including a stream being read), and the race makes
 * sure a call that ignores it still fails on time.
 */
async function withTimeout(fn) {
  const abort = new AbortController();
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => { abort.abort(new TimedOut()); reject(new TimedOut()); }, TIMEOUT_MS);
  });
  try {
    return await Promise.race([fn(abort.signal), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function clientFactory() {
  return new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    cardResolver: new DefaultAgentCardResolver({ legacyCompat }),
    transports: [new JsonRpcTransportFactory({ legacyCompat }), new RestTransportFactory({ legacyCompat })],
  }));
}

class Checks {
  constructor(card, dialect) {
    this.card = card;
    this.dialect = dialect;
    this.sentTask = undefined; // from `send`, reused by `get`
    this._client = undefined;
  }

  /** An SDK client built from the card's interfaces of this dialect only. */
  async client() {
    if (!this._client) {
      const keep = (this.card.supportedInterfaces ?? [])
        .filter((i) => majorMinor(i.protocolVersion) === this.dialect)
        // --trailing-slash: what a client sees when an operator writes the URL as a base URL.
        .map((i) => (trailingSlash && i.protocolBinding === 'JSONRPC'
          ? { ...i, url: i.url.replace(/\/*$/, '/') } : i));
      expect(keep.length > 0, `card has no ${this.dialect} interface: ${ifaceList(this.card)}`);
      this._client = await clientFactory().createFromAgentCard({ ...this.card, supportedInterfaces: keep });
    }
    return this._client;
  }

  /** Sends a message (blocking unless returnImmediately); returns the Task or Message. */
  async send(message, { returnImmediately = false } = {}) {
    const client = await this.client();
    return withTimeout((signal) => client.sendMessage(
      { tenant: '', message, configuration: { acceptedOutputModes: [], returnImmediately }, metadata: undefined },
      { signal }));
  }

  /** Streams a message; returns the list of StreamResponse events. */
  async stream(message) {
    const client = await this.client();
    return withTimeout(async (signal) => {
      const events = [];
      for await (const event of client.sendMessageStream(
        { tenant: '', message, configuration: undefined, metadata: undefined }, { signal })) {
        events.push(event);
      }
      return events;
    });
  }

  async sendForTask(message, opts) {
    const result = await this.send(message, opts);
    expect(isTask(result), `expected a Task reply, got ${JSON.stringify(result)}`);
    return result;
  }

  async getTask(id) {
    const client = await this.client();
    return withTimeout((signal) => client.getTask({ tenant: '', id, historyLength: undefined }, { signal }));
  }

  async check_card() {
    expect(this.card.name === expectedName, `card name ${JSON.stringify(this.card.name)}`);
    expect((this.card.skills ?? []).length >= 1, 'card has no skills');
    const client = await this.client();
    // esbuild names self-referencing classes `_Name`; compare the plain name.
    const name = client.transport?.constructor?.name?.replace(/^_+/, '');
    expect(name === EXPECTED_TRANSPORT[this.dialect],
      `selected ${name} (A2A-Version ${client.protocolVersion}) at ${client.transport?.endpoint ?? '?'}; `
      + `interfaces ${ifaceList(this.card)}`);
    expect(client.protocolVersion === (this.dialect === '1.0' ? '1.0' : '0.3'),
      `client protocolVersion ${client.protocolVersion}`);
  }

  async check_send() {
    const task = await this.sendForTask(userMessage('hello interop'));
    expect(task.status?.state === S.TASK_STATE_COMPLETED, `state ${stateName(task.status?.state)}`);
    expect(artifactsText(task) === 'hello interop', `artifact text ${JSON.stringify(artifactsText(task))}`);
    this.sentTask = task;
  }

  async check_stream() {
    const text = 'one two three four five six';
    expect(this.card.capabilities?.streaming, 'card does not declare capabilities.streaming');
    const events = await this.stream(userMessage(text));
    const kinds = events.map(kindOf);
    const trail = `events ${JSON.stringify(kinds)}`;
    expect(kinds[0] === 'task', `first event is ${JSON.stringify(kinds.slice(0, 1))}; ${trail}`);
    const chunks = events.filter((e) => kindOf(e) === 'artifactUpdate').map((e) => e.payload.value);
    expect(chunks.length >= 2, `${chunks.length} artifact-update events; ${trail}`);
    const joined = chunks.map((c) => textOf(c.artifact?.parts)).join('');
    expect(joined === text, `artifact chunks joined ${JSON.stringify(joined)}`);
    expect(new Set(chunks.map((c) => c.artifact?.artifactId)).size === 1, 'chunks differ in artifactId');
    expect(chunks.slice(1).every((c) => c.append), 'a chunk after the first lacks append=true');
    expect(chunks.at(-1).lastChunk, 'last chunk lacks lastChunk=true');
    const states = events
      .filter((e) => ['statusUpdate', 'task'].includes(kindOf(e)))
      .map((e) => e.payload.value.status?.state);
    expect(states.at(-1) === S.TASK_STATE_COMPLETED, `last status ${stateName(states.at(-1))}; ${trail}`);
  }

  async check_message() {
    const result = await this.send(userMessage('hi', { messageId: `tck-message-response-${randomUUID()}` }));
    expect(isMessage(result), `expected a Message reply, got ${JSON.stringify(result)}`);
    const reply = textOf(result.parts);
    expect(reply === 'Direct message response', `message text ${JSON.stringify(reply)}`);
  }

  async check_input_required() {
    const task = await this.sendForTask(userMessage('/input What is your name?'));
    expect(task.status?.state === S.TASK_STATE_INPUT_REQUIRED, `state ${stateName(task.status?.state)}`);
    const question = textOf(task.status?.message?.parts);
    expect(question === 'What is your name?', `status message ${JSON.stringify(question)}`);
    const done = await this.sendForTask(userMessage('Ada', { task }));
    expect(done.id === task.id, `follow-up answered by task ${done.id}, not ${task.id}`);
    expect(done.status?.state === S.TASK_STATE_COMPLETED, `follow-up state ${stateName(done.status?.state)}`);
    expect(artifactsText(done) === 'Ada', `follow-up artifact text ${JSON.stringify(artifactsText(done))}`);
  }

  async check_get() {
    expect(this.sentTask !== undefined, 'no task from the send check');
    const task = await this.getTask(this.sentTask.id);
    expect(task.id === this.sentTask.id, `got task ${task.id}`);
    expect(task.status?.state === S.TASK_STATE_COMPLETED, `state ${stateName(task.status?.state)}`);
  }

  /**
   * ListTasks with no filters, as the SDK writes it: over JSON-RPC its generated
   * encoder sends an unset status as `"status": "UNRECOGNIZED"` (REST sends no query).
   * 0.3 has no ListTasks; the SDK refuses it before sending anything.
   */
  async check_list() {
    const client = await this.client();
    if (this.dialect === '0.3') {
      let refused = false;
      try {
        await withTimeout((signal) => client.listTasks({}, { signal }));
      } catch {
        refused = true;
      }
      expect(refused, 'a 0.3 client listed tasks');
      return;
    }
    const page = await withTimeout((signal) => client.listTasks({}, { signal }));
    expect(Array.isArray(page.tasks) && page.tasks.length >= 1, `tasks ${JSON.stringify(page.tasks)}`);
    expect(this.sentTask === undefined || page.tasks.some((t) => t.id === this.sentTask.id),
      `the sent task ${this.sentTask?.id} is not listed`);
  }

  async check_cancel() {
    const task = await this.sendForTask(userMessage('/delay 30 slow'), { returnImmediately: true });
    expect([S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING].includes(task.status?.state),
      `non-blocking send state ${stateName(task.status?.state)}`);
    const client = await this.client();
    const canceled = await withTimeout((signal) => client.cancelTask(
      { tenant: '', id: task.id, metadata: undefined }, { signal }));
    expect(canceled.status?.state === S.TASK_STATE_CANCELED, `cancel state ${stateName(canceled.status?.state)}`);
    const again = await this.getTask(task.id);
    expect(again.status?.state === S.TASK_STATE_CANCELED, `get-after-cancel state ${stateName(again.status?.state)}`);
  }
}

/** Resolve the card with the SDK resolver: base URL + relative card path. */
async function resolveCard(cardUrl) {
  const u = new URL(cardUrl);
  const resolver = new DefaultAgentCardResolver({ legacyCompat });
  return withTimeout(() => resolver.resolve(u.origin, u.pathname + u.search));
}

async function run(cardUrl, dialect) {
  const results = {};
  let checks;
  try {
    checks = new Checks(await resolveCard(cardUrl), dialect);
  } catch (e) {
    for (const name of CHECKS) results[name] = 'no card';
    results.card = `cannot resolve ${cardUrl}: ${describe(e)}`;
    for (const name of CHECKS) console.log(`FAIL ${name}: ${results[name]}`);
  }
  for (const name of checks ? CHECKS : []) {
    try {
      await checks[`check_${name.replace('-', '_')}`]();
      results[name] = null;
    } catch (e) {
      results[name] = describe(e);
    }
    console.log(results[name] === null ? `PASS ${name}` : `FAIL ${name}: ${results[name]}`);
  }
  const failures = Object.values(results).filter((r) => r !== null).length;
  console.log(`${CHECKS.length - failures} passed, ${failures} failed`);
  return failures ? 1 : 0;
}

/** --expect-name: the gateway names a proxied agent after its file, not the remote card. */
let expectedName = 'echo';
let trailingSlash = false;

function main() {
  const usage = 'usage: node sdk_client.mjs --card-url URL --dialect 1.0|0.3 [--expect-name NAME] [--trailing-slash]';
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        'card-url': { type: 'string' },
        dialect: { type: 'string' },
        'expect-name': { type: 'string' },
        'trailing-slash': { type: 'boolean' },
      },
    }));
  } catch (e) {
    console.error(`${usage}\n${e.message}`);
    process.exit(2);
  }
  if (!values['card-url'] || !['1.0', '0.3'].includes(values.dialect)) {
    console.error(usage);
    process.exit(2);
  }
  expectedName = values['expect-name'] ?? expectedName;
  trailingSlash = values['trailing-slash'] ?? false;
  run(values['card-url'], values.dialect).then(
    (code) => process.exit(code),
    (e) => { console.error(e); process.exit(1); });
}

main();

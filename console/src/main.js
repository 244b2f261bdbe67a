// The console: the gateway's agents, a chat per agent over streamed A2A calls, and a task
// view. Plain DOM; state lives in this module (credentials also in session storage).

import { Gateway, CallError } from './client.js';
import { rawBytes, safeHref, safeType, size } from './files.js';
import { initAdmin } from './admin.js';
import { $, el } from './dom.js';

const STATES = {
  TASK_STATE_SUBMITTED: 'submitted',
  TASK_STATE_WORKING: 'working',
  TASK_STATE_INPUT_REQUIRED: 'input-required',
  TASK_STATE_AUTH_REQUIRED: 'auth-required',
  TASK_STATE_COMPLETED: 'completed',
  TASK_STATE_FAILED: 'failed',
  TASK_STATE_CANCELED: 'canceled',
  TASK_STATE_REJECTED: 'rejected',
};
const FINAL = new Set(['completed', 'failed', 'canceled', 'rejected']);
// States that wait for the caller: the next message on the task answers them.
const WAITING = new Set(['input-required', 'auth-required']);
const stateName = (s) => STATES[s] || s || 'unknown';

/** A readable sentence for a failed call. */
export function describe(e) {
  if (!(e instanceof CallError)) return `Error: ${e.message}`;
  const where = [e.code !== null ? `code ${e.code}` : null, e.status ? `HTTP ${e.status}` : null]
    .filter(Boolean)
    .join(', ');
  let lead = 'Error';
  if (e.status === 401) lead = 'Unauthorized: the gateway did not accept your credential';
  else if (e.status === 403) lead = 'Forbidden: your credential does not cover this agent';
  else if (e.status === 429) lead = 'Rate limited: wait and try again';
  else if (e.code === -32040 || e.code === -32044) lead = 'Unknown agent';
  else if (e.code === -32001) lead = 'No such task';
  return `${lead}. ${e.message}${where ? ` (${where})` : ''}`;
}

const params = new URLSearchParams(location.search);
const state = {
  base: params.get('gateway') || location.origin,
  credential: JSON.parse(sessionStorage.getItem('a2a-console-credential') || 'null'),
  agents: [],
  skills: [],
  agent: null,
  contextId: null,
  task: null, // {id, state}
  controller: null,
};

const gateway = () => new Gateway(state.base, state.credential);
const agentPath = (name) => `/a2a/agents/${encodeURIComponent(name)}`;

function say(text, kind = 'info') {
  const status = $('status');
  status.textContent = text;
  status.dataset.kind = kind;
}

// ------------------------------------------------------------------------ agents

async function loadAgents() {
  $('gateway-url').textContent = state.base;
  try {
    const g = gateway();
    const [list, health, card] = await Promise.all([
      g.getJson('/a2a/agents'),
      g.getJson('/a2a/health').catch(() => ({ agents: {} })),
      g.getJson('/.well-known/agent-card.json').catch(() => ({ skills: [] })),
    ]);
    state.agents = list.agents || [];
    state.skills = card.skills || [];
    renderAgents(health.agents || {});
    if (state.agents.length === 0 && !state.credential) {
      say(`No agent at ${state.base} is open to callers without a credential: set one above.`);
    } else {
      say(`${state.agents.length} agent(s) at ${state.base}`);
    }
    markAccess(await checkCredential(g, list.defaultAgent));
  } catch (e) {
    $('agents').replaceChildren();
    say(describe(e), 'error');
  }
}

function renderAgents(health) {
  const items = state.agents.map((a) => {
    const skills = state.skills.filter((s) => s.id.startsWith(`${a.name}/`));
    return el(
      'li',
      { class: 'agent', 'data-agent': a.name },
      el('h3', {}, a.name, ' ', el('span', { class: `health ${health[a.name] || a.health}` }, health[a.name] || a.health || '')),
      el('p', {}, a.description || ''),
      el('p', { class: 'access', 'data-access': 'unknown' }, ''),
      skills.length
        ? el(
            'ul',
            { class: 'skills' },
            skills.map((s) =>
              el(
                'li',
                {},
                el('strong', {}, s.name || s.id),
                s.description ? ` — ${s.description}` : '',
                (s.examples || []).length
                  ? el(
                      'div',
                      { class: 'examples' },
                      'Try: ',
                      s.examples.map((x) =>
                        el('button', { type: 'button', class: 'example', onclick: () => openChat(a.name, x) }, x),
                      ),
                    )
                  : null,
              ),
            ),
          )
        : null,
      el('button', { type: 'button', onclick: () => openChat(a.name) }, `Chat with ${a.name}`),
    );
  });
  $('agents').replaceChildren(...items);
}

/** Whether the gateway accepts the credential. The agent list holds only the agents the
 * caller may call, so it answers for each agent; but a credential the gateway does not
 * accept is served the list of a caller without one, and refused on every call. One call
 * tells which, made only when a credential is set: a one-task page of `ListTasks` of a listed
 * agent (the default one if listed), which succeeds for an accepted credential. (Not a read
 * of a made-up task: each of those counted a "task not found" error in the metrics.)
 * Returns the refusal (a 401 or 403), else null. */
async function checkCredential(g, defaultAgent) {
  if (!state.credential) return null;
  const target = state.agents.find((a) => a.name === defaultAgent) || state.agents[0];
  try {
    const p = { pageSize: 1, historyLength: 0 };
    await (target ? g.call(agentPath(target.name), 'ListTasks', p) : g.call('/a2a', 'ListTasks', p));
    return null;
  } catch (e) {
    if (e.status !== 401 && e.status !== 403) return null;
    say(describe(e), 'error');
    return e;
  }
}

/** Marks each agent with whether the credential may call it (see checkCredential). */
function markAccess(refused) {
  for (const node of document.querySelectorAll('#agents .access')) {
    if (refused) {
      node.textContent = refused.status === 401 ? 'Needs a credential the gateway accepts.' : 'Your credential does not cover this agent.';
      node.dataset.access = 'no';
    } else {
      node.textContent = state.credential ? 'Your credential can call it.' : 'Open to callers without a credential.';
      node.dataset.access = 'yes';
    }
  }
}

// ------------------------------------------------------------------------ chat

function openChat(name, text) {
  if (state.agent !== name) {
    state.agent = name;
    newConversation();
  }
  $('chat').hidden = false;
  $('tasks').hidden = false;
  $('chat-title').textContent = `Chat with ${name}`;
  $('tasks-title').textContent = `Tasks of ${name}`;
  if (text) $('message').value = text;
  $('message').focus();
}

function newConversation() {
  state.contextId = null;
  state.task = null;
  $('log').replaceChildren();
  showIds();
}

function showIds() {
  $('task-id').textContent = state.task ? state.task.id : '—';
  $('context-id').textContent = state.contextId || '—';
  $('task-state').textContent = state.task ? state.task.state : '—';
  const running = state.task && !FINAL.has(state.task.state);
  $('cancel').disabled = !running;
  $('answering').hidden = !(state.task && WAITING.has(state.task.state));
}

function bubble(who, text, cls = '') {
  const node = el('li', { class: `bubble ${who} ${cls}` }, el('span', { class: 'who' }, who), el('span', { class: 'text' }, text));
  $('log').append(node);
  node.scrollIntoView({ block: 'nearest' });
  return node.querySelector('.text');
}

const textOf = (parts = []) => parts.map((p) => (p.text !== undefined ? p.text : p.data !== undefined ? JSON.stringify(p.data) : '')).join('');

function setTask(id, contextId, s) {
  if (contextId) state.contextId = contextId;
  state.task = { id, state: stateName(s) };
  showIds();
}

/** Shows one streamed item in the log; `artifacts` keeps each artifact's bubble. A
 * follow-up's stream opens with the task as it was (`continuing`): its question is
 * already in the log. */
function showItem(item, artifacts, continuing) {
  if (item.task) {
    const t = item.task;
    setTask(t.id, t.contextId, t.status && t.status.state);
    for (const a of t.artifacts || []) {
      const node = artifacts.get(a.artifactId) || bubble('agent', '', 'artifact');
      artifacts.set(a.artifactId, node);
      node.textContent = textOf(a.parts);
    }
    if (t.status && t.status.message && !continuing) bubble('agent', textOf(t.status.message.parts));
  } else if (item.statusUpdate) {
    const u = item.statusUpdate;
    setTask(u.taskId, u.contextId, u.status.state);
    if (u.status.message) bubble('agent', textOf(u.status.message.parts));
    bubble('state', stateName(u.status.state), 'state');
  } else if (item.artifactUpdate) {
    const u = item.artifactUpdate;
    let node = artifacts.get(u.artifact.artifactId);
    if (!node) {
      node = bubble('agent', '', 'artifact');
      artifacts.set(u.artifact.artifactId, node);
    }
    const text = textOf(u.artifact.parts);
    node.textContent = u.append ? node.textContent + text : text;
    node.dataset.chunks = String(Number(node.dataset.chunks || 0) + 1);
  } else if (item.message) {
    if (item.message.contextId) state.contextId = item.message.contextId;
    bubble('agent', textOf(item.message.parts));
    showIds();
  }
}

async function send(event) {
  event.preventDefault();
  const text = $('message').value.trim();
  if (!text || !state.agent) return;
  $('message').value = '';
  bubble('you', text);
  const message = { role: 'ROLE_USER', messageId: crypto.randomUUID(), parts: [{ text }] };
  if (state.contextId) message.contextId = state.contextId;
  if (state.task && !FINAL.has(state.task.state)) message.taskId = state.task.id;
  state.controller = new AbortController();
  const artifacts = new Map();
  $('send').disabled = true;
  try {
    const continuing = Boolean(message.taskId);
    const resumed = (attempt) => say(`Connection lost; picking the stream up again (${attempt})`, 'info');
    for await (const item of gateway().stream(agentPath(state.agent), 'SendStreamingMessage', { message }, state.controller.signal, resumed)) {
      showItem(item, artifacts, continuing);
    }
    say(state.task ? `Task ${state.task.id}: ${state.task.state}` : 'Answered');
  } catch (e) {
    bubble('error', describe(e), 'error');
    say(describe(e), 'error');
  } finally {
    $('send').disabled = false;
    state.controller = null;
  }
}

async function cancel() {
  if (!state.task) return;
  try {
    const t = await gateway().call(agentPath(state.agent), 'CancelTask', { id: state.task.id });
    setTask(t.id, t.contextId, t.status.state);
    bubble('state', stateName(t.status.state), 'state');
    say(`Task ${t.id} canceled`);
  } catch (e) {
    bubble('error', describe(e), 'error');
  }
}

// ------------------------------------------------------------------------ tasks

async function listTasks(event) {
  if (event) event.preventDefault();
  const p = { pageSize: 50, includeArtifacts: true, historyLength: 100 };
  if ($('filter-state').value) p.status = $('filter-state').value;
  if ($('filter-context').value.trim()) p.contextId = $('filter-context').value.trim();
  try {
    const page = await gateway().call(agentPath(state.agent), 'ListTasks', p);
    const rows = (page.tasks || []).map((t) =>
      el(
        'tr',
        {},
        el('td', {}, el('button', { type: 'button', class: 'link', onclick: () => showTask(t) }, t.id)),
        el('td', {}, stateName(t.status && t.status.state)),
        el('td', {}, t.contextId),
        el('td', {}, (t.status && t.status.timestamp) || ''),
      ),
    );
    $('task-rows').replaceChildren(...rows);
    $('task-count').textContent = `${page.totalSize} task(s)`;
  } catch (e) {
    $('task-count').textContent = describe(e);
  }
}

/** Object URLs made for the task shown (its raw parts), released when another is shown. */
let objectUrls = [];

/** One part. A file becomes a link only when that cannot run script here (see files.js): an
 * `http(s)` URL, a `data:` URL of a non-active type, or its raw bytes as a blob of a
 * non-active type; any other URL shows as text. */
function partView(p) {
  if (p.text !== undefined) return el('p', {}, p.text);
  if (p.data !== undefined) return el('pre', { class: 'data' }, JSON.stringify(p.data, null, 2));
  const name = p.filename || 'file';
  if (p.raw !== undefined) {
    const bytes = rawBytes(p.raw);
    if (!bytes) return el('p', { class: 'file' }, `${name}: bytes that do not decode (${size(p.raw.length)} of base64)`);
    const href = URL.createObjectURL(new Blob([bytes], { type: safeType(p.mediaType) }));
    objectUrls.push(href);
    return el('p', { class: 'file' }, el('a', { href, download: name }, `Download ${name}`), ` (${size(bytes.length)})`);
  }
  if (p.url !== undefined) {
    const href = safeHref(p.url);
    if (!href) return el('p', { class: 'file' }, `${name}: `, el('code', { class: 'url' }, p.url));
    return el('p', { class: 'file' }, el('a', { href, download: name, target: '_blank', rel: 'noopener noreferrer' }, `Download ${name}`));
  }
  return el('p', {}, JSON.stringify(p));
}

function showTask(t) {
  const detail = $('task-detail');
  objectUrls.forEach((u) => URL.revokeObjectURL(u));
  objectUrls = [];
  const s = stateName(t.status && t.status.state);
  detail.replaceChildren(
    el('h3', {}, `Task ${t.id}`),
    el('p', {}, `State: `, el('span', { class: 'detail-state' }, s), ` · context ${t.contextId}`),
    el('h4', {}, 'History'),
    el('ol', { class: 'history' }, (t.history || []).map((m) => el('li', {}, el('span', { class: 'who' }, m.role === 'ROLE_USER' ? 'you' : 'agent'), m.parts.map(partView)))),
    el('h4', {}, 'Artifacts'),
    el('ul', { class: 'artifacts' }, (t.artifacts || []).map((a) => el('li', {}, el('strong', {}, a.name || a.artifactId), a.parts.map(partView)))),
    ...(FINAL.has(s) ? [] : [el('button', { type: 'button', onclick: () => watch(t) }, 'Watch (subscribe)')]),
  );
  detail.hidden = false;
}

async function watch(t) {
  const node = document.querySelector('#task-detail .detail-state');
  try {
    for await (const item of gateway().stream(agentPath(state.agent), 'SubscribeToTask', { id: t.id })) {
      const s = item.task ? item.task.status.state : item.statusUpdate ? item.statusUpdate.status.state : null;
      if (s && node) node.textContent = stateName(s);
    }
  } catch (e) {
    if (node) node.textContent = describe(e);
  }
}

// ------------------------------------------------------------------------ credentials

function applyCredential(event) {
  event.preventDefault();
  const value = $('credential').value.trim();
  state.credential = value ? { kind: $('credential-kind').value, value } : null;
  sessionStorage.setItem('a2a-console-credential', JSON.stringify(state.credential));
  say(value ? 'Credential set for this tab' : 'Credential cleared');
  loadAgents();
}

function init() {
  if (state.credential) {
    $('credential-kind').value = state.credential.kind;
    $('credential').value = state.credential.value;
  }
  $('credential-form').addEventListener('submit', applyCredential);
  $('chat-form').addEventListener('submit', send);
  $('cancel').addEventListener('click', cancel);
  $('new-conversation').addEventListener('click', newConversation);
  $('filter-form').addEventListener('submit', listTasks);
  initAdmin(state.base, loadAgents);
  loadAgents();
}

init();

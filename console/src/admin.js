// The console's admin view: shown once the page holds an admin secret (kept apart from the
// caller's credential, in session storage too). Adds an agent from a card URL, issues a key
// (its secret shown once, with a copy button), revokes keys, shows usage (usage.js), and
// reads the audit log, all
// through the gateway's admin API (`/admin/v1`, same origin only: it is never CORS-enabled).

import { initUsage, showUsage } from './usage.js';
import { $, el } from './dom.js';

let base = location.origin;
let secret = sessionStorage.getItem('a2a-console-admin') || '';
let onChange = () => {};

/** One admin call: its JSON, or an Error whose message is the gateway's. */
async function call(method, path, body) {
  const headers = { Authorization: `Bearer ${secret}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(`${base}/admin/v1${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = resp.status === 204 ? null : await resp.json().catch(() => null);
  if (!resp.ok) {
    const message = (answer && answer.error && answer.error.message) || `HTTP ${resp.status}`;
    throw new Error(`${message} (HTTP ${resp.status})`);
  }
  return answer;
}

/** A CSV the admin API answers, as a Blob. */
async function csv(path) {
  const resp = await fetch(`${base}/admin/v1${path}`, { headers: { Authorization: `Bearer ${secret}` } });
  if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
  return resp.blob();
}

function note(text, kind = 'info') {
  const status = $('admin-status');
  status.textContent = text;
  status.dataset.kind = kind;
}

async function addAgent(event) {
  event.preventDefault();
  const name = $('admin-agent-name').value.trim();
  const url = $('admin-agent-url').value.trim();
  try {
    await call('PUT', `/agents/${encodeURIComponent(name)}`, { backend: { kind: 'a2a', url } });
    note(`Agent ${name} added: it serves at /a2a/agents/${name}`);
    $('admin-agent-form').reset();
    onChange();
  } catch (e) {
    note(`Agent ${name} not added: ${e.message}`, 'error');
  }
}

async function issueKey(event) {
  event.preventDefault();
  const agents = $('admin-key-agents').value.split(',').map((a) => a.trim()).filter(Boolean);
  const body = { description: $('admin-key-description').value.trim() };
  if (agents.length) body.agents = agents;
  try {
    const issued = await call('POST', '/keys', body);
    const shown = $('admin-secret-shown');
    shown.replaceChildren(
      el('p', {}, `Key ${issued.key.id} issued. Its secret, shown this once:`),
      el('code', { id: 'admin-new-secret' }, issued.secret),
      ' ',
      el('button', {
        type: 'button',
        id: 'admin-copy',
        onclick: async () => {
          await navigator.clipboard.writeText(issued.secret).catch(() => {});
          $('admin-copy').textContent = 'Copied';
        },
      }, 'Copy'),
    );
    shown.hidden = false;
    $('admin-key-form').reset();
    await loadKeys();
  } catch (e) {
    note(`No key issued: ${e.message}`, 'error');
  }
}

async function revoke(id) {
  try {
    await call('POST', `/keys/${encodeURIComponent(id)}/revoke`);
    note(`Key ${id} revoked`);
    await loadKeys();
  } catch (e) {
    note(`Key ${id} not revoked: ${e.message}`, 'error');
  }
}

async function loadKeys() {
  const { keys } = await call('GET', '/keys');
  $('admin-keys').replaceChildren(
    ...keys.map((k) =>
      el(
        'tr',
        { 'data-key': k.id },
        el('td', {}, k.id),
        el('td', {}, k.description),
        el('td', {}, k.agents.join(', ')),
        el('td', { class: 'key-state' }, k.state),
        el('td', {}, k.last_used_at || '—'),
        el('td', {}, k.state === 'active'
          ? el('button', { type: 'button', onclick: () => revoke(k.id) }, `Revoke ${k.id}`)
          : ''),
      ),
    ),
  );
  await loadAudit();
}

async function loadAudit() {
  const { entries } = await call('GET', '/audit?limit=50');
  $('admin-audit').replaceChildren(
    ...entries.map((e) =>
      el('tr', {}, el('td', {}, e.at), el('td', {}, e.actor), el('td', { class: 'audit-action' }, e.action), el('td', {}, e.target), el('td', {}, e.detail || '')),
    ),
  );
}

async function useSecret(event) {
  event.preventDefault();
  secret = $('admin-secret').value.trim();
  sessionStorage.setItem('a2a-console-admin', secret);
  await open();
}

/** Shows the admin view if the secret in hand is an admin's. */
async function open() {
  $('admin-view').hidden = true;
  if (!secret) return;
  try {
    await loadKeys();
    $('admin-view').hidden = false;
    note('Admin secret accepted');
    await showUsage();
  } catch (e) {
    note(`Admin view unavailable: ${e.message}`, 'error');
  }
}

/** Sets the view up; `gateway` is the gateway's base URL, `changed` is called when the
 * agent set changes. */
export function initAdmin(gateway, changed) {
  base = gateway;
  onChange = changed;
  $('admin-secret').value = secret;
  $('admin-secret-form').addEventListener('submit', useSecret);
  $('admin-agent-form').addEventListener('submit', addAgent);
  $('admin-key-form').addEventListener('submit', issueKey);
  initUsage(call, csv);
  open();
}

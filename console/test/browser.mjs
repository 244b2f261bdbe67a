// The console in a real browser (Debian's Chromium, driven headless by playwright-core)
// against a running gateway. Prints "PASS name" / "FAIL name: details" per scenario and
// saves a screenshot of each under --screenshots; exit 0 only if all pass.
//
//   node test/browser.mjs --gateway http://127.0.0.1:PORT --api-key KEY \
//     --other-origin http://127.0.0.1:P2 --disallowed-origin http://127.0.0.1:P3 \
//     --screenshots target/console-screenshots [--chromium /usr/bin/chromium] \
//     [--only name,name] [--trust-spki BASE64_SHA256] [--through URL]
//
// --through is the gateway behind a proxy that cuts the first event stream it relays
// midway: the console must pick that stream up (scenario a-dropped-stream-is-picked-up).
// --only runs the scenarios named; --trust-spki makes the browser trust the one
// certificate key given (an https gateway's self-signed certificate, say), and nothing
// else it would otherwise refuse (node's own fetches trust it by NODE_EXTRA_CA_CERTS).
import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';

const { values: args } = parseArgs({
  options: {
    gateway: { type: 'string' },
    'api-key': { type: 'string' },
    'other-origin': { type: 'string' },
    'disallowed-origin': { type: 'string' },
    screenshots: { type: 'string' },
    chromium: { type: 'string', default: '/usr/bin/chromium' },
    only: { type: 'string' },
    'trust-spki': { type: 'string' },
    through: { type: 'string' },
    'admin-secret': { type: 'string' },
  },
});
const TIMEOUT = 15000;
mkdirSync(args.screenshots, { recursive: true });

const browser = await chromium.launch({
  executablePath: args.chromium,
  headless: true,
  args: ['--no-sandbox'].concat(
    args['trust-spki'] ? [`--ignore-certificate-errors-spki-list=${args['trust-spki']}`] : [],
  ),
});

function expect(cond, details) {
  if (!cond) throw new Error(details);
}

async function page(url, key) {
  const context = await browser.newContext({ viewport: { width: 1000, height: 900 } });
  const p = await context.newPage();
  p.setDefaultTimeout(TIMEOUT);
  await p.goto(url);
  if (key !== undefined) {
    await p.getByLabel('Credential value').fill(key);
    await p.getByRole('button', { name: 'Use', exact: true }).click();
  }
  return p;
}

const stateIs = (p, s) => p.locator('#task-state').filter({ hasText: new RegExp(`^${s}$`) }).waitFor();

async function chat(p, agent, text) {
  await p.getByRole('button', { name: `Chat with ${agent}`, exact: true }).click();
  await p.getByLabel('Message').fill(text);
  await p.getByRole('button', { name: 'Send' }).click();
}

/** A JSON-RPC call to the gateway from outside the page (to set up tasks): its result. */
async function rpc(path, method, params) {
  const resp = await fetch(`${args.gateway}${path}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'A2A-Version': '1.0', 'X-API-Key': args['api-key'] },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
  });
  const answer = await resp.json();
  expect(answer.result, `${method}: ${JSON.stringify(answer)}`);
  return answer.result;
}

/** A task of echo's whose message (kept in its history) holds `parts`; its context id. */
async function echoTask(parts, messageId = randomUUID()) {
  const result = await rpc('/a2a/agents/echo', 'SendMessage', {
    message: { role: 'ROLE_USER', messageId, parts: [{ text: 'files' }, ...parts] },
  });
  expect(result.task, `no task: ${JSON.stringify(result)}`);
  return result.task.contextId;
}

/** Opens echo's tasks of `contextId` in the task view, and that one task's detail. */
async function showTaskOf(p, contextId) {
  await p.getByRole('button', { name: 'Chat with echo', exact: true }).click();
  await p.getByLabel('Context', { exact: true }).fill(contextId);
  await p.getByRole('button', { name: 'List tasks' }).click();
  await p.locator('#task-count').filter({ hasText: /./ }).waitFor();
  const count = await p.locator('#task-count').innerText();
  expect(count === '1 task(s)', `the task list: ${count}`);
  await p.locator('#task-rows button.link').first().click();
  await p.locator('#task-detail .history li').first().waitFor();
}

/** `a2a_requests_total` by its labels, from `/metrics`. */
async function requestCounts() {
  const text = await (await fetch(`${args.gateway}/metrics`)).text();
  const counts = new Map();
  for (const line of text.split('\n')) {
    const m = line.match(/^a2a_requests_total(\{.*\}) (\d+)$/);
    if (m) counts.set(m[1], Number(m[2]));
  }
  return counts;
}

const b64 = (text) => Buffer.from(text).toString('base64');
const SCRIPT = 'window.__ran = (window.__ran || 0) + 1';

const consoleUrl = `${args.gateway}/console`;
const scenarios = {
  'list-agents': async () => {
    const p = await page(consoleUrl, args['api-key']);
    await p.locator('#agents > li').nth(3).waitFor();
    const names = await p.locator('#agents > li h3').allInnerTexts();
    for (const n of ['echo', 'greet']) expect(names.some((x) => x.startsWith(n)), `agents ${names}`);
    await p.locator('li[data-agent="echo"] .access[data-access="yes"]').waitFor();
    expect((await p.locator('li[data-agent="echo"] .examples button').count()) > 0, 'no skill examples');
    return p;
  },
  'echo-streams-three-chunks': async () => {
    const p = await page(consoleUrl, args['api-key']);
    await chat(p, 'echo', 'one two three');
    await stateIs(p, 'completed');
    const artifact = p.locator('#log .artifact .text').first();
    expect((await artifact.innerText()) === 'one two three', `artifact ${await artifact.innerText()}`);
    const chunks = await artifact.getAttribute('data-chunks');
    expect(chunks === '3', `${chunks} chunks`);
    expect((await p.locator('#task-id').innerText()).length > 30, 'no task id shown');
    expect((await p.locator('#context-id').innerText()).startsWith('echo.'), 'no context id shown');
    // The task view lists it, with its history and artifacts.
    await p.getByRole('button', { name: 'List tasks' }).click();
    await p.locator('#task-rows tr').first().waitFor();
    await p.locator('#task-rows button.link').first().click();
    await p.locator('#task-detail .artifacts li').first().waitFor();
    return p;
  },
  'opening-the-console-calls-nothing-that-fails': async () => {
    // Which agents the credential may call is known without a call bound to fail: opening
    // the console (with a credential, and without one) counts no error in the metrics.
    const noNewErrors = async (before, what) => {
      const after = await requestCounts();
      const errors = [...after].filter(([labels, n]) => !labels.includes('outcome="ok"') && n > (before.get(labels) || 0));
      expect(errors.length === 0, `errors counted ${what}: ${errors.map(([l, n]) => `${l} ${n}`).join(', ')}`);
    };
    let before = await requestCounts();
    const keyed = await page(consoleUrl, args['api-key']);
    await keyed.waitForFunction(() => {
      const marks = [...document.querySelectorAll('#agents .access')];
      return marks.length > 3 && marks.every((m) => m.dataset.access !== 'unknown');
    });
    await noNewErrors(before, 'opening the console with a credential');
    const marks = await keyed.locator('#agents .access').evaluateAll((ms) => ms.map((m) => m.dataset.access));
    expect(marks.every((m) => m === 'yes'), `access marks ${marks}`);
    await keyed.context().close();
    // Without one, every agent here needs a credential: the list is empty, and says so.
    before = await requestCounts();
    const p = await page(consoleUrl);
    await p.locator('#status').filter({ hasText: 'open to callers without a credential' }).waitFor();
    await noNewErrors(before, 'opening the console without a credential');
    return p;
  },
  'file-links-cannot-run-script': async () => {
    // File parts of a message, which the task's history keeps; an artifact's (from an
    // upstream agent, say) are drawn by the same code.
    const contextId = await echoTask([
      { url: `javascript:${SCRIPT}`, filename: 'a.txt' },
      { url: ` JaVaScRiPt:${SCRIPT}`, filename: 'b.txt' },
      { url: `java\tscript:${SCRIPT}`, filename: 'c.txt' },
      { url: `data:text/html,<script>${SCRIPT}</script>`, filename: 'd.html' },
      { url: `data:image/svg+xml,<svg xmlns="http://www.w3.org/2000/svg" onload="${SCRIPT}"/>`, filename: 'e.svg' },
      { url: `data:application/xhtml+xml;base64,${b64('<html xmlns="http://www.w3.org/1999/xhtml"/>')}`, filename: 'f.xhtml' },
      { url: `data:text/javascript,${SCRIPT}`, filename: 'g.js' },
      { url: 'vbscript:msgbox(1)', filename: 'h.txt' },
      { url: '/a2a/health', filename: 'i.json' },
      { url: 'https://files.example/report.pdf', filename: 'report.pdf' },
      { url: `data:text/plain;base64,${b64('plain')}`, filename: 'plain.txt' },
    ]);
    const p = await page(consoleUrl, args['api-key']);
    await showTaskOf(p, contextId);
    const hrefs = await p.locator('#task-detail a').evaluateAll((as) => as.map((a) => a.getAttribute('href')));
    expect(
      JSON.stringify(hrefs) === JSON.stringify(['https://files.example/report.pdf', `data:text/plain;base64,${b64('plain')}`]),
      `links: ${JSON.stringify(hrefs)}`,
    );
    // The others are text, and clicking them runs nothing.
    const shown = p.locator('#task-detail code.url');
    expect((await shown.count()) === 9, `${await shown.count()} URLs shown as text`);
    for (const node of await shown.all()) await node.click();
    await p.waitForTimeout(200);
    const ran = await p.evaluate(() => window.__ran);
    expect(ran === undefined, `a file part's URL ran script ${ran} time(s)`);
    return p;
  },
  'raw-bytes-are-downloads': async () => {
    // An artifact of raw bytes (the TCK convention of echo's), and raw parts in the history.
    const contextId = await echoTask(
      [
        { raw: b64('hello, bytes'), mediaType: 'text/plain', filename: 'hello.txt' },
        { raw: b64(`<script>${SCRIPT}</script>`), mediaType: 'text/html', filename: 'page.html' },
      ],
      `tck-artifact-file-${randomUUID()}`,
    );
    const p = await page(consoleUrl, args['api-key']);
    await showTaskOf(p, contextId);
    const links = p.locator('#task-detail a[href^="blob:"]');
    expect((await links.count()) === 3, `${await links.count()} downloads`);
    const want = [
      ['hello.txt', 'text/plain', 'hello, bytes'],
      ['page.html', 'application/octet-stream', `<script>${SCRIPT}</script>`],
      ['output.txt', 'text/plain', 'Generated file content'],
    ];
    for (const [i, [name, type, content]] of want.entries()) {
      const link = links.nth(i);
      const got = await link.evaluate(async (a) => {
        const blob = await (await fetch(a.href)).blob();
        return [a.getAttribute('download'), blob.type, await blob.text()];
      });
      expect(JSON.stringify(got) === JSON.stringify([name, type, content]), `download ${i}: ${JSON.stringify(got)}`);
      const [download] = await Promise.all([p.waitForEvent('download'), link.click()]);
      const saved = readFileSync(await download.path(), 'utf8');
      expect(download.suggestedFilename() === name && saved === content, `saved ${download.suggestedFilename()}: ${saved}`);
    }
    expect((await p.locator('#task-detail').innerText()).includes('(12 bytes)'), 'no size shown');
    const ran = await p.evaluate(() => window.__ran);
    expect(ran === undefined, `raw bytes ran script ${ran} time(s)`);
    return p;
  },
  'greet-asks-and-is-answered': async () => {
    const p = await page(consoleUrl, args['api-key']);
    await chat(p, 'greet', 'hello');
    await stateIs(p, 'input-required');
    await p.locator('#answering').waitFor();
    const taskId = await p.locator('#task-id').innerText();
    await p.getByLabel('Message').fill('Ada');
    await p.getByRole('button', { name: 'Send' }).click();
    await stateIs(p, 'completed');
    expect((await p.locator('#task-id').innerText()) === taskId, 'the answer went to another task');
    const said = (await p.locator('#log .agent .text').allInnerTexts()).join(' ');
    expect(said.includes('Ada'), `agent said: ${said}`);
    return p;
  },
  'echo-asks-to-authorize-and-is-answered': async () => {
    const p = await page(consoleUrl, args['api-key']);
    await chat(p, 'echo', '/auth Sign in at the portal');
    await stateIs(p, 'auth-required');
    await p.locator('#answering').waitFor();
    const taskId = await p.locator('#task-id').innerText();
    await p.getByLabel('Message').fill('granted');
    await p.getByRole('button', { name: 'Send' }).click();
    await stateIs(p, 'completed');
    expect((await p.locator('#task-id').innerText()) === taskId, 'the answer went to another task');
    return p;
  },
  'delay-canceled': async () => {
    const p = await page(consoleUrl, args['api-key']);
    await chat(p, 'echo', '/delay 30 slow');
    await stateIs(p, 'working');
    await p.getByRole('button', { name: 'Cancel task' }).click();
    await stateIs(p, 'canceled');
    return p;
  },
  'a-dropped-stream-is-picked-up': async () => {
    expect(args.through, 'needs --through (a proxy that cuts a stream)');
    const p = await page(`${args.through}/console`, args['api-key']);
    // Cut after the task and its working status, during the delay: the chunks and the end
    // come on the stream the console picks up.
    await chat(p, 'echo', '/delay 1.5 one two three');
    await stateIs(p, 'completed');
    const artifact = p.locator('#log .artifact .text').first();
    expect((await artifact.innerText()) === 'one two three', `artifact ${await artifact.innerText()}`);
    const chunks = await artifact.getAttribute('data-chunks');
    expect(chunks === '3', `${chunks} chunks`);
    const errors = await p.locator('#log .error').count();
    expect(errors === 0, `${errors} errors shown`);
    return p;
  },
  'wrong-key-is-401': async () => {
    const p = await page(consoleUrl, 'not-the-key');
    await p.locator('#status').filter({ hasText: 'Unauthorized' }).waitFor();
    const text = await p.locator('#status').innerText();
    expect(text.includes('HTTP 401'), `status: ${text}`);
    return p;
  },
  'other-origin-through-cors': async () => {
    const url = `${args['other-origin']}/console.html?gateway=${encodeURIComponent(args.gateway)}`;
    const p = await page(url, args['api-key']);
    await p.locator('#agents > li').first().waitFor();
    await chat(p, 'echo', 'from afar');
    await stateIs(p, 'completed');
    return p;
  },
  'admin-view-adds-an-agent-issues-and-revokes-a-key': async () => {
    expect(args['admin-secret'], 'no --admin-secret');
    const p = await page(consoleUrl, args['api-key']);
    // A wrong secret shows no admin view, and says why.
    await p.locator('#admin-secret').fill('not-the-secret');
    await p.getByRole('button', { name: 'Use admin secret' }).click();
    await p.locator('#admin-status[data-kind="error"]').filter({ hasText: 'HTTP 401' }).waitFor();
    expect(await p.locator('#admin-view').isHidden(), 'the admin view shows for a wrong secret');
    await p.locator('#admin-secret').fill(args['admin-secret']);
    await p.getByRole('button', { name: 'Use admin secret' }).click();
    await p.locator('#admin-view').waitFor();
    // An agent from its card URL: listed among the agents at once.
    await p.getByLabel('Name', { exact: true }).fill('added');
    await p.getByLabel('Card URL').fill(`${args.gateway}/a2a/agents/echo`);
    await p.getByRole('button', { name: 'Add agent' }).click();
    await p.locator('#admin-status').filter({ hasText: 'Agent added added' }).waitFor();
    await p.locator('#agents > li[data-agent="added"]').waitFor();
    // A key: its secret shown once, with a copy button.
    await p.getByLabel('Description').fill('from the console');
    await p.getByRole('button', { name: 'Issue key' }).click();
    const shown = p.locator('#admin-new-secret');
    await shown.waitFor();
    const secret = await shown.innerText();
    expect(secret.startsWith('a2agw_'), `the secret shown: ${secret}`);
    await p.getByRole('button', { name: 'Copy' }).click();
    await p.getByRole('button', { name: 'Copied' }).waitFor();
    const row = p.locator('#admin-keys tr').filter({ hasText: 'from the console' });
    const id = await row.locator('td').first().innerText();
    // The key works until it is revoked.
    const works = async () => (await fetch(`${args.gateway}/a2a/agents/echo`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'A2A-Version': '1.0', 'X-API-Key': secret },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ListTasks', params: {} }),
    })).status;
    expect((await works()) === 200, 'the issued key does not work');
    await p.getByRole('button', { name: `Revoke ${id}` }).click();
    await row.locator('.key-state').filter({ hasText: 'revoked' }).waitFor();
    expect((await works()) === 401, 'the revoked key still works');
    // The audit log says what happened.
    for (const action of ['agent.create', 'key.create', 'key.revoke']) {
      await p.locator('#admin-audit .audit-action').filter({ hasText: new RegExp(`^${action}$`) }).first().waitFor();
    }
    return p;
  },
  'usage-page-draws-its-charts': async () => {
    expect(args['admin-secret'], 'no --admin-secret');
    // Calls to three agents, as the console's key.
    const send = (agent, text) => fetch(`${args.gateway}/a2a/agents/${agent}`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'A2A-Version': '1.0', 'X-API-Key': args['api-key'] },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: crypto.randomUUID(), role: 'ROLE_USER', parts: [{ text }] } } }),
    });
    for (const [agent, n] of [['echo', 6], ['shout', 4], ['greet', 2]]) {
      for (let i = 0; i < n; i++) expect((await send(agent, `hello ${i}`)).status === 200, `a call to ${agent}`);
    }
    const p = await page(consoleUrl, args['api-key']);
    await p.locator('#admin-secret').fill(args['admin-secret']);
    await p.getByRole('button', { name: 'Use admin secret' }).click();
    await p.locator('#admin-view').waitFor();
    // No tokens from these agents: the page shows requests.
    await p.locator('#usage-measure').selectOption('requests');
    for (const agent of ['echo', 'shout', 'greet']) {
      await p.locator(`#usage-daily rect.bar[data-agent="${agent}"]`).first().waitFor();
    }
    await p.locator('#usage-daily-legend').filter({ hasText: 'shout' }).waitFor();
    await p.locator('#usage-top rect.bar[data-caller="key:console"]').waitFor();
    const row = p.locator('#usage-rows tr').filter({ hasText: 'key:console' });
    const requests = Number((await row.locator('td').nth(1).innerText()).replace(/\D/g, ''));
    expect(requests >= 12, `key:console's requests: ${requests}`);
    await p.locator('#usage-status').filter({ hasText: 'requests' }).waitFor();
    // The CSV the page downloads is the admin API's.
    const download = p.waitForEvent('download');
    await p.getByRole('button', { name: 'Download CSV' }).click();
    const csv = await (await download).path();
    const text = (await import('node:fs')).readFileSync(csv, 'utf8');
    expect(text.startsWith('day,caller,agent,requests'), `the CSV: ${text.slice(0, 80)}`);
    await p.locator('#usage').screenshot({ path: join(args.screenshots, 'usage-charts.png') });
    return p;
  },
  'disallowed-origin-fails-visibly': async () => {
    const url = `${args['disallowed-origin']}/console.html?gateway=${encodeURIComponent(args.gateway)}`;
    const p = await page(url, args['api-key']);
    await p.locator('#status[data-kind="error"]').filter({ hasText: 'Cannot reach the gateway' }).waitFor();
    return p;
  },
};

/** ListTasks of an anonymous caller on echo, for one context: how many tasks it holds. */
async function anonymousTasksIn(contextId) {
  const resp = await fetch(`${args.gateway}/a2a/agents/echo`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'A2A-Version': '1.0' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ListTasks', params: { contextId } }),
  });
  const answer = await resp.json();
  expect(answer.result, `ListTasks: ${JSON.stringify(answer)}`);
  return answer.result.tasks.length;
}

// A page on an origin the gateway does not allow tries every request a browser sends
// cross-origin without asking first: no-cors fetches of untyped Blobs, and HTML forms of
// the three types a form may post (text/plain carries JSON, as CSRF against JSON APIs
// does). None may run a task on a public agent.
// Run only when named (--only): it needs public agents, as the shipped configuration has.
const namedOnly = { 'a-page-elsewhere-cannot-run-tasks': true };
scenarios['a-page-elsewhere-cannot-run-tasks'] = async () => {
  const contextId = randomUUID();
  const message = { role: 'ROLE_USER', messageId: randomUUID(), contextId, parts: [{ text: 'from a page elsewhere' }] };
  const rpcBody = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message } });
  const restBody = JSON.stringify({ message });
  const p = await page(`${args['disallowed-origin']}/console.html?gateway=${encodeURIComponent(args.gateway)}`);
  const sent = await p.evaluate(async ({ gateway, rpcBody, restBody }) => {
    const targets = [
      [`${gateway}/a2a/agents/echo`, rpcBody],
      [`${gateway}/a2a`, rpcBody],
      [`${gateway}/a2a/agents/echo/rest/message:send`, restBody],
    ];
    let fetched = 0;
    for (const [url, body] of targets) {
      await fetch(url, { mode: 'no-cors', method: 'POST', body: new Blob([body]) });
      fetched += 1;
    }
    // A form's text/plain body is `name=value`: the JSON, split at a padding field.
    const loads = [];
    let i = 0;
    for (const enctype of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data']) {
      for (const [url, body] of targets) {
        const name = `sink${i++}`;
        const frame = document.createElement('iframe');
        frame.name = name;
        document.body.appendChild(frame);
        loads.push(new Promise((done) => frame.addEventListener('load', done, { once: true })));
        const form = document.createElement('form');
        Object.assign(form, { method: 'POST', action: url, enctype, target: name });
        const input = document.createElement('input');
        input.name = body.slice(0, -1) + ',"pad":"';
        input.value = '"}';
        form.appendChild(input);
        document.body.appendChild(form);
        form.submit();
      }
    }
    await Promise.all(loads);
    return fetched + loads.length;
  }, { gateway: args.gateway, rpcBody, restBody });
  expect(sent === 12, `the page sent ${sent} requests`);
  const held = await anonymousTasksIn(contextId);
  expect(held === 0, `a page on another origin ran ${held} task(s)`);
  // The same message sent as a client does (typed JSON) is a task: the check can see one.
  const resp = await fetch(`${args.gateway}/a2a/agents/echo`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'A2A-Version': '1.0' },
    body: rpcBody,
  });
  expect(resp.status === 200, `a typed send: ${resp.status}`);
  const after = await anonymousTasksIn(contextId);
  expect(after === 1, `a typed send made ${after} task(s)`);
  return p;
};

const only = args.only ? new Set(args.only.split(',')) : null;
for (const name of only ?? []) expect(name in scenarios, `no scenario ${name}`);
const chosen = Object.entries(scenarios).filter(([name]) => (only ? only.has(name) : !namedOnly[name]));
let failures = 0;
for (const [name, run] of chosen) {
  let p = null;
  try {
    p = await run();
    console.log(`PASS ${name}`);
  } catch (e) {
    failures += 1;
    console.log(`FAIL ${name}: ${e.message.split('\n')[0]}`);
  }
  const shot = p || (browser.contexts().at(-1)?.pages().at(-1) ?? null);
  if (shot) await shot.screenshot({ path: join(args.screenshots, `${name}.png`), fullPage: true }).catch(() => {});
}
await browser.close();
console.log(`${chosen.length - failures} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);

// The console in a real browser (Debian's Chromium, driven headless by playwright-core)
// against a running gateway. Prints "PASS name" / "FAIL name: details" per scenario and
// saves a screenshot of each under --screenshots; exit 0 only if all pass.
//
//   node test/browser.mjs --gateway http://127.0.0.1:PORT --api-key KEY \
//     --other-origin http://127.0.0.1:P2 --disallowed-origin http://127.0.0.1:P3 \
//     --screenshots target/console-screenshots [--chromium /usr/bin/chromium]
import { mkdirSync } from 'node:fs';
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
  },
});
const TIMEOUT = 15000;
mkdirSync(args.screenshots, { recursive: true });

const browser = await chromium.launch({
  executablePath: args.chromium,
  headless: true,
  args: ['--no-sandbox'],
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
    await p.getByRole('button', { name: 'Use' }).click();
  }
  return p;
}

const stateIs = (p, s) => p.locator('#task-state').filter({ hasText: new RegExp(`^${s}$`) }).waitFor();

async function chat(p, agent, text) {
  await p.getByRole('button', { name: `Chat with ${agent}`, exact: true }).click();
  await p.getByLabel('Message').fill(text);
  await p.getByRole('button', { name: 'Send' }).click();
}

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
  'delay-canceled': async () => {
    const p = await page(consoleUrl, args['api-key']);
    await chat(p, 'echo', '/delay 30 slow');
    await stateIs(p, 'working');
    await p.getByRole('button', { name: 'Cancel task' }).click();
    await stateIs(p, 'canceled');
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
  'disallowed-origin-fails-visibly': async () => {
    const url = `${args['disallowed-origin']}/console.html?gateway=${encodeURIComponent(args.gateway)}`;
    const p = await page(url, args['api-key']);
    await p.locator('#status[data-kind="error"]').filter({ hasText: 'Cannot reach the gateway' }).waitFor();
    return p;
  },
};

let failures = 0;
for (const [name, run] of Object.entries(scenarios)) {
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
console.log(`${Object.keys(scenarios).length - failures} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);

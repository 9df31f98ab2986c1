// console.mjs - the console (/ui/) in a real browser: Debian's chromium driven by
// playwright-core, headless, against the real batond on 127.0.0.1.
//
// Each test opens an address of the console in a fresh tab and checks what a person
// sees there (holders and waiters by name, a waiter that queues after the page loaded,
// a workflow's steps, the nodes; with --token nothing without it and everything with
// it), that a tab keeps one event stream open and none while hidden, and on every page: no request leaves batond, nothing is logged as an error,
// axe-core finds no serious or critical violation, at 375 px nothing scrolls sideways,
// and with the dark scheme emulated the background is dark. Screenshots of the resource
// view and of a workflow with its timeline go to SCREENSHOTS (default build/browser/;
// `make screenshots` writes those of the README).
//
// Closes with "N passed, N failed". Needs BATOND (the binary); chromium at
// /usr/bin/chromium (CHROMIUM overrides).

import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
const AXE = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const BATOND = process.env.BATOND;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = process.env.SCREENSHOTS || 'build/browser';
const WAIT = 30000;
const servers = [];
const dirs = [];

// ---- batond ------------------------------------------------------------------------

function startBatond(extra = []) {
  const dir = mkdtempSync(join(tmpdir(), 'baton-browser-'));
  dirs.push(dir);
  // CONSOLE_DIR: the console's files from there (--console-dir), as while working on them.
  const dev = process.env.CONSOLE_DIR ? ['--console-dir', process.env.CONSOLE_DIR] : [];
  const child = spawn(BATOND, ['--listen', '127.0.0.1:0', '--db', join(dir, 'b.db'), ...dev, ...extra],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  servers.push(child);
  return new Promise((resolve, reject) => {
    let log = '';
    const timer = setTimeout(() => reject(new Error(`batond did not listen: ${log}`)), WAIT);
    const onData = (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ url: m[1], child });
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', (code) => reject(new Error(`batond exited ${code}: ${log}`)));
  });
}

function stopAll() {
  for (const c of servers) if (c.exitCode === null) c.kill('SIGKILL');
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
}
process.on('exit', stopAll);

async function call(srv, method, path, body, tokenValue) {
  const headers = { 'Content-Type': 'application/json' };
  if (tokenValue) headers.Authorization = `Bearer ${tokenValue}`;
  const res = await fetch(srv.url + path, { method, headers, body: body && JSON.stringify(body) });
  const text = await res.text();
  if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function until(what, fn) {
  const end = Date.now() + WAIT;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// ---- the browser ---------------------------------------------------------------------

let browser;

// A fresh tab on srv, watched: requests elsewhere and errors are collected.
async function openTab(srv, opts = {}) {
  const context = await browser.newContext({ viewport: opts.viewport || { width: 1200, height: 900 } });
  const page = await context.newPage();
  const problems = [];
  const origin = new URL(srv.url).origin;
  page.on('request', (r) => {
    if (new URL(r.url()).origin !== origin) problems.push(`request outside batond: ${r.url()}`);
  });
  page.on('console', (m) => {
    if (m.type() === 'error' && !(opts.allow401 && /401/.test(m.text()))) problems.push(`console error: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  // The event streams the tab has open.
  const streams = new Set();
  page.on('request', (r) => {
    if ((r.headers().accept || '').includes('text/event-stream')) streams.add(r);
  });
  page.on('requestfailed', (r) => streams.delete(r));
  page.on('requestfinished', (r) => streams.delete(r));
  page.on('dialog', (d) => d.accept());
  return { page, context, problems, srv, streams };
}

async function closeTab(tab) {
  await tab.context.close();
  if (tab.problems.length) throw new Error(tab.problems.join('\n'));
}

async function text(page) {
  return page.locator('main').innerText();
}

async function expectText(page, ...wants) {
  for (const want of wants) {
    await page.locator('main').getByText(want, { exact: false }).first().waitFor({ timeout: WAIT });
  }
}

// axe-core on the page as it is: no serious or critical violation. (Evaluated over the
// DevTools protocol: the page's policy allows no inline script.)
async function accessible(page) {
  await page.evaluate(AXE);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
  const bad = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  if (bad.length) {
    throw new Error(`axe: ${bad.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`).join('; ')}`);
  }
}

// At 375 px wide the page does not scroll sideways, and dark when the system is.
async function narrowAndDark(page) {
  await page.setViewportSize({ width: 375, height: 800 });
  const over = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  if (over > 0) throw new Error(`at 375 px the page scrolls sideways by ${over} px`);
  await page.emulateMedia({ colorScheme: 'dark' });
  const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  const [r, g, b] = bg.match(/\d+/g).map(Number);
  if (0.2126 * r + 0.7152 * g + 0.0722 * b > 60) throw new Error(`dark scheme, yet the background is ${bg}`);
  await accessible(page);
  await page.emulateMedia({ colorScheme: 'light' });
  await page.setViewportSize({ width: 1200, height: 900 });
}

// ---- the tests -------------------------------------------------------------------------

const tests = [];
const test = (name, fn) => tests.push({ name, fn });
let plain;

test('the overview lists every resource with holder, queue and totals', async () => {
  const tab = await openTab(plain);
  const { page } = tab;
  const res = await page.goto(`${plain.url}/`);
  if (new URL(page.url()).pathname !== '/ui/') throw new Error(`GET / went to ${page.url()}`);
  if (res.headers()['content-security-policy'] !== "default-src 'self'") throw new Error('no Content-Security-Policy');
  await expectText(page, 'printer', 'alice (lease)', 'ledger');
  const row = await page.locator('tbody tr', { hasText: 'printer' }).innerText();
  if (!/1 of 1/.test(row)) throw new Error(`printer's row: ${row}`);
  await expectText(page, 'Ready', '1 node');
  await page.selectOption('#sort', 'contention');
  await page.waitForURL(/sort=contention/);
  const first = await page.locator('tbody tr').first().innerText();
  if (!first.startsWith('printer')) throw new Error(`by contention, first: ${first}`);
  await accessible(page);
  await narrowAndDark(page);
  await closeTab(tab);
});

test('a resource shows holders and waiters, and a new waiter without a reload', async () => {
  const tab = await openTab(plain);
  const { page } = tab;
  await page.goto(`${plain.url}/ui/resources/printer`);
  await expectText(page, 'alice (lease)', 'render (job-1 step 0)', 'Lease ttl left');
  if (await page.getByRole('button', { name: 'Release' }).count()) throw new Error('actions shown without --console-actions');
  await call(plain, 'POST', '/workflows', { id: 'job-2', resource: 'printer', workers: ['typeset'] });
  await expectText(page, 'typeset (job-2 step 0)');
  const waiters = await page.locator('table', { hasText: 'Waiters for printer' }).innerText();
  if (waiters.indexOf('render') > waiters.indexOf('typeset')) throw new Error(`waiters out of order: ${waiters}`);
  await page.locator('.timeline .hold', { hasText: 'alice #1' }).first().waitFor({ timeout: WAIT });
  // One stream for the tab; a hidden tab closes it, and opens it again when shown.
  await until('one open stream', () => tab.streams.size === 1);
  await page.evaluate(() => {
    Object.defineProperty(document, 'hidden', { value: true, configurable: true });
    document.dispatchEvent(new Event('visibilitychange'));
  });
  await until('no stream while hidden', () => tab.streams.size === 0);
  await page.evaluate(() => {
    Object.defineProperty(document, 'hidden', { value: false, configurable: true });
    document.dispatchEvent(new Event('visibilitychange'));
  });
  await until('the stream back once shown', () => tab.streams.size === 1);
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: join(SHOTS, 'console-resource.png'), fullPage: true });
  await accessible(page);
  await narrowAndDark(page);
  await closeTab(tab);
});

test('a workflow shows its steps and their timeline; the list filters', async () => {
  const tab = await openTab(plain);
  const { page } = tab;
  await page.goto(`${plain.url}/ui/workflows/report`);
  await expectText(page, 'extract', 'transform', 'load');
  await page.locator('.facts', { hasText: 'completed' }).waitFor({ timeout: WAIT });
  const steps = await page.locator('table', { hasText: 'Steps of report' }).innerText();
  for (const w of ['extract', 'transform', 'load']) {
    if (!new RegExp(`${w}\\s+completed\\s+1`).test(steps)) throw new Error(`step ${w} not completed once: ${steps}`);
  }
  await page.locator('.timeline .hold').nth(2).waitFor({ timeout: WAIT });
  await page.screenshot({ path: join(SHOTS, 'console-workflow.png'), fullPage: true });
  await accessible(page);
  await narrowAndDark(page);
  await page.getByRole('link', { name: 'Workflows' }).click();
  await page.selectOption('#f-status', 'completed');
  await page.getByRole('button', { name: 'Filter' }).click();
  await page.waitForURL(/status=completed/);
  await expectText(page, 'report');
  const list = await text(page);
  if (list.includes('job-1')) throw new Error('a waiting workflow is listed as completed');
  await accessible(page);
  await narrowAndDark(page);
  await closeTab(tab);
});

test('the nodes and the store', async () => {
  const tab = await openTab(plain);
  const { page } = tab;
  await page.goto(`${plain.url}/ui/nodes`);
  await expectText(page, 'local (this node)', '64 of 64', 'SQLite');
  await page.reload();
  await expectText(page, 'local (this node)');
  await accessible(page);
  await narrowAndDark(page);
  await closeTab(tab);
});

test('with --token nothing shows without it and all with it; actions with --console-actions', async () => {
  const srv = await startBatond(['--token', 'tok-42', '--console-actions']);
  const lease = await call(srv, 'POST', '/resources/vault/leases', { holder: 'carol', ttl_ms: 60000 }, 'tok-42');
  await call(srv, 'POST', '/workflows', { id: 'audit', resource: 'vault', workers: ['scan'] }, 'tok-42');
  const tab = await openTab(srv, { allow401: true });
  const { page } = tab;
  await page.goto(`${srv.url}/ui/resources/vault`);
  await page.getByLabel('Token').waitFor({ timeout: WAIT });
  const before = await text(page);
  if (/carol|scan|audit/.test(before)) throw new Error(`data without the token: ${before}`);
  await accessible(page);
  await page.getByLabel('Token').fill('tok-42');
  await page.getByRole('button', { name: 'Open' }).click();
  await expectText(page, 'carol (lease)', 'scan (audit step 0)');
  await page.getByRole('button', { name: 'Release' }).click();
  await until('the lease released', async () =>
    (await call(srv, 'GET', `/leases/${lease.id}`, null, 'tok-42')).state === 'released');
  await until('the waiter granted', async () =>
    (await call(srv, 'GET', '/workflows/audit', null, 'tok-42')).status === 'completed');
  await page.goto(`${srv.url}/ui/workflows/audit`);
  await expectText(page, 'scan');
  await closeTab(tab);
});

// ---- run -----------------------------------------------------------------------------

async function main() {
  if (!BATOND) throw new Error('BATOND is not set');
  plain = await startBatond();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  await call(plain, 'POST', '/resources/printer/leases', { holder: 'alice', ttl_ms: 120000 });
  await call(plain, 'POST', '/workflows', { id: 'job-1', resource: 'printer', workers: ['render'] });
  await call(plain, 'POST', '/workflows', {
    id: 'report', resource: 'ledger', workers: [{ name: 'extract', work_ms: 150 }, { name: 'transform', work_ms: 250 }, { name: 'load', work_ms: 200 }],
  });
  await until('report completed', async () => (await call(plain, 'GET', '/workflows/report')).status === 'completed');
  let passed = 0;
  let failed = 0;
  for (const t of tests) {
    const t0 = Date.now();
    try {
      await t.fn();
      passed++;
      console.log(`ok: ${t.name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    } catch (err) {
      failed++;
      console.log(`FAILED: ${t.name}: ${err.message}`);
    }
  }
  await browser.close();
  console.log(`${passed} passed, ${failed} failed`);
  return failed ? 1 : 0;
}

main().catch(async (err) => {
  console.log(`FAILED: ${err.message}`);
  if (browser) await browser.close().catch(() => {});
  console.log(`0 passed, ${tests.length} failed`);
  return 1;
}).then((code) => {
  stopAll();
  process.exit(code);
});

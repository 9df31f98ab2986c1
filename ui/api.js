// api.js - how the console talks to batond: the API with the token of this tab, event
// streams read with fetch (so that the token goes in a header and Last-Event-ID stays in
// our hands), and a small DOM helper. Nothing here stores data beyond the tab.

const TOKEN_KEY = 'baton-token';

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// Raised when the server wants a token (401): the app asks for one.
export class NeedToken extends Error {}

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
  }
}

function headers(extra) {
  const h = Object.assign({ Accept: 'application/json' }, extra || {});
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

// One API call; resolves to the parsed JSON (null for an empty answer).
export async function api(path, opts = {}) {
  const init = { method: opts.method || 'GET', headers: headers(), cache: 'no-store' };
  if (opts.body !== undefined) {
    init.body = JSON.stringify(opts.body);
    init.headers['Content-Type'] = 'application/json';
  }
  if (opts.signal) init.signal = opts.signal;
  const res = await fetch(path, init);
  if (res.status === 401) throw new NeedToken();
  const text = await res.text();
  let body = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
  }
  if (!res.ok) throw new ApiError(res.status, body && body.detail);
  return body;
}

// Parses one block of an event stream ("id:", "event:", "data:" lines).
function parseBlock(block) {
  const ev = { id: null, type: 'message', data: '' };
  for (const line of block.split('\n')) {
    if (!line || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'id') ev.id = value;
    else if (field === 'event') ev.type = value;
    else if (field === 'data') ev.data += (ev.data ? '\n' : '') + value;
  }
  return ev;
}

const FINAL = new Set(['workflow_completed', 'workflow_failed', 'workflow_cancelled']);

// Follows the event stream at path from event `after` on: onEvent(event) for each, in
// order. Reconnects after a break with Last-Event-ID, pauses while the tab is hidden,
// and stops for good after a workflow's final event or stop(). onError(err) hears of a
// NeedToken or a refusal.
export function follow(path, after, onEvent, onError) {
  let last = after;
  let ctrl = null;
  let timer = null;
  let stopped = false;
  let ended = false;

  async function run() {
    if (stopped || ended || ctrl || document.hidden) return;
    ctrl = new AbortController();
    const h = headers({ Accept: 'text/event-stream' });
    if (last !== null && last !== undefined) h['Last-Event-ID'] = String(last);
    let broke = false;
    try {
      const res = await fetch(path, { headers: h, signal: ctrl.signal, cache: 'no-store' });
      if (res.status === 401) throw new NeedToken();
      if (!res.ok) throw new ApiError(res.status);
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n?/g, '\n');
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = parseBlock(buf.slice(0, i));
          buf = buf.slice(i + 2);
          if (ev.id !== null) last = Number(ev.id);
          if (!ev.data || ev.type === 'error') continue;
          const data = JSON.parse(ev.data);
          onEvent(data);
          if (FINAL.has(data.type)) ended = true;
        }
      }
    } catch (err) {
      if (err.name !== 'AbortError') {
        broke = true;
        if (err instanceof NeedToken || err instanceof ApiError) {
          stopped = true;
          if (onError) onError(err);
        }
      }
    }
    ctrl = null;
    if (!stopped && !ended) timer = setTimeout(run, broke ? 2000 : 500);
  }

  function onVisibility() {
    if (document.hidden) {
      if (ctrl) ctrl.abort();
    } else {
      run();
    }
  }
  document.addEventListener('visibilitychange', onVisibility);
  run();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
      if (ctrl) ctrl.abort();
      document.removeEventListener('visibilitychange', onVisibility);
    },
  };
}

// Calls fn now and every `ms` while the tab is visible, until the returned stop().
export function every(ms, fn) {
  let timer = null;
  const tick = () => {
    clearTimeout(timer);
    if (!document.hidden) fn();
    timer = setTimeout(tick, ms);
  };
  const onVisibility = () => {
    if (!document.hidden) tick();
  };
  document.addEventListener('visibilitychange', onVisibility);
  tick();
  return () => {
    clearTimeout(timer);
    document.removeEventListener('visibilitychange', onVisibility);
  };
}

// h('a', {href: '/ui/'}, 'text', child...): an element; text is never parsed as HTML.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function ms(n) {
  if (n === null || n === undefined) return '–';
  if (n < 1000) return `${Math.round(n)} ms`;
  const s = n / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function since(iso) {
  return iso ? Date.now() - Date.parse(iso) : null;
}

export function time(iso) {
  if (!iso) return '–';
  const d = new Date(iso);
  return h('time', { datetime: iso }, d.toLocaleTimeString([], { hour12: false }));
}

export function resLink(name) {
  return h('a', { href: `/ui/resources/${encodeURIComponent(name)}` }, name);
}

// A holder or waiter: a lease links to its resource, where the lease is listed; a
// workflow step to its workflow.
export function holderLink(x, resource) {
  if (x.kind === 'lease') {
    return h('a', { href: `/ui/resources/${encodeURIComponent(resource)}#${x.lease_id}` },
      `${x.worker} (lease)`);
  }
  return h('a', { href: `/ui/workflows/${encodeURIComponent(x.workflow_id)}` },
    `${x.worker} (${x.workflow_id} step ${x.step})`);
}

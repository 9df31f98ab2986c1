// app.js - the console's entry: reads the address, shows its view, follows links without
// reloading, and asks for the token when the server wants one (kept for this tab only).

import { ApiError, NeedToken, h, setToken, token } from './api.js';
import { nodes, overview, resource, workflow, workflows } from './views.js';

const main = document.getElementById('main');
const statusLine = document.getElementById('status');
let stopView = null;
let settings = { actions: false };

function status(text) {
  statusLine.textContent = text;
}

function askToken(again) {
  if (stopView) stopView();
  stopView = null;
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true });
  const form = h('form', {
    class: 'token',
    onsubmit: (e) => {
      e.preventDefault();
      setToken(input.value.trim());
      show();
    },
  },
  h('p', {}, again ? 'The server did not take that token. ' : '',
    'This server needs its token to show anything. It is kept in this tab only, until the tab closes.'),
  h('label', { for: 'token' }, 'Token'), input, h('button', { type: 'submit' }, 'Open'));
  main.replaceChildren(h('h1', {}, 'Token needed'), form);
  input.focus();
}

function fail(err) {
  if (err instanceof NeedToken) {
    askToken(Boolean(token()));
  } else if (err instanceof ApiError && err.status === 404) {
    if (stopView) stopView();
    stopView = null;
    main.replaceChildren(h('h1', {}, 'Not found'), h('p', {}, err.message));
  } else {
    status(`Error: ${err.message}`);
  }
}

function go(path) {
  history.pushState(null, '', path);
  show();
  main.focus();
}

function route(path) {
  const seg = path.replace(/^\/ui\/?/, '').split('/').map(decodeURIComponent);
  if (path === '/ui/' || path === '/ui') return ['Resources', '/ui/', (root, ctx) => overview(root, ctx)];
  if (seg[0] === 'resources' && seg.length === 2 && seg[1]) {
    return [`Resource ${seg[1]}`, '/ui/', (root, ctx) => resource(root, ctx, seg[1])];
  }
  if (seg[0] === 'workflows' && seg.length === 1) return ['Workflows', '/ui/workflows', workflows];
  if (seg[0] === 'workflows' && seg.length === 2 && seg[1]) {
    return [`Workflow ${seg[1]}`, '/ui/workflows', (root, ctx) => workflow(root, ctx, seg[1])];
  }
  if (seg[0] === 'nodes' && seg.length === 1) return ['Nodes', '/ui/nodes', nodes];
  return null;
}

function show() {
  if (stopView) stopView();
  stopView = null;
  status('');
  const r = route(location.pathname);
  for (const a of document.querySelectorAll('header nav a')) {
    if (r && a.getAttribute('href') === r[1]) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!r) {
    document.title = 'Not found · baton';
    main.replaceChildren(h('h1', {}, 'Not found'), h('p', {}, 'The console has no such view.'));
    return;
  }
  document.title = `${r[0]} · baton`;
  const ctx = { settings, query: new URLSearchParams(location.search), status, fail, go };
  stopView = r[2](main, ctx);
}

document.addEventListener('click', (e) => {
  const a = e.target.closest('a');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith('/ui/') || url.pathname.includes('.')) return;
  if (url.pathname === location.pathname && url.search === location.search && url.hash) return;
  e.preventDefault();
  go(url.pathname + url.search + url.hash);
});
window.addEventListener('popstate', show);

fetch('/ui/settings.json', { cache: 'no-store' })
  .then((r) => r.json())
  .then((s) => {
    settings = s;
  })
  .catch(() => {})
  .finally(show);

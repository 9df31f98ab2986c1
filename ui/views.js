// views.js - the console's views, one function each: it fills `root` and returns what
// stops its streams and timers. Every piece of data comes from the API (api.js).

import { api, every, follow, h, holderLink, ms, resLink, since, time } from './api.js';
import { Timeline } from './timeline.js';

const PAGE = 50;

function table(caption, heads, rows, empty) {
  if (!rows.length) return h('p', { class: 'empty' }, empty);
  return h('div', { class: 'scroll', tabindex: 0, role: 'region', 'aria-label': caption },
    h('table', {},
      h('caption', {}, caption),
      h('thead', {}, h('tr', {}, heads.map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, rows.map((r) => h('tr', r.attrs || {}, r.cells.map((c, i) =>
        i === 0 ? h('th', { scope: 'row' }, c) : h('td', {}, c)))))));
}

function facts(pairs) {
  return h('dl', { class: 'facts' }, pairs.map(([k, v]) =>
    h('div', {}, h('dt', {}, k), h('dd', {}, v))));
}

function replace(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

// Calls fn at most once per `wait` ms, the last call winning.
function debounce(fn, wait) {
  let t = null;
  return () => {
    clearTimeout(t);
    t = setTimeout(fn, wait);
  };
}

function pager(label, hasNext, onFirst, onNext) {
  return h('nav', { class: 'pager', 'aria-label': label },
    h('button', { type: 'button', onclick: onFirst }, 'First page'),
    hasNext ? h('button', { type: 'button', onclick: onNext }, 'Next page') : null);
}

function confirmThen(question, action, ctx) {
  return async () => {
    if (!window.confirm(question)) return;
    try {
      await action();
      ctx.status('Done.');
    } catch (err) {
      ctx.fail(err);
    }
  };
}

// ---- the overview: every resource, with the cluster's health --------------------------

export function overview(root, ctx) {
  const sort = ctx.query.get('sort') === 'contention' ? 'contention' : 'name';
  const cursors = [null];
  const health = h('section', { class: 'health', 'aria-label': 'Cluster health' }, 'Checking health…');
  const list = h('div', {});
  const select = h('select', { id: 'sort', onchange: (e) => ctx.go(`/ui/${e.target.value === 'contention' ? '?sort=contention' : ''}`) },
    h('option', { value: 'name', selected: sort === 'name' }, 'by name'),
    h('option', { value: 'contention', selected: sort === 'contention' }, 'by contention (longest queue first)'));
  replace(root, h('h1', {}, 'Resources'), health,
    h('p', { class: 'controls' }, h('label', { for: 'sort' }, 'Sort '), select), list);

  async function loadHealth() {
    let ready = 'not ready';
    try {
      await api('/readyz');
      ready = 'ready';
    } catch (err) {
      if (err.status !== 503) throw err;
    }
    const n = await api('/nodes');
    const nodes = n.nodes || [];
    const store = nodes.length === 1 && nodes[0].lease_expires_at === null ? 'SQLite' : 'PostgreSQL';
    replace(health,
      h('span', { class: `dot ${ready === 'ready' ? 'ok' : 'bad'}` }, ready === 'ready' ? 'Ready' : 'Not ready'),
      h('span', {}, `${nodes.length} node${nodes.length === 1 ? '' : 's'}`),
      h('span', {}, `store: ${store}`),
      h('a', { href: '/ui/nodes' }, 'Nodes'));
  }

  async function load() {
    const cur = cursors[cursors.length - 1];
    const q = new URLSearchParams({ limit: PAGE });
    if (sort === 'contention') q.set('sort', 'contention');
    if (cur) q.set('cursor', cur);
    const page = await api(`/resources?${q}`);
    const rows = page.resources.map((r) => ({
      cells: [
        resLink(r.name),
        r.holder ? h('span', {}, holderLink(r.holder, r.name),
          !r.holder.exclusive && r.permits_in_use > 1 ? ` and ${r.permits_in_use - 1} more` : '') : 'free',
        `${r.permits_in_use} of ${r.limit}`,
        String(r.queue_length),
        r.oldest_waiting_since ? ms(since(r.oldest_waiting_since)) : '–',
        String(r.last_fencing_token),
        `${r.totals.grants} (${ms(r.totals.total_hold_ms)})`,
        ms(r.totals.total_wait_ms),
      ],
    }));
    replace(list,
      table('Resources', ['Resource', 'Holder', 'Permits in use', 'Queue', 'Oldest waiter',
        'Last token', 'Holds (total)', 'Waits (total)'], rows, 'No resource has been used yet.'),
      pager('Resource pages', page.next_cursor, () => { cursors.length = 1; refresh(); },
        () => { cursors.push(page.next_cursor); refresh(); }));
  }

  const refresh = () => Promise.all([load(), loadHealth()]).catch(ctx.fail);
  const stop = every(3000, refresh);
  return () => stop();
}

// ---- a resource: holders, waiters, a live timeline, its history ------------------------

export function resource(root, ctx, name) {
  const summary = h('div', {});
  const actions = h('div', {});
  const holders = h('div', {});
  const waiters = h('div', {});
  const tl = h('div', {});
  const history = h('section', { 'aria-labelledby': 'history-h' });
  replace(root, h('h1', {}, 'Resource ', h('span', { class: 'name' }, name)), summary, actions,
    h('h2', {}, 'Holders'), holders, h('h2', {}, 'Waiters'), waiters,
    h('h2', {}, 'Timeline'), tl, history);
  const path = `/resources/${encodeURIComponent(name)}`;
  let res = null;
  let stream = null;
  const leases = new Map();
  let timeline = null;

  function lanes() {
    const n = res ? Math.min(res.limit, 16) : 1;
    const l = [];
    for (let i = 0; i < n; i++) l.push(`slot ${i}`);
    l.push('waiting');
    return l;
  }

  function renderHolders() {
    const rows = res.holders.map((x) => {
      const lease = x.kind === 'lease' ? leases.get(x.lease_id) : null;
      const left = lease && lease.expires_at ? Date.parse(lease.expires_at) - Date.now() : null;
      const release = ctx.settings.actions && x.kind === 'lease'
        ? h('button', {
          type: 'button',
          onclick: confirmThen(`Release the lease of ${x.worker} on ${name}?`,
            () => api(`/leases/${encodeURIComponent(x.lease_id)}`, { method: 'DELETE' }).then(refresh), ctx),
        }, 'Release')
        : null;
      return {
        attrs: x.kind === 'lease' ? { id: x.lease_id } : {},
        cells: [holderLink(x, name), String(x.fencing_token), x.slot === null ? 'all (exclusive)' : String(x.slot),
          x.kind === 'lease' ? 'lease' : 'workflow step', time(x.since),
          left === null ? '–' : h('span', { class: left < 3000 ? 'warn' : '' }, left > 0 ? ms(left) : 'expiring'),
          release],
      };
    });
    replace(holders, table(`Holders of ${name}`, ['Holder', 'Token', 'Slot', 'Kind', 'Since', 'Lease ttl left', ''],
      rows, 'Nobody holds it.'));
  }

  function render() {
    replace(summary, facts([
      ['Limit', String(res.limit)],
      ['Permits in use', `${res.permits_in_use} of ${res.limit}`],
      ['Queue', String(res.waiters.length)],
      ['Last token', String(res.last_fencing_token)],
      ['Holds', `${res.totals.grants}, ${ms(res.totals.total_hold_ms)} in all, longest ${ms(res.totals.max_hold_ms)}`],
      ['Waits', `${ms(res.totals.total_wait_ms)} in all, longest ${ms(res.totals.max_wait_ms)}`],
      ['Node', res.node || 'this one'],
    ]));
    renderHolders();
    replace(waiters, table(`Waiters for ${name}, first in line first`,
      ['Position', 'Waiter', 'Kind', 'Waiting for', 'Exclusive'],
      res.waiters.map((w) => ({
        attrs: w.kind === 'lease' ? { id: w.lease_id } : {},
        cells: [String(w.position), holderLink(w, name), w.kind === 'lease' ? 'lease' : 'workflow step',
          ms(since(w.waiting_since)), w.exclusive ? 'yes' : 'no'],
      })), 'Nobody waits.'));
  }

  async function refresh() {
    res = await api(path);
    await Promise.all(res.holders.filter((x) => x.kind === 'lease' && !leases.has(x.lease_id)).map(async (x) => {
      try {
        leases.set(x.lease_id, await api(`/leases/${encodeURIComponent(x.lease_id)}`));
      } catch {
        leases.delete(x.lease_id);
      }
    }));
    render();
  }
  const later = debounce(() => {
    leases.clear();
    refresh().catch(ctx.fail);
  }, 150);

  function limitForm() {
    if (!ctx.settings.actions) return null;
    const input = h('input', { id: 'limit', type: 'number', min: 1, max: 10000, value: res.limit, required: true });
    return h('form', {
      class: 'inline',
      onsubmit: (e) => {
        e.preventDefault();
        confirmThen(`Change the limit of ${name} to ${input.value}?`,
          () => api(path, { method: 'PUT', body: { limit: Number(input.value) } }).then(refresh), ctx)();
      },
    }, h('label', { for: 'limit' }, 'Limit '), input, h('button', { type: 'submit' }, 'Change limit'));
  }

  let historyAfter = 0;
  async function loadHistory() {
    const page = await api(`${path}/events?after=${historyAfter}&limit=${PAGE}`);
    const rows = page.events.map((e) => ({
      cells: [String(e.seq), time(e.ts), e.type.replace(/_/g, ' '),
        e.workflow_id.startsWith('lease-') ? `${e.worker} (lease)` : h('a', { href: `/ui/workflows/${encodeURIComponent(e.workflow_id)}` }, e.workflow_id),
        e.fencing_token === undefined ? '–' : String(e.fencing_token)],
    }));
    replace(history, h('h2', { id: 'history-h' }, 'History'),
      table(`History of ${name}`, ['Seq', 'Time', 'Event', 'Who', 'Token'], rows, 'No events.'),
      pager('History pages', page.next_after !== null, () => { historyAfter = 0; loadHistory().catch(ctx.fail); },
        () => { historyAfter = page.next_after; loadHistory().catch(ctx.fail); }));
  }

  let ticker = null;
  refresh().then(() => {
    replace(actions, limitForm());
    timeline = new Timeline(`Holds of ${name}`, (ev, wait) => (wait ? 'waiting' : ev.slot === null || ev.slot === undefined ? 'slot 0' : `slot ${ev.slot}`), lanes);
    const draw = () => replace(tl, timeline.render(true));
    stream = follow(`${path}/events`, Math.max(0, res.last_event_seq - 1000), (ev) => {
      timeline.add(ev);
      draw();
      later();
    }, ctx.fail);
    draw();
    let ticks = 0;
    ticker = every(1000, () => {
      draw();
      // A renewal moves a lease's expiry without an event: read the resource again now
      // and then.
      if (++ticks % 5 === 0) later();
      else if (res) renderHolders();
    });
    return loadHistory();
  }).catch(ctx.fail);
  return () => {
    if (stream) stream.stop();
    if (ticker) ticker();
  };
}

// ---- workflows: a filtered, paged list ------------------------------------------------

const STATUSES = ['pending', 'running', 'completed', 'failed', 'cancelled'];

export function workflows(root, ctx) {
  const status = ctx.query.get('status') || '';
  const resName = ctx.query.get('resource') || '';
  const cursors = [null];
  const list = h('div', {});
  const statusSel = h('select', { id: 'f-status', name: 'status' }, h('option', { value: '' }, 'any'),
    STATUSES.map((s) => h('option', { value: s, selected: s === status }, s)));
  const resInput = h('input', { id: 'f-resource', name: 'resource', value: resName, autocomplete: 'off' });
  const form = h('form', {
    class: 'filters',
    onsubmit: (e) => {
      e.preventDefault();
      const q = new URLSearchParams();
      if (statusSel.value) q.set('status', statusSel.value);
      if (resInput.value.trim()) q.set('resource', resInput.value.trim());
      ctx.go(`/ui/workflows${q.toString() ? `?${q}` : ''}`);
    },
  }, h('label', { for: 'f-status' }, 'Status '), statusSel, h('label', { for: 'f-resource' }, 'Resource '), resInput,
  h('button', { type: 'submit' }, 'Filter'));
  replace(root, h('h1', {}, 'Workflows'), form, list);

  async function load() {
    const q = new URLSearchParams({ limit: PAGE });
    if (status) q.set('status', status);
    if (resName) q.set('resource', resName);
    const cur = cursors[cursors.length - 1];
    if (cur) q.set('cursor', cur);
    const page = await api(`/workflows?${q}`);
    const rows = page.workflows.map((w) => ({
      cells: [
        w.id.startsWith('lease-') ? h('span', {}, 'a lease, see ', resLink(w.resource))
          : h('a', { href: `/ui/workflows/${encodeURIComponent(w.id)}` }, w.id),
        resLink(w.resource), w.status, `${w.steps_completed} of ${w.steps_total}`, time(w.created_at), time(w.finished_at)],
    }));
    replace(list, table('Workflows, newest first', ['Workflow', 'Resource', 'Status', 'Steps done', 'Created', 'Finished'],
      rows, 'No workflow matches.'),
    pager('Workflow pages', page.next_cursor, () => { cursors.length = 1; load().catch(ctx.fail); },
      () => { cursors.push(page.next_cursor); load().catch(ctx.fail); }));
  }
  const stop = every(5000, () => load().catch(ctx.fail));
  return () => stop();
}

// ---- a workflow: its steps and their timeline ------------------------------------------

const FINISHED = new Set(['completed', 'failed', 'cancelled']);

function outcome(st) {
  if (st.error) return h('span', { class: 'error' }, String(st.error));
  if (st.result === null || st.result === undefined) return '–';
  const text = JSON.stringify(st.result);
  return h('code', {}, text.length > 120 ? `${text.slice(0, 120)}…` : text);
}

export function workflow(root, ctx, id) {
  const path = `/workflows/${encodeURIComponent(id)}`;
  const head = h('div', {});
  const steps = h('div', {});
  const tl = h('div', {});
  replace(root, h('h1', {}, 'Workflow ', h('span', { class: 'name' }, id)), head,
    h('h2', {}, 'Steps'), steps, h('h2', {}, 'Timeline'), tl);
  let wf = null;
  let stream = null;
  let ticker = null;
  const timeline = new Timeline(`Steps of ${id}`, (ev) => `step ${ev.step}`, () =>
    (wf ? wf.steps.map((s) => `step ${s.index}`) : []), false);

  function render() {
    const cancel = ctx.settings.actions && !FINISHED.has(wf.status)
      ? h('button', {
        type: 'button',
        onclick: confirmThen(`Cancel workflow ${id}?`, () => api(`${path}/cancel`, { method: 'POST' }).then(refresh), ctx),
      }, 'Cancel workflow')
      : null;
    replace(head, facts([
      ['Status', h('span', { class: `st-${wf.status}` }, wf.status + (wf.cancel_requested && !FINISHED.has(wf.status) ? ' (cancel requested)' : ''))],
      ['Resource', resLink(wf.resource)],
      ['Steps done', `${wf.steps_completed} of ${wf.steps_total}`],
      ['Created', time(wf.created_at)],
      ['Started', time(wf.started_at)],
      ['Finished', time(wf.finished_at)],
    ]), h('p', { class: 'outcome' }, wf.error ? 'Error: ' : 'Result: ', outcome(wf)), cancel);
    replace(steps, table(`Steps of ${id}`, ['Step', 'Worker', 'Status', 'Attempts', 'Token', 'Started', 'Finished', 'Took', 'Result or error'],
      wf.steps.map((s) => ({
        cells: [String(s.index), s.worker, s.status + (s.queue_position ? ` (#${s.queue_position} in line)` : ''),
          String(s.attempts), s.fencing_token === null ? '–' : String(s.fencing_token), time(s.started_at),
          time(s.finished_at), ms(s.duration_ms), outcome(s)],
      })), 'No steps.'));
  }

  async function refresh() {
    wf = await api(path);
    render();
  }
  const later = debounce(() => refresh().catch(ctx.fail), 150);
  const draw = () => replace(tl, timeline.render(wf && !FINISHED.has(wf.status)));
  refresh().then(() => {
    if (id.startsWith('lease-')) {
      replace(root, h('h1', {}, 'A lease'), h('p', {}, 'This is a lease, not a workflow: see ', resLink(wf.resource), '.'));
      return;
    }
    stream = follow(`${path}/events`, 0, (ev) => {
      timeline.add(ev);
      later();
      draw();
    }, ctx.fail);
    draw();
    ticker = every(1000, () => {
      if (wf && !FINISHED.has(wf.status)) draw();
    });
  }).catch(ctx.fail);
  return () => {
    if (stream) stream.stop();
    if (ticker) ticker();
  };
}

// ---- nodes: who drives what, and the store ---------------------------------------------

export function nodes(root, ctx) {
  const body = h('div', {});
  replace(root, h('h1', {}, 'Nodes'), body);
  async function load() {
    const n = await api('/nodes');
    const list = n.nodes || [];
    const sqlite = list.length === 1 && list[0].lease_expires_at === null;
    const extra = Object.entries(n).filter(([k]) => k !== 'nodes' && k !== 'store')
      .map(([k, v]) => [k.replace(/_/g, ' '), typeof v === 'object' ? JSON.stringify(v) : String(v)]);
    const st = n.store || {};
    const standbys = st.sync_standbys === 1 ? '1 synchronous standby' : `${st.sync_standbys} synchronous standbys`;
    const sync = st.sync_replication === true ? `yes (${standbys} connected)`
      : st.sync_replication === false ? 'no: a failover of the database may lose acknowledged work'
        : sqlite ? 'not applicable (SQLite)' : 'not read yet';
    extra.unshift(['Synchronous replication', sync]);
    replace(body,
      table('Live nodes', ['Node', 'Address', 'Partitions driven', 'Lease expires', 'Resources', 'Running steps'],
        list.map((x) => ({
          cells: [x.id + (x.self ? ' (this node)' : ''), x.url || '–', `${x.partitions} of 64`,
            x.lease_expires_at ? h('span', {}, time(x.lease_expires_at), ` (in ${ms(Date.parse(x.lease_expires_at) - Date.now())})`) : 'no lease (one node alone)',
            x.resources === null ? '–' : String(x.resources), x.running_steps === null ? '–' : String(x.running_steps)],
        })), 'No live node.'),
      h('h2', {}, 'Store'),
      facts([['Database', sqlite ? 'SQLite: this node alone' : `PostgreSQL, shared by ${list.length} node${list.length === 1 ? '' : 's'}`], ...extra]));
  }
  const stop = every(3000, () => load().catch(ctx.fail));
  return () => stop();
}

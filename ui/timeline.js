// timeline.js - holds as bars, one lane per slot (or per step), waits shaded, built from
// a resource's or a workflow's events as they come. Live: render() again as time passes.

import { h, ms } from './api.js';

const HOLD_ENDS = new Set(['lock_released', 'lease_expired', 'step_interrupted']);
const WAIT_ENDS = new Set(['lock_acquired', 'workflow_cancelled']);

function key(ev) {
  return `${ev.workflow_id}#${ev.step}#${ev.attempt}`;
}

export class Timeline {
  // laneOf(event, isWait) names an event's lane ("slot 0", "step 2", "waiting");
  // with spread, an exclusive grant takes every lane of lanes().
  constructor(caption, laneOf, lanes, spread = true) {
    this.caption = caption;
    this.spread = spread;
    this.laneOf = laneOf;
    this.lanes = lanes;
    this.holds = [];
    this.waits = [];
    this.open = new Map();
    this.waiting = new Map();
  }

  add(ev) {
    const t = Date.parse(ev.ts);
    if (ev.type === 'lock_requested') {
      const w = { start: t, end: null, who: ev.worker, lane: this.laneOf(ev, true) };
      this.waiting.set(key(ev), w);
      this.waits.push(w);
    } else if (ev.type === 'lock_acquired') {
      const w = this.waiting.get(key(ev));
      if (w) {
        w.end = t;
        this.waiting.delete(key(ev));
      }
      const hold = {
        start: t, end: null, who: ev.worker, token: ev.fencing_token,
        exclusive: this.spread && ev.exclusive, lane: this.laneOf(ev, false),
      };
      this.open.set(key(ev), hold);
      this.holds.push(hold);
    } else if (HOLD_ENDS.has(ev.type) && this.open.has(key(ev))) {
      this.open.get(key(ev)).end = t;
      this.open.delete(key(ev));
    } else if (WAIT_ENDS.has(ev.type)) {
      for (const [k, w] of this.waiting) {
        if (k.startsWith(`${ev.workflow_id}#`)) {
          w.end = t;
          this.waiting.delete(k);
        }
      }
    }
    if (this.holds.length > 500) this.holds.splice(0, this.holds.length - 500);
    if (this.waits.length > 500) this.waits.splice(0, this.waits.length - 500);
  }

  // The figure: a lane per slot, bars placed by CSS (no inline style attributes: the
  // page's policy forbids them; the CSSOM is allowed).
  render(live) {
    const now = Date.now();
    const all = this.holds.concat(this.waits);
    const first = all.length ? Math.min(...all.map((x) => x.start)) : now - 60000;
    const ends = all.map((x) => x.end || now);
    const last = live ? now : Math.max(first + 1000, ...ends);
    const from = Math.max(first, last - 5 * 60000);
    const span = Math.max(last - from, 1000);
    const pos = (el, start, end) => {
      const a = Math.max(start, from);
      const b = Math.max(end || now, a);
      el.style.left = `${((a - from) / span) * 100}%`;
      el.style.width = `${Math.max(((b - a) / span) * 100, 0.5)}%`;
    };
    const lanes = this.lanes();
    const rows = lanes.map((lane) => {
      const track = h('div', { class: 'track' });
      for (const w of this.waits) {
        if (w.lane !== lane || (w.end && w.end < from)) continue;
        const bar = h('div', { class: 'wait', title: `${w.who} waited ${ms((w.end || now) - w.start)}` });
        pos(bar, w.start, w.end);
        track.append(bar);
      }
      for (const x of this.holds) {
        if ((x.end && x.end < from) || (x.lane !== lane && !x.exclusive)) continue;
        const bar = h('div', {
          class: `hold${x.end ? '' : ' live'}`,
          title: `${x.who} #${x.token}: ${ms((x.end || now) - x.start)}`,
        }, `${x.who} #${x.token}`);
        pos(bar, x.start, x.end);
        track.append(bar);
      }
      return h('div', { class: 'lane' }, h('span', { class: 'lane-name' }, lane), track);
    });
    const held = this.holds.filter((x) => x.end === null).map((x) => `${x.who} #${x.token}`);
    const summary = `${this.caption}: ${this.holds.length} holds over ${ms(span)}` +
      (held.length ? `; held now by ${held.join(', ')}` : '; nobody holds it now');
    return h('figure', { class: 'timeline' },
      h('figcaption', {}, this.caption, ' ', h('small', {}, `(the last ${ms(span)}; waits shaded)`)),
      h('div', { class: 'lanes', role: 'img', 'aria-label': summary }, rows));
  }
}

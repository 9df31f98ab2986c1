/*
 * recover.c - start-up: every unfinished workflow is loaded and resumes. Steps that were
 * running when the process stopped run again as a new attempt and get their resource
 * back before any later request (a held lease and a claimed external step keep theirs,
 * with their ttl counted from now); steps waiting for a resource queue again in their
 * original order; retry waits keep their persisted time.
 */
#include "engine.h"

#include <stdlib.h>

typedef struct recovery {
	baton_engine *e;
	int inbox;
	VEC(wf_row *) cancels;	   /* a cancel was requested on another node */
	VEC(wf_row *) interrupted; /* held the resource when the process stopped */
	VEC(wf_row *) waiting;	   /* were queued for it */
	VEC(wf_row *) fresh;	   /* ask for it now: after all of those, in load order */
} recovery;

static void recover_workflow(void *ctx, wf_row *wf)
{
	recovery *rc = ctx;
	baton_engine *e = rc->e;
	event_sink ev = {eng_on_event, e};
	wf_row *cur = strmap_get(e->wfs, wf->id);
	if (cur) { /* in memory already: only a cancel requested elsewhere is news */
		if (wf->cancel_requested && !cur->cancel_requested && !cur->done && !cur->foreign)
			VEC_PUSH(rc->cancels, cur);
		wf_row_free(wf);
		return;
	}
	if (rc->inbox && !wf->dirty && !wf->cancel_requested) {
		wf_row_free(wf); /* adopted meanwhile by this node's last round */
		return;
	}
	/* Adopted from another node's submission, whose events took seqs from that node's
	 * block: this node's next events come from a fresh block, above those, so that the
	 * workflow's event cursor never goes back. */
	if (rc->inbox)
		e->event_seq = e->event_seq_end;
	/* Requested on another node and not carried out yet: carried out here, below. */
	int cancel = e->clustered && wf->cancel_requested;
	if (cancel)
		wf->cancel_requested = 0;
	wf->dirty_lo = wf->steps_total;
	wf->results_bytes = wf_results_bytes(wf);
	wf->cur = 0;
	while (wf->cur < wf->steps_total && (wf->steps[wf->cur].status == ST_COMPLETED ||
					     wf->steps[wf->cur].status == ST_FAILED))
		wf->cur++;
	if (wf->cur == wf->steps_total) { /* cannot happen: the last step commits the end */
		log_at(&e->log, BATON_LOG_ERROR, wf->id, "unfinished workflow has no step left");
		wf_row_free(wf);
		return;
	}
	strmap_put(e->wfs, wf->id, wf);
	step_row *st = &wf->steps[wf->cur];
	if (lease_recover(e, wf)) {
		/* held: still held, with its ttl counted from now; waiting: nobody waits */
	} else if (task_recover(e, wf)) {
		/* claimed: still claimed by the same attempt, its ttl counted from now */
	} else if (st->status == ST_RUNNING) {
		machine_interrupted(wf, &ev);
		VEC_PUSH(rc->interrupted, wf);
	} else if (st->status == ST_WAITING) {
		VEC_PUSH(rc->waiting, wf);
	} else if (st->status == ST_RETRYING) {
		/* The wait was stored as a time of the wall clock, which may have been stepped
		 * back while batond was down: it ends its backoff after now at the latest. */
		int64_t delay = st->next_attempt_at - st->finished_at;
		if (st->finished_at > 0 && delay > 0 && st->next_attempt_at > e->now + delay)
			st->next_attempt_at = e->now + delay;
		eng_timer_push(e, st->next_attempt_at, wf->id);
	} else {
		VEC_PUSH(rc->fresh, wf);
	}
	eng_touch_wf(e, wf);
	if (cancel)
		VEC_PUSH(rc->cancels, wf);
}

static int by_lock_seq(const void *a, const void *b)
{
	const wf_row *x = *(wf_row *const *)a, *y = *(wf_row *const *)b;
	int64_t xs = x->steps[x->cur].lock_seq, ys = y->steps[y->cur].lock_seq;
	return (xs > ys) - (xs < ys);
}

static void requeue(baton_engine *e, wf_row **v, size_t n)
{
	if (n > 1)
		qsort(v, n, sizeof *v, by_lock_seq);
	for (size_t i = 0; i < n; i++) {
		res_lock *l = eng_lock_of(e, v[i]->resource);
		lock_enqueue(l, v[i]);
		eng_touch_lock(e, l);
	}
	free(v);
}

int eng_recover(baton_engine *e, uint64_t parts, int inbox, baton_error *err)
{
	recovery r = {.e = e, .inbox = inbox};
	int64_t lock_seq = 0;
	int first = !e->recovered;
	e->recovered = 1;
	/* No resource row: a resource comes back into memory when a step asks for it
	 * (idle.c), so only those with unfinished work do, below. */
	int rc = inbox ? e->st->ops->load_inbox(e->st, parts, recover_workflow, &r, err)
		       : store_load(e->st, parts, recover_workflow, &r, &lock_seq, err);
	if (lock_seq > e->lock_seq)
		e->lock_seq = lock_seq;
	/* A step that held its resource gets it back before every later request. */
	requeue(e, r.interrupted.v, r.interrupted.n);
	requeue(e, r.waiting.v, r.waiting.n);
	/* Then the steps that never queued (submissions stored for this node, steps whose
	 * turn came): behind every request that was queued before them. */
	for (size_t i = 0; i < r.fresh.n; i++)
		eng_request(e, r.fresh.v[i], r.fresh.v[i]->cur, e->now);
	free(r.fresh.v);
	for (size_t i = 0; i < r.cancels.n; i++)
		eng_cancel_wf(e, r.cancels.v[i], e->now);
	free(r.cancels.v);
	if (inbox || !first)
		return rc;
	if (rc == BATON_OK && strmap_len(e->wfs))
		log_at(&e->log, BATON_LOG_INFO, NULL, "resuming %zu unfinished workflow%s",
		       strmap_len(e->wfs), strmap_len(e->wfs) == 1 ? "" : "s");
	return rc;
}

/*
 * engine.c - the engine thread: the single writer that turns events into checkpoints.
 *
 * Design. Everything that changes a workflow arrives as a message in one inbox: a
 * submission, a cancellation, the outcome of a step attempt (posted by a step thread).
 * The engine thread takes *all* waiting messages at once, applies them to the in-memory
 * rows through the pure transitions of machine.c, fires due retry timers, grants free
 * resources to their next waiters (lock.c), and then commits everything that changed in
 * one SQLite transaction: this is group commit. A lone workflow pays one commit per
 * step and waits for nothing, because the engine commits as soon as it has anything;
 * under load, the messages that arrive during one fsync share the next.
 *
 * Nothing leaves the engine before its commit: a step is dispatched to a step thread,
 * a client is answered and a log line is written only once the transaction that
 * recorded it is durable. So after a crash the database never lags behind what anybody
 * saw, and step k+1 of a workflow starts only after step k's checkpoint is committed
 * (they are granted in the transaction that records step k's completion).
 *
 * When a commit fails (I/O error, full disk), the transaction is rolled back, the rows
 * stay marked dirty, their effects stay pending, and the commit is retried with backoff:
 * running workflows pause instead of failing, and new submissions get BATON_EBUSY.
 *
 * Helpers. On SQLite a round may also run on the thread of the request that posted (an
 * HTTP thread: baton_engine_hold, then baton_engine_help), when the engine thread is idle:
 * a lone lease acquire is then applied, committed and answered on the thread that read
 * it, without waking the engine thread and being woken back (two hand-overs of some
 * 10 us each on this kind of machine, and the cache they cost). Rounds never overlap:
 * whoever runs one sets `in_round` under `mu`, and everything "engine thread only" in
 * engine.h belongs to the thread in a round. The engine thread, idle, waits until its next
 * timed work (`sleep_until`); a helper wakes it when its round brought that closer or
 * left messages. batond holds the engine only for a request that is alone with it
 * (server/wait.c): beside others, a round begun on an HTTP thread as its request came
 * carried that request alone, where the engine thread's takes all that came meanwhile,
 * and it kept that thread from its other connections. Work that may take long stays on
 * the engine thread: the retention pass, every round while shutting down, and every
 * round on PostgreSQL, whose commit may wait on a cut network for up to
 * tcp_user_timeout (store_ops.local).
 */
#include "engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- inbox ---- */

/* The engine this thread's posts do not wake (baton_engine_hold), and whether it posted. */
static _Thread_local baton_engine *held;
static _Thread_local int held_posted;

void eng_post(baton_engine *e, msg *m)
{
	pthread_mutex_lock(&e->mu);
	m->arrived = mono_ms(); /* under mu: a message the round did not take arrived after it */
	if (e->inbox_tail)
		e->inbox_tail->next = m;
	else
		e->inbox = m;
	e->inbox_tail = m;
	pthread_mutex_unlock(&e->mu);
	if (held == e) { /* baton_engine_help runs the round, or wakes the engine thread */
		held_posted = 1;
		return;
	}
	/* Signalled after the unlock, so that the engine does not wake only to block on the
	 * mutex still held here (a lone workflow's step made 3.4 voluntary context switches
	 * instead of 2.5). The engine, and so its cv, outlives every poster. */
	pthread_cond_signal(&e->cv);
}

int eng_post_call(baton_engine *e, msg *m, baton_error *err)
{
	pthread_mutex_lock(&e->mu);
	int full = e->pending_submits >= MAX_PENDING_SUBMITS;
	if (!full) {
		e->pending_submits++;
		m->counted = 1;
	}
	pthread_mutex_unlock(&e->mu);
	if (full)
		return err_set(err, BATON_EBUSY, "too many requests in flight; try again shortly");
	eng_post(e, m);
	return BATON_OK;
}

static void waiter_init(waiter *w)
{
	memset(w, 0, sizeof *w);
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
}

static void waiter_wait(waiter *w)
{
	pthread_mutex_lock(&w->mu);
	while (!w->done)
		pthread_cond_wait(&w->cv, &w->mu);
	pthread_mutex_unlock(&w->mu);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
}

void eng_waiter_done(waiter *w, int rc, int created, const char *msg_text)
{
	if (w->lease_cb) {
		w->lease_cb(w->ud, rc, created, w->lease, msg_text ? msg_text : w->msg);
		free(w);
		return;
	}
	if (w->cb) {
		w->cb(w->ud, rc, w->id, created, msg_text ? msg_text : "");
		free(w);
		return;
	}
	pthread_mutex_lock(&w->mu);
	w->rc = rc;
	w->created = created;
	if (msg_text)
		snprintf(w->msg, sizeof w->msg, "%s", msg_text);
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* ---- timers: a binary heap of (time, workflow id) ---- */

void eng_timer_arm(baton_engine *e, wf_row *wf, int64_t at)
{
	if (at <= 0 || (wf->hold_timer_at && wf->hold_timer_at <= at))
		return;
	eng_timer_push(e, at, wf->id);
	wf->hold_timer_at = at;
}

void eng_timer_push(baton_engine *e, int64_t at, const char *id)
{
	timer t = {at, xstrdup(id)};
	VEC_PUSH(e->timers, t);
	for (size_t i = e->timers.n - 1; i > 0;) {
		size_t p = (i - 1) / 2;
		if (e->timers.v[p].at <= e->timers.v[i].at)
			break;
		timer tmp = e->timers.v[p];
		e->timers.v[p] = e->timers.v[i];
		e->timers.v[i] = tmp;
		i = p;
	}
}

static timer timer_pop(baton_engine *e)
{
	timer top = e->timers.v[0];
	e->timers.v[0] = e->timers.v[--e->timers.n];
	for (size_t i = 0;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < e->timers.n && e->timers.v[l].at < e->timers.v[m].at)
			m = l;
		if (r < e->timers.n && e->timers.v[r].at < e->timers.v[m].at)
			m = r;
		if (m == i)
			break;
		timer tmp = e->timers.v[m];
		e->timers.v[m] = e->timers.v[i];
		e->timers.v[i] = tmp;
		i = m;
	}
	return top;
}

/* ---- applying messages ---- */

void eng_on_event(void *ctx, const wf_row *wf, const char *type, json_t *data)
{
	baton_engine *e = ctx;
	/* In a cluster every grant is recorded with the node that made it. */
	if (e->clustered && json_is_object(data) && strcmp(type, "lock_acquired") == 0)
		json_object_set_new(data, "node", json_string(e->node_id));
	/* An attempt cut off says which node runs it again, and which one ran it when that
	 * was another node (which stopped renewing its lease: a crash, a cut, a pause). */
	if (e->clustered && json_is_object(data) && strcmp(type, "step_interrupted") == 0) {
		json_int_t idx = json_integer_value(json_object_get(data, "step"));
		const char *was = idx >= 0 && idx < wf->steps_total ? wf->steps[idx].node : NULL;
		json_object_set_new(data, "node", json_string(e->node_id));
		if (was && was[0] && strcmp(was, e->node_id) != 0)
			json_object_set_new(data, "previous_node", json_string(was));
	}
	/* Every event of a round carries the round's time, the time its transitions used. */
	pending_event ev = {.ts = e->now, .wf = (wf_row *)wf, .type = type, .data = data};
	VEC_PUSH(e->events, ev);
}

/* Adds a workflow to this round's batch (once). */
void eng_set_param(baton_engine *e, wf_row *wf, int idx, const char *key, json_t *value)
{
	step_row *st = &wf->steps[idx];
	if (!value && !json_object_get(st->params, key))
		return;
	json_t *p = json_copy(st->params);
	if (value)
		json_object_set_new(p, key, value);
	else
		json_object_del(p, key);
	json_decref(st->params);
	st->params = p;
	st->params_dirty = 1;
	wf_mark_step(wf, idx);
	eng_touch_wf(e, wf);
}

void eng_touch_wf(baton_engine *e, wf_row *wf)
{
	if (wf->in_batch)
		return;
	wf->in_batch = 1;
	VEC_PUSH(e->dirty_wfs, wf);
}

void eng_touch_lock(baton_engine *e, res_lock *l)
{
	if (l->in_batch)
		return;
	l->in_batch = 1;
	VEC_PUSH(e->dirty_locks, l);
}

/* Puts the workflow's step idx in its resource's queue. */
void eng_request(baton_engine *e, wf_row *wf, int idx, int64_t now)
{
	event_sink ev = {eng_on_event, e};
	machine_request(wf, idx, ++e->lock_seq, now, &ev);
	res_lock *l = eng_lock_of(e, wf->resource);
	lock_enqueue(l, wf);
	eng_touch_lock(e, l);
}

/* Carries out what a transition asks for. */
void eng_follow(baton_engine *e, wf_row *wf, transition t, int64_t now)
{
	eng_touch_wf(e, wf);
	if (t.release) {
		res_lock *l = eng_lock_of(e, wf->resource);
		lock_release(l, wf, now);
		eng_touch_lock(e, l);
	}
	if (t.request >= 0)
		eng_request(e, wf, t.request, now);
	if (t.timer_at)
		eng_timer_push(e, t.timer_at, wf->id);
	if (t.finished)
		VEC_PUSH(e->finished, wf);
}

static int same_definition(baton_engine *e, const char *id, const char *def, int *rc_out,
			   char *detail, size_t dlen)
{
	wf_row *cur = strmap_get(e->wfs, id);
	char *stored = NULL;
	int status, rc;
	baton_error err = {0};
	if (cur) {
		stored = xstrdup(cur->definition);
		rc = BATON_OK;
	} else {
		rc = store_find_workflow(e->st, id, &stored, &status, &err);
	}
	if (rc == BATON_ENOTFOUND)
		return 0;
	if (rc) {
		*rc_out = rc;
		snprintf(detail, dlen, "%s", err.msg);
	} else if (codec_same_definition(stored, def)) {
		*rc_out = BATON_OK;
	} else {
		*rc_out = BATON_ECONFLICT;
		snprintf(detail, dlen, "workflow \"%s\" already exists with a different definition",
			 id);
	}
	free(stored);
	return 1;
}

static void apply_submit(baton_engine *e, msg *m, int64_t now)
{
	wf_row *wf = m->wf;
	char detail[512] = "";
	int rc;
	if (e->faulty || e->no_new_work) {
		eng_waiter_done(m->w, BATON_EBUSY, 0,
				e->no_new_work ? "the server is shutting down" : e->fault_why);
		wf_row_free(wf);
		return;
	}
	if (!wf->id) {
		char id[33];
		if (random_id(id) != 0) {
			eng_waiter_done(m->w, BATON_EINTERNAL, 0, "no randomness for an id");
			wf_row_free(wf);
			return;
		}
		wf->id = xstrdup(id);
	} else if (same_definition(e, wf->id, wf->definition, &rc, detail, sizeof detail)) {
		/* An identical re-POST is answered after this round's commit, which may be
		 * the one that stores the first POST. */
		snprintf(m->w->id, sizeof m->w->id, "%s", wf->id);
		if (rc == BATON_OK) {
			eng_reply(e, m->w, BATON_OK, REPLY_CHANGED, wf->resource);
		} else {
			eng_waiter_done(m->w, rc, 0, detail);
		}
		wf_row_free(wf);
		return;
	}
	snprintf(m->w->id, sizeof m->w->id, "%s", wf->id);
	baton_error err = {0};
	if (eng_next_wf_seq(e, &wf->seq, &err)) {
		log_at(&e->log, BATON_LOG_WARN, NULL, "cannot number a workflow: %s", err.msg);
		eng_waiter_done(m->w, BATON_EBUSY, 0, e->ids_why);
		wf_row_free(wf);
		return;
	}
	wf->status = WF_PENDING;
	wf->created_at = now;
	wf->is_new = 1;
	wf->dirty_lo = wf->steps_total;
	strmap_put(e->wfs, wf->id, wf);
	eng_on_event(
	    e, wf, "workflow_submitted",
	    json_pack("{s:s, s:i}", "resource", wf->resource, "steps_total", wf->steps_total));
	if (eng_drives(e, wf->resource)) {
		eng_request(e, wf, 0, now);
	} else { /* stored for the node that drives it, and gone from here once it is */
		wf->foreign = 1;
		VEC_PUSH(e->finished, wf);
	}
	eng_touch_wf(e, wf);
	/* A foreign submission is written whoever drives its partition (its owner adopts it),
	 * so its answer belongs to no partition: one that changes hands in this round, gained
	 * or lost, leaves it in the batch, and must not turn its 201 into a 503. */
	eng_reply(e, m->w, BATON_OK, REPLY_STORED, wf->foreign ? NULL : wf->resource);
}

void eng_cancel_wf(baton_engine *e, wf_row *wf, int64_t now)
{
	step_row *st = &wf->steps[wf->cur];
	if (st->status == ST_WAITING) {
		res_lock *l = eng_lock_of(e, wf->resource);
		lock_remove(l, wf);
		eng_touch_lock(e, l);
		lease_cancelled(e, wf);
	}
	event_sink ev = {eng_on_event, e};
	eng_follow(e, wf, machine_cancel(wf, e->def, now, &ev), now);
	task_cancelled(e, wf, now); /* an external step nobody claimed ends now */
}

static void apply_cancel(baton_engine *e, msg *m, int64_t now)
{
	wf_row *wf = strmap_get(e->wfs, m->id);
	snprintf(m->w->id, sizeof m->w->id, "%s", m->id);
	if (wf && wf->foreign) /* not stored yet */
		wf = NULL;
	if (!wf || wf->done) {
		char *def = NULL;
		int status = wf ? wf->status : -1, rc = BATON_OK;
		baton_error err = {0};
		if (!wf)
			rc = store_find_workflow(e->st, m->id, &def, &status, &err);
		free(def);
		if (rc == BATON_OK && !wf && status <= WF_RUNNING && e->clustered) {
			/* Another node drives it: the request is recorded for it. */
			rc = e->st->ops->request_cancel(e->st, m->id, &err);
			eng_waiter_done(m->w, rc, 0, rc ? err.msg : NULL);
		} else if (rc == BATON_ENOTFOUND)
			eng_waiter_done(m->w, rc, 0, "no such workflow");
		else if (rc)
			eng_waiter_done(m->w, rc, 0, err.msg);
		else if (status == WF_CANCELLED)
			eng_reply(e, m->w, BATON_OK, REPLY_CHANGED, NULL);
		else
			eng_waiter_done(m->w, BATON_ECONFLICT, 0,
					"the workflow has already finished");
		return;
	}
	eng_cancel_wf(e, wf, now);
	eng_reply(e, m->w, BATON_OK, REPLY_CHANGED, wf->resource);
}

static void count_deleted(baton_engine *e, int n)
{
	pthread_mutex_lock(&e->metrics_mu);
	e->workflows_deleted += (uint64_t)n;
	e->deletes++;
	pthread_mutex_unlock(&e->metrics_mu);
}

/* A workflow in memory has not finished (or its end is not committed yet): it stays. */
static void apply_delete(baton_engine *e, msg *m)
{
	snprintf(m->w->id, sizeof m->w->id, "%s", m->id);
	if (strmap_get(e->wfs, m->id)) {
		eng_waiter_done(m->w, BATON_ECONFLICT, 0,
				"the workflow has not finished; cancel it first");
		return;
	}
	baton_error err = {0};
	int n = 0, rc = store_delete_workflows(e->st, m->id, 0, 1, &n, &err);
	if (rc == BATON_OK)
		count_deleted(e, n);
	eng_waiter_done(m->w, rc, 0, rc ? err.msg : NULL);
}

/*
 * Retention: the workflows that finished more than retention_ms ago go, PURGE_BATCH per
 * transaction. While more are left, the next batch follows PURGE_BUSY_MS later, so that
 * a backlog (the first start with retention on an old database) is worked off between
 * the engine's rounds instead of in one long transaction; then a pass every
 * PURGE_IDLE_MS.
 */
#define PURGE_BATCH   100
#define PURGE_BUSY_MS 20
#define PURGE_IDLE_MS 1000
/* After a pass that failed: its delete's commit may have waited for a synchronous standby
 * down, as long as --commit-timeout-ms with the engine thread held, so not again soon. */
#define PURGE_FAILED_MS 10000

static void purge(baton_engine *e)
{
	baton_error err = {0};
	int n = 0;
	int rc =
	    store_delete_workflows(e->st, NULL, now_ms() - e->retention_ms, PURGE_BATCH, &n, &err);
	if (rc)
		log_at(&e->log, BATON_LOG_WARN, NULL, "retention: cannot delete old workflows: %s",
		       err.msg);
	else if (n)
		count_deleted(e, n);
	int64_t next = n == PURGE_BATCH ? PURGE_BUSY_MS : PURGE_IDLE_MS;
	e->purge_at = mono_ms() + (rc ? PURGE_FAILED_MS : next);
}

/* Grants l, when free, to its next waiter. */
void eng_grant_lock(baton_engine *e, res_lock *l, int64_t now)
{
	event_sink ev = {eng_on_event, e};
	int64_t waited;
	wf_row *wf;
	if (!eng_drives(e, l->row.name)) /* being handed over: its new owner grants */
		return;
	while ((wf = lock_grant_next(l, now, &waited))) {
		int slot = l->holds[l->nholds - 1].slot; /* the new hold (lock_grant_next) */
		/* The slot is kept with the step (0, the common case, as no key), so that a
		 * restart gives a held lease or claim the slot its holder was told. */
		if (slot != lock_granted_slot(wf))
			eng_set_param(e, wf, wf->cur, "slot", slot > 0 ? json_integer(slot) : NULL);
		machine_grant(wf, l->row.last_token, slot, waited, now, &ev);
		if (wf->lease) { /* held by an outside process: nothing runs here */
			eng_touch_wf(e, wf);
			lease_granted(e, wf, now);
			continue;
		}
		if (task_is_external(&wf->steps[wf->cur])) { /* a process will claim it */
			eng_touch_wf(e, wf);
			task_ready(e, wf, now);
			continue;
		}
		wf->in_flight = 1;
		eng_touch_wf(e, wf);
		dispatch d = {wf, wf->cur, wf->steps[wf->cur].attempts, l->row.last_token};
		VEC_PUSH(e->dispatches, d);
	}
}

static void apply_outcome(baton_engine *e, msg *m, int64_t now)
{
	wf_row *wf = m->wf;
	wf->in_flight = 0;
	if (wf->lost) { /* its partition went to another node, which runs it again */
		json_decref(m->out.result);
		json_decref(m->out.detail);
		wf_row_free(wf);
		return;
	}
	if (m->out.aborted || wf->cur != m->idx || wf->steps[m->idx].attempts != m->attempt ||
	    wf->steps[m->idx].status != ST_RUNNING) {
		json_decref(m->out.result);
		json_decref(m->out.detail);
		return; /* stopping: the attempt runs again after the next start */
	}
	event_sink ev = {eng_on_event, e};
	eng_follow(e, wf, machine_outcome(wf, &m->out, e->def, now, &ev), now);
	json_decref(m->out.result);
	json_decref(m->out.detail);
	/* The released resource goes to its next waiter at once, rather than at the end of
	 * the round: the step's end and the next grant are then consecutive events, which
	 * are stored as one row when the waiter is this workflow again (commit.c). */
	if (!e->no_new_work)
		eng_grant_lock(e, eng_lock_of(e, wf->resource), now);
}

static void fire_timers(baton_engine *e, int64_t now)
{
	while (e->timers.n && e->timers.v[0].at <= now) {
		timer t = timer_pop(e);
		wf_row *wf = strmap_get(e->wfs, t.id);
		if (wf && wf->hold_timer_at && t.at >= wf->hold_timer_at)
			wf->hold_timer_at = 0; /* the armed one fired (eng_timer_arm) */
		if (t.id[0] == TASK_CLAIMS_TIMER[0]) {
			task_claims_timer(e, now);
		} else if (wf && wf->lease) {
			lease_timer(e, wf, now);
		} else if (wf && task_timer(e, wf, now)) {
			/* a claim expired: a failed attempt */
		} else if (wf) {
			transition tr = machine_timer(wf, now);
			if (tr.request >= 0) {
				eng_touch_wf(e, wf);
				eng_request(e, wf, tr.request, now);
			}
		}
		/* A deadline moved later since (a renewal, a heartbeat): armed again. */
		wf = t.id[0] == TASK_CLAIMS_TIMER[0] ? NULL : strmap_get(e->wfs, t.id);
		if (wf && !wf->done && wf->lease)
			eng_timer_arm(e, wf, lease_deadline(wf));
		else if (wf && !wf->done && wf->task_claimed)
			eng_timer_arm(e, wf, wf->task_expires_at);
		free(t.id);
	}
}

/* Grants every free resource touched in this round to its next waiter. */
void eng_grant(baton_engine *e, int64_t now)
{
	for (size_t i = 0; i < e->dirty_locks.n; i++)
		eng_grant_lock(e, e->dirty_locks.v[i], now);
}

int64_t eng_arrival(const baton_engine *e, const msg *m, int64_t now)
{
	return now - (e->taken_mono - m->arrived);
}

/* ---- the loop ---- */

/* mono_ms of the engine's next timed work, INT64_MAX for none (under mu, not in a round). */
static int64_t next_wake(baton_engine *e)
{
	int64_t wake = INT64_MAX;
	if (e->timers.n)
		wake = mono_ms() + (e->timers.v[0].at - now_ms());
	if (e->faulty && e->retry_commit_at < wake)
		wake = e->retry_commit_at;
	if (e->retention_ms && !e->draining && !e->faulty && e->purge_at < wake)
		wake = e->purge_at;
	if (e->load_retry_at && e->load_retry_at < wake)
		wake = e->load_retry_at;
	if (e->clustered && !e->draining && e->inbox_at < wake)
		wake = e->inbox_at;
	return wake;
}

/* Takes the inbox for a round (under mu). */
static msg *take_inbox(baton_engine *e, int *stop)
{
	msg *m = e->inbox;
	e->inbox = e->inbox_tail = NULL;
	for (msg *x = m; x; x = x->next)
		e->pending_submits -= x->counted;
	*stop = e->stop;
	e->no_new_work = e->draining;
	e->in_round = 1;
	e->taken_mono = mono_ms();
	return m;
}

static msg *wait_for_work(baton_engine *e, int *stop)
{
	pthread_mutex_lock(&e->mu);
	e->in_round = 0;
	if (e->draining)
		pthread_cond_broadcast(&e->round_over);
	while (e->in_round || (!e->inbox && !e->stop)) {
		/* A helper's round: it wakes this thread when it ends. */
		int64_t wake = e->in_round ? INT64_MAX : next_wake(e);
		e->sleep_until = wake;
		if (wake == INT64_MAX) {
			pthread_cond_wait(&e->cv, &e->mu);
			continue;
		}
		int64_t left = wake - mono_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += left / 1000;
		ts.tv_nsec += (left % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT && !e->in_round)
			break;
	}
	e->sleep_until = 0;
	msg *m = take_inbox(e, stop);
	pthread_mutex_unlock(&e->mu);
	return m;
}

/* One round: the messages taken, then timers, grants and the commit. */
static void run_round(baton_engine *e, msg *m)
{
	eng_seam(e, "round", &m);
	int64_t now = e->now = now_ms();
	members_round(e, now);
	while (m) {
		msg *next = m->next;
		if (m->type == MSG_OWNERSHIP || m->type == MSG_INBOX)
			members_apply(e, m, now);
		else if (m->type == MSG_SUBMIT)
			apply_submit(e, m, now);
		else if (m->type == MSG_CANCEL)
			apply_cancel(e, m, now);
		else if (m->type == MSG_DELETE)
			apply_delete(e, m);
		else if (m->type == MSG_TASK_CLAIM || m->type == MSG_TASK_OP)
			task_apply(e, m, now);
		else if (m->type == MSG_LIMIT)
			permits_apply(e, m, now);
		else if (m->type >= MSG_LEASE)
			lease_apply(e, m, now);
		else
			apply_outcome(e, m, now);
		if (m->type != MSG_TASK_CLAIM || !m->w) { /* a waiting claim keeps it */
			free(m->id);
			free(m);
		}
		m = next;
	}
	members_round(e, now); /* what the messages gained, a hinted inbox */
	fire_timers(e, now);
	pthread_mutex_lock(&e->metrics_mu);
	e->timers_pending = e->timers.n;
	pthread_mutex_unlock(&e->metrics_mu);
	if (e->no_new_work && !e->leases_stopped)
		lease_stop(e);
	eng_load_pending(e);
	if (!e->no_new_work)
		eng_grant(e, now);
	if (!e->faulty || mono_ms() >= e->retry_commit_at)
		eng_flush(e);
}

static void *engine_main(void *arg)
{
	baton_engine *e = arg;
	pthread_setname_np(pthread_self(), "baton-engine"); /* as top -H and perf show it */
	for (;;) {
		int stop;
		msg *m = wait_for_work(e, &stop);
		run_round(e, m);
		if (e->retention_ms && !e->faulty && !e->no_new_work && mono_ms() >= e->purge_at)
			purge(e);
		if (e->log.flush)
			e->log.flush(e->log.ud);
		if (stop)
			break;
	}
	return NULL;
}

void baton_engine_hold(baton_engine *e)
{
	if (held)
		baton_engine_help(held);
	held = e && e->st->ops->local ? e : NULL; /* else posts wake the engine thread as usual */
	held_posted = 0;
}

void baton_engine_help(baton_engine *e)
{
	if (held != e || !held_posted) {
		held = NULL;
		return;
	}
	held = NULL;
	pthread_mutex_lock(&e->mu);
	if (e->in_round || !e->sleep_until || e->stop || e->draining || !e->inbox) {
		pthread_mutex_unlock(&e->mu);
		pthread_cond_signal(&e->cv); /* as eng_post would have */
		return;
	}
	int stop;
	msg *m = take_inbox(e, &stop);
	pthread_mutex_unlock(&e->mu);
	run_round(e, m);
	pthread_mutex_lock(&e->mu);
	e->in_round = 0;
	if (e->draining)
		pthread_cond_broadcast(&e->round_over);
	/* The engine thread sleeps until a post or its next timed work: woken when that
	 * came closer, or when messages came meanwhile. */
	int wake = e->inbox || e->stop || next_wake(e) < e->sleep_until;
	pthread_mutex_unlock(&e->mu);
	if (wake)
		pthread_cond_signal(&e->cv);
}

/* ---- public API ---- */

static void free_wf(void *p)
{
	wf_row_free(p);
}

static void free_lock(void *p)
{
	lock_free(p);
}

static void free_res_metrics(void *p)
{
	res_metrics *m = p;
	free(m->name);
	free(m);
}

int baton_engine_open(const baton_engine_config *cfg, baton_engine **out, baton_error *err)
{
	if (!cfg || !cfg->db_path || cfg->threads < 1 || cfg->readers < 1)
		return err_set(err, BATON_EINVAL,
			       "db_path, threads >= 1 and readers >= 1 are required");
	baton_engine *e = xcalloc(1, sizeof *e);
	e->log = (logger){cfg->log, cfg->log_ud, cfg->log_level, cfg->log_flush};
	e->hold_file = cfg->hold_file && cfg->hold_file[0] ? xstrdup(cfg->hold_file) : NULL;
	e->def = &mutex_workflow;
	e->allow_call = cfg->allow_call;
	e->on_commit = cfg->on_commit;
	e->on_commit_ud = cfg->on_commit_ud;
	e->retention_ms = cfg->retention_ms > 0 ? cfg->retention_ms : 0;
	e->res_metrics = strmap_new();
	pthread_mutex_init(&e->metrics_mu, NULL);
	pthread_mutex_init(&e->hints_mu, NULL);
	snprintf(e->advertise_url, sizeof e->advertise_url, "%s",
		 cfg->advertise_url ? cfg->advertise_url : "");
	json_alloc_track(NULL);
	e->wfs = strmap_new();
	e->locks = strmap_new();
	e->idle_max = cfg->idle_resources > 0 ? (size_t)cfg->idle_resources : 1024;
	e->commit_timeout_ms = cfg->commit_timeout_ms > 0 ? cfg->commit_timeout_ms : 5000;
	snprintf(e->fault_why, sizeof e->fault_why, "storage is failing; try again later");
	pthread_mutex_init(&e->mu, NULL);
	cond_init_monotonic(&e->cv); /* wait_for_work times its waits by mono_ms() */
	pthread_cond_init(&e->round_over, NULL);
	char no_curl[256];
	int rc =
	    cfg->allow_call && cfg->allow_call[0] && call_load(no_curl, sizeof no_curl)
		? err_set(err, BATON_EINTERNAL, "HTTP steps are allowed but need libcurl: %s",
			  no_curl)
		: store_open(&(store_config){cfg->db_path, cfg->readers, &e->log, cfg->fault_file,
					     cfg->accept_system_identifier, e->commit_timeout_ms,
					     cfg->require_sync_replication},
			     &e->st, err);
	e->now = now_ms();
	if (rc == BATON_OK && cfg->cache_bytes)
		store_set_cache_bytes(e->st, cfg->cache_bytes < 0 ? 0 : (size_t)cfg->cache_bytes);
	if (rc == BATON_OK)
		rc = members_join(e, cfg, err);
	uint64_t parts = 0;
	for (int p = 0; p < PARTS; p++)
		if (!e->clustered || e->epoch[p])
			parts |= (uint64_t)1 << p;
	if (rc == BATON_OK)
		rc = eng_recover(e, parts, 0, err);
	if (rc == BATON_OK && !(e->pool = sched_new(cfg->threads)))
		rc = err_set(err, BATON_EINTERNAL, "cannot start step threads");
	if (rc == BATON_OK) {
		eng_grant(e, e->now);
		eng_flush(e);
		if (e->faulty)
			rc = err_set(err, BATON_EIO, "cannot commit the recovered state");
	}
	if (rc == BATON_OK && pthread_create(&e->thread, NULL, engine_main, e) != 0)
		rc = err_set(err, BATON_EINTERNAL, "cannot start the engine thread");
	if (rc) {
		baton_engine_close(e, 0);
		return rc;
	}
	e->thread_started = 1;
	*out = e;
	return BATON_OK;
}

void baton_engine_close(baton_engine *e, int64_t timeout_ms)
{
	if (!e)
		return;
	if (e->thread_started) {
		pthread_mutex_lock(&e->mu);
		e->draining = 1;
		/* A round begun before may still grant steps, sent to the step threads at its
		 * end: the drain below must find them running. Rounds from now on grant none. */
		while (e->in_round && !e->no_new_work)
			pthread_cond_wait(&e->round_over, &e->mu);
		pthread_mutex_unlock(&e->mu);
		if (sched_drain(e->pool, timeout_ms)) {
			log_at(&e->log, BATON_LOG_WARN, NULL,
			       "steps still running after %lld ms; they run again after a restart",
			       (long long)timeout_ms);
			sched_abort(e->pool);
			sched_drain(e->pool, INT64_MAX / 4);
		}
		pthread_mutex_lock(&e->mu);
		e->stop = 1;
		pthread_cond_signal(&e->cv);
		pthread_mutex_unlock(&e->mu);
		pthread_join(e->thread, NULL);
	}
	/* Everything is committed: the partitions go to the other nodes at once. */
	if (e->st && e->st->ops->leave)
		e->st->ops->leave(e->st);
	sched_free(e->pool);
	for (msg *m = e->inbox, *next; m; m = next) {
		next = m->next;
		if (m->type == MSG_SUBMIT || m->type == MSG_CANCEL ||
		    m->type == MSG_DELETE) { /* their callers get an answer */
			eng_waiter_done(m->w, BATON_EBUSY, 0, "the server is shutting down");
			if (m->type == MSG_SUBMIT)
				wf_row_free(m->wf);
		} else if (m->type >= MSG_LEASE) {
			free(m->worker);
			free(m->resource);
			if (m->w)
				eng_waiter_done(m->w, BATON_EBUSY, 0,
						"the server is shutting down");
			if (m->type == MSG_LEASE)
				wf_row_free(m->wf);
		}
		if (m->type == MSG_OUTCOME && m->wf->lost)
			wf_row_free(m->wf);
		if (m->type == MSG_OWNERSHIP)
			free(m->own);
		json_decref(m->out.result);
		json_decref(m->out.detail);
		free(m->id);
		free(m);
	}
	for (size_t i = 0; i < e->events.n; i++)
		json_decref(e->events.v[i].data);
	for (size_t i = 0; i < e->timers.n; i++)
		free(e->timers.v[i].id);
	free(e->events.v);
	free(e->hold_file);
	free(e->text.v);
	free(e->event_rows.v);
	free(e->res_rows.v);
	free(e->timers.v);
	task_free_all(e);
	free(e->dirty_wfs.v);
	free(e->dirty_locks.v);
	free(e->unloaded.v);
	free(e->dispatches.v);
	free(e->replies.v);
	free(e->finished.v);
	free(e->changes.v);
	strmap_free_values(e->res_metrics, free_res_metrics);
	pthread_mutex_destroy(&e->metrics_mu);
	pthread_mutex_destroy(&e->hints_mu);
	free(e->hints);
	strmap_free_values(e->wfs, free_wf);
	strmap_free_values(e->locks, free_lock);
	store_close(e->st);
	pthread_cond_destroy(&e->cv);
	pthread_cond_destroy(&e->round_over);
	pthread_mutex_destroy(&e->mu);
	free(e);
}

/* Validates a submission and posts it to the engine with waiter w; 0, or an error
 * (nothing posted). */
static int post_submission(baton_engine *e, const json_t *request_body, waiter *w, baton_error *err)
{
	wf_row *wf = xcalloc(1, sizeof *wf);
	wf->stored_status = -1;
	int rc = codec_parse_request(request_body, wf, e->allow_call, err);
	if (rc) {
		wf_row_free(wf);
		return rc;
	}
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_SUBMIT;
	m->wf = wf;
	m->w = w;
	if (eng_post_call(e, m, err)) {
		wf_row_free(wf);
		free(m);
		return err->code;
	}
	return BATON_OK;
}

int baton_engine_submit_async(baton_engine *e, const json_t *request_body, baton_submitted_fn done,
			      void *ud, baton_error *err)
{
	waiter *w = xcalloc(1, sizeof *w);
	w->cb = done;
	w->ud = ud;
	int rc = post_submission(e, request_body, w, err);
	if (rc)
		free(w);
	return rc;
}

int baton_engine_submit(baton_engine *e, const json_t *request_body, json_t **workflow,
			int *created, baton_error *err)
{
	waiter w;
	waiter_init(&w);
	int rc = post_submission(e, request_body, &w, err);
	if (rc) {
		pthread_cond_destroy(&w.cv);
		pthread_mutex_destroy(&w.mu);
		return rc;
	}
	waiter_wait(&w);
	if (w.rc)
		return err_set(err, w.rc, "%s", w.msg);
	if (created)
		*created = w.created;
	return store_get_workflow(e->st, w.id, workflow, err);
}

int baton_engine_cancel(baton_engine *e, const char *id, json_t **out, baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	waiter w;
	waiter_init(&w);
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_CANCEL;
	m->id = xstrdup(id);
	m->w = &w;
	eng_post(e, m);
	waiter_wait(&w);
	if (w.rc)
		return err_set(err, w.rc, "%s", w.msg);
	return store_get_workflow(e->st, id, out, err);
}

int baton_engine_delete(baton_engine *e, const char *id, baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	waiter w;
	waiter_init(&w);
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_DELETE;
	m->id = xstrdup(id);
	m->w = &w;
	eng_post(e, m);
	waiter_wait(&w);
	return w.rc ? err_set(err, w.rc, "%s", w.msg) : BATON_OK;
}

int baton_engine_backup(baton_engine *e, const char *path, baton_error *err)
{
	return store_backup(e->st, path, err);
}

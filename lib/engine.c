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
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum msg_type { MSG_SUBMIT, MSG_CANCEL, MSG_OUTCOME };

/* Submissions waiting for the engine at most; more are refused with BATON_EBUSY. */
#define MAX_PENDING_SUBMITS 4096

/* A caller blocked until the engine has committed its request. */
typedef struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	int rc;
	int created;
	char id[MAX_NAME + 1];
	char msg[512];
} waiter;

typedef struct msg {
	int type;
	wf_row *wf;	  /* SUBMIT: the new row (owned); OUTCOME: the running workflow */
	char *id;	  /* CANCEL */
	waiter *w;	  /* SUBMIT, CANCEL */
	int idx, attempt; /* OUTCOME */
	step_output out;  /* OUTCOME */
	struct msg *next;
} msg;

typedef struct pending_event {
	int64_t seq, ts;
	wf_row *wf;
	const char *type; /* static string from machine.c */
	json_t *data;
} pending_event;

typedef struct timer {
	int64_t at;
	char *id;
} timer;

/* A growable array of any element type. */
#define VEC(T)                                                                                     \
	struct {                                                                                   \
		T *v;                                                                              \
		size_t n, cap;                                                                     \
	}
#define VEC_PUSH(vec, x)                                                                           \
	do {                                                                                       \
		if ((vec).n == (vec).cap) {                                                        \
			(vec).cap = (vec).cap ? (vec).cap * 2 : 16;                                \
			(vec).v = realloc((vec).v, (vec).cap * sizeof *(vec).v);                   \
			if (!(vec).v)                                                              \
				abort();                                                           \
		}                                                                                  \
		(vec).v[(vec).n++] = (x);                                                          \
	} while (0)

typedef struct dispatch {
	wf_row *wf;
	int idx, attempt;
	int64_t token;
} dispatch;

typedef struct reply {
	waiter *w;
	int rc;
	int created;
} reply;

/* Metrics of one resource, read by other threads under metrics_mu. */
typedef struct res_metrics {
	char *name;
	int64_t queue_depth, holders;
	histogram wait, hold;
} res_metrics;

struct baton_engine {
	logger log;
	baton_commit_fn on_commit;
	void *on_commit_ud;
	VEC(baton_change) changes;

	pthread_mutex_t metrics_mu; /* guards the metrics below */
	uint64_t steps_completed, steps_failed, steps_retried, commits, checkpoints;
	histogram commit_seconds, checkpoints_per_commit;
	strmap *res_metrics; /* name -> res_metrics */

	store *st;
	sched *pool;
	const workflow_def *def;
	const char *const *allow_call;
	pthread_t thread;
	int thread_started;

	pthread_mutex_t mu; /* guards the inbox and the flags below */
	pthread_cond_t cv;
	msg *inbox, *inbox_tail;
	int stop;	     /* the engine thread must finish its work and exit */
	int pending_submits; /* posted and not yet applied: bounds the inbox under overload */
	int draining;	     /* no new grants: shutting down */

	/* Engine thread only. */
	int faulty;	 /* commits are failing */
	int no_new_work; /* copy of draining, taken with each round */
	strmap *wfs;	 /* id -> wf_row, unfinished workflows */
	strmap *locks;	 /* resource name -> res_lock */
	int64_t wf_seq, event_seq, lock_seq;
	VEC(wf_row *) dirty_wfs;
	VEC(res_lock *) dirty_locks;
	VEC(pending_event) events;
	VEC(dispatch) dispatches;
	VEC(reply) replies;
	VEC(wf_row *) finished;
	VEC(timer) timers; /* binary min-heap on .at */
	int64_t fault_backoff_ms, retry_commit_at;
};

/* ---- inbox ---- */

static void post(baton_engine *e, msg *m)
{
	pthread_mutex_lock(&e->mu);
	if (e->inbox_tail)
		e->inbox_tail->next = m;
	else
		e->inbox = m;
	e->inbox_tail = m;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
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

static void waiter_done(waiter *w, int rc, int created, const char *msg_text)
{
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

static void timer_push(baton_engine *e, int64_t at, const char *id)
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

static void on_event(void *ctx, const wf_row *wf, const char *type, json_t *data)
{
	baton_engine *e = ctx;
	pending_event ev = {++e->event_seq, now_ms(), (wf_row *)wf, type, data};
	VEC_PUSH(e->events, ev);
}

/* Adds a workflow to this round's batch (once). */
static void touch_wf(baton_engine *e, wf_row *wf)
{
	if (wf->in_batch)
		return;
	wf->in_batch = 1;
	VEC_PUSH(e->dirty_wfs, wf);
}

static void touch_lock(baton_engine *e, res_lock *l)
{
	if (l->in_batch)
		return;
	l->in_batch = 1;
	VEC_PUSH(e->dirty_locks, l);
}

static res_lock *lock_of(baton_engine *e, const char *name)
{
	res_lock *l = strmap_get(e->locks, name);
	if (!l) {
		l = lock_new(name);
		strmap_put(e->locks, l->row.name, l);
		l->dirty = 1;
	}
	return l;
}

/* Puts the workflow's step idx in its resource's queue. */
static void request(baton_engine *e, wf_row *wf, int idx, int64_t now)
{
	event_sink ev = {on_event, e};
	machine_request(wf, idx, ++e->lock_seq, now, &ev);
	res_lock *l = lock_of(e, wf->resource);
	lock_enqueue(l, wf);
	touch_lock(e, l);
}

/* Carries out what a transition asks for. */
static void follow(baton_engine *e, wf_row *wf, transition t, int64_t now)
{
	touch_wf(e, wf);
	if (t.release) {
		res_lock *l = lock_of(e, wf->resource);
		lock_release(l, now);
		touch_lock(e, l);
	}
	if (t.request >= 0)
		request(e, wf, t.request, now);
	if (t.timer_at)
		timer_push(e, t.timer_at, wf->id);
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
	} else if (strcmp(stored, def) == 0) {
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
		waiter_done(m->w, BATON_EBUSY, 0,
			    e->no_new_work ? "the server is shutting down"
					   : "storage is failing; try again later");
		wf_row_free(wf);
		return;
	}
	if (!wf->id) {
		char id[33];
		if (random_id(id) != 0) {
			waiter_done(m->w, BATON_EINTERNAL, 0, "no randomness for an id");
			wf_row_free(wf);
			return;
		}
		wf->id = xstrdup(id);
	} else if (same_definition(e, wf->id, wf->definition, &rc, detail, sizeof detail)) {
		/* An identical re-POST is answered after this round's commit, which may be
		 * the one that stores the first POST. */
		snprintf(m->w->id, sizeof m->w->id, "%s", wf->id);
		if (rc == BATON_OK) {
			reply r = {m->w, BATON_OK, 0};
			VEC_PUSH(e->replies, r);
		} else {
			waiter_done(m->w, rc, 0, detail);
		}
		wf_row_free(wf);
		return;
	}
	snprintf(m->w->id, sizeof m->w->id, "%s", wf->id);
	wf->seq = ++e->wf_seq;
	wf->status = WF_PENDING;
	wf->created_at = now;
	wf->is_new = 1;
	wf->dirty_lo = wf->steps_total;
	strmap_put(e->wfs, wf->id, wf);
	on_event(e, wf, "workflow_submitted",
		 json_pack("{s:s, s:i}", "resource", wf->resource, "steps_total", wf->steps_total));
	request(e, wf, 0, now);
	touch_wf(e, wf);
	reply r = {m->w, BATON_OK, 1};
	VEC_PUSH(e->replies, r);
}

static void apply_cancel(baton_engine *e, msg *m, int64_t now)
{
	wf_row *wf = strmap_get(e->wfs, m->id);
	snprintf(m->w->id, sizeof m->w->id, "%s", m->id);
	if (!wf || wf->done) {
		char *def = NULL;
		int status = wf ? wf->status : -1, rc = BATON_OK;
		baton_error err = {0};
		if (!wf)
			rc = store_find_workflow(e->st, m->id, &def, &status, &err);
		free(def);
		if (rc == BATON_ENOTFOUND)
			waiter_done(m->w, rc, 0, "no such workflow");
		else if (rc)
			waiter_done(m->w, rc, 0, err.msg);
		else if (status == WF_CANCELLED)
			VEC_PUSH(e->replies, ((reply){m->w, BATON_OK, 0}));
		else
			waiter_done(m->w, BATON_ECONFLICT, 0, "the workflow has already finished");
		return;
	}
	step_row *st = &wf->steps[wf->cur];
	if (st->status == ST_WAITING) {
		res_lock *l = lock_of(e, wf->resource);
		lock_remove(l, wf);
		touch_lock(e, l);
	}
	event_sink ev = {on_event, e};
	follow(e, wf, machine_cancel(wf, e->def, now, &ev), now);
	reply r = {m->w, BATON_OK, 0};
	VEC_PUSH(e->replies, r);
}

static void apply_outcome(baton_engine *e, msg *m, int64_t now)
{
	wf_row *wf = m->wf;
	wf->in_flight = 0;
	if (m->out.aborted || wf->cur != m->idx || wf->steps[m->idx].attempts != m->attempt ||
	    wf->steps[m->idx].status != ST_RUNNING) {
		json_decref(m->out.result);
		json_decref(m->out.detail);
		return; /* stopping: the attempt runs again after the next start */
	}
	event_sink ev = {on_event, e};
	follow(e, wf, machine_outcome(wf, &m->out, e->def, now, &ev), now);
	json_decref(m->out.result);
	json_decref(m->out.detail);
}

static void fire_timers(baton_engine *e, int64_t now)
{
	while (e->timers.n && e->timers.v[0].at <= now) {
		timer t = timer_pop(e);
		wf_row *wf = strmap_get(e->wfs, t.id);
		if (wf) {
			transition tr = machine_timer(wf, now);
			if (tr.request >= 0) {
				touch_wf(e, wf);
				request(e, wf, tr.request, now);
			}
		}
		free(t.id);
	}
}

/* Grants every free resource touched in this round to its next waiter. */
static void grant(baton_engine *e, int64_t now)
{
	event_sink ev = {on_event, e};
	for (size_t i = 0; i < e->dirty_locks.n; i++) {
		res_lock *l = e->dirty_locks.v[i];
		int64_t waited;
		wf_row *wf;
		while ((wf = lock_grant_next(l, now, &waited))) {
			machine_grant(wf, l->row.last_token, waited, now, &ev);
			wf->in_flight = 1;
			touch_wf(e, wf);
			dispatch d = {wf, wf->cur, wf->steps[wf->cur].attempts, l->row.last_token};
			VEC_PUSH(e->dispatches, d);
		}
	}
}

/* ---- commit and its effects ---- */

static int write_batch(baton_engine *e, baton_error *err)
{
	int rc = store_begin(e->st, err);
	for (size_t i = 0; rc == BATON_OK && i < e->dirty_wfs.n; i++) {
		wf_row *wf = e->dirty_wfs.v[i];
		if (wf->is_new) {
			rc = store_insert_workflow(e->st, wf, err);
			continue;
		}
		rc = store_update_workflow(e->st, wf, err);
		for (int k = wf->dirty_lo; rc == BATON_OK && k < wf->dirty_hi; k++)
			if (wf->steps[k].dirty)
				rc = store_update_step(e->st, wf, &wf->steps[k], err);
	}
	for (size_t i = 0; rc == BATON_OK && i < e->dirty_locks.n; i++)
		if (e->dirty_locks.v[i]->dirty)
			rc = store_put_resource(e->st, &e->dirty_locks.v[i]->row, err);
	for (size_t i = 0; rc == BATON_OK && i < e->events.n; i++) {
		pending_event *ev = &e->events.v[i];
		rc = store_insert_event(e->st, ev->seq, ev->wf, ev->ts, ev->type, ev->data, err);
	}
	if (rc == BATON_OK)
		rc = store_commit(e->st, err);
	if (rc)
		store_rollback(e->st);
	return rc;
}

static void log_event(baton_engine *e, const pending_event *ev)
{
	const logger *lg = &e->log;
	const char *w = json_string_value(json_object_get(ev->data, "worker"));
	json_int_t attempt = json_integer_value(json_object_get(ev->data, "attempt"));
	const char *id = ev->wf->id;
	if (strcmp(ev->type, "lock_acquired") == 0) {
		log_at(lg, BATON_LOG_INFO, id, "[%s] Acquired lock on \"%s\"...", w,
		       ev->wf->resource);
	} else if (strcmp(ev->type, "step_completed") == 0) {
		json_int_t d = json_integer_value(json_object_get(ev->data, "duration_ms"));
		if (attempt > 1)
			log_at(lg, BATON_LOG_INFO, id,
			       "[%s] Done — %lldms, lock released (retry %lld)", w, (long long)d,
			       (long long)attempt);
		else
			log_at(lg, BATON_LOG_INFO, id, "[%s] Done — %lldms, lock released", w,
			       (long long)d);
	} else if (strcmp(ev->type, "step_failed") == 0) {
		const char *why = json_string_value(json_object_get(ev->data, "error"));
		json_t *retry = json_object_get(ev->data, "retry_in_ms");
		if (json_is_integer(retry))
			log_at(lg, BATON_LOG_WARN, id,
			       "[%s] FAILED — %s (lock released, retrying in %g s...)", w, why,
			       (double)json_integer_value(retry) / 1000.0);
		else
			log_at(lg, BATON_LOG_WARN, id,
			       "[%s] FAILED — %s (lock released, giving up after %lld attempts)", w,
			       why, (long long)attempt);
	} else if (strcmp(ev->type, "step_interrupted") == 0) {
		log_at(lg, BATON_LOG_WARN, id,
		       "[%s] attempt %lld was cut off by a restart; it runs again", w,
		       (long long)attempt);
	} else if (strcmp(ev->type, "workflow_completed") == 0) {
		log_at(lg, BATON_LOG_INFO, id, "workflow completed in %lld ms",
		       (long long)(ev->wf->finished_at - ev->wf->started_at));
	} else if (strcmp(ev->type, "workflow_failed") == 0) {
		log_at(lg, BATON_LOG_WARN, id, "workflow failed: %s", ev->wf->error);
	} else if (strcmp(ev->type, "workflow_cancelled") == 0) {
		log_at(lg, BATON_LOG_INFO, id, "workflow cancelled");
	}
}

typedef struct step_job {
	baton_engine *e;
	wf_row *wf;
	int idx, attempt;
	int64_t token;
} step_job;

static int sleep_on_pool(void *ctx, int64_t ms)
{
	return sched_sleep(ctx, ms);
}

static int pool_aborted(void *ctx)
{
	return sched_aborted(ctx);
}

/* Runs on a step thread: the fields it reads never change while the step is in flight. */
static void run_step_job(void *arg, sched *pool)
{
	step_job *j = arg;
	const wf_row *wf = j->wf;
	const step_row *st = &wf->steps[j->idx];
	step_input in = {
	    .workflow_id = wf->id,
	    .resource = wf->resource,
	    .worker = st->worker,
	    .index = j->idx,
	    .attempt = j->attempt,
	    .fencing_token = j->token,
	    .params = st->params,
	    .sleep_ms = sleep_on_pool,
	    .aborted = pool_aborted,
	    .sleep_ctx = pool,
	};
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_OUTCOME;
	m->wf = j->wf;
	m->idx = j->idx;
	m->attempt = j->attempt;
	j->e->def->run_step(&in, &m->out);
	post(j->e, m);
	free(j);
}

static res_metrics *res_metrics_of(baton_engine *e, const char *name)
{
	res_metrics *m = strmap_get(e->res_metrics, name);
	if (!m) {
		m = xcalloc(1, sizeof *m);
		m->name = xstrdup(name);
		strmap_put(e->res_metrics, m->name, m);
	}
	return m;
}

static double ms_field(const json_t *data, const char *key)
{
	return (double)json_integer_value(json_object_get(data, key)) / 1000.0;
}

/* Counts a committed round into the metrics; other threads read them under the lock. */
static void account(baton_engine *e, double commit_seconds)
{
	uint64_t outcomes = 0;
	pthread_mutex_lock(&e->metrics_mu);
	for (size_t i = 0; i < e->events.n; i++) {
		const pending_event *ev = &e->events.v[i];
		if (strcmp(ev->type, "step_completed") == 0) {
			e->steps_completed++;
			outcomes++;
		} else if (strcmp(ev->type, "step_failed") == 0) {
			if (json_is_integer(json_object_get(ev->data, "retry_in_ms")))
				e->steps_retried++;
			else
				e->steps_failed++;
			outcomes++;
		} else if (strcmp(ev->type, "lock_acquired") == 0) {
			hist_observe(&res_metrics_of(e, ev->wf->resource)->wait, hist_seconds,
				     ms_field(ev->data, "waited_ms"));
		} else if (strcmp(ev->type, "lock_released") == 0) {
			hist_observe(&res_metrics_of(e, ev->wf->resource)->hold, hist_seconds,
				     ms_field(ev->data, "hold_ms"));
		}
	}
	for (size_t i = 0; i < e->dirty_locks.n; i++) {
		res_lock *l = e->dirty_locks.v[i];
		res_metrics *m = res_metrics_of(e, l->row.name);
		m->queue_depth = l->queue_len;
		m->holders = l->holder != NULL;
	}
	e->commits++;
	e->checkpoints += outcomes;
	hist_observe(&e->commit_seconds, hist_seconds, commit_seconds);
	hist_observe(&e->checkpoints_per_commit, hist_counts, (double)outcomes);
	pthread_mutex_unlock(&e->metrics_mu);
}

/* Tells the server which workflows and resources have new events. */
static void notify(baton_engine *e)
{
	if (!e->on_commit || !e->events.n)
		return;
	e->changes.n = 0;
	for (size_t i = 0; i < e->events.n; i++) {
		wf_row *wf = e->events.v[i].wf;
		if (wf->noted)
			continue;
		wf->noted = 1;
		baton_change c = {wf->id, wf->resource};
		VEC_PUSH(e->changes, c);
	}
	for (size_t i = 0; i < e->events.n; i++)
		e->events.v[i].wf->noted = 0;
	e->on_commit(e->on_commit_ud, e->changes.v, e->changes.n);
}

/* After a durable commit: answer callers, start granted steps, log, free finished rows. */
static void effects(baton_engine *e, double commit_seconds)
{
	account(e, commit_seconds);
	notify(e);
	for (size_t i = 0; i < e->events.n; i++) {
		log_event(e, &e->events.v[i]);
		json_decref(e->events.v[i].data);
	}
	e->events.n = 0;
	for (size_t i = 0; i < e->replies.n; i++)
		waiter_done(e->replies.v[i].w, e->replies.v[i].rc, e->replies.v[i].created, NULL);
	e->replies.n = 0;
	for (size_t i = 0; i < e->dispatches.n; i++) {
		dispatch *d = &e->dispatches.v[i];
		step_job *j = xcalloc(1, sizeof *j);
		*j = (step_job){e, d->wf, d->idx, d->attempt, d->token};
		sched_submit(e->pool, run_step_job, j);
	}
	e->dispatches.n = 0;
	for (size_t i = 0; i < e->dirty_wfs.n; i++) {
		wf_clear_dirty(e->dirty_wfs.v[i]);
		e->dirty_wfs.v[i]->in_batch = 0;
	}
	e->dirty_wfs.n = 0;
	for (size_t i = 0; i < e->dirty_locks.n; i++) {
		e->dirty_locks.v[i]->dirty = 0;
		e->dirty_locks.v[i]->in_batch = 0;
	}
	e->dirty_locks.n = 0;
	for (size_t i = 0; i < e->finished.n; i++) {
		strmap_del(e->wfs, e->finished.v[i]->id);
		wf_row_free(e->finished.v[i]);
	}
	e->finished.n = 0;
}

/*
 * Takes back a submission whose commit failed: its caller is told 503, so the workflow
 * must not run later either. Nothing of it has left the engine yet (its grant, if any,
 * was not dispatched), so it is removed from the queue, the batch and memory.
 */
static void drop_unacknowledged(baton_engine *e, const char *id)
{
	wf_row *wf = strmap_get(e->wfs, id);
	if (!wf || !wf->is_new)
		return;
	res_lock *l = lock_of(e, wf->resource);
	if (l->holder == wf)
		l->holder = NULL; /* the next round grants the next waiter */
	else
		lock_remove(l, wf);
	touch_lock(e, l);
	size_t k = 0;
	for (size_t i = 0; i < e->dispatches.n; i++)
		if (e->dispatches.v[i].wf != wf)
			e->dispatches.v[k++] = e->dispatches.v[i];
	e->dispatches.n = k;
	k = 0;
	for (size_t i = 0; i < e->events.n; i++) {
		if (e->events.v[i].wf == wf)
			json_decref(e->events.v[i].data);
		else
			e->events.v[k++] = e->events.v[i];
	}
	e->events.n = k;
	k = 0;
	for (size_t i = 0; i < e->dirty_wfs.n; i++)
		if (e->dirty_wfs.v[i] != wf)
			e->dirty_wfs.v[k++] = e->dirty_wfs.v[i];
	e->dirty_wfs.n = k;
	strmap_del(e->wfs, wf->id);
	wf_row_free(wf);
}

static void set_faulty(baton_engine *e, int faulty)
{
	pthread_mutex_lock(&e->mu);
	e->faulty = faulty;
	pthread_mutex_unlock(&e->mu);
}

/* Commits the round; on failure keeps everything pending and schedules a retry. */
static void flush(baton_engine *e)
{
	if (!e->dirty_wfs.n && !e->dirty_locks.n && !e->events.n && !e->replies.n)
		return;
	baton_error err = {0};
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = write_batch(e, &err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc == BATON_OK) {
		if (e->faulty) {
			log_at(&e->log, BATON_LOG_WARN, NULL, "storage recovered; resuming");
			set_faulty(e, 0);
		}
		e->fault_backoff_ms = 0;
		effects(e,
			(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
		return;
	}
	if (!e->faulty)
		log_at(&e->log, BATON_LOG_ERROR, NULL, "commit failed (%s): %s; retrying",
		       baton_code_name(rc), err.msg);
	set_faulty(e, 1);
	/* Callers waiting on this round learn at once. New submissions are taken back; other
	 * changes (a cancel, step outcomes) stay in memory and commit when storage recovers. */
	for (size_t i = 0; i < e->replies.n; i++) {
		reply *r = &e->replies.v[i];
		if (r->created)
			drop_unacknowledged(e, r->w->id);
		waiter_done(r->w, BATON_EBUSY, 0, "storage is failing; try again later");
	}
	e->replies.n = 0;
	e->fault_backoff_ms = e->fault_backoff_ms ? e->fault_backoff_ms * 2 : 50;
	if (e->fault_backoff_ms > 2000)
		e->fault_backoff_ms = 2000;
	e->retry_commit_at = mono_ms() + e->fault_backoff_ms;
}

/* ---- the loop ---- */

static msg *wait_for_work(baton_engine *e, int *stop)
{
	pthread_mutex_lock(&e->mu);
	while (!e->inbox && !e->stop) {
		int64_t wake = INT64_MAX;
		if (e->timers.n)
			wake = mono_ms() + (e->timers.v[0].at - now_ms());
		if (e->faulty && e->retry_commit_at < wake)
			wake = e->retry_commit_at;
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
		if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT)
			break;
	}
	msg *m = e->inbox;
	e->inbox = e->inbox_tail = NULL;
	for (msg *x = m; x; x = x->next)
		e->pending_submits -= x->type == MSG_SUBMIT;
	*stop = e->stop;
	e->no_new_work = e->draining;
	pthread_mutex_unlock(&e->mu);
	return m;
}

static void *engine_main(void *arg)
{
	baton_engine *e = arg;
	for (;;) {
		int stop;
		msg *m = wait_for_work(e, &stop);
		int64_t now = now_ms();
		while (m) {
			msg *next = m->next;
			if (m->type == MSG_SUBMIT)
				apply_submit(e, m, now);
			else if (m->type == MSG_CANCEL)
				apply_cancel(e, m, now);
			else
				apply_outcome(e, m, now);
			free(m->id);
			free(m);
			m = next;
		}
		fire_timers(e, now);
		if (!e->no_new_work)
			grant(e, now);
		if (!e->faulty || mono_ms() >= e->retry_commit_at)
			flush(e);
		if (stop)
			break;
	}
	return NULL;
}

/* ---- recovery ---- */

typedef struct recovery {
	baton_engine *e;
	VEC(wf_row *) interrupted; /* held the resource when the process stopped */
	VEC(wf_row *) waiting;	   /* were queued for it */
} recovery;

static void recover_resource(void *ctx, resource_row *r)
{
	baton_engine *e = ctx;
	res_lock *l = lock_new(r->name);
	resource_row_fini(&l->row);
	l->row = *r;
	strmap_put(e->locks, l->row.name, l);
}

static void recover_workflow(void *ctx, wf_row *wf)
{
	recovery *rc = ctx;
	baton_engine *e = rc->e;
	event_sink ev = {on_event, e};
	wf->dirty_lo = wf->steps_total;
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
	if (st->status == ST_RUNNING) {
		machine_interrupted(wf, &ev);
		VEC_PUSH(rc->interrupted, wf);
	} else if (st->status == ST_WAITING) {
		VEC_PUSH(rc->waiting, wf);
	} else if (st->status == ST_RETRYING) {
		timer_push(e, st->next_attempt_at, wf->id);
	} else {
		request(e, wf, wf->cur, now_ms());
	}
	touch_wf(e, wf);
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
		res_lock *l = lock_of(e, v[i]->resource);
		lock_enqueue(l, v[i]);
		touch_lock(e, l);
	}
	free(v);
}

static int recover(baton_engine *e, baton_error *err)
{
	store_counters c;
	recovery r = {.e = e};
	int rc;
	if ((rc = store_counters_load(e->st, &c, err)) ||
	    (rc = store_load_resources(e->st, recover_resource, e, err)))
		return rc;
	e->wf_seq = c.wf_seq;
	e->event_seq = c.event_seq;
	e->lock_seq = c.lock_seq;
	rc = store_load_unfinished(e->st, recover_workflow, &r, err);
	/* A step that held its resource gets it back before every later request. */
	requeue(e, r.interrupted.v, r.interrupted.n);
	requeue(e, r.waiting.v, r.waiting.n);
	if (rc == BATON_OK && strmap_len(e->wfs))
		log_at(&e->log, BATON_LOG_INFO, NULL, "resuming %zu unfinished workflow%s",
		       strmap_len(e->wfs), strmap_len(e->wfs) == 1 ? "" : "s");
	return rc;
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
	e->log = (logger){cfg->log, cfg->log_ud, cfg->log_level};
	e->def = &mutex_workflow;
	e->allow_call = cfg->allow_call;
	e->on_commit = cfg->on_commit;
	e->on_commit_ud = cfg->on_commit_ud;
	e->res_metrics = strmap_new();
	pthread_mutex_init(&e->metrics_mu, NULL);
	call_global_init();
	json_alloc_track(NULL);
	e->wfs = strmap_new();
	e->locks = strmap_new();
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	const char *vfs = cfg->fault_file ? faultvfs_register(cfg->fault_file) : NULL;
	int rc = store_open(cfg->db_path, vfs, cfg->readers, &e->st, err);
	if (rc == BATON_OK)
		rc = recover(e, err);
	if (rc == BATON_OK && !(e->pool = sched_new(cfg->threads)))
		rc = err_set(err, BATON_EINTERNAL, "cannot start step threads");
	if (rc == BATON_OK) {
		grant(e, now_ms());
		flush(e);
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
	sched_free(e->pool);
	for (msg *m = e->inbox, *next; m; m = next) {
		next = m->next;
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
	free(e->timers.v);
	free(e->dirty_wfs.v);
	free(e->dirty_locks.v);
	free(e->dispatches.v);
	free(e->replies.v);
	free(e->finished.v);
	free(e->changes.v);
	strmap_free_values(e->res_metrics, free_res_metrics);
	pthread_mutex_destroy(&e->metrics_mu);
	strmap_free_values(e->wfs, free_wf);
	strmap_free_values(e->locks, free_lock);
	store_close(e->st);
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->mu);
	free(e);
}

int baton_engine_submit(baton_engine *e, const json_t *request_body, json_t **workflow,
			int *created, baton_error *err)
{
	wf_row *wf = xcalloc(1, sizeof *wf);
	int rc = codec_parse_request(request_body, wf, e->allow_call, err);
	if (rc) {
		wf_row_free(wf);
		return rc;
	}
	pthread_mutex_lock(&e->mu);
	int full = e->pending_submits >= MAX_PENDING_SUBMITS;
	if (!full)
		e->pending_submits++;
	pthread_mutex_unlock(&e->mu);
	if (full) {
		wf_row_free(wf);
		return err_set(err, BATON_EBUSY,
			       "too many submissions in flight; try again shortly");
	}
	waiter w;
	waiter_init(&w);
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_SUBMIT;
	m->wf = wf;
	m->w = &w;
	post(e, m);
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
	post(e, m);
	waiter_wait(&w);
	if (w.rc)
		return err_set(err, w.rc, "%s", w.msg);
	return store_get_workflow(e->st, id, out, err);
}

int baton_engine_get(baton_engine *e, const char *id, json_t **out, baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	return store_get_workflow(e->st, id, out, err);
}

int baton_engine_list(baton_engine *e, const baton_list_query *q, json_t **out, baton_error *err)
{
	return store_list_workflows(e->st, q, out, err);
}

int baton_engine_events(baton_engine *e, const char *id, int64_t after, json_t **out,
			baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	return store_list_events(e->st, id, after, out, err);
}

int baton_engine_resources(baton_engine *e, json_t **out, baton_error *err)
{
	return store_list_resources(e->st, out, err);
}

int baton_engine_resource(baton_engine *e, const char *name, json_t **out, baton_error *err)
{
	if (!valid_name(name))
		return err_set(err, BATON_ENOTFOUND, "no resource named \"%.128s\"", name);
	return store_get_resource(e->st, name, out, err);
}

static void add_res_metrics(void *ctx, void *value)
{
	const res_metrics *r = value;
	json_object_set_new(ctx, r->name,
			    json_pack("{s:I, s:I, s:o, s:o}", "queue_depth",
				      (json_int_t)r->queue_depth, "holders", (json_int_t)r->holders,
				      "wait_seconds", hist_json(&r->wait, hist_seconds),
				      "hold_seconds", hist_json(&r->hold, hist_seconds)));
}

int baton_engine_resource_events(baton_engine *e, const char *name, int64_t after, json_t **out,
				 baton_error *err)
{
	if (!valid_name(name))
		return err_set(err, BATON_ENOTFOUND, "no resource named \"%.128s\"", name);
	return store_resource_events(e->st, name, after, out, err);
}

int baton_engine_ready(baton_engine *e)
{
	pthread_mutex_lock(&e->mu);
	int ready = !e->faulty && !e->draining;
	pthread_mutex_unlock(&e->mu);
	return ready;
}

int baton_engine_metrics(baton_engine *e, json_t **out, baton_error *err)
{
	json_t *counts;
	int rc = store_workflow_counts(e->st, &counts, err);
	if (rc)
		return rc;
	json_t *resources = json_object();
	pthread_mutex_lock(&e->metrics_mu);
	json_t *m =
	    json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:o}", "steps_completed",
		      (json_int_t)e->steps_completed, "steps_failed", (json_int_t)e->steps_failed,
		      "steps_retried", (json_int_t)e->steps_retried, "commits",
		      (json_int_t)e->commits, "checkpoints", (json_int_t)e->checkpoints,
		      "commit_seconds", hist_json(&e->commit_seconds, hist_seconds),
		      "checkpoints_per_commit", hist_json(&e->checkpoints_per_commit, hist_counts));
	strmap_each(e->res_metrics, add_res_metrics, resources);
	pthread_mutex_unlock(&e->metrics_mu);
	json_object_set_new(m, "workflows", counts);
	json_object_set_new(m, "resources", resources);
	*out = m;
	return BATON_OK;
}

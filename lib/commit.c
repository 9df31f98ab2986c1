/*
 * commit.c - group commit and what follows it.
 *
 * Everything the engine changed in one round is written in one transaction (batch.c).
 * Only when it is durable do its effects happen: callers are answered, granted steps
 * are handed to the step threads, log lines are written, metrics are counted, event
 * streams are woken, finished rows are freed. When the write fails:
 *  - and a retry may help, the round stays pending and is retried with backoff, and
 *    submissions of that round are taken back (their callers get BATON_EBUSY);
 *  - and its outcome is unknown (the connection broke during COMMIT, or the database did
 *    not confirm it in time: a synchronous standby down), nothing is taken back: the same
 *    batch is written again until the database answers, and callers that have waited
 *    commit_timeout_ms are told 503 meanwhile (answer_unconfirmed), never success;
 *  - and the database refused one workflow's rows, that workflow alone fails.
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A lease's life in the log: one line when it is granted, one when it ends. Its events
 * are a workflow's (lease.c), but a lease has no "Done", and no workflow to complete. */
static void log_lease_event(const logger *lg, const pending_event *ev)
{
	const wf_row *wf = ev->wf;
	const step_row *st = &wf->steps[0];
	if (strcmp(ev->type, "lock_acquired") == 0)
		log_at(lg, BATON_LOG_INFO, wf->id, "lease of \"%s\" on \"%s\" granted (token %lld)",
		       st->worker, wf->resource, (long long)st->token);
	else if (strcmp(ev->type, "step_completed") == 0)
		log_at(lg, BATON_LOG_INFO, wf->id,
		       "lease of \"%s\" on \"%s\" (token %lld) released after %lld ms", st->worker,
		       wf->resource, (long long)st->token,
		       (long long)json_integer_value(json_object_get(ev->data, "duration_ms")));
	else if (strcmp(ev->type, "step_failed") == 0)
		log_at(lg, BATON_LOG_WARN, wf->id,
		       "lease of \"%s\" on \"%s\" (token %lld) expired: not renewed within %lld ms",
		       st->worker, wf->resource, (long long)st->token, (long long)wf->lease_ttl_ms);
	else if (strcmp(ev->type, "workflow_cancelled") == 0 && st->token <= 0)
		/* a granted one (cancelled through /workflows) said how it ended already */
		log_at(lg, BATON_LOG_INFO, wf->id,
		       "lease of \"%s\" on \"%s\" left the queue without being granted", st->worker,
		       wf->resource);
}

static void log_event(baton_engine *e, const pending_event *ev)
{
	const logger *lg = &e->log;
	const char *w = json_string_value(json_object_get(ev->data, "worker"));
	json_int_t attempt = json_integer_value(json_object_get(ev->data, "attempt"));
	const char *id = ev->wf->id;
	if (ev->wf->lease && strcmp(ev->type, "step_interrupted") != 0) {
		log_lease_event(lg, ev);
	} else if (strcmp(ev->type, "lock_acquired") == 0) {
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
			       "[%s] FAILED — %s (lock released, giving up after %lld attempt%s)",
			       w, why, (long long)attempt, attempt == 1 ? "" : "s");
	} else if (strcmp(ev->type, "step_interrupted") == 0) {
		const char *was = json_string_value(json_object_get(ev->data, "previous_node"));
		if (was)
			log_at(
			    lg, BATON_LOG_WARN, id,
			    "[%s] attempt %lld was cut off: node %s stopped renewing its lease and"
			    " this node took the resource over; it runs again",
			    w, (long long)attempt, was);
		else
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
	int64_t send_by; /* step_input's */
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
	    .send_by = j->send_by,
	};
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_OUTCOME;
	m->wf = j->wf;
	m->idx = j->idx;
	m->attempt = j->attempt;
	j->e->def->run_step(&in, &m->out);
	eng_post(j->e, m);
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
		m->holders = l->nholds;
		m->permits_in_use = lock_permits_in_use(l);
		m->limit = l->row.permits;
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

/* Whether the answer is a 201: something new was stored (a workflow, a lease's grant). */
static int created(const reply *r)
{
	return r->kind == REPLY_STORED || r->kind == REPLY_LEASE_GRANTED;
}

/* After a durable commit: answer callers, start granted steps (to be sent by send_by),
 * log, free finished rows. */
static void effects(baton_engine *e, int64_t send_by, double commit_seconds)
{
	/* What others wait for goes first: granted steps, then answers; the bookkeeping
	 * below runs while they do. */
	for (size_t i = 0; i < e->dispatches.n; i++) {
		dispatch *d = &e->dispatches.v[i];
		if (e->no_new_work) {
			/* Granted before the shutdown began, committed only now: the drain may be
			 * over, so the step does not start. It is stored as running, and runs
			 * again after a restart or on the partition's next owner. */
			d->wf->in_flight = 0;
			continue;
		}
		step_job *j = xcalloc(1, sizeof *j);
		*j = (step_job){e, d->wf, d->idx, d->attempt, d->token, send_by};
		sched_submit(e->pool, run_step_job, j);
	}
	e->dispatches.n = 0;
	for (size_t i = 0; i < e->replies.n; i++)
		eng_waiter_done(e->replies.v[i].w, e->replies.v[i].rc, created(&e->replies.v[i]),
				NULL);
	e->replies.n = 0;
	account(e, commit_seconds);
	notify(e);
	for (size_t i = 0; i < e->events.n; i++) {
		log_event(e, &e->events.v[i]);
		json_decref(e->events.v[i].data);
	}
	e->events.n = 0;
	for (size_t i = 0; i < e->dirty_wfs.n; i++) {
		wf_clear_dirty(e->dirty_wfs.v[i]);
		e->dirty_wfs.v[i]->stored_status = e->dirty_wfs.v[i]->status;
		e->dirty_wfs.v[i]->in_batch = 0;
	}
	e->dirty_wfs.n = 0;
	for (size_t i = 0; i < e->dirty_locks.n; i++) {
		e->dirty_locks.v[i]->dirty = 0;
		e->dirty_locks.v[i]->in_batch = 0;
		eng_park(e, e->dirty_locks.v[i]);
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
	if (!wf->foreign) { /* a foreign one never queued here */
		res_lock *l = eng_lock_of(e, wf->resource);
		if (lock_hold_of(l, wf))
			lock_ungrant(l, wf); /* the next round grants the next waiter */
		else
			lock_remove(l, wf);
		eng_touch_lock(e, l);
	}
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
	k = 0; /* cancelled in the same round: it is on the list of rows to free */
	for (size_t i = 0; i < e->finished.n; i++)
		if (e->finished.v[i] != wf)
			e->finished.v[k++] = e->finished.v[i];
	e->finished.n = k;
	strmap_del(e->wfs, wf->id);
	wf_row_free(wf);
}

static void set_faulty(baton_engine *e, int faulty)
{
	pthread_mutex_lock(&e->mu);
	e->faulty = faulty;
	pthread_mutex_unlock(&e->mu);
}

/*
 * The database refused a workflow's rows (a value or a constraint it will never accept):
 * that workflow alone fails, with the reason in its record, and the round is written
 * again without what was refused. A new submission is taken back and its caller told
 * why. Returns 0 when it could not be done (a step of it runs on a step thread): then the
 * failure is treated as one a retry may clear, until the step's outcome arrives.
 */
static int fail_unwritable(baton_engine *e, wf_row *wf, int code, const char *why)
{
	if (wf->is_new) {
		/* Another node stored the same id first: answered as a re-POST here is. */
		char *stored = NULL;
		int status, found = 0, answer = BATON_EINVAL;
		baton_error err = {0};
		if (code == BATON_ECONFLICT &&
		    store_find_workflow(e->st, wf->id, &stored, &status, &err) == BATON_OK) {
			found = 1;
			answer = codec_same_definition(stored, wf->definition) ? BATON_OK
									       : BATON_ECONFLICT;
		}
		free(stored);
		for (size_t i = 0; i < e->replies.n; i++) {
			reply *r = &e->replies.v[i];
			if (!created(r) || strcmp(r->w->id, wf->id) != 0)
				continue;
			if (found && answer == BATON_OK) {
				r->kind = REPLY_CHANGED; /* answered 200 with this round */
				continue;
			}
			eng_waiter_done(
			    r->w, answer, 0,
			    found ? "workflow already exists with a different definition" : why);
			e->replies.v[i] = e->replies.v[--e->replies.n];
			break;
		}
		drop_unacknowledged(e, wf->id);
		return 1;
	}
	/* A step granted in this round has not left the engine (its dispatch waits for the
	 * commit): it is taken back. One that runs on a step thread cannot be. */
	size_t kept = 0, before = e->dispatches.n;
	for (size_t i = 0; i < e->dispatches.n; i++)
		if (e->dispatches.v[i].wf != wf)
			e->dispatches.v[kept++] = e->dispatches.v[i];
	e->dispatches.n = kept;
	if (wf->in_flight && kept == before)
		return 0;
	wf->in_flight = 0;
	char text[640];
	snprintf(text, sizeof text, "the database refused this workflow's changes: %s", why);
	for (int k = wf->dirty_lo; k < wf->dirty_hi; k++) {
		step_row *st = &wf->steps[k];
		if (!st->dirty)
			continue;
		json_decref(st->result);
		st->result = NULL;
		free(st->error);
		st->error = NULL;
	}
	res_lock *l = eng_lock_of(e, wf->resource);
	if (lock_hold_of(l, wf))
		lock_release(l, wf, e->now);
	else
		lock_remove(l, wf);
	eng_touch_lock(e, l);
	json_decref(wf->result);
	wf->result = NULL;
	free(wf->error);
	wf->error = xstrdup(text);
	wf->status = WF_FAILED;
	wf->finished_at = e->now;
	wf->dirty = 1;
	eng_on_event(e, wf, "workflow_failed", json_pack("{s:s}", "error", text));
	if (!wf->done) {
		wf->done = 1;
		VEC_PUSH(e->finished, wf);
	}
	log_at(&e->log, BATON_LOG_ERROR, wf->id, "%s", text);
	return 1;
}

void eng_reply(baton_engine *e, waiter *w, int rc, int kind, const char *resource)
{
	reply r = {w, rc, kind, resource ? part_of(resource) : -1};
	if (!e->replies.n)
		e->replies_since = mono_ms();
	VEC_PUSH(e->replies, r);
}

/* The caller of r is told 503 because its round could not be committed: what r was to tell
 * it is taken back. A new workflow or lease leaves memory (drop_unacknowledged); a grant of
 * an older lease (to its first attempt or a retry) or a claim is given back by the next
 * round, as when its answer could not be delivered, so nobody holds what nobody was told it
 * holds. A lease's give-back names the attempt r answered: once a later attempt has
 * arrived, the lease is that attempt's to keep or give back. */
static void take_back(baton_engine *e, const reply *r)
{
	const char *id = json_string_value(json_object_get(r->w->lease, "id"));
	json_int_t attempt = json_integer_value(json_object_get(r->w->lease, "attempt"));
	baton_error err;
	switch (r->kind) {
	case REPLY_STORED:
		drop_unacknowledged(e, r->w->id);
		break;
	case REPLY_LEASE_GRANTED:
	case REPLY_LEASE_HELD: /* the attempt it answered; a later one keeps the lease */
		if (r->kind == REPLY_LEASE_GRANTED)
			drop_unacknowledged(e, r->w->id);
		if (id && strmap_get(e->wfs, id))
			baton_lease_give_back(e, id, attempt, NULL, NULL, &err);
		break;
	case REPLY_TASK_CLAIMED:
		if (id)
			baton_task_give_back(
			    e, id,
			    json_integer_value(json_object_get(r->w->lease, "claim_attempt")), NULL,
			    NULL, &err);
		break;
	}
}

/*
 * The round's commit was not confirmed (its outcome unknown: a synchronous standby that does
 * not answer, a connection lost at COMMIT) and its callers have waited commit_timeout_ms:
 * they are told 503, never success, and the round stays pending, to be written again. Nothing
 * is taken back, since it may be in the database already: a new workflow stays and commits;
 * a lease granted (or held for a retry) is kept a grace for its caller to come back with its
 * request_id, then released; a claim is given back, as when its answer could not be sent.
 */
static void answer_unconfirmed(baton_engine *e)
{
	char why[200];
	snprintf(why, sizeof why,
		 "the database did not confirm the commit within %lld ms (a synchronous standby"
		 " down?); it may still complete: ask again with the same id or request_id",
		 (long long)e->commit_timeout_ms);
	baton_error err;
	for (size_t i = 0; i < e->replies.n; i++) {
		const reply *r = &e->replies.v[i];
		const char *id = json_string_value(json_object_get(r->w->lease, "id"));
		if (r->kind == REPLY_LEASE_GRANTED || r->kind == REPLY_LEASE_HELD)
			lease_unconfirmed(e, id, e->now);
		else if (r->kind == REPLY_TASK_CLAIMED && id)
			baton_task_give_back(
			    e, id,
			    json_integer_value(json_object_get(r->w->lease, "claim_attempt")), NULL,
			    NULL, &err);
		eng_waiter_done(r->w, BATON_EBUSY, 0, why);
	}
	e->replies.n = 0;
}

/* Failing commits left nothing to commit (what they carried was taken back, or went with
 * partitions another node took): the database is asked whether it answers again, on the
 * same backoff, so that a node healthy again serves again whether it has work of its own
 * or not. Its next commit shows whether writes go through. */
static void probe_storage(baton_engine *e)
{
	baton_error err = {0};
	if (store_ping(e->st, &err) == BATON_OK) {
		log_at(&e->log, BATON_LOG_WARN, NULL,
		       "storage answers again, with nothing left to commit; resuming");
		set_faulty(e, 0);
		e->write_unknown = 0;
		e->fault_backoff_ms = 0;
		return;
	}
	e->fault_backoff_ms = e->fault_backoff_ms ? e->fault_backoff_ms * 2 : 50;
	if (e->fault_backoff_ms > 2000)
		e->fault_backoff_ms = 2000;
	e->retry_commit_at = mono_ms() + e->fault_backoff_ms;
}

/* Commits the round; on failure keeps everything pending and schedules a retry. */
void eng_flush(baton_engine *e)
{
	if (!e->dirty_wfs.n && !e->dirty_locks.n && !e->events.n && !e->replies.n) {
		if (e->faulty)
			probe_storage(e);
		return;
	}
	baton_error err = {0};
	store_write_failure why;
	struct timespec t0, t1;
	/* A granted step may be sent until this node's lease, as renewed before the write, runs
	 * out: the write's ownership check proves the partition this node's when it commits,
	 * and no other node claims it before that lease ends. A renewal that comes later may
	 * follow a lapse in which another node took the partition. */
	int64_t send_by = e->dispatches.n ? members_send_by(e) : 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = eng_write_batch(e, &why, &err);
	/* Another node took a partition of this round: what it took leaves memory, and the
	 * rest is written. */
	if (rc && why.fenced && !e->write_unknown && members_fenced(e, &err) == BATON_OK)
		rc = eng_write_batch(e, &why, &err);
	if (rc && why.permanent && why.culprit && !why.fenced && !e->write_unknown &&
	    fail_unwritable(e, (wf_row *)why.culprit, rc, err.msg))
		rc = eng_write_batch(e, &why, &err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	e->write_unknown = rc && (why.unknown || e->write_unknown);
	if (rc == BATON_OK) {
		if (e->faulty) {
			log_at(&e->log, BATON_LOG_WARN, NULL, "storage recovered; resuming");
			set_faulty(e, 0);
		}
		e->fault_backoff_ms = 0;
		eng_seam(e, "answers", NULL);
		effects(e, send_by,
			(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
		return;
	}
	if (!e->faulty)
		log_at(&e->log, BATON_LOG_ERROR, NULL, "commit failed (%s): %s; retrying",
		       baton_code_name(rc), err.msg);
	snprintf(e->fault_why, sizeof e->fault_why, "storage is failing (%.240s); try again later",
		 err.msg);
	set_faulty(e, 1);
	/* Callers waiting on this round learn at once, unless a round since the last success
	 * may have committed: then they learn when it is written again. New submissions are taken
	 * back; other changes (a cancel, step outcomes) stay in memory and commit when storage
	 * recovers. */
	for (size_t i = 0; !e->write_unknown && i < e->replies.n; i++) {
		take_back(e, &e->replies.v[i]);
		eng_waiter_done(e->replies.v[i].w, BATON_EBUSY, 0, e->fault_why);
	}
	if (!e->write_unknown)
		e->replies.n = 0;
	else if (e->replies.n && mono_ms() - e->replies_since >= e->commit_timeout_ms)
		answer_unconfirmed(e);
	e->fault_backoff_ms = e->fault_backoff_ms ? e->fault_backoff_ms * 2 : 50;
	if (e->fault_backoff_ms > 2000)
		e->fault_backoff_ms = 2000;
	e->retry_commit_at = mono_ms() + e->fault_backoff_ms;
	/* callers still waiting are answered at their bound, if not before */
	if (e->replies.n && e->replies_since + e->commit_timeout_ms < e->retry_commit_at)
		e->retry_commit_at = e->replies_since + e->commit_timeout_ms;
}

/*
 * task.c - external workers: steps that a process outside batond claims and does.
 *
 * Design. A worker {"name": ..., "external": true} is a step like any other until it is
 * granted its resource (in FIFO order, with the next fencing token, in the round's
 * commit). Then nothing runs here: the step holds the resource and waits for a claim
 * (POST /tasks/claim), in e->tasks_ready, or goes at once to the oldest waiting claim
 * whose filters it matches (e->claims). A claim answers only once the grant is durable.
 * The claimer heartbeats within its ttl, and completes or fails the attempt; the outcome
 * goes through machine_outcome as a step thread's would (retry policy, checkpoint, the
 * resource to its next waiter). A claim not heartbeaten in time is a failed attempt,
 * retried under the workflow's policy with a new token.
 *
 * A task's id names its attempt: "<workflow id>.<step>.<attempt>". A heartbeat or an
 * outcome for an attempt that is not the current claimed one (it expired or was given
 * back) answers BATON_EGONE and changes nothing.
 *
 * A claim is stored with the round that answers it: its ttl goes into the step's params
 * ("claim_ttl_ms", removed when the attempt ends). After a restart, or on the node that takes
 * the resource over, the step stays claimed by the same attempt, its ttl counted again from
 * then, as a lease's is: its worker may still be at work, so nobody else is given the step
 * before that worker could know it lost it, and it heartbeats and completes as before. A
 * step that was granted but not claimed runs again as a new attempt and waits for a claim.
 *
 * What each heartbeat, outcome, give-back, deadline and cancel does to an attempt is
 * task_machine.c's rule; this file carries the moves out (carry_out) and answers.
 */
#include "engine.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

int task_is_external(const step_row *st)
{
	return json_is_true(json_object_get(st->params, "external"));
}

static void task_id(const wf_row *wf, char *out, size_t n)
{
	const step_row *st = &wf->steps[wf->cur];
	snprintf(out, n, "%s.%d.%d", wf->id, st->index, st->attempts);
}

/* The task as the API shows it (new reference). */
static json_t *task_json(const wf_row *wf)
{
	const step_row *st = &wf->steps[wf->cur];
	char id[MAX_NAME + 32];
	task_id(wf, id, sizeof id);
	json_t *input = json_object();
	for (int i = 0; i < wf->cur; i++)
		if (wf->steps[i].status == ST_COMPLETED && wf->steps[i].result)
			json_object_set(input, wf->steps[i].worker, wf->steps[i].result);
	json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:i, s:I, s:I}", "id", id, "workflow_id",
			      wf->id, "step", st->index, "worker", st->worker, "resource",
			      wf->resource, "attempt", st->attempts, "fencing_token",
			      (json_int_t)st->token, "ttl_ms", (json_int_t)wf->task_ttl_ms);
	int slot = lock_granted_slot(wf);
	json_object_set_new(o, "slot", slot >= 0 ? json_integer(slot) : json_null());
	json_object_set_new(o, "exclusive", json_boolean(slot < 0));
	json_object_set_new(o, "expires_at", time_json(wf->task_expires_at));
	json_object_set_new(o, "claim_attempt", json_integer(wf->task_claim_attempt));
	json_object_set_new(o, "input", input);
	return o;
}

static int matches(const msg *claim, const wf_row *wf)
{
	const step_row *st = &wf->steps[wf->cur];
	return (!claim->worker || strcmp(claim->worker, st->worker) == 0) &&
	       (!claim->resource || strcmp(claim->resource, wf->resource) == 0);
}

static void claim_done(msg *claim)
{
	free(claim->worker);
	free(claim->resource);
	free(claim->id);
	claim->worker = claim->resource = claim->id = NULL;
	claim->w = NULL;
}

/* The claim of wf's step ended or was given back: its request_id names nothing any more. */
static void forget_claim(baton_engine *e, wf_row *wf)
{
	eng_set_param(e, wf, wf->cur, "claim_ttl_ms", NULL);
	if (wf->task_claim_rid) {
		eng_set_param(e, wf, wf->cur, "claim_request_id", NULL);
		eng_set_param(e, wf, wf->cur, "claim_attempt", NULL);
	}
	free(wf->task_claim_rid);
	wf->task_claim_rid = NULL;
	/* task_claim_attempt runs on: the next claim of the step is numbered after this one,
	 * so that a give-back of this claim, still on its way, cannot name the next */
}

/* Gives wf's step to claim (task_next: ready, a claim matches); answered once durable, as
 * the grant may be this round's. */
static void assign(baton_engine *e, wf_row *wf, msg *claim, int64_t now)
{
	task_facts f = {.here = 1};
	hold_move mv = task_next(TASK_READY, TASK_CLAIM, &f);
	assert(mv.act == TASK_ASSIGN && mv.answer == HOLD_GRANT);
	(void)mv;
	eng_set_param(e, wf, wf->cur, "claim_ttl_ms", json_integer(claim->ttl_ms));
	wf->task_claim_attempt++; /* after every claim of the step before it */
	if (claim->id) { /* stored: a retry finds the claim after a restart or a failover */
		wf->task_claim_rid = xstrdup(claim->id);
		eng_set_param(e, wf, wf->cur, "claim_request_id", json_string(claim->id));
	}
	wf->task_claimed = 1;
	wf->task_ttl_ms = claim->ttl_ms;
	wf->task_expires_at = now + claim->ttl_ms;
	eng_timer_arm(e, wf, wf->task_expires_at);
	waiter *w = claim->w;
	w->lease = task_json(wf);
	eng_reply(e, w, BATON_OK, REPLY_TASK_CLAIMED, wf->resource);
	claim_done(claim);
}

void task_ready(baton_engine *e, wf_row *wf, int64_t now)
{
	wf->task_claimed = 0;
	forget_claim(e, wf);
	for (size_t i = 0; i < e->claims.n; i++) {
		msg *c = e->claims.v[i];
		if (!matches(c, wf))
			continue;
		memmove(&e->claims.v[i], &e->claims.v[i + 1],
			(e->claims.n - i - 1) * sizeof *e->claims.v);
		e->claims.n--;
		assign(e, wf, c, now);
		free(c);
		return;
	}
	VEC_PUSH(e->tasks_ready, xstrdup(wf->id));
}

/* The outcome of the current attempt of wf, as a step thread would report it. */
static void outcome(baton_engine *e, wf_row *wf, step_output *out, int64_t now)
{
	event_sink ev = {eng_on_event, e};
	wf->task_claimed = 0;
	forget_claim(e, wf);
	eng_follow(e, wf, machine_outcome(wf, out, e->def, now, &ev), now);
	if (!e->no_new_work)
		eng_grant_lock(e, eng_lock_of(e, wf->resource), now);
}

/* The attempt's state: is wf's current step this attempt, claimed or waiting for a claim. */
static int state_of(const wf_row *wf, int step, int attempt)
{
	const step_row *st = &wf->steps[wf->cur];
	if (wf->done || st->index != step || st->attempts != attempt || st->status != ST_RUNNING ||
	    !task_is_external(st))
		return TASK_OVER;
	return wf->task_claimed ? TASK_CLAIMED : TASK_READY;
}

/* Carries out mv for wf's current attempt; out: the worker's outcome (TASK_END). */
static void carry_out(baton_engine *e, wf_row *wf, const hold_move *mv, step_output *out,
		      int64_t now)
{
	if (mv->act == TASK_KEEP)
		return;
	const step_row *st = &wf->steps[wf->cur];
	switch (mv->act) {
	case TASK_EXTEND:
		wf->task_expires_at = now + wf->task_ttl_ms;
		eng_timer_arm(e, wf, wf->task_expires_at);
		break;
	case TASK_OFFER:
		task_ready(e, wf, now);
		break;
	case TASK_END:
		out->duration_ms = now - st->started_at;
		outcome(e, wf, out, now);
		break;
	case TASK_END_EXPIRED:
	case TASK_END_CANCELLED: {
		step_output o = {.retryable = mv->act == TASK_END_EXPIRED,
				 .duration_ms = now - st->started_at};
		if (mv->act == TASK_END_EXPIRED) {
			snprintf(o.error, sizeof o.error,
				 "claim expired: no heartbeat within %lld ms",
				 (long long)wf->task_ttl_ms);
			log_at(&e->log, BATON_LOG_WARN, wf->id, "step %d (%s): %s", st->index,
			       st->worker, o.error);
		} else {
			snprintf(o.error, sizeof o.error, "cancelled before a worker claimed it");
		}
		outcome(e, wf, &o, now);
		break;
	}
	}
}

int task_timer(baton_engine *e, wf_row *wf, int64_t now)
{
	const step_row *st = &wf->steps[wf->cur];
	if (wf->done || !task_is_external(st))
		return 0;
	task_facts f = {.here = 1, .expired = wf->task_expires_at <= now};
	hold_move mv = task_next(state_of(wf, st->index, st->attempts), TASK_TIMER, &f);
	carry_out(e, wf, &mv, NULL, now);
	return mv.act != TASK_KEEP;
}

int task_recover(baton_engine *e, wf_row *wf)
{
	step_row *st = &wf->steps[wf->cur];
	json_int_t ttl = json_integer_value(json_object_get(st->params, "claim_ttl_ms"));
	if (st->status != ST_RUNNING || !task_is_external(st) || ttl <= 0)
		return 0;
	lock_restore(eng_lock_of(e, wf->resource), wf, lock_granted_slot(wf), st->started_at);
	wf->task_claimed = 1;
	wf->task_ttl_ms = ttl;
	wf->task_expires_at = e->now + ttl;
	const char *rid = json_string_value(json_object_get(st->params, "claim_request_id"));
	json_t *attempt = json_object_get(st->params, "claim_attempt");
	wf->task_claim_rid = rid ? xstrdup(rid) : NULL;
	wf->task_claim_attempt = json_is_integer(attempt) ? json_integer_value(attempt) : 1;
	eng_timer_arm(e, wf, wf->task_expires_at);
	return 1;
}

void task_cancelled(baton_engine *e, wf_row *wf, int64_t now)
{
	const step_row *st = &wf->steps[wf->cur];
	if (wf->done || !wf->cancel_requested)
		return;
	task_facts f = {.here = 1};
	hold_move mv = task_next(state_of(wf, st->index, st->attempts), TASK_CANCEL, &f);
	carry_out(e, wf, &mv, NULL, now);
}

void task_claims_timer(baton_engine *e, int64_t now)
{
	size_t k = 0;
	for (size_t i = 0; i < e->claims.n; i++) {
		msg *c = e->claims.v[i];
		if (c->wait_until > now) {
			e->claims.v[k++] = c;
			continue;
		}
		eng_waiter_done(c->w, BATON_OK, 0, NULL); /* no task: 204 */
		claim_done(c);
		free(c);
	}
	e->claims.n = k;
}

typedef struct rid_search {
	const char *rid;
	wf_row *found;
} rid_search;

static void find_rid(void *ctx, void *value)
{
	rid_search *q = ctx;
	wf_row *wf = value;
	if (!q->found && !wf->done && wf->task_claimed && wf->task_claim_rid &&
	    strcmp(wf->task_claim_rid, q->rid) == 0)
		q->found = wf;
}

/* A claim with a request_id that a claimed task already answers: its answer was lost and
 * the worker asks again. It is that claim's next attempt, answered the same task once the
 * round (the claim, this attempt) is durable; its ttl counts from this request, as the
 * worker counts it. 1 when it was such a retry (m answered). The search goes through the
 * workflows in memory, and only for a claim that names a request_id. */
static int claim_again(baton_engine *e, msg *m, int64_t now)
{
	rid_search q = {m->id, NULL};
	strmap_each(e->wfs, find_rid, &q);
	wf_row *wf = q.found;
	if (!wf)
		return 0;
	if (!matches(m, wf)) {
		eng_waiter_done(m->w, BATON_ECONFLICT, 0,
				"this request_id was used for another claim");
		claim_done(m);
		return 1;
	}
	wf->task_claim_attempt++;
	eng_set_param(e, wf, wf->cur, "claim_attempt", json_integer(wf->task_claim_attempt));
	wf->task_expires_at = now + wf->task_ttl_ms;
	eng_timer_arm(e, wf, wf->task_expires_at);
	m->w->lease = task_json(wf);
	eng_reply(e, m->w, BATON_OK, REPLY_TASK_CLAIMED, wf->resource);
	claim_done(m);
	return 1;
}

static void apply_claim(baton_engine *e, msg *m, int64_t now)
{
	if (e->no_new_work || e->leases_stopped) {
		eng_waiter_done(m->w, BATON_EBUSY, 0, "the server is shutting down");
		claim_done(m);
		return;
	}
	if (m->id && claim_again(e, m, now))
		return;
	if (m->resource && !eng_promise(e, m->w, m->resource)) {
		/* Another node drives it (or this one cannot prove it still does): only that
		 * node has its tasks, so the worker is told to ask it, not "no task". */
		claim_done(m);
		return;
	}
	size_t k = 0;
	wf_row *found = NULL;
	for (size_t i = 0; i < e->tasks_ready.n; i++) {
		char *id = e->tasks_ready.v[i];
		wf_row *wf = found ? NULL : strmap_get(e->wfs, id);
		int live = wf && !wf->done && !wf->task_claimed &&
			   wf->steps[wf->cur].status == ST_RUNNING &&
			   task_is_external(&wf->steps[wf->cur]);
		if (live && matches(m, wf)) {
			found = wf;
			free(id);
		} else if (live || (found && strmap_get(e->wfs, id))) {
			e->tasks_ready.v[k++] = id;
		} else {
			free(id);
		}
	}
	e->tasks_ready.n = k;
	if (found) {
		assign(e, found, m, now);
		return;
	}
	if (m->wait_ms == 0) {
		eng_waiter_done(m->w, BATON_OK, 0, NULL);
		claim_done(m);
		return;
	}
	m->wait_until = now + m->wait_ms;
	VEC_PUSH(e->claims, m);
	eng_timer_push(e, m->wait_until, TASK_CLAIMS_TIMER);
}

/* "<workflow id>.<step>.<attempt>" into its parts; 0, or -1 when malformed. */
static int parse_task_id(const char *id, char *wf_id, size_t n, int *step, int *attempt)
{
	const char *b = strrchr(id, '.');
	if (!b || b == id)
		return -1;
	const char *a = b - 1;
	while (a > id && *a != '.')
		a--;
	if (a == id || (size_t)(a - id) >= n)
		return -1;
	char *end;
	long s = strtol(a + 1, &end, 10), t = strtol(b + 1, &end, 10);
	if (*end || s < 0 || t < 1 || s > MAX_WORKERS || t > 1000000)
		return -1;
	memcpy(wf_id, id, (size_t)(a - id));
	wf_id[a - id] = 0;
	*step = (int)s;
	*attempt = (int)t;
	return 0;
}

/* A task that is not in this node's memory, as the store has it: its state (over, or
 * unknown), whether another node drives it (f->elsewhere) or the store could not be read
 * (f->unread: a workflow that may exist is not "no such task"), and its resource
 * (*resource: free it). */
static int stored_state(baton_engine *e, const char *wf_id, task_facts *f, char **resource)
{
	char *def = NULL;
	int status;
	baton_error err = {0};
	int rc = store_find_workflow(e->st, wf_id, &def, &status, &err);
	if (rc != BATON_OK) {
		f->unread = rc != BATON_ENOTFOUND;
		return TASK_UNKNOWN;
	}
	f->elsewhere = e->clustered && status <= WF_RUNNING;
	json_t *d = json_loads(def, 0, NULL);
	const char *name = json_string_value(json_object_get(d, "resource"));
	*resource = name ? xstrdup(name) : NULL;
	json_decref(d);
	free(def);
	return TASK_OVER;
}

/* Answers the caller of a heartbeat, complete or fail as mv says. */
static void answer(baton_engine *e, msg *m, const hold_move *mv, const wf_row *wf,
		   const char *resource, int step, int attempt)
{
	switch (mv->answer) {
	case HOLD_PROMISE:
		m->w->lease = task_json(wf);
		eng_waiter_done(m->w, BATON_OK, 0, NULL);
		return;
	case HOLD_COMMITTED: /* an outcome, or a claim given back */
		m->w->lease = json_pack("{s:s, s:s, s:i, s:i, s:s}", "id", m->id, "workflow_id",
					wf->id, "step", step, "attempt", attempt, "state",
					m->idx == TASK_COMPLETE ? "completed"
					: m->idx == TASK_FAIL	? "failed"
								: "ready");
		eng_reply(e, m->w, BATON_OK, REPLY_CHANGED, resource); /* once durable */
		return;
	case HOLD_REFUSE:
		eng_waiter_done(m->w, mv->code, 0, mv->why);
		return;
	case HOLD_PASS_ON:
		eng_pass_on(e, m->w, resource);
		return;
	}
}

static void apply_op(baton_engine *e, msg *m, int64_t now)
{
	char wf_id[MAX_NAME + 1], *stored_resource = NULL;
	int step = 0, attempt = 0;
	int parsed = parse_task_id(m->id, wf_id, sizeof wf_id, &step, &attempt) == 0;
	wf_row *wf = parsed ? strmap_get(e->wfs, wf_id) : NULL;
	task_facts f = {.here = wf && !wf->done};
	int state = wf ? state_of(wf, step, attempt) : TASK_UNKNOWN;
	if (wf && m->idx == TASK_UNCLAIM && m->lease_attempt)
		f.superseded = m->lease_attempt < wf->task_claim_attempt;
	f.caller = m->idx == TASK_UNCLAIM && m->w;
	if (!wf && parsed && m->w) /* only a caller needs to know what the store has */
		state = stored_state(e, wf_id, &f, &stored_resource);
	hold_move mv = task_next(state, m->idx, &f);
	const char *resource = wf ? wf->resource : stored_resource;
	if (!mv.proof || eng_promise(e, m->w, resource)) {
		carry_out(e, wf, &mv, &m->out, now);
		if (m->w)
			answer(e, m, &mv, wf, resource, step, attempt);
	}
	json_decref(m->out.result);
	free(stored_resource);
}

void task_apply(baton_engine *e, msg *m, int64_t now)
{
	if (m->type == MSG_TASK_CLAIM)
		apply_claim(e, m, now);
	else
		apply_op(e, m, now);
}

void task_stop(baton_engine *e)
{
	for (size_t i = 0; i < e->claims.n; i++) {
		eng_waiter_done(e->claims.v[i]->w, BATON_EBUSY, 0, "the server is shutting down");
		claim_done(e->claims.v[i]);
		free(e->claims.v[i]);
	}
	e->claims.n = 0;
}

void task_free_all(baton_engine *e)
{
	task_stop(e);
	for (size_t i = 0; i < e->tasks_ready.n; i++)
		free(e->tasks_ready.v[i]);
	free(e->tasks_ready.v);
	free(e->claims.v);
}

/* ---- public API ---- */

int baton_task_claim(baton_engine *e, const char *worker, const char *resource,
		     const char *request_id, int64_t wait_ms, int64_t ttl_ms, baton_lease_fn done,
		     void *ud, baton_error *err)
{
	if (resource && !valid_name(resource))
		return err_set(err, BATON_EINVAL, "resource: not a valid resource name");
	if (request_id && !valid_name(request_id))
		return err_set(err, BATON_EINVAL,
			       "request_id: a name of 1 to 128 characters [A-Za-z0-9._:-]");
	if (ttl_ms < 1000 || ttl_ms > 86400000)
		return err_set(err, BATON_EINVAL, "ttl_ms: from 1000 to 86400000");
	if (wait_ms < 0 || wait_ms > 300000)
		return err_set(err, BATON_EINVAL, "wait_ms: from 0 to 300000");
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_TASK_CLAIM;
	m->worker = worker ? xstrdup(worker) : NULL;
	m->resource = resource ? xstrdup(resource) : NULL;
	m->id = request_id ? xstrdup(request_id) : NULL;
	m->wait_ms = wait_ms;
	m->ttl_ms = ttl_ms;
	m->w = xcalloc(1, sizeof *m->w);
	m->w->lease_cb = done;
	m->w->ud = ud;
	if (eng_post_call(e, m, err)) {
		free(m->w);
		claim_done(m);
		free(m);
		return err->code;
	}
	return BATON_OK;
}

int baton_task_give_back(baton_engine *e, const char *id, int64_t claim_attempt,
			 baton_lease_fn done, void *ud, baton_error *err)
{
	if (claim_attempt < 1)
		return err_set(err, BATON_EINVAL, "claim_attempt: a whole number from 1");
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_TASK_OP;
	m->id = xstrdup(id);
	m->idx = TASK_UNCLAIM;
	m->lease_attempt = claim_attempt;
	if (!done) {
		eng_post(e, m); /* the engine's own: never refused */
		return BATON_OK;
	}
	m->w = xcalloc(1, sizeof *m->w);
	m->w->lease_cb = done;
	m->w->ud = ud;
	if (eng_post_call(e, m, err)) {
		free(m->id);
		free(m->w);
		free(m);
		return err->code;
	}
	return BATON_OK;
}

int baton_task_report(baton_engine *e, const char *id, int op, json_t *result, const char *error,
		      int retryable, baton_lease_fn done, void *ud, baton_error *err)
{
	if (op == TASK_FAIL && (!error || !*error))
		error = "failed";
	if (op == TASK_COMPLETE && !result)
		result = json_null();
	else if (op != TASK_COMPLETE) {
		json_decref(result);
		result = NULL;
	}
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_TASK_OP;
	m->id = xstrdup(id);
	m->idx = op;
	m->out.result = result;
	m->out.retryable = retryable;
	if (error) {
		snprintf(m->out.error, sizeof m->out.error, "%s", error);
		utf8_trim(m->out.error);
	}
	if (!done) { /* the engine's own (a claim given back): never refused */
		eng_post(e, m);
		return BATON_OK;
	}
	m->w = xcalloc(1, sizeof *m->w);
	m->w->lease_cb = done;
	m->w->ud = ud;
	if (eng_post_call(e, m, err)) {
		json_decref(m->out.result);
		free(m->id);
		free(m->w);
		free(m);
		return err->code;
	}
	return BATON_OK;
}

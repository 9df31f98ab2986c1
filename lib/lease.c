/*
 * lease.c - the resource's lock for any process: leases.
 *
 * Design. A lease is a workflow of one step that no step thread runs: its worker is the
 * holder's name and its params say {"lease": true, "ttl_ms": N}. So a lease request
 * joins the resource's FIFO queue (lock.c) among workflow steps, takes the resource's
 * next fencing token when granted, and is checkpointed, listed, streamed and recovered
 * by the same code as every workflow; its history (lock_requested, lock_acquired,
 * lock_released, lease_expired) is the workflow's and the resource's.
 *
 * What only a lease has lives in memory, on its wf_row: when it expires (a renewal that
 * keeps the ttl needs no commit, since a restart, or another node that takes the lease
 * over, counts the whole stored ttl again from then; one that changes the ttl is answered
 * once the new ttl is durable), how long its caller waits for it, and that caller. Every
 * change happens on the engine thread, so a grant and the end of the wait (timeout, the
 * client went away) are ordered: a lease whose caller gave up before the grant leaves the
 * queue (baton_lease_left, naming that caller); one granted to a caller that can no longer
 * be answered is given back (baton_lease_give_back, naming the attempt that was answered),
 * unless a retry of its request_id has arrived since (lease_machine.c: retries and
 * give-backs are one rule).
 *
 * A waiter asked for with a request_id keeps its place across a restart or a failover: its
 * wait deadline is stored with it ("wait_until"), recovery queues it again in its FIFO
 * order, and the same request_id retried reattaches to it. One whose caller does not come
 * back leaves the queue at that deadline; if it is granted first, the grant is released
 * after GRACE_MS unless a caller comes back for it, so nothing is held for nobody for long;
 * that deadline is stored with the grant ("grace_until"), and a restart keeps it.
 * A waiter without a request_id cannot be found again: recovery abandons it.
 *
 * Its states (waiting, held, released: its step completed, expired: its step failed with
 * lease_expired, abandoned: it left the queue ungranted) and what every call, deadline and
 * grant does to it are lease_machine.c's rules; this file reads the facts, carries the
 * machine's moves out (step, step_stored) and answers as the move says.
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#define LEASE_PREFIX "lease-"
#define GRACE_MS     5000 /* a grant nobody waited for, kept for its caller to come back */
#define MAX_WAIT_MS  300000

static int is_lease_step(const step_row *st)
{
	return json_is_true(json_object_get(st->params, "lease"));
}

/* Its state in memory (lease_machine.c). */
static int state_of(const wf_row *wf)
{
	switch (wf->steps[0].status) {
	case ST_WAITING:
	case ST_PENDING:
		return LEASE_WAITING;
	case ST_RUNNING:
		return LEASE_HELD;
	case ST_COMPLETED:
		return LEASE_RELEASED;
	case ST_FAILED:
		return LEASE_EXPIRED;
	default:
		return LEASE_ABANDONED;
	}
}

/* The lease as the API shows it, from its row in memory (new reference). */
static json_t *lease_json(const wf_row *wf)
{
	const step_row *st = &wf->steps[0];
	int held = state_of(wf) == LEASE_HELD;
	json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "id", wf->id, "resource", wf->resource,
			      "holder", st->worker, "state", lease_state_name(state_of(wf)));
	json_object_set_new(o, "fencing_token",
			    st->token > 0 ? json_integer(st->token) : json_null());
	int slot = lock_params_slot(st->params);
	json_object_set_new(o, "slot",
			    st->token > 0 && slot >= 0 ? json_integer(slot) : json_null());
	json_object_set_new(o, "exclusive", json_boolean(slot < 0));
	json_object_set_new(o, "ttl_ms", json_integer(wf->lease_ttl_ms));
	json_object_set_new(o, "expires_at", time_json(held ? wf->lease_expires_at : 0));
	json_object_set_new(o, "acquired_at", time_json(st->started_at));
	json_object_set_new(o, "ended_at", time_json(held ? 0 : st->finished_at));
	json_object_set_new(o, "attempt", json_integer(wf->lease_attempt));
	return o;
}

/* Whether a stored workflow has not ended: another node drives it (this one would hold it in
 * memory). */
static int stored_unfinished(const json_t *wf)
{
	const char *s = json_string_value(json_object_get(wf, "status"));
	return s && (strcmp(s, "pending") == 0 || strcmp(s, "running") == 0);
}

/* A lease that is not in this node's memory, from its stored workflow (new reference): one
 * that ended, or one that another node drives (held or waiting there; its expiry is in that
 * node's memory). */
static json_t *stored_lease_json(const json_t *wf)
{
	const json_t *st = json_array_get(json_object_get(wf, "steps"), 0);
	const char *status = json_string_value(json_object_get(st, "status"));
	int live = stored_unfinished(wf);
	const char *state = !status				     ? "abandoned"
			    : strcmp(status, "completed") == 0	     ? "released"
			    : strcmp(status, "failed") == 0	     ? "expired"
			    : live && strcmp(status, "running") == 0 ? "held"
			    : live				     ? "waiting"
								     : "abandoned";
	json_t *o = json_pack(
	    "{s:O, s:O, s:O, s:s, s:O, s:O, s:n, s:O, s:O}", "id", json_object_get(wf, "id"),
	    "resource", json_object_get(wf, "resource"), "holder", json_object_get(st, "worker"),
	    "state", state, "fencing_token", json_object_get(st, "fencing_token"), "ttl_ms",
	    json_object_get(st, "ttl_ms"), "expires_at", "acquired_at",
	    json_object_get(st, "started_at"), "ended_at", json_object_get(st, "finished_at"));
	json_t *slot = json_object_get(st, "slot");
	json_object_set_new(o, "slot", slot ? json_incref(slot) : json_null());
	json_object_set_new(o, "exclusive",
			    json_boolean(json_is_true(json_object_get(st, "exclusive"))));
	return o;
}

static void set_expiry(baton_engine *e, wf_row *wf, int64_t now)
{
	wf->lease_expires_at = now + wf->lease_ttl_ms;
	eng_timer_arm(e, wf, wf->lease_expires_at);
}

/* A renewal gave the lease another ttl: it is written with this round, and the renewal is
 * answered once it is durable, since a restart or another node counts the stored ttl again
 * from its start and must not end the lease before the holder was told it would. */
static void change_ttl(baton_engine *e, wf_row *wf, int64_t ttl_ms)
{
	wf->lease_ttl_ms = ttl_ms;
	eng_set_param(e, wf, 0, "ttl_ms", json_integer(ttl_ms));
}

static void count(baton_engine *e, uint64_t *counter)
{
	pthread_mutex_lock(&e->metrics_mu);
	(*counter)++;
	pthread_mutex_unlock(&e->metrics_mu);
}

/* Who holds l and how many wait, for a caller that was not granted (new reference). */
static json_t *busy_json(const res_lock *l, char *why, size_t n, const char *what)
{
	const wf_row *first = l ? lock_first_holder(l) : NULL;
	const char *holder = first ? first->steps[first->cur].worker : NULL;
	int queued = l ? l->queue_len : 0, more = l && l->nholds > 1 ? l->nholds - 1 : 0;
	char others[48] = "";
	if (more)
		snprintf(others, sizeof others, " and %d more", more);
	snprintf(why, n, "%s: resource \"%s\" is held by %s%s%s%s, %d waiting", what,
		 l ? l->row.name : "?", holder ? "\"" : "", holder ? holder : "nobody",
		 holder ? "\"" : "", others, queued);
	json_t *o = json_pack("{s:i}", "queue_length", queued);
	json_object_set_new(o, "holder", holder ? json_string(holder) : json_null());
	if (first)
		json_object_set_new(o, "holder_id", json_string(first->id));
	json_object_set_new(o, "holders", json_integer(l ? l->nholds : 0));
	return o;
}

/* Answers the caller of a lease that was not granted; the lease leaves the queue. */
static void give_up(baton_engine *e, wf_row *wf, const char *what, int64_t now)
{
	res_lock *l = eng_lock_of(e, wf->resource);
	lock_remove(l, wf);
	eng_touch_lock(e, l);
	waiter *w = wf->lease_w;
	wf->lease_w = NULL;
	if (w) { /* answered once its leaving the queue is durable */
		w->lease = busy_json(l, w->msg, sizeof w->msg, what);
		count(e, &e->leases_refused);
		eng_reply(e, w, BATON_ECONFLICT, REPLY_CHANGED, wf->resource);
	}
	event_sink ev = {eng_on_event, e};
	eng_follow(e, wf, machine_cancel(wf, e->def, now, &ev), now);
}

/* Ends a held lease: released (ok) or expired; the resource goes to the next waiter. */
static void end_hold(baton_engine *e, wf_row *wf, int ok, int64_t now)
{
	step_row *st = &wf->steps[0];
	step_output out = {.duration_ms = now - st->started_at};
	event_sink ev = {eng_on_event, e};
	if (ok) {
		out.result = json_pack("{s:b}", "released", 1);
		count(e, &e->leases_released);
	} else {
		snprintf(out.error, sizeof out.error, "lease_expired: not renewed within %lld ms",
			 (long long)wf->lease_ttl_ms);
		eng_on_event(e, wf, "lease_expired",
			     json_pack("{s:i, s:s, s:i, s:s, s:I, s:I}", "step", 0, "worker",
				       st->worker, "attempt", st->attempts, "resource",
				       wf->resource, "fencing_token", (json_int_t)st->token,
				       "ttl_ms", (json_int_t)wf->lease_ttl_ms));
		count(e, &e->leases_expired);
	}
	eng_follow(e, wf, machine_outcome(wf, &out, e->def, now, &ev), now);
	json_decref(out.result);
	if (!e->no_new_work)
		eng_grant_lock(e, eng_lock_of(e, wf->resource), now);
}

/* ---- moves: lease_machine.c decides, this carries them out ---- */

/* A waiter's new deadline; stored for a named one, so that it holds across a restart. */
static void wait_until(baton_engine *e, wf_row *wf, int64_t at)
{
	wf->lease_wait_until = at;
	eng_timer_arm(e, wf, at);
	if (wf->lease_named)
		eng_set_param(e, wf, 0, "wait_until", json_integer(at));
}

/* The resource granted wf: its expiry runs, and its caller is told once it is durable; with
 * no caller (gone with a restart) it is kept a grace for that caller to come back. The
 * grace's end is stored with the grant ("grace_until"), so that a restart does not give
 * a grant that nobody took its whole ttl again. */
static void keep_grace(baton_engine *e, wf_row *wf, int64_t now)
{
	int64_t grace = wf->lease_ttl_ms < GRACE_MS ? wf->lease_ttl_ms : GRACE_MS;
	wf->lease_grace_until = now + grace;
	eng_timer_arm(e, wf, wf->lease_grace_until);
	eng_set_param(e, wf, 0, "grace_until", json_integer(wf->lease_grace_until));
}

static void start(baton_engine *e, wf_row *wf, int unseen, int64_t now)
{
	set_expiry(e, wf, now);
	count(e, &e->leases_granted);
	if (unseen)
		keep_grace(e, wf, now);
}

/* An event's call: its caller (NULL: none), what a renewal or a retried acquire asks, what a
 * give-back or a leaving names, and when it arrived (0: the engine's own). */
typedef struct lease_call {
	waiter *w;
	int64_t ttl_ms, wait_ms;
	int64_t attempt; /* LEASE_UNDELIVERED: the attempt whose grant is given back */
	const void *who; /* LEASE_LEFT: the ud of the acquisition whose caller went away */
	int64_t arrived; /* the round's clock */
} lease_call;

/* What the engine knows of wf, a lease in memory that has not ended, at `now`. */
static lease_facts facts_of(const wf_row *wf, int event, const lease_call *c, int64_t now)
{
	lease_facts f = {.here = 1,
			 .caller = wf->lease_w != NULL,
			 .expired = wf->lease_expires_at <= now,
			 .grace_over = wf->lease_grace_until && wf->lease_grace_until <= now,
			 .wait_over = wf->lease_wait_until <= now};
	f.new_ttl = c->ttl_ms > 0 && c->ttl_ms != wf->lease_ttl_ms;
	if (event == LEASE_UNDELIVERED)
		f.superseded = c->attempt < wf->lease_attempt;
	else if (event == LEASE_LEFT)
		f.superseded = c->who && (!wf->lease_w || wf->lease_w->ud != c->who);
	else if (event == LEASE_RENEW || event == LEASE_RELEASE)
		f.late = c->arrived && wf->steps[0].status == ST_RUNNING &&
			 wf->lease_expires_at <= c->arrived;
	return f;
}

/* Every arrival of a request for the lease is its next attempt, stored with the round: a
 * give-back names the attempt it undoes, and does nothing once a later one arrived. */
static void next_attempt(baton_engine *e, wf_row *wf)
{
	wf->lease_attempt++;
	eng_set_param(e, wf, 0, "attempt", json_integer(wf->lease_attempt));
}

/* Answers w, the event's caller, as mv says; lease is what it is shown (stolen). */
static void answer(baton_engine *e, waiter *w, const hold_move *mv, json_t *lease,
		   const char *resource)
{
	if (!w || mv->answer == HOLD_SILENT || mv->answer == HOLD_WAIT) {
		json_decref(lease);
		return;
	}
	if (mv->answer == HOLD_REFUSE || mv->answer == HOLD_PASS_ON) {
		json_decref(lease);
		if (mv->answer == HOLD_REFUSE)
			eng_waiter_done(w, mv->code, 0, mv->why);
		else
			eng_pass_on(e, w, resource);
		return;
	}
	w->lease = lease;
	if (mv->answer == HOLD_COMMITTED)
		eng_reply(e, w, BATON_OK, REPLY_CHANGED, resource);
	else if (mv->answer == HOLD_GRANT)
		eng_reply(e, w, BATON_OK, REPLY_LEASE_GRANTED, resource);
	else if (mv->answer == HOLD_HELD)
		eng_reply(e, w, BATON_OK, REPLY_LEASE_HELD, resource);
	else /* HOLD_PROMISE (proven) or HOLD_READ */
		eng_waiter_done(w, BATON_OK, 0, NULL);
}

/* Carries out the event for wf, a lease in memory in `state`, for the call c. */
static void step_in(baton_engine *e, wf_row *wf, int state, int event, const lease_call *c,
		    int64_t now)
{
	waiter *w = c->w;
	if (event == LEASE_ACQUIRE && (state == LEASE_WAITING || state == LEASE_HELD))
		next_attempt(e, wf);
	lease_facts f = facts_of(wf, event, c, now);
	hold_move mv = lease_next(state, event, &f);
	if (mv.proof && !eng_promise(e, w, wf->resource))
		return;
	switch (mv.act) {
	case LEASE_NEW_TTL:
		change_ttl(e, wf, c->ttl_ms);
		/* fall through */
	case LEASE_EXTEND:
		set_expiry(e, wf, now);
		break;
	case LEASE_ADOPT:
		if (wf->lease_grace_until)
			eng_set_param(e, wf, 0, "grace_until", NULL);
		wf->lease_grace_until = 0;
		set_expiry(e, wf, now);
		break;
	case LEASE_REATTACH:
		if (wf->lease_w)
			eng_waiter_done(wf->lease_w, BATON_ECONFLICT, 0,
					"superseded by a retry with the same request_id");
		wf->lease_w = w;
		wait_until(e, wf, now + c->wait_ms);
		break;
	case LEASE_START:
	case LEASE_START_UNSEEN:
		start(e, wf, mv.act == LEASE_START_UNSEEN, now);
		w = wf->lease_w; /* the grant answers the caller of the acquisition */
		wf->lease_w = NULL;
		break;
	case LEASE_GRACE:
		if (!wf->lease_grace_until)
			keep_grace(e, wf, now);
		break;
	case LEASE_END_RELEASED:
	case LEASE_END_EXPIRED:
		end_hold(e, wf, mv.act == LEASE_END_RELEASED, now);
		break;
	case LEASE_LEAVE:
		give_up(e, wf, mv.why, now);
		break;
	}
	answer(e, w, &mv, mv.answer == HOLD_SILENT ? NULL : lease_json(wf), wf->resource);
}

static void step(baton_engine *e, wf_row *wf, int event, const lease_call *c, int64_t now)
{
	step_in(e, wf, state_of(wf), event, c, now);
}

static void step_alone(baton_engine *e, wf_row *wf, int event, int64_t now)
{
	lease_call none = {0};
	step(e, wf, event, &none, now);
}

/* ---- where a lease passed on lives ----
 *
 * A lease that another node drives is changed and answered there; this node passes its
 * requests on (members.c). To know where, it needs the lease's resource, which names the
 * partition: a lease in memory here carries it, any other is read from the store, a few
 * round trips on PostgreSQL, and none at all for a node cut from its database. A lease's
 * resource never changes, so the ones this node has learnt (a grant it relayed, a stored
 * lease it read) are kept in a small table, one slot an id, the newest in each: a renewal
 * or a release through the same node is passed on with no read. Whom to pass it to comes
 * from the partitions' owners as last read, as for an acquire; an owner that no longer
 * drives the resource answers 503, and the client asks again. */

#define HINTS 512

typedef struct lease_hint {
	char id[MAX_NAME + 1];
	char resource[MAX_NAME + 1];
} lease_hint;

static lease_hint *hint_slot(lease_hint *hints, const char *id)
{
	uint32_t h = 2166136261u;
	for (const unsigned char *c = (const unsigned char *)id; *c; c++)
		h = (h ^ *c) * 16777619u;
	return &hints[h % HINTS];
}

void baton_lease_note(baton_engine *e, const char *id, const char *resource)
{
	if (!e || !e->clustered || !id || !resource || strlen(id) > MAX_NAME ||
	    strlen(resource) > MAX_NAME)
		return;
	pthread_mutex_lock(&e->hints_mu);
	if (!e->hints)
		e->hints = calloc(HINTS, sizeof *e->hints);
	if (e->hints) {
		lease_hint *h = hint_slot(e->hints, id);
		snprintf(h->id, sizeof h->id, "%s", id);
		snprintf(h->resource, sizeof h->resource, "%s", resource);
	}
	pthread_mutex_unlock(&e->hints_mu);
}

/* The resource of lease id as noted, into resource; 0 when none was. */
static int hinted(baton_engine *e, const char *id, char resource[MAX_NAME + 1])
{
	pthread_mutex_lock(&e->hints_mu);
	const lease_hint *h = e->hints ? hint_slot(e->hints, id) : NULL;
	int found = h && strcmp(h->id, id) == 0;
	if (found)
		snprintf(resource, MAX_NAME + 1, "%s", h->resource);
	pthread_mutex_unlock(&e->hints_mu);
	return found;
}

/* The event for a lease that is not in this node's memory (or has ended in it): as the
 * store has it. One that has not ended is another node's (or being taken over here). */
static void step_stored(baton_engine *e, int event, waiter *w, const char *id)
{
	json_t *wf = NULL;
	baton_error err = {0};
	int rc = store_get_workflow(e->st, id, &wf, &err);
	const json_t *st = rc ? NULL : json_array_get(json_object_get(wf, "steps"), 0);
	if (rc == BATON_OK && !json_is_true(json_object_get(st, "lease"))) {
		json_decref(wf); /* a workflow's, not a lease's */
		rc = BATON_ENOTFOUND;
	}
	if (rc) {
		if (rc == BATON_ENOTFOUND)
			err_set(&err, rc, "no lease with id \"%.128s\"", id);
		if (w)
			eng_waiter_done(w, rc, 0, err.msg);
		return;
	}
	json_t *lease = stored_lease_json(wf);
	json_decref(wf);
	int state = lease_state_of(json_string_value(json_object_get(lease, "state")));
	/* A copy: the lease goes to its caller's thread with the answer, and this thread must
	 * not touch it (not even its reference count) after that. */
	char resource[MAX_NAME + 1];
	snprintf(resource, sizeof resource, "%s",
		 json_string_value(json_object_get(lease, "resource")));
	lease_facts f = {.elsewhere = members_elsewhere(e, resource)};
	if (f.elsewhere)
		baton_lease_note(e, id, resource);
	hold_move mv = lease_next(state, event, &f);
	answer(e, w, &mv, lease, resource);
}

void lease_granted(baton_engine *e, wf_row *wf, int64_t now)
{
	/* machine_grant has made its step running: the lease was waiting until now */
	lease_call none = {0};
	step_in(e, wf, LEASE_WAITING, LEASE_GRANTED, &none, now);
}

int64_t lease_deadline(const wf_row *wf)
{
	const step_row *st = &wf->steps[0];
	if (wf->done)
		return 0;
	if (st->status == ST_RUNNING) {
		int64_t g = wf->lease_grace_until;
		return g && g < wf->lease_expires_at ? g : wf->lease_expires_at;
	}
	return st->status == ST_WAITING ? wf->lease_wait_until : 0;
}

void lease_unconfirmed(baton_engine *e, const char *id, int64_t now)
{
	wf_row *wf = id ? strmap_get(e->wfs, id) : NULL;
	if (wf && wf->lease && !wf->done)
		step_alone(e, wf, LEASE_UNCONFIRMED, now);
}

void lease_timer(baton_engine *e, wf_row *wf, int64_t now)
{
	if (!wf->done)
		step_alone(e, wf, LEASE_TIMER, now);
}

void lease_cancelled(baton_engine *e, wf_row *wf)
{
	waiter *w = wf->lease_w;
	wf->lease_w = NULL;
	if (w)
		eng_waiter_done(w, BATON_ECONFLICT, 0, "the lease was cancelled while it waited");
	(void)e;
}

int lease_recover(baton_engine *e, wf_row *wf)
{
	step_row *st = &wf->steps[wf->cur];
	if (!is_lease_step(st))
		return 0;
	wf->lease = 1;
	wf->lease_ttl_ms = json_integer_value(json_object_get(st->params, "ttl_ms"));
	json_t *attempt = json_object_get(st->params, "attempt");
	wf->lease_attempt = json_is_integer(attempt) ? json_integer_value(attempt) : 1;
	if (st->status == ST_RUNNING) {
		lock_restore(eng_lock_of(e, wf->resource), wf, lock_granted_slot(wf),
			     st->started_at);
		set_expiry(e, wf, e->now);
		json_t *grace = json_object_get(st->params, "grace_until");
		if (json_is_integer(grace)) { /* granted to nobody: its grace, no more */
			int64_t at = json_integer_value(grace), most = e->now + GRACE_MS;
			wf->lease_grace_until = at < most ? at : most;
			if (wf->lease_grace_until < 1)
				wf->lease_grace_until = 1;
			eng_timer_arm(e, wf, wf->lease_grace_until);
		}
		return 1;
	}
	json_t *until = json_object_get(st->params, "wait_until");
	if (st->status == ST_WAITING && json_is_integer(until)) {
		/* Its caller may come back with its request_id: it waits in its place until its
		 * deadline (bounded by the longest wait, whatever clock stored it). */
		int64_t at = json_integer_value(until), most = e->now + MAX_WAIT_MS;
		wf->lease_named = 1;
		wf->lease_wait_until = at < most ? at : most;
		eng_timer_arm(e, wf, wf->lease_wait_until);
		return 0; /* queued again in its order, as every waiter */
	}
	/* Its caller was answered nothing and cannot find it again. */
	event_sink ev = {eng_on_event, e};
	eng_follow(e, wf, machine_cancel(wf, e->def, e->now, &ev), e->now);
	return 1;
}

static void stop_one(void *ctx, void *value)
{
	baton_engine *e = ctx;
	wf_row *wf = value;
	if (wf->lease && !wf->done)
		step_alone(e, wf, LEASE_STOP, e->now);
}

void lease_stop(baton_engine *e)
{
	e->leases_stopped = 1;
	task_stop(e);
	/* a lease leaving its queue changes no map entry (finished rows are freed after the
	 * commit) */
	strmap_each(e->wfs, stop_one, e);
}

/* ---- messages ---- */

/* Whether a request for l, exclusive or not, would wait now. */
static int busy_now(const res_lock *l, int exclusive)
{
	return l && !lock_fits_now(l, exclusive);
}

/* A lease asked for again with its request_id: cur, the one in memory (maybe ended in this
 * round), or stored, its stored definition. */
static void acquire_again(baton_engine *e, msg *m, wf_row *cur, const char *stored, int64_t now)
{
	if (!codec_same_definition(cur ? cur->definition : stored, m->wf->definition))
		eng_waiter_done(m->w, BATON_ECONFLICT, 0,
				"this request_id was used for another lease request");
	else if (cur)
		step(e, cur, LEASE_ACQUIRE, &(lease_call){.w = m->w, .wait_ms = m->wait_ms}, now);
	else
		step_stored(e, LEASE_ACQUIRE, m->w, m->wf->id);
}

static void apply_acquire(baton_engine *e, msg *m, int64_t now)
{
	wf_row *wf = m->wf, *cur = strmap_get(e->wfs, wf->id);
	if (e->faulty || e->no_new_work || e->leases_stopped) {
		eng_waiter_done(m->w, BATON_EBUSY, 0,
				e->faulty ? e->fault_why : "the server is shutting down");
		wf_row_free(wf);
		return;
	}
	char *stored = NULL;
	int status;
	baton_error err = {0};
	/* Only a client's request_id can name a stored lease: an id this node drew from 128
	 * random bits is new (and were it not, the store's unique id would refuse its commit,
	 * never grant it twice), so it costs no lookup, a round trip on PostgreSQL. */
	int rc = cur		    ? BATON_OK
		 : !wf->lease_named ? BATON_ENOTFOUND
				    : store_find_workflow(e->st, wf->id, &stored, &status, &err);
	if (rc != BATON_ENOTFOUND) { /* the same request_id again */
		if (rc)
			eng_waiter_done(m->w, rc, 0, err.msg);
		else
			acquire_again(e, m, cur, stored, now);
		free(stored);
		wf_row_free(wf);
		return;
	}
	if (!eng_drives(e, wf->resource)) {
		eng_pass_on(e, m->w, wf->resource);
		wf_row_free(wf);
		return;
	}
	res_lock *l = strmap_get(e->locks, wf->resource);
	if (m->wait_ms == 0 &&
	    busy_now(l, lock_wants_all(wf))) { /* try once: nothing is recorded */
		char why[512];
		m->w->lease = busy_json(l, why, sizeof why, "not granted");
		count(e, &e->leases_refused);
		eng_waiter_done(m->w, BATON_ECONFLICT, 0, why);
		wf_row_free(wf);
		return;
	}
	if (eng_next_wf_seq(e, &wf->seq, &err)) {
		eng_waiter_done(m->w, BATON_EBUSY, 0, e->ids_why);
		wf_row_free(wf);
		return;
	}
	/* A new lease: it starts waiting in its resource's queue. */
	wf->status = WF_PENDING;
	wf->created_at = now;
	wf->is_new = 1;
	wf->dirty_lo = wf->steps_total;
	wf->lease_w = m->w;
	wf->lease_attempt = 1;
	wf->lease_wait_until = now + m->wait_ms;
	if (wf->lease_named) /* a new row: its params are written with it */
		json_object_set_new(wf->steps[0].params, "wait_until",
				    json_integer(wf->lease_wait_until));
	strmap_put(e->wfs, wf->id, wf);
	eng_on_event(
	    e, wf, "workflow_submitted",
	    json_pack("{s:s, s:i, s:b}", "resource", wf->resource, "steps_total", 1, "lease", 1));
	eng_request(e, wf, 0, now);
	eng_touch_wf(e, wf);
	if (m->wait_ms > 0)
		eng_timer_arm(e, wf, wf->lease_wait_until);
}

static void apply_op(baton_engine *e, msg *m, int64_t now)
{
	wf_row *wf = strmap_get(e->wfs, m->id);
	char resource[MAX_NAME + 1];
	if (wf && !wf->lease) {
		if (m->w)
			eng_waiter_done(m->w, BATON_ENOTFOUND, 0, "no lease with that id");
	} else if (!wf && m->w && hinted(e, m->id, resource) && members_elsewhere(e, resource)) {
		eng_pass_on(e, m->w, resource); /* the node that drives it reads it if need be */
	} else if (!wf || wf->done) {
		step_stored(e, m->idx, m->w, m->id);
	} else {
		lease_call c = {.w = m->w,
				.ttl_ms = m->ttl_ms,
				.attempt = m->lease_attempt,
				.who = m->who,
				.arrived = m->arrived ? eng_arrival(e, m, now) : 0};
		step(e, wf, m->idx, &c, now);
	}
}

void lease_apply(baton_engine *e, msg *m, int64_t now)
{
	if (m->type == MSG_LEASE)
		apply_acquire(e, m, now);
	else if (m->type == MSG_LEASE_STOP)
		lease_stop(e);
	else
		apply_op(e, m, now);
}

/* ---- public API ---- */

static wf_row *new_lease_row(const baton_lease_request *req, const char *id)
{
	wf_row *wf = xcalloc(1, sizeof *wf);
	wf->stored_status = -1;
	wf->id = xstrdup(id);
	wf->resource = xstrdup(req->resource);
	wf->lease = 1;
	wf->lease_named = req->request_id != NULL;
	wf->lease_ttl_ms = req->ttl_ms;
	wf->retry = (retry_policy){
	    .max_attempts = 1, .first_retry_ms = 1000, .backoff = 2, .max_delay_ms = 1000};
	wf->on_failure = ON_FAILURE_FAIL;
	wf->steps_total = 1;
	wf->steps = xcalloc(1, sizeof *wf->steps);
	step_row *st = &wf->steps[0];
	st->worker = xstrdup(req->holder);
	st->params = json_pack("{s:s, s:b, s:I}", "name", req->holder, "lease", 1, "ttl_ms",
			       (json_int_t)req->ttl_ms);
	st->duration_ms = -1;
	json_t *def = json_pack("{s:s, s:{s:s, s:I}}", "resource", req->resource, "lease", "holder",
				req->holder, "ttl_ms", (json_int_t)req->ttl_ms);
	if (req->exclusive) { /* only then: the definition of a plain lease is as it was */
		json_object_set_new(st->params, "exclusive", json_true());
		json_object_set_new(json_object_get(def, "lease"), "exclusive", json_true());
	}
	wf->definition = codec_text_sorted(def);
	json_decref(def);
	return wf;
}

static waiter *lease_waiter(baton_lease_fn done, void *ud, const char *id)
{
	waiter *w = xcalloc(1, sizeof *w);
	w->lease_cb = done;
	w->ud = ud;
	snprintf(w->id, sizeof w->id, "%s", id);
	return w;
}

int baton_lease_acquire(baton_engine *e, const baton_lease_request *req, baton_lease_fn done,
			void *ud, char id[48], baton_error *err)
{
	if (!req->resource || !valid_name(req->resource))
		return err_set(
		    err, BATON_EINVAL,
		    "resource: a name of 1 to 128 characters [A-Za-z0-9._:-] is required");
	if (!req->holder || !valid_name(req->holder))
		return err_set(err, BATON_EINVAL,
			       "holder: a name of 1 to 128 characters [A-Za-z0-9._:-] is required");
	if (req->ttl_ms < 1000 || req->ttl_ms > 86400000)
		return err_set(err, BATON_EINVAL, "ttl_ms: from 1000 to 86400000");
	if (req->wait_ms < 0 || req->wait_ms > 300000)
		return err_set(err, BATON_EINVAL, "wait_ms: from 0 to 300000");
	char buf[MAX_NAME + 1];
	if (req->request_id) {
		if (!valid_name(req->request_id) ||
		    strlen(req->request_id) > MAX_NAME - strlen(LEASE_PREFIX))
			return err_set(err, BATON_EINVAL,
				       "request_id: a name of 1 to 122 characters [A-Za-z0-9._:-]");
		snprintf(buf, sizeof buf, LEASE_PREFIX "%s", req->request_id);
	} else {
		char hex[33];
		if (random_id(hex) != 0)
			return err_set(err, BATON_EINTERNAL, "no randomness for an id");
		snprintf(buf, sizeof buf, LEASE_PREFIX "%s", hex);
	}
	snprintf(id, 48, "%.47s", buf);
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_LEASE;
	m->wf = new_lease_row(req, buf);
	m->w = lease_waiter(done, ud, buf);
	m->wait_ms = req->wait_ms;
	if (eng_post_call(e, m, err)) {
		wf_row_free(m->wf);
		free(m->w);
		free(m);
		return err->code;
	}
	return BATON_OK;
}

static int post_op(baton_engine *e, const char *id, int op, int64_t ttl_ms, int64_t attempt,
		   const void *who, baton_lease_fn done, void *ud, baton_error *err)
{
	if (!valid_name(id) || strncmp(id, LEASE_PREFIX, strlen(LEASE_PREFIX)) != 0)
		return err_set(err, BATON_ENOTFOUND, "no lease with id \"%.128s\"", id);
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_LEASE_OP;
	m->id = xstrdup(id);
	m->idx = op;
	m->ttl_ms = ttl_ms;
	m->lease_attempt = attempt;
	m->who = who;
	m->w = done ? lease_waiter(done, ud, id) : NULL;
	if (!m->w) { /* the engine's own (a waiter that left, a grant given back): never refused */
		eng_post(e, m);
		return BATON_OK;
	}
	if (eng_post_call(e, m, err)) {
		free(m->id);
		free(m->w);
		free(m);
		return err->code;
	}
	return BATON_OK;
}

void baton_lease_left(baton_engine *e, const char *id, const void *ud)
{
	baton_error err;
	post_op(e, id, LEASE_LEFT, 0, 0, ud, NULL, NULL, &err);
}

int baton_lease_give_back(baton_engine *e, const char *id, int64_t attempt, baton_lease_fn done,
			  void *ud, baton_error *err)
{
	if (attempt < 1)
		return err_set(err, BATON_EINVAL, "attempt: a whole number from 1");
	return post_op(e, id, LEASE_UNDELIVERED, 0, attempt, NULL, done, ud, err);
}

int baton_lease_renew(baton_engine *e, const char *id, int64_t ttl_ms, baton_lease_fn done,
		      void *ud, baton_error *err)
{
	if (ttl_ms != 0 && (ttl_ms < 1000 || ttl_ms > 86400000))
		return err_set(err, BATON_EINVAL, "ttl_ms: from 1000 to 86400000");
	return post_op(e, id, LEASE_RENEW, ttl_ms, 0, NULL, done, ud, err);
}

int baton_lease_release(baton_engine *e, const char *id, baton_lease_fn done, void *ud,
			baton_error *err)
{
	return post_op(e, id, LEASE_RELEASE, 0, 0, NULL, done, ud, err);
}

int baton_lease_get(baton_engine *e, const char *id, baton_lease_fn done, void *ud,
		    baton_error *err)
{
	return post_op(e, id, LEASE_GET, 0, 0, NULL, done, ud, err);
}

void baton_lease_stop(baton_engine *e)
{
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_LEASE_STOP;
	eng_post(e, m);
}

/*
 * machine.c - the workflow state machine, as pure transitions.
 *
 * Design. baton runs a workflow as an explicit state machine, not by replaying code:
 * C has no generators to suspend, and the shape of every workflow (one step per worker,
 * in order) is known when it is submitted. The persisted rows *are* the state, so
 * recovery is a query instead of a re-execution, and a completed step is memoized by
 * construction: its row says "completed" with its result, and no transition ever leads
 * back from there to "running".
 *
 * Each function takes a workflow row and an event (the resource was granted, an attempt
 * finished, a retry timer fired, a cancel arrived), changes the row, records history
 * through an event_sink, and tells the engine what to do next (a transition). Nothing
 * here touches threads, locks or the database, so the rules are tested on their own.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t retry_delay_ms(const retry_policy *p, int n)
{
	double d = (double)p->first_retry_ms * pow(p->backoff, n - 1);
	if (!(d < (double)p->max_delay_ms)) /* also catches inf and nan */
		return p->max_delay_ms;
	return (int64_t)d;
}

static void emit(const event_sink *ev, const wf_row *wf, const char *type, json_t *data)
{
	if (ev && ev->emit)
		ev->emit(ev->ctx, wf, type, data);
	else
		json_decref(data);
}

/* Event members, set without json_pack's format parsing or a UTF-8 check of the keys,
 * which are the constants below (this runs for every event of every step). */
static void put_int(json_t *d, const char *key, json_int_t v)
{
	json_object_set_new_nocheck(d, key, json_integer(v));
}

static void put_str(json_t *d, const char *key, const char *v)
{
	json_object_set_new_nocheck(d, key, json_string(v));
}

static json_t *step_data(const step_row *st, int attempt)
{
	json_t *d = json_object();
	put_int(d, "step", st->index);
	put_str(d, "worker", st->worker);
	put_int(d, "attempt", attempt);
	return d;
}

static void set_error(char **dst, const char *msg)
{
	free(*dst);
	*dst = msg ? xstrdup(msg) : NULL;
}

static void finish(wf_row *wf, int status, const workflow_def *def, int64_t now,
		   const event_sink *ev, transition *t)
{
	wf->status = status;
	wf->finished_at = now;
	wf->dirty = 1;
	wf->done = 1;
	t->finished = 1;
	if (status == WF_COMPLETED) {
		json_decref(wf->result);
		wf->result = def->result(wf);
		emit(ev, wf, "workflow_completed", json_pack("{s:O}", "result", wf->result));
	} else if (status == WF_FAILED) {
		emit(ev, wf, "workflow_failed", json_pack("{s:s}", "error", wf->error));
	} else {
		for (int i = wf->cur; i < wf->steps_total; i++) {
			step_row *st = &wf->steps[i];
			if (st->status == ST_PENDING || st->status == ST_WAITING ||
			    st->status == ST_RETRYING) {
				st->status = ST_CANCELLED;
				st->next_attempt_at = 0; /* no attempt will come */
				wf_mark_step(wf, i);
			}
		}
		emit(ev, wf, "workflow_cancelled", json_object());
	}
}

void machine_request(wf_row *wf, int idx, int64_t lock_seq, int64_t now, const event_sink *ev)
{
	step_row *st = &wf->steps[idx];
	wf->cur = idx;
	st->status = ST_WAITING;
	st->lock_seq = lock_seq;
	st->requested_at = now;
	st->next_attempt_at = 0;
	wf_mark_step(wf, st->index);
	emit(ev, wf, "lock_requested", step_data(st, st->attempts + 1));
}

void machine_grant(wf_row *wf, int64_t token, int slot, int64_t waited_ms, int64_t now,
		   const event_sink *ev)
{
	step_row *st = &wf->steps[wf->cur];
	if (wf->status == WF_PENDING) {
		wf->status = WF_RUNNING;
		wf->started_at = now;
		wf->dirty = 1;
		emit(ev, wf, "workflow_started", json_object());
	}
	st->status = ST_RUNNING;
	st->attempts++;
	st->token = token;
	st->started_at = now;
	st->finished_at = 0;
	st->duration_ms = -1;
	set_error(&st->error, NULL);
	wf_mark_step(wf, st->index);
	json_t *d = step_data(st, st->attempts);
	put_str(d, "resource", wf->resource);
	put_int(d, "fencing_token", token);
	if (d) {
		json_object_set_new(d, "slot", slot >= 0 ? json_integer(slot) : json_null());
		json_object_set_new(d, "exclusive", json_boolean(slot < 0));
	}
	put_int(d, "waited_ms", waited_ms);
	emit(ev, wf, "lock_acquired", d);
}

/* Moves past a step that ended (completed, or failed under on_failure "continue"). */
static void advance(wf_row *wf, const workflow_def *def, int64_t now, const event_sink *ev,
		    transition *t)
{
	if (wf->cancel_requested) {
		wf->cur++;
		finish(wf, WF_CANCELLED, def, now, ev, t);
	} else if (wf->cur + 1 < wf->steps_total) {
		t->request = wf->cur + 1;
	} else {
		wf->cur = wf->steps_total;
		finish(wf, WF_COMPLETED, def, now, ev, t);
	}
}

static void release_event(const wf_row *wf, const step_row *st, int64_t now, const event_sink *ev)
{
	json_t *d = step_data(st, st->attempts);
	put_str(d, "resource", wf->resource);
	put_int(d, "fencing_token", st->token);
	put_int(d, "hold_ms", now - st->started_at);
	emit(ev, wf, "lock_released", d);
}

static void step_failed(wf_row *wf, step_row *st, const step_output *out, const workflow_def *def,
			int64_t now, const event_sink *ev, transition *t)
{
	set_error(&st->error, out->error);
	json_t *d = step_data(st, st->attempts);
	json_object_set_new(d, "duration_ms", json_integer(st->duration_ms));
	json_object_set_new(d, "error", json_string(out->error));
	if (out->detail)
		json_object_update_missing(d, out->detail);
	if (out->retryable && st->attempts < wf->retry.max_attempts && !wf->cancel_requested) {
		int64_t delay = retry_delay_ms(&wf->retry, st->attempts);
		if (out->retry_after_ms > delay)
			delay = out->retry_after_ms;
		st->status = ST_RETRYING;
		st->next_attempt_at = now + delay;
		t->timer_at = st->next_attempt_at;
		json_object_set_new(d, "retry_in_ms", json_integer(delay));
		json_object_set_new(d, "next_attempt_at", time_json(st->next_attempt_at));
		emit(ev, wf, "step_failed", d);
		release_event(wf, st, now, ev);
		return;
	}
	st->status = ST_FAILED;
	json_object_set_new(d, "retry_in_ms", json_null());
	json_object_set_new(d, "next_attempt_at", json_null());
	emit(ev, wf, "step_failed", d);
	release_event(wf, st, now, ev);
	if (wf->on_failure == ON_FAILURE_CONTINUE || wf->cancel_requested) {
		advance(wf, def, now, ev, t);
		return;
	}
	char msg[512];
	snprintf(msg, sizeof msg, "step %d (%s) failed after %d attempt%s: %s", st->index,
		 st->worker, st->attempts, st->attempts == 1 ? "" : "s", out->error);
	set_error(&wf->error, msg);
	wf->cur = wf->steps_total;
	finish(wf, WF_FAILED, def, now, ev, t);
}

static size_t json_size(const json_t *v)
{
	return v ? json_dumpb(v, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY) : 0;
}

size_t wf_results_bytes(const wf_row *wf)
{
	size_t n = 0;
	for (int i = 0; i < wf->steps_total; i++)
		if (wf->steps[i].status == ST_COMPLETED)
			n += json_size(wf->steps[i].result);
	return n;
}

transition machine_outcome(wf_row *wf, const step_output *out, const workflow_def *def, int64_t now,
			   const event_sink *ev)
{
	transition t = {.release = 1, .request = -1};
	step_row *st = &wf->steps[wf->cur];
	st->finished_at = now;
	st->duration_ms = out->duration_ms;
	wf_mark_step(wf, st->index);
	if (!out->result) {
		step_failed(wf, st, out, def, now, ev, &t);
		return t;
	}
	size_t size = json_size(out->result);
	if (wf->results_bytes + size > MAX_WORKFLOW_RESULTS) {
		step_output over = *out; /* borrows its detail */
		over.result = NULL;
		over.retryable = 0;
		snprintf(over.error, sizeof over.error,
			 "the result (%zu bytes) would take the workflow's results past %d bytes"
			 " (%zu stored)",
			 size, MAX_WORKFLOW_RESULTS, wf->results_bytes);
		step_failed(wf, st, &over, def, now, ev, &t);
		return t;
	}
	wf->results_bytes += size;
	st->status = ST_COMPLETED;
	json_decref(st->result);
	st->result = json_incref(out->result);
	wf->steps_completed++;
	json_t *d = step_data(st, st->attempts);
	put_int(d, "duration_ms", st->duration_ms);
	json_object_set_new_nocheck(d, "result", json_incref(st->result));
	if (out->detail)
		json_object_update_missing(d, out->detail);
	emit(ev, wf, "step_completed", d);
	release_event(wf, st, now, ev);
	advance(wf, def, now, ev, &t);
	return t;
}

transition machine_timer(wf_row *wf, int64_t now)
{
	transition t = {.request = -1};
	if (wf->done || wf->cur >= wf->steps_total)
		return t;
	const step_row *st = &wf->steps[wf->cur];
	if (st->status == ST_RETRYING && st->next_attempt_at <= now)
		t.request = wf->cur;
	return t;
}

transition machine_cancel(wf_row *wf, const workflow_def *def, int64_t now, const event_sink *ev)
{
	transition t = {.request = -1};
	if (wf->done || wf->cancel_requested)
		return t;
	wf->cancel_requested = 1;
	wf->dirty = 1;
	emit(ev, wf, "cancel_requested", json_object());
	if (wf->steps[wf->cur].status != ST_RUNNING)
		finish(wf, WF_CANCELLED, def, now, ev, &t);
	return t;
}

void machine_interrupted(wf_row *wf, const event_sink *ev)
{
	step_row *st = &wf->steps[wf->cur];
	emit(ev, wf, "step_interrupted", step_data(st, st->attempts));
	st->status = ST_WAITING;
	wf_mark_step(wf, st->index);
}

int machine_resource_event(const char *type)
{
	static const char *const types[] = {"lock_requested", "lock_acquired", "lock_released",
					    "workflow_cancelled",
					    "lease_expired"}; /* and store.c's LOCK_TYPES */
	for (size_t i = 0; type && i < sizeof types / sizeof *types; i++)
		if (strcmp(type, types[i]) == 0)
			return 1;
	return 0;
}

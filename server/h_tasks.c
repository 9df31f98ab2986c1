/*
 * h_tasks.c - handlers of external workers: POST /tasks/claim (a long poll), and
 * POST /tasks/{id}/heartbeat, /complete, /fail, /give-back. The engine answers
 * (lib/task.c); the requests wait for it without holding an HTTP thread (wait.c). A claim
 * whose client is found gone when its answer is built, or whose answer could not be sent,
 * is given back (offered to the next claim) instead of waiting for its ttl to run out,
 * naming the claim_attempt that answer told. When the claim was passed on to the node that
 * drives the task (forward.c), that node gives it back: POST /tasks/{id}/give-back
 * {"claim_attempt": N}, which does nothing once a later attempt of the claim arrived.
 */
#include "server.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct task_answer {
	int rc, claim, give_back;
	json_t *task;
	char why[512];
	int64_t wait_ms;
	int forwarded; /* passed on to the node that drives the resource: its answer in fwd */
	srv_forward fwd;
} task_answer;

static void on_task(void *ud, int rc, int created, json_t *task, const char *why)
{
	request *r = ud;
	task_answer *a = r->wait.data;
	(void)created;
	if (srv_forward_refused(r, rc, task, &a->fwd, a->wait_ms, a->claim && a->wait_ms > 0,
				&a->forwarded)) {
		json_decref(task); /* answered by forward.c's thread */
		return;
	}
	a->rc = rc;
	a->task = task;
	snprintf(a->why, sizeof a->why, "%s", why ? why : "");
	srv_wait_done(r);
}

/* The claim answered in task could not be delivered: given back, naming its claim_attempt
 * (a retry of the claim's request_id that arrived since keeps it); at the node that answered
 * it (by: its URL) when it was passed on. */
static void unclaim(srv *s, const char *by, const char *authorization, const json_t *task)
{
	const char *id = json_string_value(json_object_get(task, "id"));
	json_int_t attempt = json_integer_value(json_object_get(task, "claim_attempt"));
	baton_error err;
	if (!id || attempt < 1)
		return;
	if (by)
		srv_forward_claim_give_back(s, by, authorization, id, attempt);
	else
		baton_task_give_back(s->engine, id, attempt, NULL, NULL, &err);
}

static int worker_gone(response *out)
{
	/* One that only half-closed still reads this answer, which must say so. */
	return reply_problem(out, 409,
			     "the worker closed its side of the connection before the"
			     " claim could be answered: the task is offered again");
}

/* The answer of the node that drives the task, relayed. A claim for a worker that has gone
 * is given back there at once, naming its claim_attempt, as answered does here. */
static int relayed(srv *s, request *r, task_answer *a, response *out)
{
	int status = srv_forward_reply(&a->fwd, out);
	json_t *task =
	    a->claim && status == 200 && out->text ? json_loads(out->text, 0, NULL) : NULL;
	const char *id = json_string_value(json_object_get(task, "id"));
	if (id && srv_peer_gone(r->fd)) {
		unclaim(s, a->fwd.url, r->authorization, task);
		free(out->text);
		out->text = NULL;
		out->location[0] = 0;
		status = worker_gone(out);
	} else if (id) {
		snprintf(r->task_claimed, sizeof r->task_claimed, "%s", id);
		snprintf(r->claimed_by, sizeof r->claimed_by, "%s", a->fwd.url);
		r->claim_attempt = json_integer_value(json_object_get(task, "claim_attempt"));
	}
	json_decref(task);
	srv_forward_fini(&a->fwd);
	return status;
}

static int answered(srv *s, request *r, void *data, response *out)
{
	task_answer *a = data;
	if (a->forwarded)
		return relayed(s, r, a, out);
	json_t *task = a->task;
	a->task = NULL;
	if (a->rc) {
		baton_error err = {.code = a->rc};
		snprintf(err.msg, sizeof err.msg, "%s", a->why);
		reply_error(out, &err);
		srv_driven_by(a->rc, task, out);
		json_decref(task);
		return out->status;
	}
	if (!task || a->give_back) { /* no task within wait_ms; a claim given back */
		json_decref(task);
		out->status = 204;
		return 204;
	}
	const char *id = json_string_value(json_object_get(task, "id"));
	if (a->claim && id) {
		if (srv_peer_gone(srv_conn_fd(r->conn))) {
			/* Claimed for a worker that closed its side: offered again at once. */
			unclaim(s, NULL, NULL, task);
			json_decref(task);
			return worker_gone(out);
		}
		snprintf(r->task_claimed, sizeof r->task_claimed, "%s", id);
		r->claim_attempt = json_integer_value(json_object_get(task, "claim_attempt"));
	}
	return reply_json(out, 200, task);
}

/* The answer dropped unsent (its connection closed first): a task claimed for nobody is
 * given back at once, as answered does for a worker that left. */
static void dropped(srv *s, void *data)
{
	task_answer *a = data;
	if (a->forwarded) {
		json_t *task = a->claim && a->fwd.status == 200
				   ? json_loadb(a->fwd.body, a->fwd.body_len, 0, NULL)
				   : NULL;
		unclaim(s, a->fwd.url, srv_forward_auth(&a->fwd), task);
		json_decref(task);
		srv_forward_fini(&a->fwd);
		return;
	}
	if (!a->rc && a->claim)
		unclaim(s, NULL, NULL, a->task);
	json_decref(a->task);
	a->task = NULL;
}

void srv_task_unsent(srv *s, request *r)
{
	baton_error err;
	if (r->task_claimed[0] && r->claimed_by[0])
		srv_forward_claim_give_back(s, r->claimed_by, r->authorization, r->task_claimed,
					    r->claim_attempt);
	else if (r->task_claimed[0])
		baton_task_give_back(s->engine, r->task_claimed, r->claim_attempt, NULL, NULL,
				     &err);
}

static task_answer *begin(srv *s, request *r, int claim, int64_t wait_ms, response *out)
{
	task_answer *a = calloc(1, sizeof *a);
	if (!a) {
		reply_problem(out, 500, "out of memory");
		return NULL;
	}
	a->claim = claim;
	a->wait_ms = wait_ms;
	if (srv_wait_begin(s, r, a, answered, out))
		return NULL;
	srv_wait_on_discard(r, dropped);
	return a;
}

int h_task_claim(srv *s, const request *cr, const char *const *p, response *out)
{
	static const char *const keys[] = {"worker", "resource",   "wait_ms",
					   "ttl_ms", "request_id", NULL};
	request *r = (request *)cr;
	json_t *body;
	const char *worker = NULL, *resource = NULL, *request_id = NULL;
	int64_t wait_ms = 30000, ttl_ms = 30000;
	(void)p;
	if (body_optional_body(r, out, &body))
		return out->status;
	if (body_only_fields(body, keys, out) || body_field_str(body, "worker", &worker, out) ||
	    body_field_str(body, "resource", &resource, out) ||
	    body_field_str(body, "request_id", &request_id, out) ||
	    body_field_int(body, "wait_ms", 0, 300000, &wait_ms, out) ||
	    body_field_int(body, "ttl_ms", 1000, 86400000, &ttl_ms, out)) {
		json_decref(body);
		return out->status;
	}
	if (!begin(s, r, 1, wait_ms, out)) {
		json_decref(body);
		return out->status;
	}
	baton_error err = {0};
	int rc = baton_task_claim(s->engine, worker, resource, request_id, wait_ms, ttl_ms, on_task,
				  r, &err);
	json_decref(body);
	if (rc) {
		srv_wait_cancel(s, r);
		return reply_error(out, &err);
	}
	return srv_wait_suspend(s, r, out);
}

static int report(srv *s, request *r, const char *id, int op, json_t *result, const char *error,
		  int retryable, response *out)
{
	if (!begin(s, r, 0, 0, out)) {
		json_decref(result);
		return out->status;
	}
	baton_error err = {0};
	if (baton_task_report(s->engine, id, op, result, error, retryable, on_task, r, &err)) {
		srv_wait_cancel(s, r);
		return reply_error(out, &err);
	}
	return srv_wait_suspend(s, r, out);
}

/* POST /tasks/{id}/give-back {"claim_attempt": N}: the claim answered to that attempt (the
 * answer's "claim_attempt") is given back, and the task offered to the next claim; 409 once
 * a later attempt of the claim arrived (it keeps the claim) or when nothing is claimed. A
 * node that passed a claim on sends it when it could not deliver the owner's answer. */
int h_task_give_back(srv *s, const request *cr, const char *const *p, response *out)
{
	static const char *const keys[] = {"claim_attempt", NULL};
	request *r = (request *)cr;
	json_t *body;
	int64_t attempt = 0;
	if (read_json_body(r, out, &body))
		return out->status;
	int bad = body_only_fields(body, keys, out) ||
		  body_field_int(body, "claim_attempt", 1, LLONG_MAX, &attempt, out);
	json_decref(body);
	if (bad)
		return out->status;
	if (!attempt)
		return reply_problem(out, 400,
				     "claim_attempt: is required (a whole number from 1)");
	task_answer *a = begin(s, r, 0, 0, out);
	if (!a)
		return out->status;
	a->give_back = 1;
	baton_error err = {0};
	if (baton_task_give_back(s->engine, p[0], attempt, on_task, r, &err)) {
		srv_wait_cancel(s, r);
		return reply_error(out, &err);
	}
	return srv_wait_suspend(s, r, out);
}

int h_task_heartbeat(srv *s, const request *r, const char *const *p, response *out)
{
	return report(s, (request *)r, p[0], BATON_TASK_HEARTBEAT, NULL, NULL, 0, out);
}

int h_task_complete(srv *s, const request *r, const char *const *p, response *out)
{
	static const char *const keys[] = {"result", NULL};
	json_t *body;
	if (body_optional_body(r, out, &body))
		return out->status;
	if (body_only_fields(body, keys, out)) {
		json_decref(body);
		return out->status;
	}
	json_t *result = json_incref(json_object_get(body, "result"));
	json_decref(body);
	return report(s, (request *)r, p[0], BATON_TASK_COMPLETE, result, NULL, 0, out);
}

int h_task_fail(srv *s, const request *r, const char *const *p, response *out)
{
	static const char *const keys[] = {"error", "retryable", NULL};
	json_t *body;
	const char *error = "failed";
	if (body_optional_body(r, out, &body))
		return out->status;
	const json_t *retry = json_object_get(body, "retryable");
	if (body_only_fields(body, keys, out) || body_field_str(body, "error", &error, out)) {
		json_decref(body);
		return out->status;
	}
	if (retry && !json_is_boolean(retry)) {
		json_decref(body);
		return reply_problem(out, 400, "retryable: true or false");
	}
	int status = report(s, (request *)r, p[0], BATON_TASK_FAIL, NULL, error,
			    !retry || json_is_true(retry), out);
	json_decref(body);
	return status;
}

/*
 * h_tasks.c - handlers of external workers: POST /tasks/claim (a long poll), and
 * POST /tasks/{id}/heartbeat, /complete, /fail. The engine answers (lib/task.c); the
 * requests wait for it without holding an HTTP thread (wait.c). A claim whose client is
 * found gone when its answer is built, or whose answer could not be sent, is given back
 * (offered to the next claim) instead of waiting for its ttl to run out.
 */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct task_answer {
	int rc, claim;
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

/* Gives a claimed task back to its queue: its worker will never see the claim. */
/* The claim answered in task could not be delivered: given back, naming its claim_attempt
 * (a retry of the claim's request_id that arrived since keeps it). */
static void unclaim(srv *s, const json_t *task)
{
	baton_task_give_back(s->engine, json_string_value(json_object_get(task, "id")),
			     json_integer_value(json_object_get(task, "claim_attempt")));
}

static int answered(srv *s, request *r, void *data, response *out)
{
	task_answer *a = data;
	if (a->forwarded) { /* a claim relayed to a worker that has gone runs out with its ttl */
		int status = srv_forward_reply(&a->fwd, out);
		srv_forward_fini(&a->fwd);
		return status;
	}
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
	if (!task) { /* no task within wait_ms */
		out->status = 204;
		return 204;
	}
	const char *id = json_string_value(json_object_get(task, "id"));
	if (a->claim && id) {
		if (srv_peer_gone(srv_conn_fd(r->conn))) {
			/* Claimed for a worker that closed its side: offered again at once. One
			 * that only half-closed still reads this answer, which must say so. */
			unclaim(s, task);
			json_decref(task);
			return reply_problem(
			    out, 409,
			    "the worker closed its side of the connection before the"
			    " claim could be answered: the task is offered again");
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
		srv_forward_fini(&a->fwd);
		return;
	}
	const char *id = json_string_value(json_object_get(a->task, "id"));
	if (!a->rc && a->claim && id)
		unclaim(s, a->task);
	json_decref(a->task);
	a->task = NULL;
}

void srv_task_unsent(srv *s, request *r)
{
	if (r->task_claimed[0])
		baton_task_give_back(s->engine, r->task_claimed, r->claim_attempt);
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

/*
 * h_workflows.c - handlers of /workflows: validate, hand to the engine, answer. They
 * never run a step: the engine persists and schedules, and a submission is answered
 * only once it is durable.
 */
#include "server.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int is_json_type(const char *ct)
{
	static const char want[] = "application/json";
	if (!ct || strncasecmp(ct, want, sizeof want - 1) != 0)
		return 0;
	char c = ct[sizeof want - 1];
	return c == 0 || c == ';' || c == ' ' || c == '\t';
}

/* Parses the request body as JSON; on failure fills out and returns its status. */
int read_json_body(const request *r, response *out, json_t **body)
{
	const char *ct =
	    MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
	if (!is_json_type(ct))
		return reply_problem(out, 415, "the body must be application/json, not %s",
				     ct ? ct : "missing");
	if (r->body_len == 0)
		return reply_problem(out, 400, "the body is empty; it must be a JSON object");
	baton_error err = {0};
	if (baton_decode_json(r->body, r->body_len, body, &err))
		return reply_error(out, &err);
	return 0;
}

/* What the engine answered to a submission (the request's wait data). */
typedef struct submitted {
	int rc, created;
	char id[160];
	char why[512];
} submitted;

/* The engine thread's answer: recorded, and the connection resumed. */
static void on_submitted(void *ud, int rc, const char *id, int created, const char *why)
{
	request *r = ud;
	submitted *sub = r->wait.data;
	sub->rc = rc;
	sub->created = created;
	snprintf(sub->id, sizeof sub->id, "%s", id);
	snprintf(sub->why, sizeof sub->why, "%s", why);
	srv_wait_done(r);
}

/* The answer, on an HTTP thread, once the engine has answered. */
static int created(srv *s, request *r, void *data, response *out)
{
	const submitted *sub = data;
	baton_error err = {0};
	(void)r;
	if (sub->rc) {
		err.code = sub->rc;
		snprintf(err.msg, sizeof err.msg, "%s", sub->why);
		return reply_error(out, &err);
	}
	/* The submission is durable: its answer must not be a 503 that says "not taken". A
	 * read that fails now (the database went away right after the commit, or a pooled
	 * connection broke) is tried again for a while; a client that still gets an error
	 * re-POSTs with the same id and is answered 200. */
	json_t *wf;
	int rc, pause_ms = 50;
	for (int64_t waited = 0;;
	     waited += pause_ms, pause_ms = pause_ms < 1000 ? pause_ms * 2 : 1000) {
		rc = baton_engine_get(s->engine, sub->id, &wf, &err);
		if ((rc != BATON_EIO && rc != BATON_EBUSY) || waited >= 15000)
			break;
		struct timespec ts = {pause_ms / 1000, (long)(pause_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	if (rc)
		return reply_error(out, &err);
	if (sub->created)
		snprintf(out->location, sizeof out->location, "/workflows/%s", sub->id);
	return reply_json(out, sub->created ? 201 : 200, wf);
}

/*
 * A submission is answered only once it is durable, but its thread does not wait for
 * the commit: the connection is suspended until the engine answers (wait.c), so that a
 * few HTTP threads can carry many submissions into one commit.
 */
int h_workflows_create(srv *s, const request *cr, const char *const *p, response *out)
{
	request *r = (request *)cr; /* its wait: MHD keeps it until the answer is sent */
	json_t *body;
	baton_error err = {0};
	(void)p;
	if (read_json_body(r, out, &body))
		return out->status;
	submitted *sub = calloc(1, sizeof *sub);
	if (!sub) {
		json_decref(body);
		return reply_problem(out, 500, "out of memory");
	}
	if (srv_wait_begin(s, r, sub, created, out)) {
		json_decref(body);
		return out->status;
	}
	int rc = baton_engine_submit_async(s->engine, body, on_submitted, r, &err);
	json_decref(body);
	if (rc) {
		srv_wait_cancel(s, r);
		return reply_error(out, &err);
	}
	return srv_wait_suspend(s, r, out);
}

int h_workflows_list(srv *s, const request *r, const char *const *p, response *out)
{
	baton_list_query q = {
	    .status = query_arg(r, "status"),
	    .resource = query_arg(r, "resource"),
	    .cursor = query_arg(r, "cursor"),
	};
	long long limit = 0; /* 0: the default */
	(void)p;
	if (query_int(r, "limit", 1, MAX_LIST_LIMIT, &limit, out))
		return out->status;
	q.limit = (int)limit;
	json_t *list;
	baton_error err = {0};
	if (baton_engine_list(s->engine, &q, &list, &err))
		return reply_error(out, &err);
	return reply_json(out, 200, list);
}

int h_workflow_get(srv *s, const request *r, const char *const *p, response *out)
{
	char *text;
	size_t len;
	baton_error err = {0};
	(void)r;
	if (baton_engine_get_text(s->engine, p[0], &text, &len, &err))
		return reply_error(out, &err);
	out->status = 200;
	out->text = text;
	out->content_type = "application/json";
	return 200;
}

int h_workflow_events(srv *s, const request *r, const char *const *p, response *out)
{
	long long after = 0, limit = DEFAULT_EVENT_LIMIT;
	if (query_int(r, "after", 0, LLONG_MAX, &after, out) ||
	    query_int(r, "limit", 1, MAX_EVENT_LIMIT, &limit, out))
		return out->status;
	json_t *events;
	baton_error err = {0};
	int stream = srv_wants_stream(r);
	/* A stream first checks that the workflow exists (asking for nothing after the end). */
	if (baton_engine_events(s->engine, p[0], stream ? INT64_MAX : after, (int)limit, &events,
				&err))
		return reply_error(out, &err);
	if (stream) {
		json_decref(events);
		return srv_stream_start(s, r, 0, p[0], after, out);
	}
	return reply_json(out, 200, events);
}

int h_workflow_delete(srv *s, const request *r, const char *const *p, response *out)
{
	baton_error err = {0};
	(void)r;
	if (baton_engine_delete(s->engine, p[0], &err))
		return reply_error(out, &err);
	out->status = 204;
	return 204;
}

int h_workflow_steps(srv *s, const request *r, const char *const *p, response *out)
{
	long long after = -1, limit = DEFAULT_STEP_LIMIT;
	if (query_int(r, "after", 0, INT_MAX, &after, out) ||
	    query_int(r, "limit", 1, MAX_STEP_LIMIT, &limit, out))
		return out->status;
	json_t *steps;
	baton_error err = {0};
	if (baton_engine_steps(s->engine, p[0], (int)after, (int)limit, &steps, &err))
		return reply_error(out, &err);
	return reply_json(out, 200, steps);
}

int h_workflow_cancel(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *wf;
	baton_error err = {0};
	(void)r;
	if (baton_engine_cancel(s->engine, p[0], &wf, &err))
		return reply_error(out, &err);
	return reply_json(out, 200, wf);
}

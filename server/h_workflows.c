/*
 * h_workflows.c - handlers of /workflows: validate, hand to the engine, answer. They
 * never run a step: the engine persists and schedules, and a submission is answered
 * only once it is durable.
 */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int is_json_type(const char *ct)
{
	static const char want[] = "application/json";
	if (!ct || strncasecmp(ct, want, sizeof want - 1) != 0)
		return 0;
	char c = ct[sizeof want - 1];
	return c == 0 || c == ';' || c == ' ' || c == '\t';
}

/* ?after=SEQ: 0 when absent; -1 (and a 400 in out) when malformed. */
int64_t after_arg(const request *r, response *out)
{
	const char *a = query_arg(r, "after");
	if (!a)
		return 0;
	char *end;
	errno = 0;
	long long v = strtoll(a, &end, 10);
	if (!*a || *end || errno || v < 0) {
		reply_problem(out, 400, "after: must be a sequence number >= 0");
		return -1;
	}
	return v;
}

/* ?limit=N for event lists: 0 when absent (all), -1 (and a 400 in out) when malformed. */
int limit_arg(const request *r, response *out)
{
	const char *a = query_arg(r, "limit");
	if (!a)
		return 0;
	char *end;
	errno = 0;
	long v = strtol(a, &end, 10);
	if (!*a || *end || errno || v < 1 || v > 100000) {
		reply_problem(out, 400, "limit: must be between 1 and 100000");
		return -1;
	}
	return (int)v;
}

/* Parses the request body as JSON; on failure fills out and returns its status. */
static int read_json_body(const request *r, response *out, json_t **body)
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

/* The engine thread's answer to a submission: recorded, and the connection resumed. */
static void on_submitted(void *ud, int rc, const char *id, int created, const char *why)
{
	request *r = ud;
	srv *s = r->srv;
	pthread_mutex_lock(&s->post_mu);
	r->post_rc = rc;
	r->post_created = created;
	snprintf(r->post_id, sizeof r->post_id, "%s", id);
	snprintf(r->post_why, sizeof r->post_why, "%s", why);
	r->post_state = 2;
	int suspended = r->post_suspended;
	pthread_mutex_unlock(&s->post_mu);
	/* Outside the lock: until resumed, the connection (and r) stays as it is. */
	if (suspended)
		MHD_resume_connection(r->conn);
}

/* A submission is off the engine's hands (under post_mu): srv_posts_drain may go on. */
static void post_done_locked(srv *s, request *r)
{
	r->post_state = 0;
	if (--s->posts_waiting == 0)
		pthread_cond_broadcast(&s->post_cv);
}

/*
 * A submission is answered only once it is durable, but its thread does not wait for
 * the commit: the connection is suspended until the engine answers (on_submitted), so
 * that a few HTTP threads can carry many submissions into one commit.
 */
int h_workflows_create(srv *s, const request *cr, const char *const *p, response *out)
{
	request *r = (request *)cr; /* its post_ fields: MHD keeps it until the answer is sent */
	json_t *body;
	baton_error err = {0};
	(void)p;
	if (read_json_body(r, out, &body))
		return out->status;
	pthread_mutex_lock(&s->post_mu);
	int closing = s->closing;
	s->posts_waiting += !closing;
	pthread_mutex_unlock(&s->post_mu);
	if (closing) {
		json_decref(body);
		reply_problem(out, 503, "the server is shutting down");
		out->retry_after = 1;
		return 503;
	}
	r->srv = s;
	r->post_state = 1;
	int rc = baton_engine_submit_async(s->engine, body, on_submitted, r, &err);
	json_decref(body);
	if (rc) {
		pthread_mutex_lock(&s->post_mu);
		post_done_locked(s, r);
		pthread_mutex_unlock(&s->post_mu);
		return reply_error(out, &err);
	}
	pthread_mutex_lock(&s->post_mu);
	int waiting = r->post_state == 1;
	if (waiting) {
		r->post_suspended = 1;
		MHD_suspend_connection(r->conn);
	}
	pthread_mutex_unlock(&s->post_mu);
	if (waiting) {
		out->pending = 1;
		return 0;
	}
	return h_workflows_created(s, r, out); /* answered before it could wait */
}

int srv_post_answered(srv *s, request *r)
{
	pthread_mutex_lock(&s->post_mu);
	int answered = r->post_state == 2;
	pthread_mutex_unlock(&s->post_mu);
	return answered;
}

int h_workflows_created(srv *s, request *r, response *out)
{
	baton_error err = {0};
	char id[sizeof r->post_id];
	pthread_mutex_lock(&s->post_mu);
	int rc = r->post_rc, created = r->post_created;
	snprintf(id, sizeof id, "%s", r->post_id);
	snprintf(err.msg, sizeof err.msg, "%s", r->post_why);
	post_done_locked(s, r);
	pthread_mutex_unlock(&s->post_mu);
	out->route = "/workflows";
	if (rc) {
		err.code = rc;
		return reply_error(out, &err);
	}
	json_t *wf;
	if (baton_engine_get(s->engine, id, &wf, &err))
		return reply_error(out, &err);
	if (created)
		snprintf(out->location, sizeof out->location, "/workflows/%s", id);
	return reply_json(out, created ? 201 : 200, wf);
}

void srv_post_abandoned(srv *s, request *r)
{
	pthread_mutex_lock(&s->post_mu);
	if (r->post_state) /* answered, but the connection closed before it was sent */
		post_done_locked(s, r);
	pthread_mutex_unlock(&s->post_mu);
}

void srv_posts_drain(srv *s)
{
	pthread_mutex_lock(&s->post_mu);
	s->closing = 1;
	while (s->posts_waiting > 0)
		pthread_cond_wait(&s->post_cv, &s->post_mu);
	pthread_mutex_unlock(&s->post_mu);
}

int h_workflows_list(srv *s, const request *r, const char *const *p, response *out)
{
	baton_list_query q = {
	    .status = query_arg(r, "status"),
	    .resource = query_arg(r, "resource"),
	    .cursor = query_arg(r, "cursor"),
	};
	const char *limit = query_arg(r, "limit");
	(void)p;
	if (limit) {
		char *end;
		errno = 0;
		long v = strtol(limit, &end, 10);
		if (!*limit || *end || errno || v < 1 || v > 1000)
			return reply_problem(out, 400, "limit: must be between 1 and 1000");
		q.limit = (int)v;
	}
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
	int64_t after = after_arg(r, out);
	if (after < 0)
		return out->status;
	json_t *events;
	baton_error err = {0};
	int stream = srv_wants_stream(r);
	/* A stream first checks that the workflow exists (asking for nothing after the end). */
	int limit = limit_arg(r, out);
	if (limit < 0)
		return out->status;
	if (baton_engine_events(s->engine, p[0], stream ? INT64_MAX : after, limit, &events, &err))
		return reply_error(out, &err);
	if (stream) {
		json_decref(events);
		return srv_stream_start(s, r, 0, p[0], after, out);
	}
	return reply_json(out, 200, events);
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

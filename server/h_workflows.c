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

int h_workflows_create(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *body, *wf = NULL;
	baton_error err = {0};
	int created = 0;
	(void)p;
	if (read_json_body(r, out, &body))
		return out->status;
	int rc = baton_engine_submit(s->engine, body, &wf, &created, &err);
	json_decref(body);
	if (rc)
		return reply_error(out, &err);
	if (created)
		snprintf(out->location, sizeof out->location, "/workflows/%s",
			 json_string_value(json_object_get(wf, "id")));
	return reply_json(out, created ? 201 : 200, wf);
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

/*
 * h_resources.c - handlers of /resources, /nodes and /healthz.
 */
#include "server.h"

#include <limits.h>
#include <string.h>

int h_resources_list(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *list;
	baton_error err = {0};
	long long limit = 0; /* 0: the default */
	(void)p;
	if (query_int(r, "limit", 1, BATON_RESOURCE_PAGE_MAX, &limit, out))
		return out->status;
	const char *sort = query_arg(r, "sort");
	int order = BATON_RESOURCES_BY_NAME;
	if (sort && strcmp(sort, "contention") == 0)
		order = BATON_RESOURCES_BY_CONTENTION;
	else if (sort && strcmp(sort, "name") != 0)
		return reply_problem(out, 400, "sort: \"name\" or \"contention\"");
	if (baton_engine_resources(s->engine, query_arg(r, "cursor"), (int)limit, order, &list,
				   &err))
		return reply_error(out, &err);
	return reply_json(out, 200, list);
}

int h_resource_get(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *res;
	baton_error err = {0};
	(void)r;
	if (baton_engine_resource(s->engine, p[0], &res, &err))
		return reply_error(out, &err);
	return reply_json(out, 200, res);
}

/* ?from=now: *after becomes where the resource's history ends now, so that a list or a
 * stream shows only what happens from here on; 0, or -1 with the problem in out. */
static int from_now(srv *s, const request *r, const char *name, long long *after, response *out)
{
	const char *from = query_arg(r, "from");
	if (!from)
		return 0;
	if (strcmp(from, "now") != 0) {
		reply_problem(out, 400, "from: the only value is \"now\"");
		return -1;
	}
	if (query_arg(r, "after")) {
		reply_problem(out, 400, "from=now and after: give one of them");
		return -1;
	}
	json_t *res;
	baton_error err = {0};
	if (baton_engine_resource(s->engine, name, &res, &err)) {
		reply_error(out, &err);
		return -1;
	}
	*after = json_integer_value(json_object_get(res, "last_event_seq"));
	json_decref(res);
	return 0;
}

int h_resource_events(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *events;
	baton_error err = {0};
	long long after = 0, limit = DEFAULT_EVENT_LIMIT;
	if (query_int(r, "after", 0, LLONG_MAX, &after, out) ||
	    query_int(r, "limit", 1, MAX_EVENT_LIMIT, &limit, out) ||
	    from_now(s, r, p[0], &after, out))
		return out->status;
	int stream = srv_wants_stream(r);
	if (baton_engine_resource_events(s->engine, p[0], stream ? INT64_MAX : after, (int)limit,
					 &events, &err))
		return reply_error(out, &err);
	if (stream) {
		json_decref(events);
		return srv_stream_start(s, r, 1, p[0], after, out);
	}
	return reply_json(out, 200, events);
}

/* Ready: recovery finished (it does before the listener opens) and the last commit
 * succeeded, so the database takes writes. */
int h_readyz(srv *s, const request *r, const char *const *p, response *out)
{
	(void)r;
	(void)p;
	if (!baton_engine_ready(s->engine))
		return reply_problem(out, 503, "not ready: the database is not taking writes");
	/* Answered without a token: whether commits are replicated synchronously, no more. */
	json_t *st = baton_engine_store(s->engine);
	json_t *body = json_pack("{s:s, s:O}", "status", "ready", "sync_replication",
				 json_object_get(st, "sync_replication"));
	json_decref(st);
	return reply_json(out, 200, body);
}

int h_healthz(srv *s, const request *r, const char *const *p, response *out)
{
	(void)s;
	(void)r;
	(void)p;
	return reply_json(out, 200, json_pack("{s:s}", "status", "ok"));
}

/* The cluster's live nodes (this node alone on SQLite). */
int h_nodes(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *nodes;
	baton_error err = {0};
	(void)r;
	(void)p;
	if (baton_engine_nodes(s->engine, &nodes, &err))
		return reply_error(out, &err);
	return reply_json(out, 200, nodes);
}

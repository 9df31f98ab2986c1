/*
 * h_resources.c - handlers of /resources and /healthz.
 */
#include "server.h"

#include <limits.h>

int h_resources_list(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *list;
	baton_error err = {0};
	long long limit = 0; /* 0: the default */
	(void)p;
	if (query_int(r, "limit", 1, BATON_RESOURCE_PAGE_MAX, &limit, out))
		return out->status;
	if (baton_engine_resources(s->engine, query_arg(r, "cursor"), (int)limit, &list, &err))
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

int h_resource_events(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *events;
	baton_error err = {0};
	long long after = 0, limit = DEFAULT_EVENT_LIMIT;
	if (query_int(r, "after", 0, LLONG_MAX, &after, out) ||
	    query_int(r, "limit", 1, MAX_EVENT_LIMIT, &limit, out))
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
	return reply_json(out, 200, json_pack("{s:s}", "status", "ready"));
}

int h_healthz(srv *s, const request *r, const char *const *p, response *out)
{
	(void)s;
	(void)r;
	(void)p;
	return reply_json(out, 200, json_pack("{s:s}", "status", "ok"));
}

/*
 * h_resources.c - handlers of /resources and /healthz.
 */
#include "server.h"

int h_resources_list(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *list;
	baton_error err = {0};
	(void)r;
	(void)p;
	if (baton_engine_resources(s->engine, &list, &err))
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

int h_healthz(srv *s, const request *r, const char *const *p, response *out)
{
	(void)s;
	(void)r;
	(void)p;
	return reply_json(out, 200, json_pack("{s:s}", "status", "ok"));
}

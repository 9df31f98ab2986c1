/*
 * routes.c - the routes table: {method, pattern, handler}. A pattern's "{x}" segments
 * match one path segment and are handed to the handler in order. HEAD is served wherever
 * GET is, by the GET handler (libmicrohttpd sends the head of its answer without the
 * body). A path that matches with another method answers 405 with Allow; no match at all
 * answers 404.
 */
#include "server.h"

#include <string.h>

static const route_def routes[] = {
    {"POST", "/workflows", h_workflows_create},
    {"GET", "/workflows", h_workflows_list},
    {"GET", "/workflows/{id}", h_workflow_get},
    {"DELETE", "/workflows/{id}", h_workflow_delete},
    {"GET", "/workflows/{id}/events", h_workflow_events},
    {"GET", "/workflows/{id}/steps", h_workflow_steps},
    {"POST", "/workflows/{id}/cancel", h_workflow_cancel},
    {"GET", "/resources", h_resources_list},
    {"GET", "/resources/{name}", h_resource_get},
    {"PUT", "/resources/{name}", h_resource_put},
    {"GET", "/resources/{name}/events", h_resource_events},
    {"POST", "/resources/{name}/leases", h_lease_acquire},
    {"GET", "/leases/{id}", h_lease_get},
    {"DELETE", "/leases/{id}", h_lease_release},
    {"POST", "/leases/{id}/renew", h_lease_renew},
    {"POST", "/tasks/claim", h_task_claim},
    {"POST", "/tasks/{id}/heartbeat", h_task_heartbeat},
    {"POST", "/tasks/{id}/complete", h_task_complete},
    {"POST", "/tasks/{id}/fail", h_task_fail},
    {"POST", "/tasks/{id}/give-back", h_task_give_back},
    {"GET", "/healthz", h_healthz},
    {"GET", "/readyz", h_readyz},
    {"GET", "/nodes", h_nodes},
    {"GET", "/metrics", h_metrics},
    {"GET", "/backup", h_backup},
    {"GET", "/", h_ui_redirect},
    {"GET", "/ui", h_ui_redirect},
    {"GET", "/ui/", h_ui_file},
    {"GET", "/ui/{file}", h_ui_file},
    {"GET", "/ui/resources/{name}", h_ui_file},
    {"GET", "/ui/workflows/{id}", h_ui_file},
    {"GET", "/favicon.ico", h_ui_file},
};

/* Matches path against pattern; captured segments are copied into caps. */
static int match(const char *pattern, const char *path, char caps[MAX_PARAMS][MAX_SEGMENT],
		 int *ncaps)
{
	*ncaps = 0;
	while (*pattern && *path) {
		if (*pattern != '/' || *path != '/')
			return 0;
		pattern++;
		path++;
		const char *pe = strchr(pattern, '/'), *se = strchr(path, '/');
		size_t plen = pe ? (size_t)(pe - pattern) : strlen(pattern);
		size_t slen = se ? (size_t)(se - path) : strlen(path);
		if (pattern[0] == '{') {
			if (slen == 0 || slen >= MAX_SEGMENT || *ncaps == MAX_PARAMS)
				return 0;
			memcpy(caps[*ncaps], path, slen);
			caps[(*ncaps)++][slen] = 0;
		} else if (plen != slen || memcmp(pattern, path, slen) != 0) {
			return 0;
		}
		pattern += plen;
		path += slen;
	}
	return *pattern == 0 && *path == 0;
}

const route_def *route_lookup(const char *method, const char *path,
			      char caps[MAX_PARAMS][MAX_SEGMENT], char *allow, size_t allow_len)
{
	int ncaps;
	int head = strcmp(method, "HEAD") == 0;
	allow[0] = 0;
	for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
		if (!match(routes[i].pattern, path, caps, &ncaps))
			continue;
		int get = strcmp(routes[i].method, "GET") == 0;
		if (strcmp(routes[i].method, method) == 0 || (head && get))
			return &routes[i];
		size_t n = strlen(allow);
		snprintf(allow + n, allow_len - n, "%s%s%s", n ? ", " : "", routes[i].method,
			 get ? ", HEAD" : "");
	}
	return NULL;
}

void route(srv *s, const request *r, response *out)
{
	char caps[MAX_PARAMS][MAX_SEGMENT];
	const route_def *rd = route_lookup(r->method, r->path, caps, out->allow, sizeof out->allow);
	if (rd) {
		const char *params[MAX_PARAMS] = {caps[0], caps[1]};
		out->route = rd->pattern;
		rd->handler(s, r, params, out);
		out->allow[0] = 0;
	} else if (out->allow[0]) {
		out->route = "unmatched-method";
		reply_problem(out, 405, "%s is not allowed on %s (allowed: %s)", r->method, r->path,
			      out->allow);
	} else {
		reply_problem(out, 404, "no such path: %s", r->path);
	}
}

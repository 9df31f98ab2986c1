/*
 * calls.c - the fixtures and checks of the HTTP-step suites (see calls.h).
 */
#include "calls.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define WAIT_MS 30000

/* ---- fixtures ------------------------------------------------------------------- */

/*
 * Opens the resource and, when `prefixes` is not NULL, batond allowed to call them (each
 * a path on the resource, "/" for all of it), with the `extra` arguments (at most 4,
 * NULL-terminated) when not NULL. On failure releases what was opened (cmocka runs no
 * calls_teardown after a failed calls_setup).
 */
static int calls_open(void **state, const char *const *prefixes, const char *const *extra)
{
	calls_ctx *c = calloc(1, sizeof *c);
	*state = c;
	c->res = fragile_open();
	if (c->res)
		c->url = fragile_url(c->res, "/op");
	if (!c->res || !prefixes)
		goto out;
	char *urls[4] = {0};
	const char *args[12] = {0};
	size_t n = 0;
	for (size_t i = 0; prefixes[i] && i < 4; i++) {
		urls[i] = fragile_url(c->res, prefixes[i]);
		args[n++] = "--allow-call";
		args[n++] = urls[i];
	}
	for (size_t i = 0; extra && extra[i] && i < 4; i++)
		args[n++] = extra[i];
	c->s = hs_open(args);
	for (size_t i = 0; i < 4; i++)
		free(urls[i]);
out:
	if (c->res && (c->s || !prefixes))
		return 0;
	calls_teardown(state);
	*state = NULL;
	return -1;
}

int calls_setup(void **state)
{
	static const char *const all[] = {"/", NULL};
	return calls_open(state, all, NULL);
}

/* The same with --log-level debug: the most batond ever writes to its log. */
int calls_setup_debug(void **state)
{
	static const char *const all[] = {"/", NULL};
	static const char *const debug[] = {"--log-level", "debug", NULL};
	return calls_open(state, all, debug);
}

/* Two prefixes, one without and one with a trailing slash; plus a batond with none. */
/* The same with --shutdown-timeout 0: SIGTERM cuts running steps off. */
int calls_setup_timeout0(void **state)
{
	static const char *const all[] = {"/", NULL};
	static const char *const timeout0[] = {"--shutdown-timeout", "0", NULL};
	return calls_open(state, all, timeout0);
}

int calls_setup_prefixes(void **state)
{
	static const char *const two[] = {"/api", "/v2/", NULL};
	if (calls_open(state, two, NULL) != 0)
		return -1;
	calls_ctx *c = *state;
	c->bare = hs_open(NULL);
	if (c->bare)
		return 0;
	calls_teardown(state);
	*state = NULL;
	return -1;
}

int calls_setup_resource_only(void **state)
{
	return calls_open(state, NULL, NULL);
}

/* batond first, so that no call is in flight when the resource goes away. */
int calls_teardown(void **state)
{
	calls_ctx *c = *state;
	if (!c)
		return 0;
	int rc = hs_close(c->s);
	if (hs_close(c->bare) != 0)
		rc = -1;
	fragile_close(c->res);
	free(c->url);
	free(c);
	return rc;
}

/* ---- helpers -------------------------------------------------------------------- */

char *calls_key_of(const char *wf_id, int step)
{
	char *k = NULL;
	assert_true(asprintf(&k, "%s/%d", wf_id, step) > 0);
	return k;
}

/* A retry policy with a short backoff: the first retry after first_ms, then twice as long. */
json_t *calls_quick_retry(int first_ms)
{
	return json_pack("{s:i, s:f, s:i}", "first_retry_ms", first_ms, "backoff", 2.0,
			 "max_delay_ms", 2000);
}

/*
 * A workflow `id` on `resource` whose workflow-level call posts to `url` and whose
 * `n` workers are named "w0".."w<n-1>", each with its own call body {"n": i}.
 */
json_t *calls_workflow(const char *id, const char *url, int n, json_t *retry)
{
	json_t *workers = json_array();
	for (int i = 0; i < n; i++) {
		char name[32];
		snprintf(name, sizeof name, "w%d", i);
		json_array_append_new(
		    workers, json_pack("{s:s, s:{s:{s:i}}}", "name", name, "call", "body", "n", i));
	}
	json_t *body = json_pack("{s:s, s:s, s:o, s:{s:s}}", "id", id, "resource", "gateway",
				 "workers", workers, "call", "url", url);
	if (retry)
		json_object_set_new(body, "retry", retry);
	return body;
}

/* Creates `body` (stolen) and returns nothing; asserts 201. */
void calls_create(const hs_server *s, json_t *body)
{
	json_decref(hs_create_workflow(s, body));
}

void calls_submit_gated(calls_ctx *c, const char *id, const char *resource, int steps)
{
	fragile_push(c->res, (fragile_action){.status = 200, .gated = true});
	json_t *workers = json_array();
	json_array_append_new(workers,
			      json_pack("{s:s, s:{s:s}}", "name", "holder", "call", "url", c->url));
	for (int i = 1; i < steps; i++) {
		char name[32];
		snprintf(name, sizeof name, "w%d", i);
		json_array_append_new(workers,
				      json_pack("{s:s, s:i}", "name", name, "work_ms", 10));
	}
	calls_create(
	    c->s, json_pack("{s:s, s:s, s:o}", "id", id, "resource", resource, "workers", workers));
}

/* Fails the test unless the resource never saw an overlap, a stale token or a bad request. */
void calls_assert_sound(fragile *res)
{
	fragile_stats st;
	fragile_get_stats(res, &st);
	if (st.overlaps || st.stale || st.bad || st.max_in_flight > 1)
		fail_msg(
		    "the resource saw %zu overlapping requests (at most %zu at once), %zu stale"
		    " tokens, %zu bad requests",
		    st.overlaps, st.max_in_flight, st.stale, st.bad);
}

void calls_dump_records(const fragile_record *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, "  #%zu %s %s key=%s token=%lld attempt=%s -> %d %s\n", r[i].seq,
			r[i].method, r[i].path, r[i].idempotency_key ? r[i].idempotency_key : "-",
			r[i].token, r[i].attempt ? r[i].attempt : "-", r[i].status,
			fragile_outcome_name(r[i].outcome));
}

/* The resource's records, asserting there are exactly `want`. Free with fragile_records_free. */
fragile_record *calls_records_exactly(fragile *res, size_t want)
{
	size_t n;
	fragile_record *r = fragile_records(res, &n);
	if (n != want) {
		calls_dump_records(r, n);
		fail_msg("the resource saw %zu requests, expected %zu", n, want);
	}
	return r;
}

/* Value of header `name` in a record's "Name: value\n" lines, or NULL; caller frees. */
char *calls_record_header(const fragile_record *r, const char *name)
{
	size_t len = strlen(name);
	for (const char *line = r->headers; line && *line;) {
		const char *eol = strchr(line, '\n');
		if (strncasecmp(line, name, len) == 0 && line[len] == ':')
			return strndup(line + len + 2, (size_t)(eol - line) - len - 2);
		line = eol ? eol + 1 : "";
	}
	return NULL;
}

/* Asserts the HTTP fields an attempt's event carries: method, url, latency, status. */
void calls_assert_event(const json_t *ev, const char *what, const char *method, const char *url,
			int http_status)
{
	if (!ev)
		fail_msg("missing event: %s", what);
	assert_string_equal(hs_str(ev, "method"), method);
	assert_string_equal(hs_str(ev, "url"), url);
	assert_true(hs_int(ev, "latency_ms") >= 0);
	json_t *hs = json_object_get(ev, "http_status");
	if (http_status)
		assert_int_equal(json_integer_value(hs), http_status);
	else if (!json_is_null(hs))
		fail_msg("%s: http_status should be null (no answer), got %lld", what,
			 (long long)json_integer_value(hs));
}

bool calls_contains(const char *hay, const char *needle)
{
	return hay && strstr(hay, needle) != NULL;
}

/*
 * calls.h - what the HTTP-step suites (test_calls.c, test_call_policy.c) share: a
 * fragile resource (fragile.h) with a batond allowed to call it, workflows whose steps
 * call it, and the checks on what the resource saw.
 */
#ifndef BATON_TEST_CALLS_H
#define BATON_TEST_CALLS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "fragile.h"
#include "harness.h"

typedef struct calls_ctx {
	fragile *res;
	hs_server *s;	 /* batond allowed to call the resource */
	hs_server *bare; /* batond without --allow-call (only in some tests) */
	char *url;	 /* the resource's operation URL, http://127.0.0.1:PORT/op */
} calls_ctx;

/* cmocka fixtures; state is a calls_ctx. */
int calls_setup(void **state);		     /* batond may call all of the resource */
int calls_setup_debug(void **state);	     /* the same at --log-level debug */
int calls_setup_timeout0(void **state);	     /* the same with --shutdown-timeout 0 */
int calls_setup_prefixes(void **state);	     /* "/api" and "/v2/" only, and a bare batond */
int calls_setup_resource_only(void **state); /* the resource, no batond */
int calls_teardown(void **state);

char *calls_key_of(const char *wf_id, int step); /* "<id>/<step>", malloc'ed */
/* A retry policy with a short backoff: the first retry after first_ms, then twice as long. */
json_t *calls_quick_retry(int first_ms);
/* A workflow `id` on "gateway" whose workflow-level call posts to `url` and whose `n`
 * workers are named "w0".."w<n-1>", each with its own call body {"n": i}; retry (stolen)
 * may be NULL. */
json_t *calls_workflow(const char *id, const char *url, int n, json_t *retry);
void calls_create(const hs_server *s, json_t *body); /* body stolen; asserts 201 */
/*
 * Submits workflow `id` on `resource` whose first worker ("holder") calls the resource
 * with a gated action (fragile_action.gated): it holds `resource` until the test calls
 * fragile_open_gate, however slow the machine; the `steps - 1` others work 10 ms each.
 */
void calls_submit_gated(calls_ctx *c, const char *id, const char *resource, int steps);
/* Fails the test unless the resource never saw an overlap, a stale token or a bad request. */
void calls_assert_sound(fragile *res);
void calls_dump_records(const fragile_record *r, size_t n);
/* The resource's records, asserting there are exactly `want`. Free with fragile_records_free. */
fragile_record *calls_records_exactly(fragile *res, size_t want);
/* Value of header `name` in a record's "Name: value\n" lines, or NULL; caller frees. */
char *calls_record_header(const fragile_record *r, const char *name);
/* Asserts the HTTP fields an attempt's event carries: method, url, latency, status (0:
 * no answer, null). */
void calls_assert_event(const json_t *ev, const char *what, const char *method, const char *url,
			int http_status);
bool calls_contains(const char *hay, const char *needle);

#endif

/*
 * test_workflow_api.c - the workflow resources of the API, over HTTP against the real
 * binary: idempotent submission (a re-POST of the same id and definition answers 200, a
 * different one 409, and nothing runs twice), generated ids, listing with filters and
 * cursor paging, 404 and 405.
 *
 * Each test starts its own batond on a fresh temporary database (harness.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/calls.h"
#include "../harness/harness.h"

#define WAIT_MS 30000

/* POSTs `text` and returns the response (the caller finishes it). */
static hs_response post_text(hs_server *s, const char *text)
{
	hs_response r;
	hs_post(s, "/workflows", text, &r);
	return r;
}

/*
 * Re-posting an id: the same (normalized) definition gives 200 and the stored workflow,
 * without a second run; any different definition gives 409 and changes nothing.
 */
static void test_repost_same_id(void **state)
{
	hs_server *s = *state;
	static const char original[] =
	    "{\"id\":\"order-42\",\"resource\":\"till\","
	    "\"workers\":[\"worker-A\",{\"name\":\"worker-B\",\"work_ms\":20}]}";
	hs_response r = post_text(s, original);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	json_t *stored = hs_wait_workflow(s, "order-42", "completed", WAIT_MS);

	char explicit_defaults[1024];
	snprintf(explicit_defaults, sizeof explicit_defaults,
		 "{\"on_failure\":\"fail\",\"workers\":[{\"name\":\"worker-A\",\"work_ms\":%d,"
		 "\"fail_attempts\":0},{\"work_ms\":20,\"name\":\"worker-B\"}],"
		 "\"retry\":{\"max_attempts\":10,\"first_retry_ms\":2000,\"backoff\":2.0,"
		 "\"max_delay_ms\":30000},\"resource\":\"till\",\"id\":\"order-42\"}",
		 hs_default_work_ms("worker-A"));
	/* the deprecated spelling of the default first retry: 1000 ms times the backoff */
	static const char deprecated_defaults[] =
	    "{\"id\":\"order-42\",\"resource\":\"till\",\"retry\":{\"initial_delay_ms\":1000},"
	    "\"workers\":[\"worker-A\",{\"name\":\"worker-B\",\"work_ms\":20}]}";
	const char *same[] = {original, explicit_defaults, deprecated_defaults};
	for (size_t i = 0; i < 3; i++) {
		r = post_text(s, same[i]);
		if (r.status != 200)
			fail_msg("re-POST of the same definition %s: %ld %s, expected 200", same[i],
				 r.status, r.body ? r.body : "");
		if (!json_equal(r.json, stored))
			fail_msg("re-POST answered %s, not the stored workflow", r.body);
		hs_response_fini(&r);
	}

	static const char *const conflicting[] = {
	    "{\"id\":\"order-42\",\"resource\":\"other\","
	    "\"workers\":[\"worker-A\",{\"name\":\"worker-B\",\"work_ms\":20}]}",
	    "{\"id\":\"order-42\",\"resource\":\"till\","
	    "\"workers\":[{\"name\":\"worker-B\",\"work_ms\":20},\"worker-A\"]}",
	    "{\"id\":\"order-42\",\"resource\":\"till\","
	    "\"workers\":[\"worker-A\",{\"name\":\"worker-B\",\"work_ms\":21}]}",
	    "{\"id\":\"order-42\",\"resource\":\"till\","
	    "\"workers\":[\"worker-A\",{\"name\":\"worker-B\",\"work_ms\":20,\"fail_attempts\":1}]"
	    "}",
	    "{\"id\":\"order-42\",\"resource\":\"till\",\"workers\":[\"worker-A\","
	    "{\"name\":\"worker-B\",\"work_ms\":20},\"worker-C\"]}",
	    "{\"id\":\"order-42\",\"resource\":\"till\","
	    "\"workers\":[\"worker-A\",{\"name\":\"worker-B\",\"work_ms\":20}],"
	    "\"retry\":{\"max_attempts\":3}}",
	    "{\"id\":\"order-42\",\"resource\":\"till\","
	    "\"workers\":[\"worker-A\",{\"name\":\"worker-B\",\"work_ms\":20}],"
	    "\"on_failure\":\"continue\"}",
	};
	for (size_t i = 0; i < sizeof conflicting / sizeof conflicting[0]; i++) {
		r = post_text(s, conflicting[i]);
		hs_assert_problem(&r, 409, "conflict", conflicting[i]);
		hs_response_fini(&r);
	}
	json_t *now = hs_get_workflow(s, "order-42");
	assert_true(json_equal(now, stored));
	assert_int_equal(hs_db_count(s, "SELECT count(*) FROM workflows"), 1);

	/* A re-POST while the workflow runs does not start it again. */
	static const char running[] = "{\"id\":\"order-43\",\"resource\":\"till\","
				      "\"workers\":[{\"name\":\"slow\",\"work_ms\":400}]}";
	r = post_text(s, running);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	r = post_text(s, running);
	assert_int_equal(r.status, 200);
	assert_string_equal(hs_str(r.json, "id"), "order-43");
	hs_response_fini(&r);
	json_decref(hs_wait_workflow(s, "order-43", "completed", WAIT_MS));
	json_t *events = hs_get_events(s, "order-43");
	assert_int_equal(hs_event_count(events, "workflow_submitted", -1, -1), 1);
	assert_int_equal(hs_event_count(events, "lock_acquired", -1, -1), 1);
	assert_int_equal(hs_db_count(s, "SELECT count(*) FROM workflows"), 2);

	json_decref(events);
	json_decref(now);
	json_decref(stored);
}

/* POSTs a one-worker workflow `id` with retry policy `retry` (JSON text); asserts 201 and
 * returns the retry policy it shows (new reference). */
static json_t *created_retry(hs_server *s, const char *id, const char *retry)
{
	char body[512];
	snprintf(body, sizeof body,
		 "{\"id\":\"%s\",\"resource\":\"alias\",\"workers\":[{\"name\":\"w\","
		 "\"work_ms\":0}],\"retry\":%s}",
		 id, retry);
	hs_response r = post_text(s, body);
	if (r.status != 201)
		fail_msg("POST %s: %ld %s, expected 201", body, r.status, r.body ? r.body : "");
	json_t *policy = json_incref(json_object_get(r.json, "retry"));
	hs_response_fini(&r);
	assert_null(json_object_get(policy, "initial_delay_ms"));
	return policy;
}

/*
 * initial_delay_ms, the deprecated name, keeps its meaning (the first retry came after
 * initial_delay_ms * backoff): it is taken as first_retry_ms = initial_delay_ms * backoff,
 * rounded and at most 86400000, and shown as first_retry_ms; first_retry_ms is taken as
 * given. Both at once are refused, naming both, and nothing is created.
 */
static void test_initial_delay_ms_is_an_alias(void **state)
{
	hs_server *s = *state;
	static const struct {
		const char *id, *retry;
		json_int_t first;
	} cases[] = {
	    {"old-default", "{\"initial_delay_ms\":1000}", 2000},
	    {"old-flat", "{\"initial_delay_ms\":300,\"backoff\":1.0}", 300},
	    {"old-rounded", "{\"initial_delay_ms\":333,\"backoff\":1.5}", 500},
	    {"old-capped", "{\"initial_delay_ms\":86400000,\"backoff\":3}", 86400000},
	    {"new", "{\"first_retry_ms\":333,\"backoff\":1.5}", 333},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *policy = created_retry(s, cases[i].id, cases[i].retry);
		if (hs_int(policy, "first_retry_ms") != cases[i].first)
			fail_msg("retry %s shows first_retry_ms %lld, expected %lld",
				 cases[i].retry, (long long)hs_int(policy, "first_retry_ms"),
				 (long long)cases[i].first);
		json_decref(policy);
	}
	hs_response r = post_text(s, "{\"id\":\"both\",\"resource\":\"alias\",\"workers\":"
				     "[\"w\"],\"retry\":{\"first_retry_ms\":2000,"
				     "\"initial_delay_ms\":1000}}");
	hs_assert_problem(&r, 400, "invalid-request", "both retry fields");
	const char *detail = hs_str(r.json, "detail");
	if (!strstr(detail, "first_retry_ms") || !strstr(detail, "initial_delay_ms"))
		fail_msg("the refusal of both fields does not name both: %s", detail);
	hs_response_fini(&r);
	json_t *gone = hs_get_json(s, "/workflows/both", 404);
	json_decref(gone);
}

static bool is_hex32(const char *id)
{
	if (strlen(id) != 32)
		return false;
	for (const char *p = id; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

/* Without an id, batond generates 32 lowercase hex characters, different each time. */
static void test_generated_ids(void **state)
{
	hs_server *s = *state;
	char *ids[4];
	for (size_t i = 0; i < 4; i++) {
		json_t *wf =
		    hs_create_workflow(s, json_pack("{s:s, s:[{s:s, s:i}]}", "resource", "ids",
						    "workers", "name", "w", "work_ms", 0));
		ids[i] = strdup(hs_str(wf, "id"));
		if (!is_hex32(ids[i]))
			fail_msg("generated id \"%s\" is not 32 lowercase hex characters", ids[i]);
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(ids[i], ids[j]);
		json_decref(wf);
	}
	for (size_t i = 0; i < 4; i++) {
		json_decref(hs_wait_workflow(s, ids[i], "completed", WAIT_MS));
		free(ids[i]);
	}
}

/* GET `path` and returns the ids of its "workflows", comma-joined; *cursor gets next_cursor. */
static char *list_ids(hs_server *s, const char *path, char **cursor)
{
	json_t *doc = hs_get_json(s, path, 200);
	json_t *items = json_object_get(doc, "workflows");
	assert_true(json_is_array(items));
	json_t *next = json_object_get(doc, "next_cursor");
	assert_true(json_is_null(next) || json_is_string(next));
	if (cursor)
		*cursor = json_is_string(next) ? strdup(json_string_value(next)) : NULL;
	else
		assert_true(json_is_null(next));
	size_t cap = 1;
	for (size_t k = 0; k < json_array_size(items); k++)
		cap += strlen(hs_str(json_array_get(items, k), "id")) + 1;
	char *out = calloc(1, cap);
	int64_t prev = INT64_MAX;
	size_t i;
	json_t *it;
	json_array_foreach(items, i, it)
	{
		static const char *const keys[] = {"id",	  "resource",	    "status",
						   "created_at",  "started_at",	    "finished_at",
						   "steps_total", "steps_completed"};
		for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
			if (!json_object_get(it, keys[k]))
				fail_msg("GET %s: item without \"%s\"", path, keys[k]);
		hs_time_or_null(it, "started_at");
		hs_time_or_null(it, "finished_at");
		hs_int(it, "steps_total");
		hs_int(it, "steps_completed");
		int64_t created = hs_time(it, "created_at");
		assert_true(created <= prev); /* newest first */
		prev = created;
		if (i > 0)
			strcat(out, ",");
		strcat(out, hs_str(it, "id"));
	}
	json_decref(doc);
	return out;
}

/*
 * Pages through `base` with `limit`, following next_cursor; returns all ids joined.
 * When `insert_after_first` is set, POSTs it after the first page.
 */
static char *page_all(hs_server *s, const char *base, int limit, const char *insert_after_first)
{
	char *all = calloc(1, 4096), *cursor = NULL;
	for (int page = 0; page < 50; page++) {
		char path[1024];
		char sep = strchr(base, '?') ? '&' : '?';
		if (cursor) {
			char *escaped = hs_url_escape(cursor);
			snprintf(path, sizeof path, "%s%climit=%d&cursor=%s", base, sep, limit,
				 escaped);
			free(escaped);
		} else
			snprintf(path, sizeof path, "%s%climit=%d", base, sep, limit);
		free(cursor);
		char *ids = list_ids(s, path, &cursor);
		size_t n = *ids ? 1 : 0;
		for (const char *p = ids; *p; p++)
			n += *p == ',';
		assert_true(n <= (size_t)limit);
		if (strlen(all) + strlen(ids) + 2 > 4096)
			fail_msg("paging %s returned more than it could hold: [%s]", base, all);
		if (*ids) {
			if (*all)
				strcat(all, ",");
			strcat(all, ids);
		}
		free(ids);
		if (page == 0 && insert_after_first) {
			/* A workflow created between pages must not shift the next pages. */
			hs_response r;
			hs_post(s, "/workflows", insert_after_first, &r);
			assert_int_equal(r.status, 201);
			hs_response_fini(&r);
		}
		if (!cursor)
			return all;
	}
	fail_msg("paging %s did not end after 50 pages", base);
	return all;
}

static void post_ok(hs_server *s, const char *id, const char *resource, const char *workers,
		    const char *extra)
{
	char body[1024];
	snprintf(body, sizeof body, "{\"id\":\"%s\",\"resource\":\"%s\",\"workers\":%s%s}", id,
		 resource, workers, extra ? extra : "");
	hs_response r;
	hs_post(s, "/workflows", body, &r);
	if (r.status != 201)
		fail_msg("POST %s: %ld %s", body, r.status, r.body ? r.body : "");
	hs_response_fini(&r);
}

/*
 * GET /workflows: newest first, status and resource filters, limit, stable cursor paging.
 * wf-07 stays running through every query: its call is held by the test resource until
 * the end (calls_submit_gated), however slow the machine.
 */
static void test_list_filters_and_paging(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	static const char quick[] = "[{\"name\":\"w\",\"work_ms\":0}]";
	post_ok(s, "wf-01", "list-a", quick, NULL);
	post_ok(s, "wf-02", "list-a", quick, NULL);
	post_ok(s, "wf-03", "list-a", quick, NULL);
	post_ok(s, "wf-04", "list-b", quick, NULL);
	post_ok(s, "wf-05", "list-b", quick, NULL);
	post_ok(s, "wf-06", "list-c", "[{\"name\":\"w\",\"work_ms\":0,\"fail_attempts\":1}]",
		",\"retry\":{\"max_attempts\":1}");
	static const char *const done[] = {"wf-01", "wf-02", "wf-03", "wf-04", "wf-05"};
	for (size_t i = 0; i < 5; i++)
		json_decref(hs_wait_workflow(s, done[i], "completed", WAIT_MS));
	json_decref(hs_wait_workflow(s, "wf-06", "failed", WAIT_MS));
	calls_submit_gated(c, "wf-07", "list-d", 1);
	json_decref(hs_wait_workflow(s, "wf-07", "running", WAIT_MS));
	post_ok(s, "wf-08", "list-d", quick, NULL);
	post_ok(s, "wf-09", "list-d", quick, NULL);
	hs_response r;
	hs_post(s, "/workflows/wf-09/cancel", NULL, &r);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);
	json_t *pending = hs_get_workflow(s, "wf-08");
	assert_string_equal(hs_str(pending, "status"), "pending");
	json_decref(pending);

	static const struct {
		const char *query, *want;
	} cases[] = {
	    {"/workflows", "wf-09,wf-08,wf-07,wf-06,wf-05,wf-04,wf-03,wf-02,wf-01"},
	    {"/workflows?status=completed", "wf-05,wf-04,wf-03,wf-02,wf-01"},
	    {"/workflows?status=failed", "wf-06"},
	    {"/workflows?status=running", "wf-07"},
	    {"/workflows?status=pending", "wf-08"},
	    {"/workflows?status=cancelled", "wf-09"},
	    {"/workflows?resource=list-a", "wf-03,wf-02,wf-01"},
	    {"/workflows?resource=list-d&status=pending", "wf-08"},
	    {"/workflows?status=completed&resource=list-b", "wf-05,wf-04"},
	    {"/workflows?resource=nothing-here", ""},
	    {"/workflows?limit=1000", "wf-09,wf-08,wf-07,wf-06,wf-05,wf-04,wf-03,wf-02,wf-01"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *got = list_ids(s, cases[i].query, NULL);
		if (strcmp(got, cases[i].want) != 0)
			fail_msg("GET %s listed [%s], expected [%s]", cases[i].query, got,
				 cases[i].want);
		free(got);
	}
	json_t *doc = hs_get_json(s, "/workflows?resource=list-c", 200);
	json_t *item = json_array_get(json_object_get(doc, "workflows"), 0);
	assert_string_equal(hs_str(item, "status"), "failed");
	assert_int_equal(hs_int(item, "steps_total"), 1);
	assert_int_equal(hs_int(item, "steps_completed"), 0);
	json_decref(doc);

	/* Pages of 2 give the same list; a workflow created meanwhile does not disturb them. */
	char *paged = page_all(s, "/workflows?resource=list-a&status=completed", 2, NULL);
	assert_string_equal(paged, "wf-03,wf-02,wf-01");
	free(paged);
	paged = page_all(s, "/workflows", 2,
			 "{\"id\":\"wf-10\",\"resource\":\"list-d\",\"workers\":[\"w\"]}");
	assert_string_equal(paged, "wf-09,wf-08,wf-07,wf-06,wf-05,wf-04,wf-03,wf-02,wf-01");
	free(paged);
	paged = page_all(s, "/workflows?status=completed", 1, NULL);
	assert_string_equal(paged, "wf-05,wf-04,wf-03,wf-02,wf-01");
	free(paged);

	fragile_open_gate(c->res);
	json_decref(hs_wait_workflow(s, "wf-08", "completed", WAIT_MS));
	json_decref(hs_wait_workflow(s, "wf-10", "completed", WAIT_MS));
}

/* Unknown ids and paths: 404 problem documents; /healthz answers ok. */
static void test_not_found(void **state)
{
	hs_server *s = *state;
	json_t *health = hs_get_json(s, "/healthz", 200);
	assert_string_equal(hs_str(health, "status"), "ok");
	json_decref(health);
	post_ok(s, "known", "nf", "[{\"name\":\"w\",\"work_ms\":0}]", NULL);

	static const struct {
		const char *method, *path;
	} cases[] = {
	    {"GET", "/workflows/no-such-workflow"},
	    {"GET", "/workflows/no-such-workflow/events"},
	    {"POST", "/workflows/no-such-workflow/cancel"},
	    {"GET", "/resources/never-used"},
	    {"GET", "/index.html"}, /* GET / redirects to the console (test_console) */
	    {"GET", "/nope"},
	    {"GET", "/workflows/known/nope"},
	    {"GET", "/workflows/known/events/1"},
	    {"POST", "/workflows/known/cancel/now"},
	    {"GET", "/resources/nf/waiters"},
	    {"GET", "/healthz/deep"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		hs_request req = {.method = cases[i].method, .path = cases[i].path};
		hs_response r;
		hs_send(s, &req, &r);
		char what[256];
		snprintf(what, sizeof what, "%s %s", cases[i].method, cases[i].path);
		hs_assert_problem(&r, 404, "not-found", what);
		hs_response_fini(&r);
	}
	json_decref(hs_wait_workflow(s, "known", "completed", WAIT_MS));
}

/* Known paths with a method they do not serve: 405 with the right Allow header. */
static void test_method_not_allowed(void **state)
{
	hs_server *s = *state;
	post_ok(s, "m1", "mna", "[{\"name\":\"w\",\"work_ms\":0}]", NULL);
	json_decref(hs_wait_workflow(s, "m1", "completed", WAIT_MS));
	static const struct {
		const char *method, *path, *allow;
	} cases[] = {
	    {"DELETE", "/workflows", "GET, HEAD, POST"},
	    {"PUT", "/workflows", "GET, HEAD, POST"},
	    {"PATCH", "/workflows", "GET, HEAD, POST"},
	    {"PATCH", "/workflows/m1", "GET, HEAD, DELETE"},
	    {"POST", "/workflows/m1", "GET, HEAD, DELETE"},
	    {"PUT", "/workflows/m1", "GET, HEAD, DELETE"},
	    {"GET", "/workflows/m1/cancel", "POST"},
	    {"DELETE", "/workflows/m1/cancel", "POST"},
	    {"POST", "/workflows/m1/events", "GET, HEAD"},
	    {"POST", "/resources", "GET, HEAD"},
	    {"DELETE", "/resources/mna", "GET, HEAD, PUT"},
	    {"POST", "/healthz", "GET, HEAD"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		bool post = strcmp(cases[i].method, "POST") == 0;
		hs_request req = {.method = cases[i].method,
				  .path = cases[i].path,
				  .content_type = post ? "application/json" : NULL,
				  .body = post ? "{}" : NULL,
				  .body_len = post ? 2 : 0};
		hs_response r;
		hs_send(s, &req, &r);
		char what[256];
		snprintf(what, sizeof what, "%s %s", cases[i].method, cases[i].path);
		hs_assert_problem(&r, 405, "method-not-allowed", what);
		hs_assert_allow(&r, cases[i].allow);
		hs_response_fini(&r);
	}
	assert_int_equal(hs_db_count(s, "SELECT count(*) FROM workflows"), 1);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_repost_same_id, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_initial_delay_ms_is_an_alias, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_generated_ids, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_list_filters_and_paging, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_not_found, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_method_not_allowed, hs_setup, hs_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

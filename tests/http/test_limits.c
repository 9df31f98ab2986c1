/*
 * test_limits.c - what bounds batond's memory and its answers, against the real binary:
 * the cache of finished workflows stays within --cache-bytes, an event stream whose
 * buffer cannot take the next event ends with an error event and a client that resumes
 * with Last-Event-ID gets every event exactly once; every list and history has a
 * default page size, a maximum and a next page (GET /resources, the event lists, a
 * workflow's steps), and the client follows them; a workflow's results together are
 * capped, and the step that would pass the cap fails alone.
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

#include <curl/curl.h>

#include "../harness/calls.h"
#include "../harness/client.h"
#include "../harness/harness.h"
#include "../harness/prom.h"
#include "../harness/sse.h"

#define WAIT_MS 60000

/* ---- helpers ------------------------------------------------------------------------ */

static int open_with(void **state, const char *const *args)
{
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

/* A workflow `id` on `resource` of n workers that take no time, with names of `pad`
 * characters (so that its answers have a known order of size). */
static void submit(const hs_server *s, const char *id, const char *resource, int n, int pad)
{
	json_t *workers = json_array();
	for (int i = 0; i < n; i++) {
		char name[160];
		snprintf(name, sizeof name, "w%d-%.*s", i, pad,
			 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
			 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
		json_array_append_new(workers, json_pack("{s:s, s:i}", "name", name, "work_ms", 0));
	}
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:o}", "id", id, "resource", resource, "workers", workers)));
}

/* ---- the cache of finished workflows ----------------------------------------------- */

static int setup_small_cache(void **state)
{
	static const char *const args[] = {"--cache-bytes", "65536", NULL};
	return open_with(state, args);
}

/*
 * 60 finished workflows of about 2.5 KB of text each, each read three times (the later
 * reads come from the cache when the workflow is in it): the answers are the same each
 * time, the cache holds something, and never more than --cache-bytes (64 KB, far less
 * than the 150 KB the workflows take together). A workflow larger than an eighth of the
 * budget (about 14 KB) is served but not kept.
 */
static void test_finished_cache_bounded_by_bytes(void **state)
{
	hs_server *s = *state;
	enum { N = 60 };
	char id[32];
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "c%d", i);
		submit(s, id, "cache", 4, 40);
	}
	submit(s, "big", "cache", 20, 100); /* about 14 KB: more than 65536 / 8 */
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "c%d", i);
		json_decref(hs_wait_workflow(s, id, "completed", WAIT_MS));
	}
	json_decref(hs_wait_workflow(s, "big", "completed", WAIT_MS));
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i <= N; i++) {
			snprintf(id, sizeof id, i < N ? "c%d" : "big", i);
			json_t *first = hs_get_workflow(s, id);
			json_t *again = hs_get_workflow(s, id);
			assert_true(json_equal(first, again));
			assert_string_equal(hs_str(again, "status"), "completed");
			json_decref(first);
			json_decref(again);
			json_t *doc = prom_scrape(s);
			double bytes = prom_metric(doc, "baton_finished_cache_bytes", "");
			json_decref(doc);
			if (bytes > 65536)
				fail_msg("the cache holds %.0f bytes, past --cache-bytes 65536",
					 bytes);
			if (bytes <= 0)
				fail_msg("the cache holds nothing after reading %s twice", id);
		}
	}
}

/* ---- an event stream's buffer ------------------------------------------------------- */

static int setup_small_stream_buffer(void **state)
{
	static const char *const args[] = {"--stream-buffer", "4096", NULL};
	return open_with(state, args);
}

typedef struct resumed {
	sse *st;
	size_t want; /* a resource's stream never ends: done once this many arrived */
} resumed;

static bool ended_or_complete(void *arg)
{
	resumed *r = arg;
	return r->st->done || (r->want && sse_count(r->st) >= r->want);
}

/*
 * Reads a stream as an EventSource would: from the start, then after each end with an
 * error event again with Last-Event-ID set to the last event received, until a
 * connection ends without one (a workflow's) or `want` events arrived in all (a
 * resource's, 0 for a workflow's). Returns the events in order; *ends: error events.
 */
static json_t *follow_with_resumes(CURLM *m, const hs_server *s, const char *path, size_t want,
				   int *ends)
{
	json_t *all = json_array();
	long long last = 0;
	*ends = 0;
	for (int attempt = 0; attempt < 1000; attempt++) {
		char hdr[64];
		snprintf(hdr, sizeof hdr, "Last-Event-ID: %lld", last);
		const char *const headers[] = {SSE_ACCEPT, hdr, NULL};
		resumed r = {sse_open(m, s, path, headers), want ? want - json_array_size(all) : 0};
		if (!sse_pump_until(m, ended_or_complete, &r, WAIT_MS))
			fail_msg("stream %d did not end (%zu events)", attempt, sse_count(r.st));
		sse_assert_ok(r.st, "a stream with a small buffer");
		for (size_t i = 0; i < sse_count(r.st); i++)
			json_array_append(all, sse_data(r.st, i));
		if (sse_count(r.st))
			last = r.st->last_id;
		int ended_by_error = r.st->error_events;
		if (ended_by_error && sse_count(r.st) == 0)
			fail_msg("a stream ended with an error before any event (after %lld):"
				 " it can never move on",
				 last);
		sse_close(m, r.st);
		if (!ended_by_error || (want && json_array_size(all) >= want))
			return all;
		(*ends)++;
	}
	fail_msg("the stream never ended without an error");
	return all;
}

/*
 * With --stream-buffer 4096, a finished workflow of 30 steps (about 100 events of
 * 200-400 bytes) cannot be formatted in one buffer: the event that does not fit is
 * taken out again, the stream sends those before it and ends with "event: error" (no
 * id). A client that resumes with Last-Event-ID, as many times as it takes, has
 * received exactly the events of GET /workflows/{id}/events, each once, in order: the
 * path an allocation failure takes skips nothing. The same holds for a live workflow
 * whose stream is opened before its steps run, and for a resource's stream.
 */
static void test_stream_buffer_full_ends_with_error_and_resumes(void **state)
{
	hs_server *s = *state;
	CURLM *m = curl_multi_init();
	submit(s, "done", "buffered", 30, 20);
	json_decref(hs_wait_workflow(s, "done", "completed", WAIT_MS));
	int ends;
	json_t *got = follow_with_resumes(m, s, "/workflows/done/events", 0, &ends);
	json_t *events = hs_get_events(s, "done");
	if (ends < 2)
		fail_msg("only %d streams ended with an error: the buffer cap was not reached",
			 ends);
	if (!json_equal(got, events))
		fail_msg("the resumed streams brought %zu events, the workflow has %zu",
			 json_array_size(got), json_array_size(events));
	json_decref(got);
	json_decref(events);

	/* The resource's history the same way (its stream never ends by itself: read until
	 * every event of its history arrived). */
	json_t *history = hs_get_json(s, "/resources/buffered/events?limit=1000", 200);
	json_t *want = json_object_get(history, "events");
	json_t *seen =
	    follow_with_resumes(m, s, "/resources/buffered/events", json_array_size(want), &ends);
	assert_true(ends >= 2);
	assert_true(json_equal(seen, want));
	json_decref(seen);
	json_decref(history);

	/* Live: the stream is open before the workflow's steps run. */
	submit(s, "live", "buffered", 30, 20);
	got = follow_with_resumes(m, s, "/workflows/live/events", 0, &ends);
	json_decref(hs_wait_workflow(s, "live", "completed", WAIT_MS));
	events = hs_get_events(s, "live");
	assert_true(json_equal(got, events));
	json_decref(got);
	json_decref(events);
	curl_multi_cleanup(m);
}

/* ---- pages -------------------------------------------------------------------------- */

static void expect_400(const hs_server *s, const char *path)
{
	hs_response r;
	hs_get(s, path, &r);
	hs_assert_problem(&r, 400, "invalid-request", path);
	hs_response_fini(&r);
}

/* GET /resources page by page (limit 0: the default) until next_cursor is null; returns
 * the names in order; *pages counts the answers. */
static json_t *resource_names(const hs_server *s, int limit, int *pages)
{
	json_t *names = json_array();
	char path[400] = "/resources";
	if (limit)
		snprintf(path, sizeof path, "/resources?limit=%d", limit);
	for (*pages = 1;; (*pages)++) {
		json_t *doc = hs_get_json(s, path, 200);
		json_t *list = json_object_get(doc, "resources"), *r;
		size_t i;
		json_array_foreach(list, i, r)
		{
			json_array_append_new(names, json_string(hs_str(r, "name")));
		}
		json_t *next = json_object_get(doc, "next_cursor");
		if (json_is_null(next)) {
			json_decref(doc);
			return names;
		}
		assert_true(json_is_string(next));
		assert_int_equal(json_array_size(list), limit ? (size_t)limit : 100);
		snprintf(path, sizeof path, "/resources?cursor=%s%s%d", json_string_value(next),
			 limit ? "&limit=" : "", limit);
		if (!limit)
			path[strlen(path) - 1] = 0; /* no "0" */
		json_decref(doc);
		if (*pages > 1000)
			fail_msg("GET /resources never ends");
	}
}

/*
 * 105 resources: GET /resources answers 100 by default and a next_cursor, the next page
 * the other 5 and null; with ?limit=7 the pages together are every name once, in
 * order; `baton resources` follows the cursors and lists all 105. Bad limits and
 * cursors are 400.
 */
static void test_resources_are_paged(void **state)
{
	hs_server *s = *state;
	enum { N = 105 };
	char id[32], res[32];
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "p%d", i);
		snprintf(res, sizeof res, "res-%03d", i);
		submit(s, id, res, 1, 1);
	}
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof id, "p%d", i);
		json_decref(hs_wait_workflow(s, id, "completed", WAIT_MS));
	}
	int pages;
	json_t *names = resource_names(s, 0, &pages);
	assert_int_equal(pages, 2);
	assert_int_equal(json_array_size(names), N);
	for (int i = 0; i < N; i++) {
		snprintf(res, sizeof res, "res-%03d", i);
		assert_string_equal(json_string_value(json_array_get(names, (size_t)i)), res);
	}
	json_t *by7 = resource_names(s, 7, &pages);
	assert_int_equal(pages, 15);
	assert_true(json_equal(names, by7));
	json_decref(by7);

	const char *const args[] = {"--json", "resources", NULL};
	client_proc *c = client_expect_exit(0, client_url_of(s), args);
	json_t *doc = json_loads(c->o.p, 0, NULL);
	json_t *listed = json_object_get(doc, "resources"), *r;
	assert_int_equal(json_array_size(listed), N);
	size_t i;
	json_array_foreach(listed, i, r)
	{
		assert_string_equal(hs_str(r, "name"), json_string_value(json_array_get(names, i)));
	}
	json_decref(doc);
	client_free(c);
	json_decref(names);

	expect_400(s, "/resources?limit=0");
	expect_400(s, "/resources?limit=1001");
	expect_400(s, "/resources?cursor=w12");
	expect_400(s, "/resources?cursor=r");
	expect_400(s, "/resources?cursor=r%20x");
}

/*
 * A workflow of 300 workers (about 1200 events, on one resource): its event list and the
 * resource's answer 1000 events by default with next_after, the page's last seq, and the
 * rest after it with next_after null; ?limit= caps a page at 10000. Its steps come 100
 * at a time from GET /workflows/{id}/steps (?after=, ?limit= up to 1000), each as GET
 * /workflows/{id} shows it; after the last step, an empty page. `baton events` shows
 * every event.
 */
static void test_histories_and_steps_are_paged(void **state)
{
	hs_server *s = *state;
	submit(s, "wide", "wide-res", 300, 1);
	json_t *wf = hs_wait_workflow(s, "wide", "completed", WAIT_MS);
	json_t *events = hs_get_events(s, "wide"); /* follows next_after */
	size_t total = json_array_size(events);
	assert_true(total > 1000);
	json_t *first = hs_get_json(s, "/workflows/wide/events", 200);
	assert_int_equal(json_array_size(json_object_get(first, "events")), 1000);
	assert_int_equal(hs_int(first, "next_after"), hs_int(json_array_get(events, 999), "seq"));
	json_decref(first);
	char path[256];
	snprintf(path, sizeof path, "/workflows/wide/events?limit=10000");
	json_t *whole = hs_get_json(s, path, 200);
	assert_true(json_equal(json_object_get(whole, "events"), events));
	assert_true(json_is_null(json_object_get(whole, "next_after")));
	json_decref(whole);
	expect_400(s, "/workflows/wide/events?limit=10001");
	expect_400(s, "/resources/wide-res/events?limit=10001");

	json_t *res = hs_get_json(s, "/resources/wide-res/events", 200);
	size_t n = json_array_size(json_object_get(res, "events"));
	assert_int_equal(n, 900); /* 3 lock events per step */
	assert_true(json_is_null(json_object_get(res, "next_after")));
	json_decref(res);
	res = hs_get_json(s, "/resources/wide-res/events?limit=500", 200);
	json_int_t after = hs_int(res, "next_after");
	json_decref(res);
	snprintf(path, sizeof path, "/resources/wide-res/events?after=%lld", (long long)after);
	res = hs_get_json(s, path, 200);
	assert_int_equal(json_array_size(json_object_get(res, "events")), 400);
	json_decref(res);

	/* Steps, 100 by default, then 64 at a time. */
	json_t *steps = json_object_get(wf, "steps");
	json_t *page = hs_get_json(s, "/workflows/wide/steps", 200);
	assert_int_equal(hs_int(page, "steps_total"), 300);
	assert_string_equal(hs_str(page, "status"), "completed");
	assert_int_equal(json_array_size(json_object_get(page, "steps")), 100);
	assert_int_equal(hs_int(page, "next_after"), 99);
	json_decref(page);
	json_t *paged = json_array();
	long long next = -1;
	for (int k = 0; k < 100; k++) {
		if (next < 0)
			snprintf(path, sizeof path, "/workflows/wide/steps?limit=64");
		else
			snprintf(path, sizeof path, "/workflows/wide/steps?limit=64&after=%lld",
				 next);
		page = hs_get_json(s, path, 200);
		json_array_extend(paged, json_object_get(page, "steps"));
		json_t *na = json_object_get(page, "next_after");
		next = json_is_integer(na) ? json_integer_value(na) : -1;
		json_decref(page);
		if (next < 0)
			break;
	}
	assert_true(json_equal(paged, steps));
	json_decref(paged);
	page = hs_get_json(s, "/workflows/wide/steps?after=299", 200);
	assert_int_equal(json_array_size(json_object_get(page, "steps")), 0);
	assert_true(json_is_null(json_object_get(page, "next_after")));
	json_decref(page);
	expect_400(s, "/workflows/wide/steps?limit=0");
	expect_400(s, "/workflows/wide/steps?limit=1001");
	expect_400(s, "/workflows/wide/steps?after=-1");
	hs_response r;
	hs_get(s, "/workflows/nope/steps", &r);
	hs_assert_problem(&r, 404, "not-found", "steps of an unknown workflow");
	hs_response_fini(&r);

	const char *const args[] = {"--json", "events", "wide", NULL};
	client_proc *c = client_expect_exit(0, client_url_of(s), args);
	json_t *doc = json_loads(c->o.p, 0, NULL);
	assert_true(json_equal(json_object_get(doc, "events"), events));
	json_decref(doc);
	client_free(c);
	json_decref(events);
	json_decref(wf);
}

/* ---- a workflow's results together ------------------------------------------------ */

/*
 * A resource that answers every call with a JSON body of about 1 MB: a workflow of 18
 * such steps stores 16 results (16 MB), and the 17th step's result would take its
 * results past MAX_WORKFLOW_RESULTS (16 MiB): that step fails at once (one attempt,
 * though retries are allowed) with an error that names the limit, and the workflow fails;
 * nothing past it runs. Another workflow on the same batond completes meanwhile (the
 * engine goes on), and after a restart the failed workflow, its steps and its whole
 * history still read back.
 */
typedef struct heavy_wait {
	const hs_server *s;
	const char *id, *status;
} heavy_wait;

/* The workflow has the status, read from a one-step page (its GET is 32 MB). */
static bool has_status(void *arg)
{
	heavy_wait *w = arg;
	char path[256];
	snprintf(path, sizeof path, "/workflows/%s/steps?limit=1", w->id);
	hs_response r;
	bool yes =
	    hs_get(w->s, path, &r) == 0 && r.status == 200 && r.json &&
	    strcmp(json_string_value(json_object_get(r.json, "status")) ?: "", w->status) == 0;
	hs_response_fini(&r);
	return yes;
}

/* Step i of workflow id, from its own page (new reference). */
static json_t *step_of(const hs_server *s, const char *id, int i)
{
	char path[256];
	if (i == 0)
		snprintf(path, sizeof path, "/workflows/%s/steps?limit=1", id);
	else
		snprintf(path, sizeof path, "/workflows/%s/steps?limit=1&after=%d", id, i - 1);
	json_t *page = hs_get_json(s, path, 200);
	json_t *st = json_incref(json_array_get(json_object_get(page, "steps"), 0));
	json_decref(page);
	assert_non_null(st);
	return st;
}

/*
 * A resource that answers every call with a JSON body of about 1 MB: a workflow of 18
 * such steps stores 16 results (16 MB), and the 17th step's result would take its
 * results past MAX_WORKFLOW_RESULTS (16 MiB): that step fails at once (one attempt,
 * though retries are allowed) with an error that names the limit, and the workflow fails;
 * nothing past it runs. Another workflow on the same batond completes meanwhile (the
 * engine goes on), and after a restart the failed workflow, its steps and its whole
 * history still read back. (Its steps and history are read a page at a time: GET
 * /workflows/heavy is about 32 MB, the results twice.)
 */
static void test_results_past_the_workflow_cap_fail_the_step(void **state)
{
	calls_ctx *c = *state;
	enum { BODY = 1000000 };
	char *body = malloc(BODY);
	assert_non_null(body);
	memset(body, 'x', BODY);
	body[0] = body[BODY - 1] = '"'; /* one JSON string */
	fragile_set_default(c->res, (fragile_action){.status = 200,
						     .body = body,
						     .body_len = BODY,
						     .content_type = "application/json"});
	free(body);
	calls_create(c->s, calls_workflow("heavy", c->url, 18, calls_quick_retry(20)));
	heavy_wait w = {c->s, "heavy", "failed"};
	if (!hs_wait_until(has_status, &w, WAIT_MS * 2))
		fail_msg("the workflow of 1 MB results did not fail");
	for (int i = 0; i < 16; i++) {
		json_t *st = step_of(c->s, "heavy", i);
		assert_string_equal(hs_str(st, "status"), "completed");
		json_decref(st);
	}
	json_t *over = step_of(c->s, "heavy", 16);
	assert_string_equal(hs_str(over, "status"), "failed");
	assert_int_equal(hs_int(over, "attempts"), 1);
	if (!strstr(hs_str(over, "error"), "past 16777216 bytes"))
		fail_msg("step 16 failed with \"%s\"", hs_str(over, "error"));
	json_t *last = step_of(c->s, "heavy", 17);
	assert_string_equal(hs_str(last, "status"), "skipped");
	json_decref(last);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 17);

	fragile_set_default(c->res, (fragile_action){.status = 200});
	calls_create(c->s, calls_workflow("light", c->url, 2, NULL));
	json_decref(hs_wait_workflow(c->s, "light", "completed", WAIT_MS));

	assert_int_equal(hs_stop(c->s), 0);
	assert_int_equal(hs_start(c->s), 0);
	json_t *again = step_of(c->s, "heavy", 16);
	assert_true(json_equal(again, over));
	json_decref(again);
	json_decref(over);
	/* The history, two events a page (a page of 1 MB results is slow to build under the
	 * sanitizers): every page answers, and the last event is the workflow's failure. */
	json_t *last_event = NULL;
	long long after = 0;
	for (int pages = 0; after >= 0; pages++) {
		char path[128];
		snprintf(path, sizeof path, "/workflows/heavy/events?limit=2&after=%lld", after);
		json_t *doc = hs_get_json(c->s, path, 200);
		json_t *list = json_object_get(doc, "events");
		if (json_array_size(list)) {
			json_decref(last_event);
			last_event = json_incref(json_array_get(list, json_array_size(list) - 1));
		}
		json_t *next = json_object_get(doc, "next_after");
		after = json_is_integer(next) ? json_integer_value(next) : -1;
		json_decref(doc);
		if (pages > 1000)
			fail_msg("the history of heavy never ends");
	}
	assert_non_null(last_event);
	assert_string_equal(hs_str(last_event, "type"), "workflow_failed");
	json_decref(last_event);
}

static int teardown(void **state)
{
	client_free_all();
	return hs_teardown(state);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_finished_cache_bounded_by_bytes, setup_small_cache,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_stream_buffer_full_ends_with_error_and_resumes,
					    setup_small_stream_buffer, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_resources_are_paged, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_histories_and_steps_are_paged, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_results_past_the_workflow_cap_fail_the_step,
					    calls_setup, calls_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_resources.c - one holder per resource across workflows, over HTTP against the
 * real batond: concurrent workflows on one resource never overlap and get strictly
 * increasing fencing tokens; different resources run in parallel; grants are FIFO;
 * GET /resources/{name} shows holder and queue; a SIGKILL with holders and waiters
 * loses no checkpoint and never reuses a fencing token. Cancellation is test_cancel.c;
 * what both use is tests/harness/queue.c.
 *
 * Exclusivity is checked twice, independently: on the events' own order (seq: between
 * a lock_acquired and its lock_released no other lock_acquired on that resource) and on
 * the steps' wall-clock intervals [started_at, finished_at].
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/calls.h"
#include "../harness/queue.h"

#define WAIT_MS 60000

/* ---- submitting many workflows at once ------------------------------------------- */

typedef struct post_job {
	const hs_server *s;
	char *body;   /* owned */
	long status;  /* answer of POST /workflows */
	char id[160]; /* id of the created workflow */
} post_job;

static void *post_thread(void *arg)
{
	post_job *job = arg;
	hs_response r;
	hs_post(job->s, "/workflows", job->body, &r);
	job->status = r.status;
	const char *id = json_string_value(json_object_get(r.json, "id"));
	snprintf(job->id, sizeof job->id, "%s", id ? id : "");
	hs_response_fini(&r);
	return NULL;
}

/* POSTs every job's body from its own thread, all at once; asserts 201 for each. */
static void post_concurrently(post_job *jobs, size_t n)
{
	pthread_t *threads = calloc(n, sizeof *threads);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(pthread_create(&threads[i], NULL, post_thread, &jobs[i]), 0);
	for (size_t i = 0; i < n; i++)
		pthread_join(threads[i], NULL);
	free(threads);
	for (size_t i = 0; i < n; i++) {
		if (jobs[i].status != 201)
			fail_msg("concurrent POST %zu answered %ld", i, jobs[i].status);
		free(jobs[i].body);
		jobs[i].body = NULL;
	}
}

/* ---- events across workflows ----------------------------------------------------- */

/*
 * Asserts that on each resource the fencing tokens of lock_acquired strictly increase in
 * grant (seq) order, hence no duplicates. Returns the largest token granted on `resource`
 * by an event stamped at or before `until_ms` (0 when `resource` is NULL).
 */
static json_int_t assert_tokens_increase(const json_t *events, const char *resource,
					 int64_t until_ms)
{
	json_t *last = json_object(); /* resource -> last token */
	json_int_t max_before = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		if (!queue_is_type(ev, "lock_acquired"))
			continue;
		const char *res = hs_str(ev, "resource");
		json_int_t token = hs_int(ev, "fencing_token");
		json_t *prev = json_object_get(last, res);
		if (prev && token <= json_integer_value(prev))
			fail_msg("fencing token %lld on %s granted after %lld", (long long)token,
				 res, (long long)json_integer_value(prev));
		json_object_set_new(last, res, json_integer(token));
		if (resource && strcmp(res, resource) == 0 && hs_time(ev, "ts") <= until_ms &&
		    token > max_before)
			max_before = token;
	}
	json_decref(last);
	return max_before;
}

/* ---- wall-clock intervals -------------------------------------------------------- */

typedef struct interval {
	const char *resource, *wf;
	size_t step;
	int64_t start, end;
} interval;

static int by_resource_start(const void *a, const void *b)
{
	const interval *x = a, *y = b;
	int c = strcmp(x->resource, y->resource);
	if (c)
		return c;
	if (x->start != y->start)
		return (x->start > y->start) - (x->start < y->start);
	return (x->end > y->end) - (x->end < y->end);
}

/*
 * Asserts that the [started_at, finished_at] intervals of the completed steps of `wfs`
 * never overlap on the same resource, and that each workflow's steps follow its order.
 */
static void assert_no_overlap(json_t **wfs, size_t n)
{
	size_t cap = 0;
	for (size_t i = 0; i < n; i++)
		cap += json_array_size(json_object_get(wfs[i], "steps"));
	interval *iv = calloc(cap ? cap : 1, sizeof *iv);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		int64_t prev_end = INT64_MIN;
		size_t j;
		json_t *st;
		json_array_foreach(json_object_get(wfs[i], "steps"), j, st)
		{
			if (strcmp(hs_str(st, "status"), "completed") != 0)
				continue;
			iv[k] = (interval){hs_str(wfs[i], "resource"), hs_str(wfs[i], "id"), j,
					   hs_time(st, "started_at"), hs_time(st, "finished_at")};
			assert_true(iv[k].start <= iv[k].end);
			if (iv[k].start < prev_end)
				fail_msg("%s step %zu started before its previous step ended",
					 iv[k].wf, j);
			prev_end = iv[k].end;
			k++;
		}
	}
	qsort(iv, k, sizeof *iv, by_resource_start);
	for (size_t i = 1; i < k; i++) {
		if (strcmp(iv[i - 1].resource, iv[i].resource) == 0 && iv[i - 1].end > iv[i].start)
			fail_msg(
			    "on %s, %s step %zu [%lld, %lld] overlaps %s step %zu [%lld, %lld]",
			    iv[i].resource, iv[i - 1].wf, iv[i - 1].step,
			    (long long)iv[i - 1].start, (long long)iv[i - 1].end, iv[i].wf,
			    iv[i].step, (long long)iv[i].start, (long long)iv[i].end);
	}
	free(iv);
}

/* Asserts that each step's fencing_token is the token of its last lock_acquired event. */
static void assert_step_tokens_match(json_t **wfs, size_t n, const json_t *events)
{
	for (size_t i = 0; i < n; i++) {
		size_t j;
		json_t *st;
		json_array_foreach(json_object_get(wfs[i], "steps"), j, st)
		{
			json_int_t want = -1;
			size_t e;
			json_t *ev;
			json_array_foreach(events, e, ev)
			{
				if (queue_is_type(ev, "lock_acquired") &&
				    strcmp(hs_str(ev, "workflow_id"), hs_str(wfs[i], "id")) == 0 &&
				    hs_int(ev, "step") == (json_int_t)j)
					want = hs_int(ev, "fencing_token");
			}
			assert_int_equal(hs_int(st, "fencing_token"), want);
		}
	}
}

/* ---- the tests ------------------------------------------------------------------- */

/*
 * 20 workflows x 5 workers on one resource, posted at once: all complete, no two steps
 * ever hold the resource together, fencing tokens strictly increase in grant order.
 */
static void test_one_holder_across_workflows(void **state)
{
	hs_server *s = *state;
	enum { N = 20, STEPS = 5 };
	post_job jobs[N];
	char *ids[N];
	for (size_t i = 0; i < N; i++) {
		char id[32];
		snprintf(id, sizeof id, "many-%02zu", i);
		jobs[i] = (post_job){.s = s, .body = queue_body(id, "shared", STEPS, 20)};
	}
	post_concurrently(jobs, N);
	for (size_t i = 0; i < N; i++)
		ids[i] = jobs[i].id;

	json_t **wfs = queue_wait_completed(s, ids, N);
	for (size_t i = 0; i < N; i++) {
		hs_assert_workflow_shape(wfs[i]);
		for (size_t j = 0; j < STEPS; j++)
			assert_int_equal(hs_int(hs_step_at(wfs[i], j), "attempts"), 1);
	}
	assert_no_overlap(wfs, N);
	json_t *events = queue_merged_events(s, ids, N);
	assert_int_equal(queue_assert_one_holder(events, HS_NO_TIME), N * STEPS);
	json_int_t max_token = assert_tokens_increase(events, "shared", INT64_MAX);
	assert_step_tokens_match(wfs, N, events);

	json_t *res = hs_get_json(s, "/resources/shared", 200);
	assert_string_equal(hs_str(res, "name"), "shared");
	assert_true(json_is_null(json_object_get(res, "holder")));
	assert_int_equal(json_array_size(json_object_get(res, "waiters")), 0);
	assert_int_equal(hs_int(res, "last_fencing_token"), max_token);
	assert_int_equal(hs_int(json_object_get(res, "totals"), "grants"), N * STEPS);

	json_decref(res);
	json_decref(events);
	queue_free_all(wfs, N);
}

/* Two resources with the same load run side by side: steps of one overlap steps of the other. */
static void test_two_resources_run_in_parallel(void **state)
{
	hs_server *s = *state;
	enum { N = 6, STEPS = 4, WORK = 100 };
	post_job jobs[N];
	char *ids[N];
	for (size_t i = 0; i < N; i++) {
		char id[32];
		snprintf(id, sizeof id, "par-%zu", i);
		jobs[i] = (post_job){.s = s,
				     .body = queue_body(id, i % 2 ? "right" : "left", STEPS, WORK)};
	}
	post_concurrently(jobs, N);
	for (size_t i = 0; i < N; i++)
		ids[i] = jobs[i].id;
	json_t **wfs = queue_wait_completed(s, ids, N);
	assert_no_overlap(wfs, N);
	json_t *events = queue_merged_events(s, ids, N);
	queue_assert_one_holder(events, HS_NO_TIME);
	assert_tokens_increase(events, NULL, INT64_MAX);

	int64_t serial = 0;
	bool overlapped = false;
	for (size_t i = 0; i < N; i++) {
		for (size_t j = 0; j < STEPS; j++) {
			json_t *st = hs_step_at(wfs[i], j);
			int64_t a = hs_time(st, "started_at"), b = hs_time(st, "finished_at");
			serial += b - a;
			/* Any step on the other resource running at the same time? */
			for (size_t k = (i + 1) % 2; k < N; k += 2)
				for (size_t m = 0; m < STEPS; m++) {
					json_t *o = hs_step_at(wfs[k], m);
					if (hs_time(o, "started_at") < b &&
					    a < hs_time(o, "finished_at"))
						overlapped = true;
				}
		}
	}
	assert_true(serial >= (int64_t)N * STEPS * WORK);
	/* Parallel means overlapping; how much shorter the whole run was than the serial
	 * work depends on the machine's speed, and is not checked. */
	if (!overlapped)
		fail_msg("no step of \"left\" ever ran while a step of \"right\" ran");
	json_decref(events);
	queue_free_all(wfs, N);
}

/* Whether /metrics has a queue-depth series for `resource` (one per resource in memory). */
static bool metrics_has_resource(const hs_server *s, const char *resource)
{
	hs_response r;
	assert_int_equal(hs_get(s, "/metrics", &r), 0);
	assert_int_equal(r.status, 200);
	char series[160];
	snprintf(series, sizeof series, "baton_resource_queue_depth{resource=\"%s\"}", resource);
	bool has = r.body && strstr(r.body, series) != NULL;
	hs_response_fini(&r);
	return has;
}

static bool only_idle_c_in_memory(void *arg)
{
	const hs_server *s = arg;
	return metrics_has_resource(s, "idle-c") && !metrics_has_resource(s, "idle-a") &&
	       !metrics_has_resource(s, "idle-b");
}

/*
 * With --idle-resources 1, a free resource leaves memory once another becomes idle after
 * it (its per-resource metrics go with it), and comes back from the store when a step
 * asks for it: the next grant takes the token after its stored one, round after round and
 * after a restart, which loads no idle resource at all.
 */
static void test_idle_resources_leave_memory(void **state)
{
	(void)state;
	const char *args[] = {"--idle-resources", "1", NULL};
	hs_server *s = hs_open(args);
	assert_non_null(s);
	const char *names[] = {"idle-a", "idle-b", "idle-c"};
	for (int round = 1; round <= 4; round++) {
		if (round == 4) { /* from the store only */
			assert_int_equal(hs_stop(s), 0);
			assert_int_equal(hs_start(s), 0);
		}
		for (int i = 0; i < 3; i++) {
			char id[64];
			snprintf(id, sizeof id, "idle-%d-%d", round, i);
			queue_submit(s, id, names[i], 1, 1);
			json_t *wf = hs_wait_workflow(s, id, "completed", WAIT_MS);
			json_int_t token = hs_int(hs_step_at(wf, 0), "fencing_token");
			if (token != round)
				fail_msg("round %d on %s: fencing token %lld, expected %d", round,
					 names[i], (long long)token, round);
			json_decref(wf);
			json_t *res = hs_get_json(s, "/resources/idle-a", 200);
			assert_int_equal(hs_int(res, "last_fencing_token"), round);
			json_decref(res);
		}
		/* idle-c was used last: it stays; idle-a and idle-b leave memory (just after
		 * the commit that the workflow's status shows). */
		if (!hs_wait_until(only_idle_c_in_memory, s, WAIT_MS))
			fail_msg("round %d: idle-a or idle-b still in /metrics, or idle-c not",
				 round);
	}
	assert_int_equal(hs_close(s), 0);
}

/* Grants follow request order: the steps that asked first (lock_requested) get it first. */
static void test_grants_are_fifo(void **state)
{
	hs_server *s = *state;
	enum { N = 8, STEPS = 3 };
	post_job jobs[N];
	char *ids[N];
	for (size_t i = 0; i < N; i++) {
		char id[32];
		snprintf(id, sizeof id, "fifo-%zu", i);
		jobs[i] = (post_job){.s = s, .body = queue_body(id, "fifo", STEPS, 30)};
	}
	post_concurrently(jobs, N);
	for (size_t i = 0; i < N; i++)
		ids[i] = jobs[i].id;
	json_t **wfs = queue_wait_completed(s, ids, N);
	json_t *events = queue_merged_events(s, ids, N);

	json_t *requested = json_array(), *granted = json_array();
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		char key[256];
		if (!queue_is_type(ev, "lock_requested") && !queue_is_type(ev, "lock_acquired"))
			continue;
		queue_attempt_key(ev, key, sizeof key);
		if (queue_is_type(ev, "lock_requested"))
			json_array_append_new(requested, json_string(key));
		else {
			if (!queue_has_event(events, "lock_requested", key))
				fail_msg("%s acquired the lock without a lock_requested event",
					 key);
			json_array_append_new(granted, json_string(key));
		}
	}
	assert_int_equal(json_array_size(granted), N * STEPS);
	assert_int_equal(json_array_size(requested), N * STEPS);
	for (i = 0; i < N * STEPS; i++) {
		const char *r = json_string_value(json_array_get(requested, i));
		const char *g = json_string_value(json_array_get(granted, i));
		if (strcmp(r, g) != 0)
			fail_msg("grant #%zu went to %s, but %s had asked before it", i + 1, g, r);
	}
	json_decref(requested);
	json_decref(granted);
	json_decref(events);
	queue_free_all(wfs, N);
}

static json_int_t requested_seq(const hs_server *s, const char *id)
{
	json_t *events = hs_get_events(s, id);
	json_t *ev = hs_event_find(events, "lock_requested", 0, 1);
	assert_non_null(ev);
	json_int_t seq = hs_int(ev, "seq");
	json_decref(events);
	return seq;
}

/*
 * While one workflow holds a resource and four wait, GET /resources/{name} shows the
 * holder and the waiters in request order with positions 1..4, consistent with the
 * workflows' own steps; GET /resources lists it; totals add up afterwards. The holder is
 * a call the test resource holds until the test has looked (calls_submit_gated).
 */
static void test_resource_view_during_contention(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	calls_submit_gated(c, "holder", "view", 1);
	json_decref(hs_wait_step(s, "holder", 0, "running", WAIT_MS));
	static const char *const waiting[] = {"wait-1", "wait-2", "wait-3", "wait-4"};
	for (size_t i = 0; i < 4; i++)
		queue_submit(s, waiting[i], "view", 1, 10);
	queue_wait(s, "view", 4);

	json_t *res = hs_get_json(s, "/resources/view", 200);
	json_t *holder_wf = hs_get_workflow(s, "holder");
	assert_string_equal(hs_str(res, "name"), "view");
	json_t *holder = json_object_get(res, "holder");
	assert_string_equal(hs_str(holder, "workflow_id"), "holder");
	assert_int_equal(hs_int(holder, "step"), 0);
	assert_string_equal(hs_str(holder, "worker"), "holder");
	int64_t held_since = hs_time(holder, "since");
	assert_int_equal(hs_int(holder, "fencing_token"),
			 hs_int(hs_step_at(holder_wf, 0), "fencing_token"));
	assert_int_equal(hs_int(res, "last_fencing_token"), hs_int(holder, "fencing_token"));
	json_t *totals = json_object_get(res, "totals");
	static const char *const total_keys[] = {"grants", "total_hold_ms", "max_hold_ms",
						 "total_wait_ms", "max_wait_ms"};
	for (size_t i = 0; i < 5; i++)
		hs_int(totals, total_keys[i]);
	assert_true(hs_int(totals, "grants") >= 1);

	json_t *waiters = json_object_get(res, "waiters");
	json_int_t prev_seq = 0;
	int64_t prev_since = INT64_MIN;
	for (size_t i = 0; i < 4; i++) {
		json_t *w = json_array_get(waiters, i);
		const char *id = hs_str(w, "workflow_id");
		assert_int_equal(hs_int(w, "position"), (json_int_t)i + 1);
		assert_int_equal(hs_int(w, "step"), 0);
		char worker[64];
		snprintf(worker, sizeof worker, "%s-0", id);
		assert_string_equal(hs_str(w, "worker"), worker);
		int64_t since = hs_time(w, "waiting_since");
		assert_true(since >= prev_since);
		prev_since = since;
		json_int_t seq = requested_seq(s, id);
		if (seq <= prev_seq)
			fail_msg("waiter %zu (%s) asked for the lock before waiter %zu", i + 1, id,
				 i);
		prev_seq = seq;
		json_t *wf = hs_get_workflow(s, id);
		assert_string_equal(hs_str(wf, "status"), "pending");
		json_t *st = hs_step_at(wf, 0);
		assert_string_equal(hs_str(st, "status"), "waiting");
		assert_int_equal(hs_int(st, "queue_position"), (json_int_t)i + 1);
		assert_string_equal(hs_str(st, "waiting_since"), hs_str(w, "waiting_since"));
		json_decref(wf);
	}

	json_t *list = hs_get_json(s, "/resources", 200);
	bool listed = false;
	size_t i;
	json_t *item;
	json_array_foreach(json_object_get(list, "resources"), i, item)
	{
		if (strcmp(hs_str(item, "name"), "view") != 0)
			continue;
		listed = true;
		assert_int_equal(hs_int(item, "queue_length"), 4);
		assert_string_equal(hs_str(json_object_get(item, "holder"), "workflow_id"),
				    "holder");
	}
	assert_true(listed);

	int64_t opened = hs_now_ms();
	fragile_open_gate(c->res);
	char *ids[] = {"holder", "wait-1", "wait-2", "wait-3", "wait-4"};
	json_t **wfs = queue_wait_completed(s, ids, 5);
	json_t *after = hs_get_json(s, "/resources/view", 200);
	assert_true(json_is_null(json_object_get(after, "holder")));
	assert_int_equal(json_array_size(json_object_get(after, "waiters")), 0);
	json_t *t = json_object_get(after, "totals");
	assert_int_equal(hs_int(t, "grants"), 5);
	assert_true(hs_int(t, "max_hold_ms") >= opened - held_since - 1); /* held till then */
	assert_true(hs_int(t, "total_hold_ms") >= hs_int(t, "max_hold_ms"));
	assert_true(hs_int(t, "total_wait_ms") >= hs_int(t, "max_wait_ms"));
	json_t *res_list = hs_get_json(s, "/resources", 200);
	json_array_foreach(json_object_get(res_list, "resources"), i, item)
	{
		if (strcmp(hs_str(item, "name"), "view") == 0) {
			assert_true(json_is_null(json_object_get(item, "holder")));
			assert_int_equal(hs_int(item, "queue_length"), 0);
		}
	}
	json_decref(res_list);
	json_decref(after);
	queue_free_all(wfs, 5);
	json_decref(list);
	json_decref(holder_wf);
	json_decref(res);
}

typedef struct kill_ready {
	const hs_server *s;
} kill_ready;

/* True when both k1 and k2 have a holder and a waiter, and 4+ steps are checkpointed. */
static bool busy_enough(void *arg)
{
	kill_ready *k = arg;
	static const char *const paths[] = {"/resources/k1", "/resources/k2"};
	for (size_t i = 0; i < 2; i++) {
		hs_response r;
		bool ok = hs_get(k->s, paths[i], &r) == 0 && r.status == 200 &&
			  json_is_object(json_object_get(r.json, "holder")) &&
			  json_array_size(json_object_get(r.json, "waiters")) >= 1;
		hs_response_fini(&r);
		if (!ok)
			return false;
	}
	hs_response r;
	json_int_t done = 0;
	if (hs_get(k->s, "/workflows?limit=1000", &r) == 0 && r.status == 200) {
		json_t *items = json_object_get(r.json, "workflows");
		for (size_t i = 0; i < json_array_size(items); i++)
			done += json_integer_value(
			    json_object_get(json_array_get(items, i), "steps_completed"));
	}
	hs_response_fini(&r);
	return done >= 4;
}

/*
 * SIGKILL while workflows hold and wait on two resources; after a restart on the same
 * database all complete, no checkpointed step runs again, the interrupted ones run once
 * more, exclusivity holds across the crash and no fencing token is ever reused.
 */
static void test_sigkill_with_holders_and_waiters(void **state)
{
	hs_server *s = *state;
	enum { N = 6, STEPS = 4 };
	post_job jobs[N];
	char *ids[N];
	for (size_t i = 0; i < N; i++) {
		char id[32];
		snprintf(id, sizeof id, "crash-%zu", i);
		jobs[i] =
		    (post_job){.s = s, .body = queue_body(id, i % 2 ? "k2" : "k1", STEPS, 150)};
	}
	post_concurrently(jobs, N);
	for (size_t i = 0; i < N; i++)
		ids[i] = jobs[i].id;
	kill_ready k = {s};
	if (!hs_wait_until(busy_enough, &k, WAIT_MS))
		fail_msg("k1 and k2 never both had a holder and a waiter");

	json_t *before[N];
	for (size_t i = 0; i < N; i++)
		before[i] = hs_get_workflow(s, ids[i]);
	hs_kill(s);
	int64_t kill_ms = hs_now_ms();
	while (hs_now_ms() <= kill_ms + 2)
		; /* the restarted process's events must carry later timestamps */
	assert_int_equal(hs_start(s), 0);

	json_t **wfs = queue_wait_completed(s, ids, N);
	size_t kept = 0;
	for (size_t i = 0; i < N; i++) {
		for (size_t j = 0; j < STEPS; j++) {
			json_t *b = hs_step_at(before[i], j), *a = hs_step_at(wfs[i], j);
			if (strcmp(hs_str(b, "status"), "completed") != 0)
				continue;
			kept++;
			if (hs_int(a, "attempts") != 1)
				fail_msg("%s step %zu was completed before the kill but has %lld "
					 "attempts",
					 ids[i], j, (long long)hs_int(a, "attempts"));
			assert_int_equal(hs_int(a, "fencing_token"), hs_int(b, "fencing_token"));
			assert_string_equal(hs_str(a, "started_at"), hs_str(b, "started_at"));
			assert_string_equal(hs_str(a, "finished_at"), hs_str(b, "finished_at"));
			assert_true(
			    json_equal(json_object_get(a, "result"), json_object_get(b, "result")));
		}
	}
	assert_true(kept >= 4);

	json_t *events = queue_merged_events(s, ids, N);
	for (size_t i = 0; i < N; i++) {
		json_t *mine = hs_get_events(s, ids[i]);
		for (int j = 0; j < STEPS; j++) {
			json_int_t attempts = hs_int(hs_step_at(wfs[i], (size_t)j), "attempts");
			size_t interrupted = hs_event_count(mine, "step_interrupted", j, -1);
			if (hs_event_count(mine, "step_completed", j, -1) != 1)
				fail_msg("%s step %d completed %zu times", ids[i], j,
					 hs_event_count(mine, "step_completed", j, -1));
			assert_int_equal(attempts, 1 + (json_int_t)interrupted);
			assert_int_equal(hs_event_count(mine, "lock_acquired", j, -1), attempts);
		}
		json_decref(mine);
	}
	queue_assert_one_holder(events, kill_ms);
	static const char *const resources[] = {"k1", "k2"};
	for (size_t r = 0; r < 2; r++) {
		json_int_t max_before = assert_tokens_increase(events, resources[r], kill_ms);
		assert_true(max_before > 0);
		size_t i;
		json_t *ev;
		json_array_foreach(events, i, ev)
		{
			if (queue_is_type(ev, "lock_acquired") &&
			    strcmp(hs_str(ev, "resource"), resources[r]) == 0 &&
			    hs_time(ev, "ts") > kill_ms &&
			    hs_int(ev, "fencing_token") <= max_before)
				fail_msg("token %lld on %s after the restart is not above %lld",
					 (long long)hs_int(ev, "fencing_token"), resources[r],
					 (long long)max_before);
		}
	}
	assert_no_overlap(wfs, N);

	json_decref(events);
	queue_free_all(wfs, N);
	for (size_t i = 0; i < N; i++)
		json_decref(before[i]);
}

/* POSTs a lease on `resource` for `holder` (granted at once); returns its id (malloc'd). */
static char *hold_lease(const hs_server *s, const char *resource, const char *holder)
{
	char path[128], body[160];
	snprintf(path, sizeof path, "/resources/%s/leases", resource);
	snprintf(body, sizeof body, "{\"holder\": \"%s\", \"ttl_ms\": 120000}", holder);
	hs_response r;
	assert_int_equal(hs_post(s, path, body, &r), 0);
	if (r.status != 201)
		fail_msg("lease on %s answered %ld: %s", resource, r.status, r.body ? r.body : "");
	char *id = strdup(hs_str(r.json, "id"));
	hs_response_fini(&r);
	return id;
}

/* The names of GET `path`'s "resources", comma-joined (malloc'd); *next gets next_cursor
 * (malloc'd, NULL when null). */
static char *page_names(const hs_server *s, const char *path, char **next)
{
	json_t *doc = hs_get_json(s, path, 200);
	char *names = calloc(1, 1024);
	size_t i;
	json_t *r;
	json_array_foreach(json_object_get(doc, "resources"), i, r)
	{
		if (i)
			strcat(names, ",");
		strncat(names, hs_str(r, "name"), 900 - strlen(names));
	}
	const char *n = json_string_value(json_object_get(doc, "next_cursor"));
	*next = n ? strdup(n) : NULL;
	json_decref(doc);
	return names;
}

/*
 * GET /resources tells where it is contended: each resource's last token, its totals and
 * since when its oldest waiter waits (null when nobody does); ?sort=contention lists the
 * longest queues first (then by name), and pages as by name do. Bad sorts and cursors
 * are 400.
 */
static void test_resources_list_shows_contention(void **state)
{
	hs_server *s = *state;
	queue_submit(s, "calm-1", "calm", 1, 0);
	json_decref(hs_wait_workflow(s, "calm-1", "completed", WAIT_MS));
	char *busy = hold_lease(s, "busy", "holder-busy");
	char *mid = hold_lease(s, "mid", "holder-mid");
	int64_t before = hs_now_ms();
	queue_submit(s, "busy-1", "busy", 1, 0);
	queue_submit(s, "busy-2", "busy", 1, 0);
	queue_submit(s, "mid-1", "mid", 1, 0);
	queue_wait(s, "busy", 2);
	queue_wait(s, "mid", 1);

	json_t *doc = hs_get_json(s, "/resources", 200);
	json_t *list = json_object_get(doc, "resources");
	assert_int_equal(json_array_size(list), 3);
	json_t *b = json_array_get(list, 0), *c = json_array_get(list, 1);
	assert_string_equal(hs_str(b, "name"), "busy");
	assert_string_equal(hs_str(c, "name"), "calm");
	assert_int_equal(hs_int(b, "last_fencing_token"), 1);
	assert_true(hs_time(b, "oldest_waiting_since") >= before - 1000);
	assert_true(json_is_null(json_object_get(c, "oldest_waiting_since")));
	json_t *totals = json_object_get(c, "totals");
	assert_int_equal(hs_int(totals, "grants"), 1);
	assert_true(json_is_integer(json_object_get(totals, "total_hold_ms")));
	assert_true(json_is_integer(json_object_get(totals, "total_wait_ms")));
	json_decref(doc);

	char *next, *names = page_names(s, "/resources?sort=contention", &next);
	assert_string_equal(names, "busy,mid,calm");
	assert_null(next);
	free(names);
	char path[300], *all = calloc(1, 1024);
	snprintf(path, sizeof path, "/resources?sort=contention&limit=1");
	for (int pages = 0; pages < 10; pages++) {
		names = page_names(s, path, &next);
		strcat(all, *all ? "," : "");
		strcat(all, names);
		free(names);
		if (!next)
			break;
		char *esc = hs_url_escape(next);
		snprintf(path, sizeof path, "/resources?sort=contention&limit=1&cursor=%s", esc);
		free(esc);
		free(next);
	}
	assert_string_equal(all, "busy,mid,calm");
	free(all);

	static const char *const bad[] = {
	    "/resources?sort=noise", "/resources?sort=", "/resources?sort=contention&cursor=rbusy",
	    "/resources?cursor=c1:busy", "/resources?sort=contention&cursor=cx:busy"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		hs_response r;
		hs_get(s, bad[i], &r);
		hs_assert_problem(&r, 400, "invalid-request", bad[i]);
		hs_response_fini(&r);
	}
	free(busy);
	free(mid);
}

/* A batond with a single HTTP thread. */
static int setup_one_http_thread(void **state)
{
	static const char *const args[] = {"--http-threads", "1", NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

/*
 * A submission's connection is suspended until the engine answers it (h_workflows.c):
 * 32 clients posting at once to a batond with a single HTTP thread are all answered
 * 201, each with its own workflow, which then runs to completion. (That the thread
 * serves others meanwhile shows in bench/'s HTTP accept, not in a pass/fail test.)
 */
static void test_many_posts_over_one_http_thread(void **state)
{
	hs_server *s = *state;
	enum { N = 32 };
	post_job jobs[N];
	char *ids[N];
	for (size_t i = 0; i < N; i++) {
		char id[32];
		snprintf(id, sizeof id, "one-thread-%02zu", i);
		jobs[i] = (post_job){.s = s, .body = queue_body(id, i % 2 ? "odd" : "even", 2, 0)};
	}
	post_concurrently(jobs, N);
	for (size_t i = 0; i < N; i++)
		ids[i] = jobs[i].id;
	json_t **wfs = queue_wait_completed(s, ids, N);
	for (size_t i = 0; i < N; i++)
		assert_string_equal(hs_str(wfs[i], "id"), jobs[i].id);
	queue_free_all(wfs, N);
	json_t *list = hs_get_json(s, "/workflows?limit=1000", 200);
	assert_int_equal(json_array_size(json_object_get(list, "workflows")), N);
	json_decref(list);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_one_holder_across_workflows, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_two_resources_run_in_parallel, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_grants_are_fifo, hs_setup, hs_teardown),
	    cmocka_unit_test(test_idle_resources_leave_memory),
	    cmocka_unit_test_setup_teardown(test_resources_list_shows_contention, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_resource_view_during_contention, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_many_posts_over_one_http_thread,
					    setup_one_http_thread, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_sigkill_with_holders_and_waiters, hs_setup,
					    hs_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_calls.c - HTTP steps against a fragile shared resource (issue 4), over HTTP
 * against the real batond: a step's `call` reaches the resource one request at a time,
 * with fencing tokens that only grow and an Idempotency-Key "<workflow id>/<step index>"
 * that stays the same over retries and restarts; 5xx, 429 (honouring Retry-After),
 * timeouts and lost answers are retried, other 4xx are not; a SIGKILL in the middle of a
 * call repeats it after restart without applying it twice; a stored call step on a
 * batond without libcurl waits until it can be loaded. What may be called, and with
 * what, is test_call_policy.c.
 *
 * Each test gets its own fragile resource (tests/harness/fragile.h, the oracle: it
 * records every request, answers 500 to an overlap and 409 to a stale token, and
 * deduplicates applied operations by Idempotency-Key) and its own batond
 * (tests/harness/calls.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../harness/calls.h"

#define WAIT_MS 30000

/* ---- the oracle itself ---------------------------------------------------------- */

typedef struct direct {
	const char *url, *key, *token;
	long timeout_ms;
	long status; /* 0 when no answer */
	CURLcode rc;
	curl_off_t retry_after;
} direct;

/* One request to the resource without batond, headers as given (NULL: absent). */
static void *send_direct(void *arg)
{
	direct *d = arg;
	char kh[256], th[256];
	struct curl_slist *h = NULL;
	if (d->key) {
		snprintf(kh, sizeof kh, "Idempotency-Key: %s", d->key);
		h = curl_slist_append(h, kh);
	}
	if (d->token) {
		snprintf(th, sizeof th, "Baton-Fencing-Token: %s", d->token);
		h = curl_slist_append(h, th);
	}
	CURL *e = curl_easy_init();
	curl_easy_setopt(e, CURLOPT_URL, d->url);
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, "{}");
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, d->timeout_ms ? d->timeout_ms : 15000L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, NULL);
	FILE *sink = fopen("/dev/null", "w");
	curl_easy_setopt(e, CURLOPT_WRITEDATA, sink);
	d->rc = curl_easy_perform(e);
	d->status = 0;
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &d->status);
	curl_easy_getinfo(e, CURLINFO_RETRY_AFTER, &d->retry_after);
	curl_easy_cleanup(e);
	curl_slist_free_all(h);
	fclose(sink);
	return NULL;
}

static long direct_status(const char *url, const char *key, const char *token)
{
	direct d = {.url = url, .key = key, .token = token};
	send_direct(&d);
	return d.status;
}

/*
 * The oracle can fail: an overlap is answered 500, a stale token 409, a repeat of an
 * applied key 200 without a second application, a dropped answer applies the operation,
 * a client that leaves a delayed request is noticed and nothing is applied.
 */
static void test_fragile_detects(void **state)
{
	calls_ctx *c = *state;
	fragile *res = c->res;
	fragile_push(res, (fragile_action){.status = 200, .delay_ms = 1500});
	direct first = {.url = c->url, .key = "k1", .token = "5"};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, send_direct, &first), 0);
	assert_true(fragile_wait_held(res, 1, WAIT_MS));
	assert_int_equal(direct_status(c->url, "k2", "6"), 500); /* overlaps the held one */
	pthread_join(t, NULL);
	assert_int_equal(first.status, 200);
	fragile_stats st;
	fragile_get_stats(res, &st);
	assert_int_equal(st.overlaps, 1);
	assert_int_equal(st.max_in_flight, 2);
	assert_int_equal(st.max_token, 5);

	assert_int_equal(direct_status(c->url, "k3", "4"), 409); /* below 5 */
	assert_int_equal(direct_status(c->url, "k1", "7"), 200); /* duplicate */
	assert_int_equal(direct_status(c->url, NULL, "8"), 400);
	assert_int_equal(direct_status(c->url, "k4", NULL), 400);
	assert_int_equal(direct_status(c->url, "k4", "x9"), 400);

	fragile_push(res, (fragile_action){.drop = true});
	direct lost = {.url = c->url, .key = "k5", .token = "9"};
	send_direct(&lost);
	assert_int_equal(lost.status, 0);
	assert_int_equal(lost.rc, CURLE_GOT_NOTHING);
	assert_true(fragile_applied(res, "k5"));
	assert_int_equal(direct_status(c->url, "k5", "10"), 200); /* duplicate */

	fragile_push(res, (fragile_action){.status = 429, .retry_after = "7"});
	direct busy = {.url = c->url, .key = "k6", .token = "11"};
	send_direct(&busy);
	assert_int_equal(busy.status, 429);
	assert_int_equal(busy.retry_after, 7);
	assert_false(fragile_applied(res, "k6"));

	fragile_push(res, (fragile_action){.status = 200, .delay_ms = 20000});
	direct impatient = {.url = c->url, .key = "k7", .token = "12", .timeout_ms = 200};
	send_direct(&impatient);
	assert_int_equal(impatient.rc, CURLE_OPERATION_TIMEDOUT);

	fragile_stats before;
	fragile_get_stats(res, &before);
	assert_true(fragile_wait_finished(res, before.requests, WAIT_MS));
	size_t n;
	fragile_record *r = fragile_records(res, &n);
	assert_int_equal(n, 11);
	assert_int_equal(r[1].outcome, FRAGILE_OVERLAP);
	assert_int_equal(r[2].outcome, FRAGILE_STALE);
	assert_int_equal(r[3].outcome, FRAGILE_DUPLICATE);
	assert_false(r[3].applied);
	assert_int_equal(r[7].outcome, FRAGILE_DROPPED);
	assert_true(r[7].applied);
	assert_int_equal(r[8].outcome, FRAGILE_DUPLICATE);
	assert_int_equal(r[9].status, 429);
	assert_int_equal(r[10].outcome, FRAGILE_CLIENT_GONE);
	assert_false(r[10].applied);
	/* noticed, not waited out (the answer was due after 20 s) */
	assert_true(r[10].finished_ms - r[10].arrived_ms < 20000);
	assert_string_equal(r[0].body, "{}");
	assert_string_equal(r[0].method, "POST");
	assert_string_equal(r[0].path, "/op");
	fragile_records_free(r, n);
	fragile_get_stats(res, &st);
	assert_int_equal(st.applied, 2); /* k1 and k5, each once */
	assert_int_equal(st.duplicates, 2);
	assert_int_equal(st.stale, 1);
	assert_int_equal(st.bad, 3);
	assert_int_equal(st.in_flight, 0);
}

/* ---- contention ------------------------------------------------------------------ */

#define N_WF	  10
#define N_WORKERS 4

typedef struct post_job {
	const hs_server *s;
	char *body;
	long status;
	char answer[300]; /* the start of the answer, or why none came */
} post_job;

static void *post_thread(void *arg)
{
	post_job *job = arg;
	hs_response r;
	hs_post(job->s, "/workflows", job->body, &r);
	job->status = r.status;
	snprintf(job->answer, sizeof job->answer, "%s", r.body ? r.body : r.error);
	hs_response_fini(&r);
	return NULL;
}

/* Asserts the records of a contended run: sequential, growing tokens, expected keys. */
static void assert_contended_records(const fragile_record *r, size_t n)
{
	bool seen[N_WF][N_WORKERS] = {{false}};
	int next_step[N_WF] = {0};
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && r[i].token <= r[i - 1].token)
			fail_msg("request %zu carries token %lld after %lld", i, r[i].token,
				 r[i - 1].token);
		if (i > 0 && r[i].arrived_ms < r[i - 1].finished_ms)
			fail_msg("request %zu arrived before request %zu was answered", i, i - 1);
		assert_int_equal(r[i].outcome, FRAGILE_ANSWERED);
		assert_int_equal(r[i].status, 200);
		assert_string_equal(r[i].method, "PUT");
		assert_string_equal(r[i].path, "/op");
		assert_non_null(r[i].workflow);
		assert_non_null(r[i].worker);
		int wf = -1, step = -1;
		if (sscanf(r[i].workflow, "contend-%d", &wf) != 1 || wf < 0 || wf >= N_WF ||
		    sscanf(r[i].worker, "w%d", &step) != 1 || step < 0 || step >= N_WORKERS)
			fail_msg("unexpected Baton-Workflow %s / Baton-Worker %s", r[i].workflow,
				 r[i].worker);
		char want[64], body[32];
		snprintf(want, sizeof want, "contend-%02d/%d", wf, step);
		assert_string_equal(r[i].idempotency_key, want);
		assert_string_equal(r[i].attempt, "1");
		snprintf(body, sizeof body, "{\"n\":%d}", step);
		assert_string_equal(r[i].body, body);
		char *tag = calls_record_header(&r[i], "X-Run");
		assert_string_equal(tag, "contend");
		free(tag);
		if (seen[wf][step])
			fail_msg("%s was called twice", want);
		seen[wf][step] = true;
		if (step != next_step[wf])
			fail_msg("%s was called before step %d of its workflow", want,
				 next_step[wf]);
		next_step[wf]++;
	}
}

/* The workflow's steps carry the tokens the resource saw, and the HTTP events. */
static void assert_contended_workflow(const hs_server *s, const char *id, const char *url,
				      const fragile_record *r, size_t n)
{
	json_t *wf = hs_wait_workflow(s, id, "completed", WAIT_MS);
	json_t *events = hs_get_events(s, id);
	for (int i = 0; i < N_WORKERS; i++) {
		json_t *st = hs_step_at(wf, (size_t)i);
		char *key = calls_key_of(id, i);
		const fragile_record *rec = NULL;
		for (size_t k = 0; k < n; k++)
			if (strcmp(r[k].idempotency_key, key) == 0)
				rec = &r[k];
		assert_non_null(rec);
		assert_int_equal(hs_int(st, "attempts"), 1);
		assert_int_equal(hs_int(st, "fencing_token"), rec->token);
		json_t *resp = json_object_get(json_object_get(st, "result"), "response");
		assert_int_equal(hs_int(resp, "status"), 200);
		assert_string_equal(hs_str(json_object_get(resp, "body"), "key"), key);
		json_t *call = json_object_get(st, "call");
		assert_string_equal(hs_str(call, "method"), "PUT");
		assert_string_equal(hs_str(call, "url"), url);
		calls_assert_event(hs_event_find(events, "step_completed", i, 1), key, "PUT", url,
				   200);
		free(key);
	}
	json_decref(events);
	json_decref(wf);
}

/*
 * 10 workflows of 4 call workers each, posted at once, on one resource: the resource
 * never sees two requests at once, fencing tokens only grow, every Idempotency-Key is
 * "<workflow id>/<step index>", each operation is applied once, in each workflow's
 * worker order; each step's token and events match what the resource saw.
 */
static void test_contention(void **state)
{
	calls_ctx *c = *state;
	/* A little work per request widens the window in which an overlap would show. */
	fragile_set_default(c->res, (fragile_action){.status = 200, .delay_ms = 15});
	post_job jobs[N_WF];
	pthread_t threads[N_WF];
	for (int i = 0; i < N_WF; i++) {
		char id[32];
		snprintf(id, sizeof id, "contend-%02d", i);
		json_t *body = calls_workflow(id, c->url, N_WORKERS, NULL);
		json_object_set_new(json_object_get(body, "call"), "method", json_string("PUT"));
		json_object_set_new(json_object_get(body, "call"), "headers",
				    json_pack("{s:s}", "X-Run", "contend"));
		jobs[i] = (post_job){.s = c->s, .body = json_dumps(body, JSON_COMPACT)};
		json_decref(body);
	}
	for (int i = 0; i < N_WF; i++)
		assert_int_equal(pthread_create(&threads[i], NULL, post_thread, &jobs[i]), 0);
	for (int i = 0; i < N_WF; i++)
		pthread_join(threads[i], NULL);
	for (int i = 0; i < N_WF; i++)
		free(jobs[i].body);
	for (int i = 0; i < N_WF; i++)
		if (jobs[i].status != 201)
			fail_msg("concurrent POST %d answered %ld: %s", i, jobs[i].status,
				 jobs[i].answer);
	assert_true(fragile_wait_finished(c->res, N_WF * N_WORKERS, WAIT_MS * 2));
	size_t n;
	fragile_record *r = fragile_records(c->res, &n);
	calls_assert_sound(c->res);
	if (n != N_WF * N_WORKERS) {
		calls_dump_records(r, n);
		fail_msg("the resource saw %zu requests, expected %d", n, N_WF * N_WORKERS);
	}
	assert_contended_records(r, n);
	for (int i = 0; i < N_WF; i++) {
		char id[32];
		snprintf(id, sizeof id, "contend-%02d", i);
		assert_contended_workflow(c->s, id, c->url, r, n);
	}
	fragile_records_free(r, n);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.applied, N_WF * N_WORKERS);
	assert_int_equal(st.duplicates, 0);
	assert_int_equal(st.max_in_flight, 1);
}

/* ---- retries --------------------------------------------------------------------- */

/*
 * 503 then 200: the step is retried, with the same Idempotency-Key, a new fencing token
 * and Baton-Attempt 2; it completes with the resource's answer as its result; both
 * attempts are in the events with their HTTP status.
 */
static void test_503_then_200_retried(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 503});
	calls_create(c->s, calls_workflow("r503", c->url, 1, calls_quick_retry(100)));
	json_t *wf = hs_wait_workflow(c->s, "r503", "completed", WAIT_MS);
	fragile_record *r = calls_records_exactly(c->res, 2);
	assert_string_equal(r[0].idempotency_key, "r503/0");
	assert_string_equal(r[1].idempotency_key, "r503/0");
	assert_string_equal(r[0].workflow, "r503");
	assert_string_equal(r[0].worker, "w0");
	assert_string_equal(r[0].attempt, "1");
	assert_string_equal(r[1].attempt, "2");
	assert_true(r[1].token > r[0].token);
	assert_int_equal(r[0].status, 503);
	assert_int_equal(r[1].status, 200);
	assert_string_equal(r[1].body, "{\"n\":0}");
	char *ctype = calls_record_header(&r[1], "Content-Type");
	assert_string_equal(ctype, "application/json");
	free(ctype);

	json_t *st = hs_step_at(wf, 0);
	assert_string_equal(hs_str(st, "status"), "completed");
	assert_int_equal(hs_int(st, "attempts"), 2);
	assert_int_equal(hs_int(st, "fencing_token"), r[1].token);
	json_t *result = json_object_get(st, "result");
	assert_string_equal(hs_str(result, "workerId"), "w0");
	assert_string_equal(hs_str(result, "action"), "updated-gateway");
	json_t *resp = json_object_get(result, "response");
	assert_int_equal(hs_int(resp, "status"), 200);
	assert_string_equal(hs_str(json_object_get(resp, "body"), "key"), "r503/0");
	assert_int_equal(hs_int(json_object_get(resp, "body"), "token"), r[1].token);

	json_t *events = hs_get_events(c->s, "r503");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	calls_assert_event(failed, "step_failed attempt 1", "POST", c->url, 503);
	assert_true(json_is_integer(json_object_get(failed, "retry_in_ms")));
	assert_true(calls_contains(hs_str(failed, "error"), "503"));
	calls_assert_event(hs_event_find(events, "step_completed", 0, 2),
			   "step_completed attempt 2", "POST", c->url, 200);
	assert_int_equal(hs_event_count(events, "step_failed", -1, -1), 1);
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	calls_assert_sound(c->res);
	assert_true(fragile_applied(c->res, "r503/0"));
}

/* 400 is not retried: the step and its workflow fail after one attempt; later steps never call. */
static void test_400_not_retried(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 400});
	calls_create(c->s, calls_workflow("r400", c->url, 2, calls_quick_retry(100)));
	json_t *wf = hs_wait_workflow(c->s, "r400", "failed", WAIT_MS);
	fragile_record *r = calls_records_exactly(c->res, 1);
	assert_string_equal(r[0].idempotency_key, "r400/0");
	fragile_records_free(r, 1);
	json_t *st = hs_step_at(wf, 0);
	assert_string_equal(hs_str(st, "status"), "failed");
	assert_int_equal(hs_int(st, "attempts"), 1);
	assert_true(calls_contains(hs_str(st, "error"), "400"));
	assert_int_equal(hs_int(hs_step_at(wf, 1), "attempts"), 0);
	assert_true(calls_contains(hs_str(wf, "error"), "400"));
	json_t *events = hs_get_events(c->s, "r400");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	calls_assert_event(failed, "step_failed", "POST", c->url, 400);
	assert_true(json_is_null(json_object_get(failed, "retry_in_ms")));
	assert_int_equal(hs_event_count(events, "lock_acquired", -1, -1), 1);
	json_decref(events);
	json_decref(wf);
	fragile_stats s;
	fragile_get_stats(c->res, &s);
	assert_int_equal(s.applied, 0);
	calls_assert_sound(c->res);
}

/* 429 with Retry-After: 3 waits about 3 s, although the backoff asks for 200 ms. */
static void test_429_retry_after_honoured(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 429, .retry_after = "3"});
	calls_create(c->s, calls_workflow("r429", c->url, 1, calls_quick_retry(200)));
	json_t *wf = hs_wait_workflow(c->s, "r429", "completed", WAIT_MS);
	fragile_record *r = calls_records_exactly(c->res, 2);
	int64_t gap = r[1].arrived_ms - r[0].finished_ms;
	if (gap < 2900) /* how much later: the workflow's deadline */
		fail_msg("the retry came %lld ms after the 429, expected 3000 or more",
			 (long long)gap);
	assert_string_equal(r[1].idempotency_key, "r429/0");
	assert_true(r[1].token > r[0].token);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 2);
	json_t *events = hs_get_events(c->s, "r429");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	calls_assert_event(failed, "step_failed", "POST", c->url, 429);
	assert_int_equal(hs_int(failed, "retry_in_ms"), 3000);
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	calls_assert_sound(c->res);
}

/* A call that outlives its timeout_ms is abandoned and retried with the same key. */
static void test_timeout_retried(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 200, .delay_ms = 20000});
	json_t *body = calls_workflow("rto", c->url, 1, calls_quick_retry(200));
	json_object_set_new(json_object_get(body, "call"), "timeout_ms", json_integer(300));
	calls_create(c->s, body);
	json_t *wf = hs_wait_workflow(c->s, "rto", "completed", WAIT_MS);
	fragile_record *r = calls_records_exactly(c->res, 2);
	assert_int_equal(r[0].outcome, FRAGILE_CLIENT_GONE); /* batond hung up */
	assert_false(r[0].applied);
	/* The resource saw batond give up before its 20 s answer (how much before depends on
	 * the machine's speed); how long batond itself waited is its own measure (the timeout
	 * also covers the connect, which the resource cannot see), checked below on the
	 * event. */
	int64_t held = r[0].finished_ms - r[0].arrived_ms;
	if (held >= 20000)
		fail_msg("batond waited %lld ms for the delayed answer, timeout_ms is 300",
			 (long long)held);
	assert_int_equal(r[1].status, 200);
	assert_string_equal(r[0].idempotency_key, "rto/0");
	assert_string_equal(r[1].idempotency_key, "rto/0");
	assert_string_equal(r[1].attempt, "2");
	assert_true(r[1].token > r[0].token);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 2);
	json_t *events = hs_get_events(c->s, "rto");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	calls_assert_event(failed, "step_failed", "POST", c->url, 0);
	assert_true(calls_contains(hs_str(failed, "error"), "timed out"));
	json_int_t waited = hs_int(failed, "latency_ms");
	if (waited < 299 || waited >= 20000)
		fail_msg("the timed-out attempt took %lld ms, timeout_ms is 300",
			 (long long)waited);
	assert_true(json_is_integer(json_object_get(failed, "retry_in_ms")));
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	calls_assert_sound(c->res);
	assert_true(fragile_applied(c->res, "rto/0"));
}

/*
 * A lost answer (applied, connection closed): the retry carries the same key, the
 * resource recognizes it, and the operation is applied once.
 */
static void test_lost_answer_applied_once(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.drop = true});
	calls_create(c->s, calls_workflow("rlost", c->url, 1, calls_quick_retry(100)));
	json_t *wf = hs_wait_workflow(c->s, "rlost", "completed", WAIT_MS);
	fragile_record *r = calls_records_exactly(c->res, 2);
	assert_int_equal(r[0].outcome, FRAGILE_DROPPED);
	assert_int_equal(r[1].outcome, FRAGILE_DUPLICATE);
	assert_string_equal(r[1].idempotency_key, r[0].idempotency_key);
	assert_true(r[1].token > r[0].token);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 2);
	json_t *events = hs_get_events(c->s, "rlost");
	calls_assert_event(hs_event_find(events, "step_failed", 0, 1), "step_failed", "POST",
			   c->url, 0);
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.applied, 1);
	calls_assert_sound(c->res);
}

/* ---- SIGKILL in the middle of a call ----------------------------------------------- */

/* Kills batond while the resource holds a request, once the resource saw it go restarts it. */
static void kill_while_held(calls_ctx *c, size_t finished_after)
{
	assert_true(fragile_wait_held(c->res, 1, WAIT_MS));
	hs_kill(c->s);
	assert_true(fragile_wait_finished(c->res, finished_after, WAIT_MS));
	assert_int_equal(hs_start(c->s), 0);
}

/*
 * batond is killed twice while a call is in flight: once after the resource applied
 * step 1's operation (its answer is lost with the process), once before it applied step
 * 2's (the request is cut off). After each restart the call is repeated with the same
 * Idempotency-Key, a higher fencing token and Baton-Attempt 2; the resource counts each
 * of the three workers' operations exactly once.
 */
static void test_sigkill_during_call(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 200});
	fragile_push(c->res, (fragile_action){.drop = true, .delay_ms = 60000});
	fragile_push(c->res, (fragile_action){.status = 200, .delay_ms = 60000});
	calls_create(c->s, calls_workflow("kill", c->url, 3, calls_quick_retry(100)));
	assert_true(fragile_wait_held(c->res, 1, WAIT_MS));
	json_t *during = hs_get_workflow(c->s, "kill");
	assert_string_equal(hs_str(hs_step_at(during, 1), "status"), "running");
	json_decref(during);
	assert_true(fragile_applied(c->res, "kill/1"));
	kill_while_held(c, 2);
	assert_true(fragile_wait_arrived(c->res, 4, WAIT_MS));
	assert_false(fragile_applied(c->res, "kill/2"));
	kill_while_held(c, 4);
	json_t *wf = hs_wait_workflow(c->s, "kill", "completed", WAIT_MS);

	fragile_record *r = calls_records_exactly(c->res, 5);
	const char *const keys[] = {"kill/0", "kill/1", "kill/1", "kill/2", "kill/2"};
	const char *const attempts[] = {"1", "1", "2", "1", "2"};
	const fragile_outcome outcomes[] = {FRAGILE_ANSWERED, FRAGILE_DROPPED, FRAGILE_DUPLICATE,
					    FRAGILE_CLIENT_GONE, FRAGILE_ANSWERED};
	for (size_t i = 0; i < 5; i++) {
		assert_string_equal(r[i].idempotency_key, keys[i]);
		assert_string_equal(r[i].attempt, attempts[i]);
		assert_int_equal(r[i].outcome, outcomes[i]);
		assert_true(i == 0 || r[i].token > r[i - 1].token);
	}
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(hs_int(hs_step_at(wf, i), "attempts"), i == 0 ? 1 : 2);
	assert_int_equal(hs_int(hs_step_at(wf, 1), "fencing_token"), r[2].token);
	assert_int_equal(hs_int(hs_step_at(wf, 2), "fencing_token"), r[4].token);
	json_t *events = hs_get_events(c->s, "kill");
	for (int step = 1; step <= 2; step++) {
		assert_non_null(hs_event_find(events, "step_interrupted", step, 1));
		calls_assert_event(hs_event_find(events, "step_completed", step, 2),
				   "step_completed", "POST", c->url, 200);
	}
	fragile_records_free(r, 5);
	json_decref(events);
	json_decref(wf);

	fragile_stats s;
	fragile_get_stats(c->res, &s);
	assert_int_equal(s.applied, 3); /* = the number of workers */
	assert_int_equal(s.duplicates, 1);
	calls_assert_sound(c->res);
}

/* Polls until the workflow's history has a step_failed event of step 0, attempt 2. */
static json_t *wait_failed_attempt(const hs_server *s, const char *id)
{
	for (int i = 0; i < WAIT_MS / 20; i++) {
		json_t *events = hs_get_events(s, id);
		json_t *ev = hs_event_find(events, "step_failed", 0, 2);
		if (ev) {
			json_incref(ev);
			json_decref(events);
			return ev;
		}
		json_decref(events);
		struct timespec ts = {0, 20 * 1000000L};
		nanosleep(&ts, NULL);
	}
	fail_msg("no step_failed event for attempt 2 of %s", id);
	return NULL;
}

/*
 * A call step accepted earlier runs on a batond that cannot load libcurl (restarted
 * after kill -9 without --allow-call, a file that is not a library first on
 * LD_LIBRARY_PATH): the attempt fails with a retryable error that says so, nothing is
 * sent; once the file is gone, the next attempt loads the real libcurl and the call is
 * made, with the same Idempotency-Key, without a restart.
 */
static void test_stored_call_waits_for_libcurl(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 200, .delay_ms = 60000});
	calls_create(c->s, calls_workflow("nocurl", c->url, 1,
					  json_pack("{s:i, s:i, s:f}", "max_attempts", 50,
						    "first_retry_ms", 300, "backoff", 1.0)));
	assert_true(fragile_wait_held(c->res, 1, WAIT_MS));
	hs_kill(c->s);
	assert_true(fragile_wait_finished(c->res, 1, WAIT_MS));

	char dir[] = "/tmp/baton-nocurl-XXXXXX", lib[64];
	assert_non_null(mkdtemp(dir));
	snprintf(lib, sizeof lib, "%s/libcurl.so.4", dir);
	FILE *f = fopen(lib, "w");
	assert_non_null(f);
	fputs("not a shared library\n", f);
	fclose(f);
	assert_int_equal(hs_set_args(c->s, NULL), 0);
	hs_set_env(c->s, "LD_LIBRARY_PATH", dir);
	assert_int_equal(hs_start(c->s), 0);

	json_t *ev = wait_failed_attempt(c->s, "nocurl");
	const char *error = hs_str(ev, "error");
	if (!strstr(error, "HTTP steps need libcurl"))
		fail_msg("the failed attempt says \"%s\", not that HTTP steps need libcurl", error);
	assert_true(json_is_integer(json_object_get(ev, "retry_in_ms")));
	json_decref(ev);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 1); /* the attempt cut off by the kill, nothing since */

	unlink(lib);
	rmdir(dir);
	json_t *wf = hs_wait_workflow(c->s, "nocurl", "completed", WAIT_MS);
	assert_true(hs_int(hs_step_at(wf, 0), "attempts") >= 3);
	json_decref(wf);
	fragile_record *r = calls_records_exactly(c->res, 2);
	assert_string_equal(r[0].idempotency_key, "nocurl/0");
	assert_string_equal(r[1].idempotency_key, "nocurl/0");
	assert_true(r[1].token > r[0].token);
	fragile_records_free(r, 2);
	calls_assert_sound(c->res);
}

/* ---- a call given up on ----------------------------------------------------------- */

/* A resource that goes on working after its client hung up: a bare listener on 127.0.0.1
 * and the batond allowed to call it. */
typedef struct lingering {
	int l;	/* the listener */
	int fd; /* the given-up call's connection, -1 once closed */
	hs_server *s;
	char url[80];
} lingering;

static int lingering_setup(void **state)
{
	lingering *g = calloc(1, sizeof *g);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	g->fd = -1;
	g->l = socket(AF_INET, SOCK_STREAM, 0);
	if (g->l < 0 || bind(g->l, (struct sockaddr *)&a, sizeof a) != 0 || listen(g->l, 8) != 0 ||
	    getsockname(g->l, (struct sockaddr *)&a, &len) != 0)
		return -1;
	char allow[40];
	snprintf(allow, sizeof allow, "http://127.0.0.1:%d/", ntohs(a.sin_port));
	snprintf(g->url, sizeof g->url, "%sop", allow);
	const char *args[] = {"--allow-call", allow, NULL};
	g->s = hs_open(args);
	*state = g;
	return g->s ? 0 : -1;
}

static int lingering_teardown(void **state)
{
	lingering *g = *state;
	int rc = hs_close(g->s);
	if (g->fd >= 0)
		close(g->fd);
	close(g->l);
	free(g);
	return rc;
}

/* Reads fd until the end of a request's head; false when none came within ms. */
static bool read_head(int fd, int ms)
{
	char buf[8192];
	size_t n = 0;
	for (int64_t end = hs_mono_ms() + ms; hs_mono_ms() < end && n < sizeof buf - 1;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 100) != 1)
			continue;
		ssize_t got = read(fd, buf + n, sizeof buf - 1 - n);
		if (got <= 0)
			return false;
		n += (size_t)got;
		buf[n] = 0;
		if (strstr(buf, "\r\n\r\n"))
			return true;
	}
	return false;
}

/* Whether the listener has a connection waiting within ms. */
static bool arrives(int l, int ms)
{
	struct pollfd p = {.fd = l, .events = POLLIN};
	return poll(&p, 1, ms) == 1;
}

/*
 * A call that baton gives up on (here its timeout) may still run at the resource: the
 * resource is granted again only once the resource has closed that call's connection too.
 * The resource here notices the hang-up, works on for a second, then closes; the next
 * holder's call must not arrive before. Before, baton closed its side and granted the
 * next step at once, whose call arrived while the first one still ran.
 */
static void test_given_up_call_keeps_the_resource_until_closed(void **state)
{
	lingering *g = *state;
	char body[512];
	for (int i = 0; i < 2; i++) {
		snprintf(body, sizeof body,
			 "{\"id\": \"linger-%d\", \"resource\": \"linger\", \"workers\": [\"w\"],"
			 " \"call\": {\"url\": \"%s\", \"timeout_ms\": %d},"
			 " \"retry\": {\"max_attempts\": 1}}",
			 i, g->url, i == 0 ? 300 : 10000);
		json_decref(hs_create_workflow(g->s, json_loads(body, 0, NULL)));
	}
	assert_true(arrives(g->l, WAIT_MS));
	g->fd = accept(g->l, NULL, NULL);
	assert_true(g->fd >= 0);
	assert_true(read_head(g->fd, WAIT_MS));
	/* batond hangs up at the timeout: the resource reads the end of the connection */
	char c;
	for (int64_t end = hs_mono_ms() + WAIT_MS; read(g->fd, &c, 1) > 0;)
		assert_true(hs_mono_ms() < end);
	/* ... and works on for a second: nothing else may reach it meanwhile */
	bool early = arrives(g->l, 1000);
	close(g->fd);
	g->fd = -1;
	if (early)
		fail_msg("the next holder's call arrived while the given-up call still ran");
	assert_true(arrives(g->l, WAIT_MS));
	int fd = accept(g->l, NULL, NULL);
	assert_true(fd >= 0);
	assert_true(read_head(fd, WAIT_MS));
	static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
				 "Content-Length: 2\r\nConnection: close\r\n\r\n{}";
	assert_int_equal(write(fd, ok, sizeof ok - 1), (ssize_t)(sizeof ok - 1));
	close(fd);
	json_decref(hs_wait_workflow(g->s, "linger-0", "failed", WAIT_MS));
	json_decref(hs_wait_workflow(g->s, "linger-1", "completed", WAIT_MS));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_fragile_detects, calls_setup_resource_only,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_contention, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_503_then_200_retried, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_400_not_retried, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_429_retry_after_honoured, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_timeout_retried, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_given_up_call_keeps_the_resource_until_closed,
					    lingering_setup, lingering_teardown),
	    cmocka_unit_test_setup_teardown(test_lost_answer_applied_once, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_sigkill_during_call, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_stored_call_waits_for_libcurl, calls_setup,
					    calls_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

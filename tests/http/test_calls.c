/*
 * test_calls.c - HTTP steps against a fragile shared resource (issue 4), over HTTP
 * against the real batond: a step's `call` reaches the resource one request at a time,
 * with fencing tokens that only grow and an Idempotency-Key "<workflow id>/<step index>"
 * that stays the same over retries and restarts; 5xx, 429 (honouring Retry-After),
 * timeouts and lost answers are retried, other 4xx and redirects are not; a SIGKILL in
 * the middle of a call repeats it after restart without applying it twice; only URLs
 * under the operator's --allow-call prefixes are accepted; baton's own headers cannot be
 * overridden; header values never leave batond except towards the resource; without a
 * usable libcurl, a batond that allows calls refuses to start and says why.
 *
 * Each test gets its own fragile resource (tests/harness/fragile.h, the oracle: it
 * records every request, answers 500 to an overlap and 409 to a stale token, and
 * deduplicates applied operations by Idempotency-Key) and its own batond.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../harness/fragile.h"
#include "../harness/harness.h"

#define WAIT_MS 30000
#define SECRET	"Bearer s3cret"
#define SECRET2 "k3y-zz9-secret"

typedef struct ctx {
	fragile *res;
	hs_server *s;	 /* batond allowed to call the resource */
	hs_server *bare; /* batond without --allow-call (only in some tests) */
	char *url;	 /* the resource's operation URL, http://127.0.0.1:PORT/op */
} ctx;

/* ---- fixtures ------------------------------------------------------------------- */

static int teardown(void **state);

/*
 * Opens the resource and, when `prefixes` is not NULL, batond allowed to call them (each
 * a path on the resource, "/" for all of it), at `log_level` when not NULL. On failure
 * releases what was opened (cmocka runs no teardown after a failed setup).
 */
static int open_ctx(void **state, const char *const *prefixes, const char *log_level)
{
	ctx *c = calloc(1, sizeof *c);
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
	if (log_level) {
		args[n++] = "--log-level";
		args[n++] = log_level;
	}
	c->s = hs_open(args);
	for (size_t i = 0; i < 4; i++)
		free(urls[i]);
out:
	if (c->res && (c->s || !prefixes))
		return 0;
	teardown(state);
	*state = NULL;
	return -1;
}

static int setup(void **state)
{
	static const char *const all[] = {"/", NULL};
	return open_ctx(state, all, NULL);
}

/* The same with --log-level debug: the most batond ever writes to its log. */
static int setup_debug(void **state)
{
	static const char *const all[] = {"/", NULL};
	return open_ctx(state, all, "debug");
}

/* Two prefixes, one without and one with a trailing slash; plus a batond with none. */
static int setup_prefixes(void **state)
{
	static const char *const two[] = {"/api", "/v2/", NULL};
	if (open_ctx(state, two, NULL) != 0)
		return -1;
	ctx *c = *state;
	c->bare = hs_open(NULL);
	if (c->bare)
		return 0;
	teardown(state);
	*state = NULL;
	return -1;
}

static int setup_resource_only(void **state)
{
	return open_ctx(state, NULL, NULL);
}

/* batond first, so that no call is in flight when the resource goes away. */
static int teardown(void **state)
{
	ctx *c = *state;
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

static json_t *step_at(const json_t *wf, size_t i)
{
	json_t *st = json_array_get(json_object_get(wf, "steps"), i);
	assert_non_null(st);
	return st;
}

static char *key_of(const char *wf_id, int step)
{
	char *k = NULL;
	assert_true(asprintf(&k, "%s/%d", wf_id, step) > 0);
	return k;
}

/* A retry policy with a short backoff: the first retry after 2 * initial ms. */
static json_t *quick_retry(int initial_ms)
{
	return json_pack("{s:i, s:f, s:i}", "initial_delay_ms", initial_ms, "backoff", 2.0,
			 "max_delay_ms", 2000);
}

/*
 * A workflow `id` on `resource` whose workflow-level call posts to `url` and whose
 * `n` workers are named "w0".."w<n-1>", each with its own call body {"n": i}.
 */
static json_t *call_workflow(const char *id, const char *url, int n, json_t *retry)
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
static void create(const hs_server *s, json_t *body)
{
	json_decref(hs_create_workflow(s, body));
}

/* Fails the test unless the resource never saw an overlap, a stale token or a bad request. */
static void assert_resource_sound(fragile *res)
{
	fragile_stats st;
	fragile_get_stats(res, &st);
	if (st.overlaps || st.stale || st.bad || st.max_in_flight > 1)
		fail_msg(
		    "the resource saw %zu overlapping requests (at most %zu at once), %zu stale"
		    " tokens, %zu bad requests",
		    st.overlaps, st.max_in_flight, st.stale, st.bad);
}

static void dump_records(const fragile_record *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, "  #%zu %s %s key=%s token=%lld attempt=%s -> %d %s\n", r[i].seq,
			r[i].method, r[i].path, r[i].idempotency_key ? r[i].idempotency_key : "-",
			r[i].token, r[i].attempt ? r[i].attempt : "-", r[i].status,
			fragile_outcome_name(r[i].outcome));
}

/* The resource's records, asserting there are exactly `want`. Free with fragile_records_free. */
static fragile_record *records_exactly(fragile *res, size_t want)
{
	size_t n;
	fragile_record *r = fragile_records(res, &n);
	if (n != want) {
		dump_records(r, n);
		fail_msg("the resource saw %zu requests, expected %zu", n, want);
	}
	return r;
}

/* Value of header `name` in a record's "Name: value\n" lines, or NULL; caller frees. */
static char *record_header(const fragile_record *r, const char *name)
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
static void assert_call_event(const json_t *ev, const char *what, const char *method,
			      const char *url, int http_status)
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

static bool contains(const char *hay, const char *needle)
{
	return hay && strstr(hay, needle) != NULL;
}

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
	ctx *c = *state;
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
	assert_true(r[10].finished_ms - r[10].arrived_ms < 10000); /* noticed, not waited out */
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
		char *tag = record_header(&r[i], "X-Run");
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
		json_t *st = step_at(wf, (size_t)i);
		char *key = key_of(id, i);
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
		assert_call_event(hs_event_find(events, "step_completed", i, 1), key, "PUT", url,
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
	ctx *c = *state;
	/* A little work per request widens the window in which an overlap would show. */
	fragile_set_default(c->res, (fragile_action){.status = 200, .delay_ms = 15});
	post_job jobs[N_WF];
	pthread_t threads[N_WF];
	for (int i = 0; i < N_WF; i++) {
		char id[32];
		snprintf(id, sizeof id, "contend-%02d", i);
		json_t *body = call_workflow(id, c->url, N_WORKERS, NULL);
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
	assert_resource_sound(c->res);
	if (n != N_WF * N_WORKERS) {
		dump_records(r, n);
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
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 503});
	create(c->s, call_workflow("r503", c->url, 1, quick_retry(50)));
	json_t *wf = hs_wait_workflow(c->s, "r503", "completed", WAIT_MS);
	fragile_record *r = records_exactly(c->res, 2);
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
	char *ctype = record_header(&r[1], "Content-Type");
	assert_string_equal(ctype, "application/json");
	free(ctype);

	json_t *st = step_at(wf, 0);
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
	assert_call_event(failed, "step_failed attempt 1", "POST", c->url, 503);
	assert_true(json_is_integer(json_object_get(failed, "retry_in_ms")));
	assert_true(contains(hs_str(failed, "error"), "503"));
	assert_call_event(hs_event_find(events, "step_completed", 0, 2), "step_completed attempt 2",
			  "POST", c->url, 200);
	assert_int_equal(hs_event_count(events, "step_failed", -1, -1), 1);
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	assert_resource_sound(c->res);
	assert_true(fragile_applied(c->res, "r503/0"));
}

/* 400 is not retried: the step and its workflow fail after one attempt; later steps never call. */
static void test_400_not_retried(void **state)
{
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 400});
	create(c->s, call_workflow("r400", c->url, 2, quick_retry(50)));
	json_t *wf = hs_wait_workflow(c->s, "r400", "failed", WAIT_MS);
	fragile_record *r = records_exactly(c->res, 1);
	assert_string_equal(r[0].idempotency_key, "r400/0");
	fragile_records_free(r, 1);
	json_t *st = step_at(wf, 0);
	assert_string_equal(hs_str(st, "status"), "failed");
	assert_int_equal(hs_int(st, "attempts"), 1);
	assert_true(contains(hs_str(st, "error"), "400"));
	assert_int_equal(hs_int(step_at(wf, 1), "attempts"), 0);
	assert_true(contains(hs_str(wf, "error"), "400"));
	json_t *events = hs_get_events(c->s, "r400");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	assert_call_event(failed, "step_failed", "POST", c->url, 400);
	assert_true(json_is_null(json_object_get(failed, "retry_in_ms")));
	assert_int_equal(hs_event_count(events, "lock_acquired", -1, -1), 1);
	json_decref(events);
	json_decref(wf);
	fragile_stats s;
	fragile_get_stats(c->res, &s);
	assert_int_equal(s.applied, 0);
	assert_resource_sound(c->res);
}

/* 429 with Retry-After: 3 waits about 3 s, although the backoff asks for 200 ms. */
static void test_429_retry_after_honoured(void **state)
{
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 429, .retry_after = "3"});
	create(c->s, call_workflow("r429", c->url, 1, quick_retry(100)));
	json_t *wf = hs_wait_workflow(c->s, "r429", "completed", WAIT_MS);
	fragile_record *r = records_exactly(c->res, 2);
	int64_t gap = r[1].arrived_ms - r[0].finished_ms;
	if (gap < 2900 || gap > 10000)
		fail_msg("the retry came %lld ms after the 429, expected about 3000",
			 (long long)gap);
	assert_string_equal(r[1].idempotency_key, "r429/0");
	assert_true(r[1].token > r[0].token);
	assert_int_equal(hs_int(step_at(wf, 0), "attempts"), 2);
	json_t *events = hs_get_events(c->s, "r429");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	assert_call_event(failed, "step_failed", "POST", c->url, 429);
	assert_int_equal(hs_int(failed, "retry_in_ms"), 3000);
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	assert_resource_sound(c->res);
}

/* A call that outlives its timeout_ms is abandoned and retried with the same key. */
static void test_timeout_retried(void **state)
{
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 200, .delay_ms = 20000});
	json_t *body = call_workflow("rto", c->url, 1, quick_retry(100));
	json_object_set_new(json_object_get(body, "call"), "timeout_ms", json_integer(300));
	create(c->s, body);
	json_t *wf = hs_wait_workflow(c->s, "rto", "completed", WAIT_MS);
	fragile_record *r = records_exactly(c->res, 2);
	assert_int_equal(r[0].outcome, FRAGILE_CLIENT_GONE); /* batond hung up */
	assert_false(r[0].applied);
	/* The resource saw batond give up long before its 20 s answer; how long batond
	 * itself waited is its own measure (the timeout also covers the connect, which the
	 * resource cannot see), checked below on the event. */
	int64_t held = r[0].finished_ms - r[0].arrived_ms;
	if (held > 10000)
		fail_msg("batond waited %lld ms for the delayed answer, timeout_ms is 300",
			 (long long)held);
	assert_int_equal(r[1].status, 200);
	assert_string_equal(r[0].idempotency_key, "rto/0");
	assert_string_equal(r[1].idempotency_key, "rto/0");
	assert_string_equal(r[1].attempt, "2");
	assert_true(r[1].token > r[0].token);
	assert_int_equal(hs_int(step_at(wf, 0), "attempts"), 2);
	json_t *events = hs_get_events(c->s, "rto");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	assert_call_event(failed, "step_failed", "POST", c->url, 0);
	assert_true(contains(hs_str(failed, "error"), "timed out"));
	json_int_t waited = hs_int(failed, "latency_ms");
	if (waited < 299 || waited > 10000)
		fail_msg("the timed-out attempt took %lld ms, timeout_ms is 300",
			 (long long)waited);
	assert_true(json_is_integer(json_object_get(failed, "retry_in_ms")));
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	assert_resource_sound(c->res);
	assert_true(fragile_applied(c->res, "rto/0"));
}

/*
 * A lost answer (applied, connection closed): the retry carries the same key, the
 * resource recognizes it, and the operation is applied once.
 */
static void test_lost_answer_applied_once(void **state)
{
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.drop = true});
	create(c->s, call_workflow("rlost", c->url, 1, quick_retry(50)));
	json_t *wf = hs_wait_workflow(c->s, "rlost", "completed", WAIT_MS);
	fragile_record *r = records_exactly(c->res, 2);
	assert_int_equal(r[0].outcome, FRAGILE_DROPPED);
	assert_int_equal(r[1].outcome, FRAGILE_DUPLICATE);
	assert_string_equal(r[1].idempotency_key, r[0].idempotency_key);
	assert_true(r[1].token > r[0].token);
	assert_int_equal(hs_int(step_at(wf, 0), "attempts"), 2);
	json_t *events = hs_get_events(c->s, "rlost");
	assert_call_event(hs_event_find(events, "step_failed", 0, 1), "step_failed", "POST", c->url,
			  0);
	fragile_records_free(r, 2);
	json_decref(events);
	json_decref(wf);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.applied, 1);
	assert_resource_sound(c->res);
}

/* ---- SIGKILL in the middle of a call ----------------------------------------------- */

/* Kills batond while the resource holds a request, once the resource saw it go restarts it. */
static void kill_while_held(ctx *c, size_t finished_after)
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
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 200});
	fragile_push(c->res, (fragile_action){.drop = true, .delay_ms = 60000});
	fragile_push(c->res, (fragile_action){.status = 200, .delay_ms = 60000});
	create(c->s, call_workflow("kill", c->url, 3, quick_retry(50)));
	assert_true(fragile_wait_held(c->res, 1, WAIT_MS));
	json_t *during = hs_get_workflow(c->s, "kill");
	assert_string_equal(hs_str(step_at(during, 1), "status"), "running");
	json_decref(during);
	assert_true(fragile_applied(c->res, "kill/1"));
	kill_while_held(c, 2);
	assert_true(fragile_wait_arrived(c->res, 4, WAIT_MS));
	assert_false(fragile_applied(c->res, "kill/2"));
	kill_while_held(c, 4);
	json_t *wf = hs_wait_workflow(c->s, "kill", "completed", WAIT_MS);

	fragile_record *r = records_exactly(c->res, 5);
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
		assert_int_equal(hs_int(step_at(wf, i), "attempts"), i == 0 ? 1 : 2);
	assert_int_equal(hs_int(step_at(wf, 1), "fencing_token"), r[2].token);
	assert_int_equal(hs_int(step_at(wf, 2), "fencing_token"), r[4].token);
	json_t *events = hs_get_events(c->s, "kill");
	for (int step = 1; step <= 2; step++) {
		assert_non_null(hs_event_find(events, "step_interrupted", step, 1));
		assert_call_event(hs_event_find(events, "step_completed", step, 2),
				  "step_completed", "POST", c->url, 200);
	}
	fragile_records_free(r, 5);
	json_decref(events);
	json_decref(wf);

	fragile_stats s;
	fragile_get_stats(c->res, &s);
	assert_int_equal(s.applied, 3); /* = the number of workers */
	assert_int_equal(s.duplicates, 1);
	assert_resource_sound(c->res);
}

/* ---- what may be called ---------------------------------------------------------- */

/* POSTs `body` (stolen) and asserts a 400 problem whose detail contains `needle`. */
static void assert_refused(const hs_server *s, json_t *body, const char *needle, const char *what)
{
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	hs_response r;
	hs_post(s, "/workflows", text, &r);
	hs_assert_problem(&r, 400, "invalid-request", what);
	const char *detail = hs_str(r.json, "detail");
	if (needle && !strstr(detail, needle))
		fail_msg("%s: detail \"%s\" does not mention \"%s\"", what, detail, needle);
	hs_response_fini(&r);
	free(text);
}

/* A one-worker workflow whose worker calls `url`. */
static json_t *one_call(const char *url)
{
	return json_pack("{s:s, s:[{s:s, s:{s:s}}]}", "resource", "gateway", "workers", "name",
			 "w0", "call", "url", url);
}

/*
 * Only URLs under an --allow-call prefix, on a path boundary, are accepted at POST;
 * nothing refused is stored or called; a batond without --allow-call refuses every
 * call and says how to allow it.
 */
static void test_allowed_prefixes(void **state)
{
	ctx *c = *state;
	int port = fragile_port(c->res);
	char *base = fragile_url(c->res, "");
	const char *const refused_paths[] = {"/apix", "/ap",	"/",	  "/API/x",
					     "/v2",   "/v2x/y", "/other", "/x/api"};
	for (size_t i = 0; i < sizeof refused_paths / sizeof *refused_paths; i++) {
		char url[256], what[300];
		snprintf(url, sizeof url, "%s%s", base, refused_paths[i]);
		snprintf(what, sizeof what, "POST with call.url %s", url);
		assert_refused(c->s, one_call(url), "--allow-call", what);
	}
	char other[256], host[256], tls[256], ftp[256];
	snprintf(other, sizeof other, "http://127.0.0.1:%d/api/x", port == 65535 ? 1 : port + 1);
	snprintf(host, sizeof host, "http://localhost:%d/api/x", port);
	snprintf(tls, sizeof tls, "https://127.0.0.1:%d/api/x", port);
	snprintf(ftp, sizeof ftp, "ftp://127.0.0.1:%d/api/x", port);
	assert_refused(c->s, one_call(other), "--allow-call", "another port");
	assert_refused(c->s, one_call(host), "--allow-call", "another host name");
	assert_refused(c->s, one_call(tls), "--allow-call", "another scheme");
	assert_refused(c->s, one_call(ftp), "http://", "a scheme other than http(s)");

	/* The merged call is checked: the worker's url wins over the workflow's. */
	char *api = fragile_url(c->res, "/api/ok"), *outside = fragile_url(c->res, "/admin");
	json_t *body = one_call(outside);
	json_object_set_new(body, "call", json_pack("{s:s}", "url", api));
	assert_refused(c->s, body, "workers[0].call.url", "worker url outside, default inside");
	body = json_pack("{s:s, s:[s], s:{s:s}}", "resource", "gateway", "workers", "w0", "call",
			 "url", outside);
	assert_refused(c->s, body, "--allow-call", "default url outside");

	/* Accepted, and called where they say. */
	const char *const ok_paths[] = {"/api", "/api/x", "/api?q=1", "/v2/y"};
	const char *const seen_paths[] = {"/api", "/api/x", "/api", "/v2/y"};
	for (size_t i = 0; i < 4; i++) {
		char url[256], id[32];
		snprintf(url, sizeof url, "%s%s", base, ok_paths[i]);
		snprintf(id, sizeof id, "ok-%zu", i);
		json_t *b = one_call(url);
		json_object_set_new(b, "id", json_string(id));
		create(c->s, b);
		json_decref(hs_wait_workflow(c->s, id, "completed", WAIT_MS));
	}
	body = one_call(api);
	json_object_set_new(body, "id", json_string("ok-merged"));
	json_object_set_new(body, "call", json_pack("{s:s}", "url", outside));
	create(c->s, body); /* the worker's allowed url wins over the default */
	json_decref(hs_wait_workflow(c->s, "ok-merged", "completed", WAIT_MS));
	assert_int_equal(hs_db_count(c->s, "SELECT count(*) FROM workflows"), 5);
	fragile_record *r = records_exactly(c->res, 5);
	for (size_t i = 0; i < 4; i++)
		assert_string_equal(r[i].path, seen_paths[i]);
	assert_string_equal(r[4].path, "/api/ok");
	fragile_records_free(r, 5);

	/* No --allow-call: every call is refused, with the way to allow it. */
	assert_refused(c->bare, one_call(api), "--allow-call", "batond without --allow-call");
	body = json_pack("{s:s, s:[s], s:{s:s}}", "resource", "gateway", "workers", "w0", "call",
			 "url", api);
	assert_refused(c->bare, body, "--allow-call", "default call, batond without --allow-call");
	assert_int_equal(hs_db_count(c->bare, "SELECT count(*) FROM workflows"), 0);
	free(api);
	free(outside);
	free(base);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 5);
}

/*
 * A path that climbs out of an allowed prefix with dot segments ("/api/../admin") is
 * under it as text, but would reach /admin once normalized (libcurl removes dot
 * segments unless told not to; many servers decode %2e): refused at POST, never called.
 */
static void test_dot_segments_refused(void **state)
{
	ctx *c = *state;
	const char *const climbs[] = {"/api/../admin",	   "/api/./../admin", "/v2/../admin",
				      "/api/%2e%2e/admin", "/api/%2E./admin", "/api/.%2e"};
	for (size_t i = 0; i < sizeof climbs / sizeof *climbs; i++) {
		char *url = fragile_url(c->res, climbs[i]);
		char what[300];
		snprintf(what, sizeof what, "POST with call.url %s", url);
		assert_refused(c->s, one_call(url), NULL, what);
		free(url);
	}
	assert_int_equal(hs_db_count(c->s, "SELECT count(*) FROM workflows"), 0);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 0);
}

/* Headers that baton sets, or that frame the message, are refused in call.headers. */
static void test_reserved_headers_refused(void **state)
{
	ctx *c = *state;
	const char *const reserved[] = {"Idempotency-Key",
					"idempotency-key",
					"Baton-Fencing-Token",
					"BATON-FENCING-TOKEN",
					"Baton-Workflow",
					"Baton-Worker",
					"Baton-Attempt",
					"Host",
					"Content-Length",
					"Transfer-Encoding",
					"Expect",
					"Connection"};
	for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
		char what[128];
		json_t *worker_level = one_call(c->url);
		json_t *call = json_object_get(
		    json_array_get(json_object_get(worker_level, "workers"), 0), "call");
		json_object_set_new(call, "headers", json_pack("{s:s}", reserved[i], "1"));
		snprintf(what, sizeof what, "worker call.headers.%s", reserved[i]);
		assert_refused(c->s, worker_level, reserved[i], what);

		json_t *wf_level =
		    json_pack("{s:s, s:[s], s:{s:s, s:{s:s}}}", "resource", "gateway", "workers",
			      "w0", "call", "url", c->url, "headers", reserved[i], "1");
		snprintf(what, sizeof what, "workflow call.headers.%s", reserved[i]);
		assert_refused(c->s, wf_level, reserved[i], what);
	}
	assert_int_equal(hs_db_count(c->s, "SELECT count(*) FROM workflows"), 0);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 0);
}

/* ---- secrets and redirects --------------------------------------------------------- */

static void assert_no_secret(const char *text, const char *where)
{
	if (contains(text, "s3cret") || contains(text, SECRET2))
		fail_msg("a header value leaked into %s: %.2000s", where, text);
}

/*
 * Header values reach the resource (workflow-level headers merged under the worker's,
 * the worker's winning) but are never echoed: not in the POST answer, GET of the
 * workflow or of the list, the events, nor batond's log at debug level.
 */
static void test_header_values_not_echoed(void **state)
{
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 503}); /* a failure event and log line */
	json_t *body = call_workflow("sec", c->url, 2, quick_retry(50));
	json_object_set_new(json_object_get(body, "call"), "headers",
			    json_pack("{s:s, s:s}", "Authorization", SECRET, "X-Tenant", "acme"));
	json_t *w0call =
	    json_object_get(json_array_get(json_object_get(body, "workers"), 0), "call");
	json_object_set_new(w0call, "headers",
			    json_pack("{s:s, s:s}", "X-Tenant", "beta", "X-Api-Key", SECRET2));
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	hs_response created;
	hs_post(c->s, "/workflows", text, &created);
	free(text);
	assert_int_equal(created.status, 201);
	assert_no_secret(created.body, "the POST answer");
	hs_response_fini(&created);
	json_t *wf = hs_wait_workflow(c->s, "sec", "completed", WAIT_MS);

	fragile_record *r = records_exactly(c->res, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_string_equal(r[i].authorization, SECRET);
		bool w0 = strcmp(r[i].worker, "w0") == 0;
		char *tenant = record_header(&r[i], "X-Tenant"),
		     *key = record_header(&r[i], "X-Api-Key");
		assert_string_equal(tenant, w0 ? "beta" : "acme");
		if (w0)
			assert_string_equal(key, SECRET2);
		else
			assert_null(key);
		free(tenant);
		free(key);
	}
	fragile_records_free(r, 3);

	json_t *h0 = json_object_get(json_object_get(step_at(wf, 0), "call"), "headers");
	json_t *h1 = json_object_get(json_object_get(step_at(wf, 1), "call"), "headers");
	assert_string_equal(hs_str(h0, "Authorization"), "<redacted>");
	assert_string_equal(hs_str(h0, "X-Api-Key"), "<redacted>");
	assert_string_equal(hs_str(h1, "X-Tenant"), "<redacted>");
	assert_null(json_object_get(h1, "X-Api-Key"));
	json_decref(wf);

	hs_response got;
	hs_get(c->s, "/workflows/sec", &got);
	assert_int_equal(got.status, 200);
	assert_no_secret(got.body, "GET /workflows/sec");
	hs_response_fini(&got);
	hs_get(c->s, "/workflows", &got);
	assert_no_secret(got.body, "GET /workflows");
	hs_response_fini(&got);
	hs_get(c->s, "/workflows/sec/events", &got);
	assert_int_equal(got.status, 200);
	assert_true(contains(got.body, "step_failed"));
	assert_no_secret(got.body, "the events");
	hs_response_fini(&got);
	char *log = hs_log_text(c->s);
	assert_true(contains(log, "wf=sec"));
	assert_no_secret(log, "batond's log");
	free(log);
	assert_resource_sound(c->res);
}

/* A 302 is not followed: the step fails at once and its Location is never requested. */
static void test_redirect_not_followed(void **state)
{
	ctx *c = *state;
	char *elsewhere = fragile_url(c->res, "/elsewhere");
	fragile_push(c->res, (fragile_action){.status = 302, .location = elsewhere});
	create(c->s, call_workflow("redir", c->url, 1, quick_retry(50)));
	json_t *wf = hs_wait_workflow(c->s, "redir", "failed", WAIT_MS);
	fragile_record *r = records_exactly(c->res, 1);
	assert_string_equal(r[0].path, "/op");
	assert_int_equal(r[0].status, 302);
	fragile_records_free(r, 1);
	json_t *st = step_at(wf, 0);
	assert_int_equal(hs_int(st, "attempts"), 1);
	assert_true(contains(hs_str(st, "error"), "redirect"));
	json_t *events = hs_get_events(c->s, "redir");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	assert_call_event(failed, "step_failed", "POST", c->url, 302);
	assert_true(json_is_null(json_object_get(failed, "retry_in_ms")));
	json_decref(events);
	json_decref(wf);
	free(elsewhere);
	assert_resource_sound(c->res);
}

/*
 * batond loads libcurl only when calls are allowed. With a libcurl.so.4 that is not a
 * library first on LD_LIBRARY_PATH (so the dynamic loader finds it before the real
 * one), a batond with --allow-call exits 1 at start and its log says that HTTP steps
 * need libcurl; it never listens.
 */
static void test_allow_call_needs_libcurl(void **state)
{
	(void)state;
	char dir[] = "/tmp/baton-nocurl-XXXXXX", lib[64], db[64];
	assert_non_null(mkdtemp(dir));
	snprintf(lib, sizeof lib, "%s/libcurl.so.4", dir);
	snprintf(db, sizeof db, "%s/baton.db", dir);
	FILE *f = fopen(lib, "w");
	assert_non_null(f);
	fputs("not a shared library\n", f);
	fclose(f);

	const char *const args[] = {"--listen",	    "127.0.0.1:0",	   "--db", db,
				    "--allow-call", "http://127.0.0.1:9/", NULL};
	char text[8192];
	int status = hs_run_batond(args, "LD_LIBRARY_PATH", dir, WAIT_MS, text, sizeof text);
	if (status == -1)
		fail_msg("batond with --allow-call and no usable libcurl did not exit");
	unlink(lib);
	char path[96];
	static const char *const suffix[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "%s%s", db, suffix[i]);
		unlink(path);
	}
	rmdir(dir);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 1)
		fail_msg("batond ended with wait status %d, expected exit 1; log:\n%s", status,
			 text);
	if (!strstr(text, "need libcurl") || strstr(text, "listening on"))
		fail_msg("batond's log does not say that HTTP steps need libcurl:\n%s", text);
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
	ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 200, .delay_ms = 60000});
	create(c->s, call_workflow("nocurl", c->url, 1,
				   json_pack("{s:i, s:i, s:f}", "max_attempts", 50,
					     "initial_delay_ms", 300, "backoff", 1.0)));
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
	assert_true(hs_int(step_at(wf, 0), "attempts") >= 3);
	json_decref(wf);
	fragile_record *r = records_exactly(c->res, 2);
	assert_string_equal(r[0].idempotency_key, "nocurl/0");
	assert_string_equal(r[1].idempotency_key, "nocurl/0");
	assert_true(r[1].token > r[0].token);
	fragile_records_free(r, 2);
	assert_resource_sound(c->res);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_fragile_detects, setup_resource_only, teardown),
	    cmocka_unit_test_setup_teardown(test_contention, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_503_then_200_retried, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_400_not_retried, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_429_retry_after_honoured, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_timeout_retried, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lost_answer_applied_once, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_sigkill_during_call, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_allowed_prefixes, setup_prefixes, teardown),
	    cmocka_unit_test_setup_teardown(test_dot_segments_refused, setup_prefixes, teardown),
	    cmocka_unit_test_setup_teardown(test_reserved_headers_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_header_values_not_echoed, setup_debug, teardown),
	    cmocka_unit_test_setup_teardown(test_redirect_not_followed, setup, teardown),
	    cmocka_unit_test(test_allow_call_needs_libcurl),
	    cmocka_unit_test_setup_teardown(test_stored_call_waits_for_libcurl, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

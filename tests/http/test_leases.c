/*
 * test_leases.c - leases over HTTP against the real batond: grant, renew, release (twice),
 * try-once refusal with who holds it, expiry that hands the resource to the next waiter
 * at a higher token (lease_expired in the history, 410 for the late holder), one FIFO
 * queue shared with workflow steps, the end of wait_ms, a waiter whose client goes away,
 * request_id, kill -9 with a lease held, bad input, the lease counters of /metrics, and
 * lease grants, releases and expiries in the resource's live event stream.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../harness/harness.h"
#include "../harness/prom.h"
#include "../harness/sse.h"

#define WAIT_MS 60000

/* POSTs a lease request; returns the answer's JSON (new reference) and its status. */
static json_t *acquire(const hs_server *s, const char *resource, const char *body, long *status)
{
	char path[256];
	snprintf(path, sizeof path, "/resources/%s/leases", resource);
	hs_response r;
	if (hs_post(s, path, body, &r) != 0)
		fail_msg("POST %s: %s", path, r.error);
	*status = r.status;
	if (r.status == 201) {
		assert_non_null(r.location);
		char want[200];
		snprintf(want, sizeof want, "/leases/%s", hs_str(r.json, "id"));
		assert_string_equal(r.location, want);
	}
	if (r.status >= 400)
		assert_string_equal(r.content_type, "application/problem+json");
	json_t *j = json_incref(r.json);
	hs_response_fini(&r);
	return j;
}

/* A lease that must be granted at once (asserted 201). */
static json_t *acquire_ok(const hs_server *s, const char *resource, const char *body)
{
	long status;
	json_t *l = acquire(s, resource, body, &status);
	if (status != 201)
		fail_msg("lease on %s answered %ld", resource, status);
	return l;
}

static long lease_call(const hs_server *s, const char *method, const char *id, const char *suffix,
		       const char *body, json_t **out)
{
	char path[256];
	snprintf(path, sizeof path, "/leases/%s%s", id, suffix);
	hs_request req = {.method = method,
			  .path = path,
			  .content_type = body ? "application/json" : NULL,
			  .body = body,
			  .body_len = body ? strlen(body) : 0};
	hs_response r;
	if (hs_send(s, &req, &r) != 0)
		fail_msg("%s %s: %s", method, path, r.error);
	long status = r.status;
	if (out)
		*out = json_incref(r.json);
	hs_response_fini(&r);
	return status;
}

static json_t *resource(const hs_server *s, const char *name)
{
	char path[256];
	snprintf(path, sizeof path, "/resources/%s", name);
	return hs_get_json(s, path, 200);
}

typedef struct queue_wait {
	const hs_server *s;
	const char *name;
	size_t n;
} queue_wait;

static bool has_waiters(void *arg)
{
	queue_wait *q = arg;
	json_t *r = resource(q->s, q->name);
	bool ok = json_array_size(json_object_get(r, "waiters")) == q->n;
	json_decref(r);
	return ok;
}

static void wait_waiters(const hs_server *s, const char *name, size_t n)
{
	queue_wait q = {s, name, n};
	if (!hs_wait_until(has_waiters, &q, WAIT_MS))
		fail_msg("resource %s never had %zu waiters", name, n);
}

/* A lease request from a thread of its own (it may wait). */
typedef struct lease_job {
	const hs_server *s;
	const char *resource, *body;
	long status;
	json_t *lease;
	pthread_t t;
} lease_job;

static void *lease_thread(void *arg)
{
	lease_job *j = arg;
	char path[256];
	snprintf(path, sizeof path, "/resources/%s/leases", j->resource);
	hs_response r;
	hs_post(j->s, path, j->body, &r);
	j->status = r.status;
	j->lease = json_incref(r.json);
	hs_response_fini(&r);
	return NULL;
}

static void job_start(lease_job *j)
{
	assert_int_equal(pthread_create(&j->t, NULL, lease_thread, j), 0);
}

/* ---- tests ---- */

static void test_grant_renew_release(void **state)
{
	hs_server *s = *state;
	json_t *l = acquire_ok(s, "db", "{\"holder\": \"nightly-backup\", \"ttl_ms\": 15000}");
	const char *id = hs_str(l, "id");
	assert_string_equal(hs_str(l, "resource"), "db");
	assert_string_equal(hs_str(l, "holder"), "nightly-backup");
	assert_string_equal(hs_str(l, "state"), "held");
	assert_int_equal(hs_int(l, "fencing_token"), 1);
	assert_int_equal(hs_int(l, "ttl_ms"), 15000);
	int64_t exp1 = hs_time(l, "expires_at");

	json_t *got;
	assert_int_equal(lease_call(s, "GET", id, "", NULL, &got), 200);
	assert_string_equal(hs_str(got, "state"), "held");
	assert_int_equal(hs_int(got, "fencing_token"), 1);
	json_decref(got);

	json_t *res = resource(s, "db");
	json_t *h = json_object_get(res, "holder");
	assert_string_equal(hs_str(h, "kind"), "lease");
	assert_string_equal(hs_str(h, "lease_id"), id);
	assert_string_equal(hs_str(h, "worker"), "nightly-backup");
	json_decref(res);

	/* renewal with a longer ttl: expires later than before */
	json_t *ren;
	assert_int_equal(lease_call(s, "POST", id, "/renew", "{\"ttl_ms\": 60000}", &ren), 200);
	assert_int_equal(hs_int(ren, "ttl_ms"), 60000);
	assert_true(hs_time(ren, "expires_at") > exp1);
	json_decref(ren);
	assert_int_equal(lease_call(s, "POST", id, "/renew", NULL, NULL), 200);

	assert_int_equal(lease_call(s, "DELETE", id, "", NULL, NULL), 204);
	assert_int_equal(lease_call(s, "DELETE", id, "", NULL, NULL), 204);
	assert_int_equal(lease_call(s, "GET", id, "", NULL, &got), 200);
	assert_string_equal(hs_str(got, "state"), "released");
	json_decref(got);
	res = resource(s, "db");
	assert_true(json_is_null(json_object_get(res, "holder")));
	json_decref(res);
	/* its history is a workflow's: granted, released */
	json_t *ev = hs_get_events(s, id);
	assert_non_null(hs_event_find(ev, "lock_acquired", 0, 1));
	assert_non_null(hs_event_find(ev, "lock_released", 0, 1));
	json_decref(ev);
	json_decref(l);
}

static void test_try_once_says_who_holds_it(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\"}");
	long status;
	json_t *b = acquire(s, "db", "{\"holder\": \"b\", \"wait_ms\": 0}", &status);
	assert_int_equal(status, 409);
	assert_string_equal(hs_str(b, "holder"), "a");
	assert_int_equal(hs_int(b, "queue_length"), 0);
	assert_non_null(strstr(hs_str(b, "detail"), "\"a\""));
	json_decref(b);
	json_t *res = resource(s, "db");
	assert_int_equal(json_array_size(json_object_get(res, "waiters")), 0);
	assert_int_equal(hs_int(res, "last_fencing_token"), 1);
	json_decref(res);
	json_decref(a);
}

static void test_expiry_hands_over_with_higher_token(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 1000}");
	const char *aid = hs_str(a, "id");
	lease_job b = {.s = s, .resource = "db", .body = "{\"holder\": \"b\", \"wait_ms\": 60000}"};
	job_start(&b);
	pthread_join(b.t, NULL);
	assert_int_equal(b.status, 201);
	assert_true(hs_int(b.lease, "fencing_token") > hs_int(a, "fencing_token"));
	/* the late holder learns it worked unprotected */
	json_t *p;
	assert_int_equal(lease_call(s, "POST", aid, "/renew", NULL, &p), 410);
	json_decref(p);
	assert_int_equal(lease_call(s, "DELETE", aid, "", NULL, NULL), 410);
	assert_int_equal(lease_call(s, "GET", aid, "", NULL, &p), 200);
	assert_string_equal(hs_str(p, "state"), "expired");
	json_decref(p);
	json_t *ev = hs_get_json(s, "/resources/db/events", 200);
	json_t *list = json_object_get(ev, "events");
	assert_non_null(hs_event_find(list, "lease_expired", 0, 1));
	json_decref(ev);
	json_t *wf = hs_get_workflow(s, aid);
	assert_string_equal(hs_str(wf, "status"), "failed");
	json_decref(wf);
	json_decref(b.lease);
	json_decref(a);
}

/* A lease's life in batond's log: a line when granted, one when it ends (released,
 * expired, or left the queue ungranted), each naming the holder, the resource and the
 * token; nothing about a workflow, which a lease's user never made. */
typedef struct log_wait {
	const hs_server *s;
	const char *what;
} log_wait;

static bool log_says(void *arg)
{
	log_wait *w = arg;
	return hs_log_says(w->s, w->what, NULL);
}

static void test_log_tells_a_leases_life(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	long status;
	json_t *b = acquire(s, "db", "{\"holder\": \"b\", \"wait_ms\": 200}", &status);
	assert_int_equal(status, 409);
	json_decref(b);
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	/* cancelled through /workflows while held, then released: it ends once */
	json_t *d = acquire_ok(s, "db2", "{\"holder\": \"d\", \"ttl_ms\": 60000}");
	char path[200];
	snprintf(path, sizeof path, "/workflows/%s/cancel", hs_str(d, "id"));
	hs_response r;
	if (hs_post(s, path, NULL, &r) != 0 || r.status != 200)
		fail_msg("POST %s: %ld %s", path, r.status, r.error);
	hs_response_fini(&r);
	assert_int_equal(lease_call(s, "DELETE", hs_str(d, "id"), "", NULL, NULL), 204);
	json_t *c = acquire_ok(s, "db", "{\"holder\": \"c\", \"ttl_ms\": 1000}");
	log_wait w = {s, "lease of \"c\" on \"db\" (token 2) expired: not renewed within 1000 ms"};
	if (!hs_wait_until(log_says, &w, WAIT_MS))
		fail_msg("the log never said: %s", w.what);
	char *log = hs_log_text(s);
	assert_non_null(log);
	/* level, then the line after the workflow id */
	static const char *const lines[][2] = {
	    {"INFO ", "lease of \"a\" on \"db\" granted (token 1)\n"},
	    {"INFO ", "lease of \"a\" on \"db\" (token 1) released after "},
	    {"INFO ", "lease of \"c\" on \"db\" granted (token 2)\n"},
	    {"WARN ", "lease of \"c\" on \"db\" (token 2) expired: not renewed within 1000 ms\n"},
	};
	const char *ids[] = {hs_str(a, "id"), hs_str(a, "id"), hs_str(c, "id"), hs_str(c, "id")};
	const char *at = log;
	for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
		char want[300];
		snprintf(want, sizeof want, "%s wf=%s %s", lines[i][0], ids[i], lines[i][1]);
		const char *hit = strstr(at, want);
		if (!hit)
			fail_msg("the log lacks, in order: %s", want);
		at = hit + strlen(want);
	}
	assert_non_null(
	    strstr(log, "lease of \"b\" on \"db\" left the queue without being granted"));
	assert_non_null(strstr(log, "lease of \"d\" on \"db2\" granted (token 1)\n"));
	assert_non_null(strstr(log, "lease of \"d\" on \"db2\" (token 1) released after "));
	assert_null(strstr(log, "lease of \"d\" on \"db2\" left the queue"));
	/* one line each, and no workflow's words */
	const char *p = log;
	int n = 0;
	while ((p = strstr(p, "wf=lease-")) != NULL) {
		n++;
		p++;
	}
	assert_int_equal(n, 7);
	assert_null(strstr(log, "workflow completed"));
	assert_null(strstr(log, "workflow failed"));
	assert_null(strstr(log, "Acquired lock"));
	free(log);
	json_decref(d);
	json_decref(c);
	json_decref(a);
}

static void test_fifo_with_workflow_steps(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	json_t *wf = hs_create_workflow(s, json_pack("{s:s, s:[{s:s, s:i}]}", "resource", "db",
						     "workers", "name", "step", "work_ms", 200));
	const char *wid = hs_str(wf, "id");
	wait_waiters(s, "db", 1);
	lease_job b = {.s = s, .resource = "db", .body = "{\"holder\": \"b\", \"wait_ms\": 60000}"};
	job_start(&b);
	wait_waiters(s, "db", 2);
	json_t *res = resource(s, "db");
	json_t *w = json_object_get(res, "waiters");
	assert_string_equal(hs_str(json_array_get(w, 0), "kind"), "step");
	assert_string_equal(hs_str(json_array_get(w, 1), "kind"), "lease");
	json_decref(res);
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	pthread_join(b.t, NULL);
	assert_int_equal(b.status, 201);
	json_t *done = hs_wait_workflow(s, wid, "completed", WAIT_MS);
	json_int_t step_token = hs_int(hs_step_at(done, 0), "fencing_token");
	/* the step queued first got the resource first; the lease after it */
	assert_int_equal(step_token, hs_int(a, "fencing_token") + 1);
	assert_int_equal(hs_int(b.lease, "fencing_token"), step_token + 1);
	assert_true(hs_time(b.lease, "acquired_at") >= hs_time(hs_step_at(done, 0), "finished_at"));
	json_decref(done);
	json_decref(b.lease);
	json_decref(wf);
	json_decref(a);
}

static void test_wait_ms_ends_and_leaves_queue(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	long status;
	json_t *b = acquire(s, "db", "{\"holder\": \"b\", \"wait_ms\": 1000}", &status);
	assert_int_equal(status, 409);
	assert_string_equal(hs_str(b, "holder"), "a");
	json_decref(b);
	json_t *res = resource(s, "db");
	assert_int_equal(json_array_size(json_object_get(res, "waiters")), 0);
	json_decref(res);
	/* released now, it goes to nobody else: a try-once request gets it */
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	json_t *c = acquire_ok(s, "db", "{\"holder\": \"c\"}");
	assert_int_equal(hs_int(c, "fencing_token"), 2);
	json_decref(c);
	json_decref(a);
}

static void test_disconnected_waiter_leaves_queue(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hs_port(s))};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	const char *body = "{\"holder\": \"gone\", \"wait_ms\": 120000}";
	char req[512];
	int n = snprintf(req, sizeof req,
			 "POST /resources/db/leases HTTP/1.1\r\nHost: x\r\nContent-Type: "
			 "application/json\r\nContent-Length: %zu\r\n\r\n%s",
			 strlen(body), body);
	assert_int_equal(write(fd, req, (size_t)n), n);
	wait_waiters(s, "db", 1);
	close(fd);
	wait_waiters(s, "db", 0);
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	json_t *res = resource(s, "db");
	assert_true(json_is_null(json_object_get(res, "holder")));
	json_decref(res);
	json_t *c = acquire_ok(s, "db", "{\"holder\": \"c\"}");
	assert_int_equal(hs_int(c, "fencing_token"), 2); /* nobody held it in between */
	json_decref(c);
	json_decref(a);
}

static bool nobody_holds_db(void *arg)
{
	json_t *res = resource(arg, "db");
	bool yes = json_is_null(json_object_get(res, "holder"));
	json_decref(res);
	return yes;
}

/* A client that half-closes its socket after its request (as `nc -N` does) is never told it
 * holds a lease it does not hold: either 201 and the lease is held, or a refusal and the
 * resource is free. */
static void test_half_closed_client_is_told_the_truth(void **state)
{
	hs_server *s = *state;
	json_t *l;
	long st = hs_post_half_closed(s, "/resources/db/leases", "{\"holder\": \"h\"}", &l);
	assert_true(st == 201 || st == 409);
	if (st == 201) {
		json_t *res = resource(s, "db");
		assert_string_equal(hs_str(json_object_get(res, "holder"), "lease_id"),
				    hs_str(l, "id"));
		json_decref(res);
	} else { /* given back: the release follows the answer at once */
		assert_true(hs_wait_until(nobody_holds_db, s, WAIT_MS));
	}
	json_decref(l);
}

static void test_request_id_returns_same_lease(void **state)
{
	hs_server *s = *state;
	const char *body = "{\"holder\": \"a\", \"request_id\": \"deploy-42\"}";
	json_t *a = acquire_ok(s, "db", body);
	assert_string_equal(hs_str(a, "id"), "lease-deploy-42");
	long status;
	json_t *again = acquire(s, "db", body, &status);
	assert_int_equal(status, 200);
	assert_string_equal(hs_str(again, "id"), "lease-deploy-42");
	assert_int_equal(hs_int(again, "fencing_token"), hs_int(a, "fencing_token"));
	json_decref(again);
	json_t *res = resource(s, "db");
	assert_int_equal(json_array_size(json_object_get(res, "waiters")), 0);
	assert_int_equal(hs_int(json_object_get(res, "totals"), "grants"), 1);
	json_decref(res);
	json_t *other =
	    acquire(s, "db", "{\"holder\": \"b\", \"request_id\": \"deploy-42\"}", &status);
	assert_int_equal(status, 409);
	json_decref(other);
	/* after its release, the same request still names that lease, not a new one */
	assert_int_equal(lease_call(s, "DELETE", "lease-deploy-42", "", NULL, NULL), 204);
	again = acquire(s, "db", body, &status);
	assert_int_equal(status, 200);
	assert_string_equal(hs_str(again, "state"), "released");
	json_decref(again);
	json_decref(a);
}

static void test_kill9_keeps_a_held_lease(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 4000}");
	const char *id = hs_str(a, "id");
	lease_job b = {
	    .s = s, .resource = "db", .body = "{\"holder\": \"b\", \"wait_ms\": 300000}"};
	job_start(&b);
	wait_waiters(s, "db", 1);
	hs_kill(s);
	pthread_join(b.t, NULL); /* its connection died with the server */
	json_decref(b.lease);
	int64_t restarted = hs_now_ms();
	assert_int_equal(hs_start(s), 0);
	json_t *got;
	assert_int_equal(lease_call(s, "GET", id, "", NULL, &got), 200);
	assert_string_equal(hs_str(got, "state"), "held");
	assert_int_equal(hs_int(got, "fencing_token"), hs_int(a, "fencing_token"));
	assert_true(hs_time(got, "expires_at") >= restarted + 4000);
	json_decref(got);
	long status;
	json_t *c = acquire(s, "db", "{\"holder\": \"c\"}", &status);
	assert_int_equal(status, 409); /* still held, and the dead waiter left the queue */
	assert_int_equal(hs_int(c, "queue_length"), 0);
	json_decref(c);
	assert_int_equal(lease_call(s, "POST", id, "/renew", NULL, NULL), 200);
	assert_int_equal(lease_call(s, "DELETE", id, "", NULL, NULL), 204);
	c = acquire_ok(s, "db", "{\"holder\": \"c\"}");
	assert_true(hs_int(c, "fencing_token") > hs_int(a, "fencing_token"));
	json_decref(c);
	json_decref(a);
}

/* A renewal's new ttl is durable before it is answered: after kill -9 the lease keeps it, and
 * does not end on the shorter ttl it was granted with. */
static void test_kill9_keeps_a_renewed_ttl(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 1000}");
	const char *id = hs_str(a, "id");
	json_t *ren;
	assert_int_equal(lease_call(s, "POST", id, "/renew", "{\"ttl_ms\": 60000}", &ren), 200);
	json_decref(ren);
	hs_kill(s);
	assert_int_equal(hs_start(s), 0);
	/* b waits 4 s, four times the old ttl: the lease must outlast it */
	long status;
	json_t *b = acquire(s, "db", "{\"holder\": \"b\", \"wait_ms\": 4000}", &status);
	assert_int_equal(status, 409);
	json_decref(b);
	json_t *got;
	assert_int_equal(lease_call(s, "GET", id, "", NULL, &got), 200);
	assert_string_equal(hs_str(got, "state"), "held");
	assert_int_equal(hs_int(got, "ttl_ms"), 60000);
	json_decref(got);
	json_decref(a);
}

/* A waiter with a request_id keeps its place across kill -9: retried with the same
 * request_id after the restart, it is reattached ahead of everyone who queued after it, in
 * the order they first queued, whatever order the retries come in. */
static void test_restart_keeps_a_waiters_place(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	lease_job b = {.s = s,
		       .resource = "db",
		       .body = "{\"holder\": \"b\", \"request_id\": \"b-1\", \"wait_ms\": 60000}"};
	job_start(&b);
	wait_waiters(s, "db", 1);
	lease_job c = {.s = s,
		       .resource = "db",
		       .body = "{\"holder\": \"c\", \"request_id\": \"c-1\", \"wait_ms\": 60000}"};
	job_start(&c);
	wait_waiters(s, "db", 2);
	hs_kill(s);
	pthread_join(b.t, NULL); /* their connections died with the server */
	pthread_join(c.t, NULL);
	json_decref(b.lease);
	json_decref(c.lease);
	assert_int_equal(hs_start(s), 0);
	/* both still wait, in their order */
	json_t *res = resource(s, "db");
	json_t *w = json_object_get(res, "waiters");
	assert_int_equal(json_array_size(w), 2);
	json_decref(res);
	/* c retries first, then b; a releases: b is granted before c */
	lease_job c2 = {.s = s, .resource = "db", .body = c.body};
	job_start(&c2);
	lease_job b2 = {.s = s, .resource = "db", .body = b.body};
	job_start(&b2);
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	pthread_join(b2.t, NULL);
	assert_true(b2.status == 200 || b2.status == 201);
	assert_string_equal(hs_str(b2.lease, "id"), "lease-b-1");
	assert_string_equal(hs_str(b2.lease, "state"), "held");
	assert_int_equal(lease_call(s, "DELETE", "lease-b-1", "", NULL, NULL), 204);
	pthread_join(c2.t, NULL);
	assert_true(c2.status == 200 || c2.status == 201);
	assert_string_equal(hs_str(c2.lease, "state"), "held");
	assert_true(hs_int(c2.lease, "fencing_token") > hs_int(b2.lease, "fencing_token"));
	json_decref(b2.lease);
	json_decref(c2.lease);
	json_decref(a);
}

/* A waiter kept across a restart whose client never comes back is granted to nobody: the
 * grant is released after a short grace, and the resource goes on to the next waiter. */
static void test_restart_waiter_nobody_takes_is_released(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	lease_job b = {.s = s,
		       .resource = "db",
		       .body = "{\"holder\": \"b\", \"request_id\": \"b-1\", \"wait_ms\": 60000,"
			       " \"ttl_ms\": 60000}"};
	job_start(&b);
	wait_waiters(s, "db", 1);
	hs_kill(s);
	pthread_join(b.t, NULL);
	json_decref(b.lease);
	assert_int_equal(hs_start(s), 0);
	wait_waiters(s, "db", 1);
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	/* c waits far less than b's ttl of 60 s: it gets the resource once b's grace ends */
	long status;
	json_t *c = acquire(s, "db", "{\"holder\": \"c\", \"wait_ms\": 20000}", &status);
	assert_int_equal(status, 201);
	json_t *got;
	assert_int_equal(lease_call(s, "GET", "lease-b-1", "", NULL, &got), 200);
	assert_string_equal(hs_str(got, "state"), "released");
	json_decref(got);
	json_decref(c);
	json_decref(a);
}

static void test_bad_input_changes_nothing(void **state)
{
	hs_server *s = *state;
	static const char *const bad[] = {
	    "{\"ttl_ms\": 999}",
	    "{\"wait_ms\": 300001}",
	    "{\"wait_ms\": -1}",
	    "{\"holder\": 5}",
	    "{\"holder\": \"a b\"}",
	    "{\"color\": \"red\"}",
	    "[1]",
	    "{\"request_id\": \"x/y\"}",
	    "{\"ttl_ms\": \"15s\"}",
	    "{\"holder\": \"\"}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		hs_response r;
		assert_int_equal(hs_post(s, "/resources/db/leases", bad[i], &r), 0);
		hs_assert_problem(&r, 400, "invalid-request", bad[i]);
		hs_response_fini(&r);
	}
	hs_response r;
	assert_int_equal(hs_post(s, "/resources/bad%20name/leases", "{}", &r), 0);
	assert_true(r.status == 400 || r.status == 404);
	hs_response_fini(&r);
	assert_int_equal(lease_call(s, "GET", "lease-nope", "", NULL, NULL), 404);
	assert_int_equal(lease_call(s, "DELETE", "nope", "", NULL, NULL), 404);
	assert_int_equal(lease_call(s, "POST", "lease-nope", "/renew", "{\"ttl_ms\": 5}", NULL),
			 400);
	assert_int_equal(
	    hs_post(s, "/workflows",
		    "{\"id\": \"lease-x\", \"resource\": \"db\", \"workers\": [\"w\"]}", &r),
	    0);
	hs_assert_problem(&r, 400, "invalid-request", "a workflow id of a lease");
	hs_response_fini(&r);
	json_t *list = hs_get_json(s, "/resources", 200);
	assert_int_equal(json_array_size(json_object_get(list, "resources")), 0);
	json_decref(list);
}

static void test_metrics_count_leases(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\"}");
	long status;
	json_decref(acquire(s, "db", "{\"holder\": \"b\"}", &status));
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	hs_response r;
	assert_int_equal(hs_get(s, "/metrics", &r), 0);
	assert_non_null(strstr(r.body, "baton_leases_granted_total 1\n"));
	assert_non_null(strstr(r.body, "baton_leases_released_total 1\n"));
	assert_non_null(strstr(r.body, "baton_leases_refused_total 1\n"));
	assert_non_null(strstr(r.body, "baton_leases_expired_total 0\n"));
	hs_response_fini(&r);
	json_decref(a);
}

static bool lease_expired(void *arg)
{
	void **a = arg;
	json_t *p = NULL;
	long st = lease_call(a[0], "GET", a[1], "", NULL, &p);
	bool yes = st == 200 && strcmp(hs_str(p, "state"), "expired") == 0;
	json_decref(p);
	return yes;
}

/* Renewals add no timers: 2,000 renewals leave the engine a handful of timers (before,
 * each one pushed a timer that stayed until its time came, 2,000+ here), and the lease
 * still expires on time once they stop. */
static void test_renewals_add_no_timers(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 3000}");
	const char *id = hs_str(a, "id");
	for (int i = 0; i < 2000; i++)
		assert_int_equal(lease_call(s, "POST", id, "/renew", NULL, NULL), 200);
	json_t *m = prom_scrape(s);
	double timers = prom_metric(m, "baton_engine_timers", "");
	print_message("timers after 2000 renewals: %.0f\n", timers);
	assert_true(timers >= 1 && timers <= 8);
	json_decref(m);
	void *args[2] = {s, (void *)id};
	assert_true(hs_wait_until(lease_expired, args, WAIT_MS));
	json_decref(a);
}

static bool stream_has_all(void *arg)
{
	const sse *st = arg;
	return sse_count_type(st, "lock_acquired") >= 2 &&
	       sse_count_type(st, "lock_released") >= 2 && sse_count_type(st, "lease_expired") >= 1;
}

static void test_stream_shows_grants_releases_expiries(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\"}");
	CURLM *m = curl_multi_init();
	const char *const accept[] = {SSE_ACCEPT, NULL};
	sse *st = sse_open(m, s, "/resources/db/events", accept);
	assert_int_equal(lease_call(s, "DELETE", hs_str(a, "id"), "", NULL, NULL), 204);
	json_t *b = acquire_ok(s, "db", "{\"holder\": \"b\", \"ttl_ms\": 1000}");
	bool ok = sse_pump_until(m, stream_has_all, st, WAIT_MS);
	long exp = sse_find(st, "lease_expired", 0, hs_str(b, "id"));
	sse_close(m, st);
	curl_multi_cleanup(m);
	assert_true(ok);
	assert_true(exp >= 0);
	json_decref(a);
	json_decref(b);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_grant_renew_release, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_try_once_says_who_holds_it, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_expiry_hands_over_with_higher_token, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_log_tells_a_leases_life, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_fifo_with_workflow_steps, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_wait_ms_ends_and_leaves_queue, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_disconnected_waiter_leaves_queue, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_half_closed_client_is_told_the_truth, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_request_id_returns_same_lease, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_kill9_keeps_a_held_lease, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_kill9_keeps_a_renewed_ttl, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_restart_keeps_a_waiters_place, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_restart_waiter_nobody_takes_is_released, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_bad_input_changes_nothing, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_metrics_count_leases, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_renewals_add_no_timers, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_stream_shows_grants_releases_expiries, hs_setup,
					    hs_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

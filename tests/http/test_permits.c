/*
 * test_permits.c - resources with several permits over HTTP against the real
 * batond: a resource's `limit` raised and lowered while it has holders and waiters (raising
 * grants the waiters that now fit at once, lowering takes nothing from holders); an
 * exclusive request among plain ones (strict FIFO: it is never starved, and nobody behind it
 * barges past it to a free permit); the lowest free slot reused by the next waiter at a
 * higher token; a lease that expires hands its permit to the next waiter; kill -9 with
 * several holders and waiters (held leases and a claimed step keep their slots and tokens,
 * a step that ran is granted again first, waiters keep their order, tokens go on above the
 * old ones); workflows whose steps share a resource of two permits, an exclusive worker
 * running alone (checked live on GET /resources/{name} and afterwards on the resource's
 * history); bad input that changes nothing; and all of it through a node of a cluster that
 * does not drive the resource (PostgreSQL only: on SQLite that test skips).
 *
 * Lease requests that wait run on threads of their own. Their slots live outside the tests'
 * stack frames, so that the teardown of a failed test can stop batond (which ends their
 * requests) and join them before it frees anything they use.
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

#include "../harness/cluster.h"
#include "../harness/harness.h"
#include "../harness/prom.h"

#define WAIT_MS	 60000
#define LEASE_MS 3000 /* the cluster nodes' --lease-ms */
#define MAX_JOBS 16

#define SKIP_UNLESS_PG()                                                                           \
	do {                                                                                       \
		if (!hs_store_is_pg())                                                             \
			skip(); /* a cluster shares one PostgreSQL database */                     \
	} while (0)

/* ---- requests ------------------------------------------------------------------- */

/*
 * One request; asked again while the answer is 503 with Retry-After (a cluster node that has
 * just taken a partition over answers so until it has loaded it), within WAIT_MS. Its status
 * (0 when no answer came) and its JSON (new reference, or NULL) in *out when out is not
 * NULL. No cmocka call: the lease threads use it too.
 */
static long call(const hs_server *s, const char *method, const char *path, const char *body,
		 json_t **out)
{
	hs_request req = {.method = method,
			  .path = path,
			  .content_type = body ? "application/json" : NULL,
			  .body = body,
			  .body_len = body ? strlen(body) : 0};
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	for (;;) {
		hs_response r;
		long status = hs_send(s, &req, &r) == 0 ? r.status : 0;
		bool again = status == 503 && r.retry_after && hs_mono_ms() < deadline;
		if (!again && out)
			*out = json_incref(r.json);
		hs_response_fini(&r);
		if (!again)
			return status;
		hs_pause_ms(200);
	}
}

/* GET /resources/{name}, asserted 200 (new reference). */
static json_t *resource(const hs_server *s, const char *name)
{
	char path[256];
	snprintf(path, sizeof path, "/resources/%s", name);
	json_t *res = NULL;
	long status = call(s, "GET", path, NULL, &res);
	if (status != 200 || !json_is_object(res))
		fail_msg("GET %s answered %ld", path, status);
	return res;
}

/* PUT /resources/{name} with `body` as given; the whole answer in r. */
static void put_raw(const hs_server *s, const char *name, const char *body, hs_response *r)
{
	char path[256];
	snprintf(path, sizeof path, "/resources/%s", name);
	hs_request req = {.method = "PUT",
			  .path = path,
			  .content_type = "application/json",
			  .body = body,
			  .body_len = strlen(body)};
	if (hs_send(s, &req, r) != 0)
		fail_msg("PUT %s: %s", path, r->error);
}

/* PUT {"limit": n}, asserted 200 with the resource's body and that limit; the body (new
 * reference). */
static json_t *set_limit(const hs_server *s, const char *name, int n)
{
	char path[256], body[64];
	snprintf(path, sizeof path, "/resources/%s", name);
	snprintf(body, sizeof body, "{\"limit\": %d}", n);
	json_t *got = NULL;
	long status = call(s, "PUT", path, body, &got);
	if (status != 200)
		fail_msg("PUT %s %s answered %ld: %s", path, body, status,
			 got ? json_dumps(got, JSON_COMPACT) : "(no JSON)");
	assert_string_equal(hs_str(got, "name"), name);
	assert_int_equal(hs_int(got, "limit"), n);
	assert_true(json_is_array(json_object_get(got, "holders")));
	assert_true(json_is_array(json_object_get(got, "waiters")));
	return got;
}

/* POSTs a lease request; returns the answer's JSON (new reference) and its status. */
static json_t *acquire(const hs_server *s, const char *name, const char *body, long *status)
{
	char path[256];
	snprintf(path, sizeof path, "/resources/%s/leases", name);
	json_t *l = NULL;
	*status = call(s, "POST", path, body, &l);
	if (*status == 0)
		fail_msg("POST %s %s: no answer", path, body);
	return l;
}

/* A lease that must be granted at once (asserted 201). */
static json_t *acquire_ok(const hs_server *s, const char *name, const char *body)
{
	long status;
	json_t *l = acquire(s, name, body, &status);
	if (status != 201)
		fail_msg("lease %s on %s answered %ld: %s", body, name, status,
			 l ? json_dumps(l, JSON_COMPACT) : "(no JSON)");
	assert_string_equal(hs_str(l, "state"), "held");
	return l;
}

/* A try-once request that must be refused (409) while `name` is busy. */
static void assert_refused(const hs_server *s, const char *name, const char *body)
{
	long status;
	json_t *l = acquire(s, name, body, &status);
	if (status != 409)
		fail_msg("lease %s on %s answered %ld, expected 409: %s", body, name, status,
			 l ? json_dumps(l, JSON_COMPACT) : "(no JSON)");
	json_decref(l);
}

static void release(const hs_server *s, const json_t *lease)
{
	char path[256];
	snprintf(path, sizeof path, "/leases/%s", hs_str(lease, "id"));
	long status = call(s, "DELETE", path, NULL, NULL);
	if (status != 204)
		fail_msg("DELETE %s answered %ld", path, status);
}

/* ---- lease requests that wait, each on a thread of its own ----------------------- */

typedef struct lease_job {
	const hs_server *s;
	char path[256], body[512];
	long status;
	json_t *lease;
	pthread_t t;
	bool running;
} lease_job;

static lease_job jobs[MAX_JOBS];
static int njobs;

static void *lease_thread(void *arg)
{
	lease_job *j = arg;
	j->status = call(j->s, "POST", j->path, j->body, &j->lease);
	return NULL;
}

static lease_job *job_start(const hs_server *s, const char *name, const char *body)
{
	assert_true(njobs < MAX_JOBS);
	lease_job *j = &jobs[njobs++];
	memset(j, 0, sizeof *j);
	j->s = s;
	snprintf(j->path, sizeof j->path, "/resources/%s/leases", name);
	snprintf(j->body, sizeof j->body, "%s", body);
	assert_int_equal(pthread_create(&j->t, NULL, lease_thread, j), 0);
	j->running = true;
	return j;
}

static void job_join(lease_job *j)
{
	if (j->running)
		pthread_join(j->t, NULL);
	j->running = false;
}

/* Joins a waiting request that must end granted (201, or 200 for a request_id reattached);
 * its lease (borrowed from the job). */
static json_t *job_granted(lease_job *j)
{
	job_join(j);
	if (j->status != 201 && j->status != 200)
		fail_msg("lease %s answered %ld: %s", j->body, j->status,
			 j->lease ? json_dumps(j->lease, JSON_COMPACT) : "(no JSON)");
	assert_string_equal(hs_str(j->lease, "state"), "held");
	return j->lease;
}

/* After batond was stopped (which ends every request): joins and frees every job. */
static void jobs_reap(void)
{
	for (int i = 0; i < njobs; i++) {
		job_join(&jobs[i]);
		json_decref(jobs[i].lease);
		jobs[i].lease = NULL;
	}
	njobs = 0;
}

/* ---- fixtures ------------------------------------------------------------------- */

/* Stops a running server by SIGTERM, as hs_close would: -1 (after its log) when it did not
 * exit with 0. */
static int stop_checked(hs_server *s)
{
	if (!s || !hs_running(s))
		return 0;
	int status = hs_stop(s);
	if (status == 0)
		return 0;
	fprintf(stderr, "batond exited with %d after SIGTERM, expected 0\n", status);
	hs_dump_log(s, 6000);
	return -1;
}

static int teardown(void **state)
{
	hs_server *s = *state;
	int rc = stop_checked(s); /* ends what the threads still wait for */
	jobs_reap();
	if (hs_close(s) != 0)
		rc = -1;
	return rc;
}

static int cl_setup(void **state)
{
	*state = calloc(1, sizeof(cluster));
	return *state ? 0 : -1;
}

static int cl_teardown(void **state)
{
	cluster *c = *state;
	int rc = 0;
	for (int i = c->n - 1; i >= 0; i--)
		if (stop_checked(c->node[i]) != 0)
			rc = -1;
	jobs_reap();
	if (cl_close(c) != 0)
		rc = -1;
	free(c);
	return rc;
}

/* ---- reading a resource --------------------------------------------------------- */

/* A slot: its integer, or -1 for null; fails when the member is absent or of another type. */
static json_int_t slot_of(const json_t *o)
{
	json_t *v = json_object_get(o, "slot");
	if (json_is_null(v))
		return -1;
	if (!json_is_integer(v))
		fail_msg("slot is neither an integer nor null in %s", json_dumps(o, JSON_COMPACT));
	return json_integer_value(v);
}

static bool exclusive_of(const json_t *o)
{
	json_t *v = json_object_get(o, "exclusive");
	if (!json_is_boolean(v))
		fail_msg("exclusive is not a boolean in %s", json_dumps(o, JSON_COMPACT));
	return json_is_true(v);
}

static size_t holders_n(const json_t *res)
{
	return json_array_size(json_object_get(res, "holders"));
}

static size_t waiters_n(const json_t *res)
{
	return json_array_size(json_object_get(res, "waiters"));
}

static json_t *holder_at(const json_t *res, size_t i)
{
	json_t *h = json_array_get(json_object_get(res, "holders"), i);
	if (!h)
		fail_msg("no holder %zu in %s", i, json_dumps(res, JSON_COMPACT));
	return h;
}

static json_t *waiter_at(const json_t *res, size_t i)
{
	json_t *w = json_array_get(json_object_get(res, "waiters"), i);
	if (!w)
		fail_msg("no waiter %zu in %s", i, json_dumps(res, JSON_COMPACT));
	return w;
}

/*
 * What every GET /resources/{name} must say of its permits: `limit` and `permits_in_use`
 * (plain holders 1 each, an exclusive one the limit), holders by ascending token, each with
 * its members, plain ones on distinct slots, an exclusive one alone and on no slot, `holder`
 * the first of them, and each waiter's `exclusive` and `permits`.
 */
static void assert_permits_shape(const json_t *res)
{
	json_int_t limit = hs_int(res, "limit");
	assert_true(limit >= 1 && limit <= 10000);
	json_t *holders = json_object_get(res, "holders");
	assert_true(json_is_array(holders));
	json_int_t in_use = 0, prev = 0;
	bool exclusive = false;
	size_t i, k;
	json_t *h;
	json_array_foreach(holders, i, h)
	{
		hs_str(h, "workflow_id");
		hs_str(h, "worker");
		hs_int(h, "step");
		hs_time(h, "since");
		json_int_t token = hs_int(h, "fencing_token");
		if (token <= prev)
			fail_msg("holders not by ascending token: %s",
				 json_dumps(res, JSON_COMPACT));
		prev = token;
		const char *kind = hs_str(h, "kind");
		assert_true(strcmp(kind, "lease") == 0 || strcmp(kind, "step") == 0);
		if (strcmp(kind, "lease") == 0)
			hs_str(h, "lease_id");
		if (exclusive_of(h)) {
			exclusive = true;
			in_use += limit;
			assert_int_equal(slot_of(h), -1);
		} else {
			in_use++;
			json_int_t slot = slot_of(h);
			assert_true(slot >= 0);
			for (k = 0; k < i; k++)
				if (slot_of(json_array_get(holders, k)) == slot)
					fail_msg("two holders on slot %lld: %s", (long long)slot,
						 json_dumps(res, JSON_COMPACT));
		}
	}
	if (exclusive && json_array_size(holders) != 1)
		fail_msg("an exclusive holder is not alone: %s", json_dumps(res, JSON_COMPACT));
	assert_int_equal(hs_int(res, "permits_in_use"), in_use);
	json_t *first = json_object_get(res, "holder");
	if (json_array_size(holders) == 0)
		assert_true(json_is_null(first));
	else if (!json_equal(first, json_array_get(holders, 0)))
		fail_msg("holder is not the first of holders: %s", json_dumps(res, JSON_COMPACT));
	json_t *w;
	json_array_foreach(json_object_get(res, "waiters"), i, w)
	{
		assert_int_equal(hs_int(w, "position"), (json_int_t)i + 1);
		assert_int_equal(hs_int(w, "permits"), exclusive_of(w) ? limit : 1);
	}
}

/* GET, with assert_permits_shape and `limit`, `holders` and `waiters` as given. */
static json_t *resource_is(const hs_server *s, const char *name, int limit, size_t holders,
			   size_t waiters)
{
	json_t *res = resource(s, name);
	assert_permits_shape(res);
	if (hs_int(res, "limit") != limit || holders_n(res) != holders || waiters_n(res) != waiters)
		fail_msg("%s: expected limit %d, %zu holders, %zu waiters; got %s", name, limit,
			 holders, waiters, json_dumps(res, JSON_COMPACT));
	return res;
}

static void assert_holder(const json_t *h, const char *kind, const char *worker, json_int_t slot,
			  json_int_t token)
{
	if (strcmp(hs_str(h, "kind"), kind) != 0 || strcmp(hs_str(h, "worker"), worker) != 0 ||
	    slot_of(h) != slot || hs_int(h, "fencing_token") != token)
		fail_msg("expected the %s of %s on slot %lld with token %lld; got %s", kind, worker,
			 (long long)slot, (long long)token, json_dumps(h, JSON_COMPACT));
	assert_int_equal(exclusive_of(h), slot < 0);
}

static void assert_lease(const json_t *l, json_int_t slot, json_int_t token)
{
	if (slot_of(l) != slot || hs_int(l, "fencing_token") != token)
		fail_msg("expected lease on slot %lld with token %lld; got %s", (long long)slot,
			 (long long)token, json_dumps(l, JSON_COMPACT));
	assert_int_equal(exclusive_of(l), slot < 0);
}

typedef struct res_wait {
	const hs_server *s;
	const char *name;
	size_t holders, waiters;
} res_wait;

static bool res_counts(void *arg)
{
	res_wait *w = arg;
	char path[256];
	snprintf(path, sizeof path, "/resources/%s", w->name);
	json_t *res = NULL;
	bool yes = call(w->s, "GET", path, NULL, &res) == 200 && holders_n(res) == w->holders &&
		   waiters_n(res) == w->waiters;
	json_decref(res);
	return yes;
}

/* Waits until the resource shows `holders` holders and `waiters` waiters. */
static void wait_counts(const hs_server *s, const char *name, size_t holders, size_t waiters)
{
	res_wait w = {s, name, holders, waiters};
	if (!hs_wait_until(res_counts, &w, WAIT_MS)) {
		json_t *res = NULL;
		char path[256];
		snprintf(path, sizeof path, "/resources/%s", name);
		call(s, "GET", path, NULL, &res);
		fail_msg("%s never showed %zu holders and %zu waiters; it shows %s", name, holders,
			 waiters, res ? json_dumps(res, JSON_COMPACT) : "nothing");
	}
}

/* The resource's whole history, page after page (new reference). */
static json_t *resource_events(const hs_server *s, const char *name)
{
	json_t *all = json_array();
	json_int_t after = 0;
	for (;;) {
		char path[300];
		snprintf(path, sizeof path, "/resources/%s/events?after=%lld", name,
			 (long long)after);
		json_t *doc = hs_get_json(s, path, 200);
		json_array_extend(all, json_object_get(doc, "events"));
		json_t *next = json_object_get(doc, "next_after");
		after = json_is_integer(next) ? json_integer_value(next) : -1;
		json_decref(doc);
		if (after < 0)
			return all;
	}
}

static bool is_type(const json_t *ev, const char *type)
{
	return strcmp(hs_str(ev, "type"), type) == 0;
}

static void attempt_key(const json_t *ev, char *buf, size_t size)
{
	snprintf(buf, size, "%s#%lld#%lld", hs_str(ev, "workflow_id"),
		 (long long)hs_int(ev, "step"), (long long)hs_int(ev, "attempt"));
}

/*
 * Walks a resource's history (no restart in it, the limit `limit` throughout) and asserts
 * that the permits were kept: tokens strictly increase; a plain grant takes a slot in
 * 0..limit-1 that no current holder has, and only while fewer than `limit` hold it and
 * nobody holds it exclusively; an exclusive grant has no slot and comes only when nobody
 * holds it. A release ends a current hold. Returns the most holders seen at once.
 */
static size_t assert_permits_kept(const json_t *events, int limit)
{
	json_t *held = json_object();  /* attempt key -> slot (null: exclusive) */
	json_t *ended = json_object(); /* attempt keys whose hold ended */
	json_int_t last_token = 0;
	size_t most = 0, i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		char key[256];
		if (is_type(ev, "lock_acquired")) {
			attempt_key(ev, key, sizeof key);
			json_int_t token = hs_int(ev, "fencing_token");
			if (token <= last_token)
				fail_msg("token %lld granted after %lld (seq %lld)",
					 (long long)token, (long long)last_token,
					 (long long)hs_int(ev, "seq"));
			last_token = token;
			bool excl = exclusive_of(ev);
			json_int_t slot = slot_of(ev);
			const char *k;
			json_t *v;
			json_object_foreach(held, k, v)
			{
				if (excl || json_is_null(v))
					fail_msg("%s granted %s (seq %lld) while %s held it%s", key,
						 excl ? "exclusively" : "a permit",
						 (long long)hs_int(ev, "seq"), k,
						 excl ? "" : " exclusively");
				if (json_integer_value(v) == slot)
					fail_msg("%s granted slot %lld (seq %lld) that %s holds",
						 key, (long long)slot, (long long)hs_int(ev, "seq"),
						 k);
			}
			if (excl && slot != -1)
				fail_msg("exclusive grant of %s with slot %lld", key,
					 (long long)slot);
			if (!excl && (slot < 0 || slot >= limit))
				fail_msg("grant of %s with slot %lld, limit %d", key,
					 (long long)slot, limit);
			if (json_object_size(held) + 1 > (size_t)limit)
				fail_msg("%s granted (seq %lld) while %zu held it, limit %d", key,
					 (long long)hs_int(ev, "seq"), json_object_size(held),
					 limit);
			json_object_set_new(held, key, excl ? json_null() : json_integer(slot));
			if (json_object_size(held) > most)
				most = json_object_size(held);
		} else if (is_type(ev, "lock_released") || is_type(ev, "lease_expired")) {
			attempt_key(ev, key, sizeof key);
			if (json_object_get(held, key)) {
				json_object_del(held, key);
				json_object_set_new(ended, key, json_true());
			} else if (!json_object_get(ended, key)) { /* an expiry says it twice */
				fail_msg("%s released (seq %lld) what it did not hold", key,
					 (long long)hs_int(ev, "seq"));
			}
		}
	}
	json_decref(held);
	json_decref(ended);
	return most;
}

/*
 * Strict FIFO over all requests: the attempts were granted in exactly the order they asked
 * (lock_requested), every one of them.
 */
static void assert_granted_in_request_order(const json_t *events)
{
	json_t *asked = json_array(), *granted = json_array();
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		char key[256];
		bool req = is_type(ev, "lock_requested"), acq = is_type(ev, "lock_acquired");
		if (!req && !acq)
			continue;
		attempt_key(ev, key, sizeof key);
		json_array_append_new(req ? asked : granted, json_string(key));
	}
	if (!json_equal(asked, granted))
		fail_msg("not granted in request order:\nasked   %s\ngranted %s",
			 json_dumps(asked, JSON_COMPACT), json_dumps(granted, JSON_COMPACT));
	json_decref(asked);
	json_decref(granted);
}

/* ---- tests ---------------------------------------------------------------------- */

/*
 * Limit 1 (the default), one holder and two waiters. Raising it to 3 grants both waiters at
 * once, on slots 1 and 2 with the next tokens in their order. Lowering it to 1 takes nothing
 * from the three holders; a fourth request waits, and still waits when two of them left
 * (one holder, limit 1: full), and is granted the lowest slot when the last one leaves.
 */
static void test_raise_and_lower_limit(void **state)
{
	hs_server *s = *state;
	json_t *a = acquire_ok(s, "pool", "{\"holder\": \"a\", \"ttl_ms\": 300000}");
	assert_lease(a, 0, 1);
	json_decref(resource_is(s, "pool", 1, 1, 0));
	lease_job *b =
	    job_start(s, "pool", "{\"holder\": \"b\", \"ttl_ms\": 300000, \"wait_ms\": 60000}");
	wait_counts(s, "pool", 1, 1);
	lease_job *c =
	    job_start(s, "pool", "{\"holder\": \"c\", \"ttl_ms\": 300000, \"wait_ms\": 60000}");
	wait_counts(s, "pool", 1, 2);
	json_t *res = resource_is(s, "pool", 1, 1, 2);
	assert_string_equal(hs_str(waiter_at(res, 0), "worker"), "b");
	assert_false(exclusive_of(waiter_at(res, 0)));
	assert_string_equal(hs_str(waiter_at(res, 1), "worker"), "c");
	json_decref(res);

	/* the answer, the resource once the limit is durable, shows them granted already */
	res = set_limit(s, "pool", 3);
	assert_permits_shape(res);
	if (holders_n(res) != 3 || waiters_n(res) != 0)
		fail_msg("raising the limit to 3 answered %s: not both waiters granted at once",
			 json_dumps(res, JSON_COMPACT));
	json_decref(res);
	json_t *lb = job_granted(b), *lc = job_granted(c);
	assert_lease(lb, 1, 2);
	assert_lease(lc, 2, 3);
	res = resource_is(s, "pool", 3, 3, 0);
	assert_int_equal(hs_int(res, "permits_in_use"), 3);
	assert_holder(holder_at(res, 0), "lease", "a", 0, 1);
	assert_holder(holder_at(res, 1), "lease", "b", 1, 2);
	assert_holder(holder_at(res, 2), "lease", "c", 2, 3);
	assert_string_equal(hs_str(holder_at(res, 1), "lease_id"), hs_str(lb, "id"));
	json_decref(res);
	/* the list and the metrics say the same */
	json_t *list = hs_get_json(s, "/resources", 200);
	json_t *item = json_array_get(json_object_get(list, "resources"), 0);
	assert_string_equal(hs_str(item, "name"), "pool");
	assert_int_equal(hs_int(item, "limit"), 3);
	assert_int_equal(hs_int(item, "permits_in_use"), 3);
	json_decref(list);
	json_t *m = prom_scrape(s);
	prom_assert_metric(m, "baton_resource_permit_limit", "resource=pool", 3);
	prom_assert_metric(m, "baton_resource_permits_in_use", "resource=pool", 3);
	json_decref(m);

	/* lowered: every holder keeps its permit, nobody new is granted */
	res = set_limit(s, "pool", 1);
	assert_int_equal(holders_n(res), 3);
	assert_int_equal(hs_int(res, "permits_in_use"), 3);
	json_decref(res);
	json_decref(resource_is(s, "pool", 1, 3, 0));
	assert_refused(s, "pool", "{\"holder\": \"e\"}");
	lease_job *d =
	    job_start(s, "pool", "{\"holder\": \"d\", \"ttl_ms\": 300000, \"wait_ms\": 60000}");
	wait_counts(s, "pool", 3, 1);
	release(s, a);
	release(s, lb);
	/* one holder left, the limit 1: still full */
	res = resource_is(s, "pool", 1, 1, 1);
	assert_holder(holder_at(res, 0), "lease", "c", 2, 3);
	assert_string_equal(hs_str(waiter_at(res, 0), "worker"), "d");
	assert_int_equal(hs_int(res, "permits_in_use"), 1);
	json_decref(res);
	assert_refused(s, "pool", "{\"holder\": \"e\"}");
	m = prom_scrape(s);
	prom_assert_metric(m, "baton_resource_permit_limit", "resource=pool", 1);
	prom_assert_metric(m, "baton_resource_permits_in_use", "resource=pool", 1);
	json_decref(m);
	release(s, lc);
	json_t *ld = job_granted(d);
	assert_lease(ld, 0, 4);
	res = resource_is(s, "pool", 1, 1, 0);
	assert_holder(holder_at(res, 0), "lease", "d", 0, 4);
	assert_int_equal(hs_int(res, "last_fencing_token"), 4);
	json_decref(res);
	release(s, ld);
	json_decref(a);
	json_t *ev = resource_events(s, "pool");
	assert_int_equal(assert_permits_kept(ev, 3), 3);
	json_decref(ev);
}

/*
 * Limit 3, two plain holders; an exclusive request waits, and a plain one behind it is not
 * granted although a permit is free (no barging, so the exclusive one is not starved). The
 * holders leave: the exclusive one is granted, on no slot, with a token above every earlier
 * one, and the plain one still waits until it leaves.
 */
static void test_exclusive_waiter_not_starved(void **state)
{
	hs_server *s = *state;
	json_decref(set_limit(s, "gate", 3));
	json_t *a = acquire_ok(s, "gate", "{\"holder\": \"a\", \"ttl_ms\": 300000}");
	json_t *b = acquire_ok(s, "gate", "{\"holder\": \"b\", \"ttl_ms\": 300000}");
	assert_lease(a, 0, 1);
	assert_lease(b, 1, 2);
	lease_job *x = job_start(s, "gate",
				 "{\"holder\": \"x\", \"exclusive\": true, \"ttl_ms\": 300000,"
				 " \"wait_ms\": 60000}");
	wait_counts(s, "gate", 2, 1);
	lease_job *p = job_start(s, "gate",
				 "{\"holder\": \"p\", \"exclusive\": false, \"ttl_ms\": 300000,"
				 " \"wait_ms\": 60000}");
	wait_counts(s, "gate", 2, 2);
	json_t *res = resource_is(s, "gate", 3, 2, 2);
	assert_int_equal(hs_int(res, "permits_in_use"), 2);
	assert_string_equal(hs_str(waiter_at(res, 0), "worker"), "x");
	assert_true(exclusive_of(waiter_at(res, 0)));
	assert_int_equal(hs_int(waiter_at(res, 0), "permits"), 3);
	assert_string_equal(hs_str(waiter_at(res, 1), "worker"), "p");
	assert_false(exclusive_of(waiter_at(res, 1)));
	assert_int_equal(hs_int(waiter_at(res, 1), "permits"), 1);
	json_decref(res);
	/* a permit is free, but two wait: nobody barges */
	assert_refused(s, "gate", "{\"holder\": \"q\"}");
	assert_refused(s, "gate", "{\"holder\": \"q\", \"exclusive\": true}");
	release(s, a);
	res = resource_is(s, "gate", 3, 1, 2);
	assert_holder(holder_at(res, 0), "lease", "b", 1, 2);
	assert_string_equal(hs_str(waiter_at(res, 1), "worker"), "p");
	json_decref(res);
	release(s, b);
	json_t *lx = job_granted(x);
	assert_lease(lx, -1, 3);
	res = resource_is(s, "gate", 3, 1, 1);
	assert_holder(holder_at(res, 0), "lease", "x", -1, 3);
	assert_int_equal(hs_int(res, "permits_in_use"), 3);
	assert_string_equal(hs_str(waiter_at(res, 0), "worker"), "p");
	json_decref(res);
	assert_refused(s, "gate", "{\"holder\": \"q\"}");
	release(s, lx);
	json_t *lp = job_granted(p);
	assert_lease(lp, 0, 4);
	release(s, lp);
	json_t *ev = resource_events(s, "gate");
	assert_permits_kept(ev, 3);
	json_decref(ev);
	json_decref(a);
	json_decref(b);
}

/*
 * Limit 2, holders on slots 0 and 1, a waiter: slot 0's holder leaves and the waiter gets
 * slot 0 with the next token; then slot 1's holder leaves and a waiting workflow step (an
 * external worker, so that its claim shows it) gets slot 1, which its task and its step
 * tell too.
 */
static void test_slot_reused_at_higher_token(void **state)
{
	hs_server *s = *state;
	json_decref(set_limit(s, "duo", 2));
	json_t *a = acquire_ok(s, "duo", "{\"holder\": \"a\", \"ttl_ms\": 300000}");
	json_t *b = acquire_ok(s, "duo", "{\"holder\": \"b\", \"ttl_ms\": 300000}");
	assert_lease(a, 0, 1);
	assert_lease(b, 1, 2);
	lease_job *c =
	    job_start(s, "duo", "{\"holder\": \"c\", \"ttl_ms\": 300000, \"wait_ms\": 60000}");
	wait_counts(s, "duo", 2, 1);
	release(s, a);
	json_t *lc = job_granted(c);
	assert_lease(lc, 0, 3);
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:b}]}", "id", "ext", "resource",
					    "duo", "workers", "name", "x", "external", 1)));
	wait_counts(s, "duo", 2, 1);
	json_t *res = resource_is(s, "duo", 2, 2, 1);
	assert_string_equal(hs_str(waiter_at(res, 0), "kind"), "step");
	assert_holder(holder_at(res, 0), "lease", "b", 1, 2);
	assert_holder(holder_at(res, 1), "lease", "c", 0, 3);
	json_decref(res);
	json_t *wf = hs_get_workflow(s, "ext");
	assert_int_equal(slot_of(hs_step_at(wf, 0)), -1); /* not granted yet */
	json_decref(wf);
	release(s, b);
	json_t *task = NULL;
	long st = call(s, "POST", "/tasks/claim",
		       "{\"worker\": \"x\", \"resource\": \"duo\", \"wait_ms\": 10000}", &task);
	if (st != 200)
		fail_msg("claim answered %ld", st);
	assert_int_equal(slot_of(task), 1);
	assert_false(exclusive_of(task));
	assert_int_equal(hs_int(task, "fencing_token"), 4);
	res = resource_is(s, "duo", 2, 2, 0);
	assert_holder(holder_at(res, 0), "lease", "c", 0, 3);
	assert_holder(holder_at(res, 1), "step", "x", 1, 4);
	json_decref(res);
	wf = hs_get_workflow(s, "ext");
	assert_int_equal(slot_of(hs_step_at(wf, 0)), 1);
	json_decref(wf);
	char path[256];
	snprintf(path, sizeof path, "/tasks/%s/complete", hs_str(task, "id"));
	assert_int_equal(call(s, "POST", path, "{\"result\": 1}", NULL), 200);
	json_decref(hs_wait_workflow(s, "ext", "completed", WAIT_MS));
	release(s, lc);
	json_t *ev = resource_events(s, "duo");
	assert_int_equal(assert_permits_kept(ev, 2), 2);
	json_decref(ev);
	json_decref(task);
	json_decref(a);
	json_decref(b);
}

/* Limit 3, three leases held, one with a short ttl, and a waiter: the short one expires and
 * its permit (its slot) goes to the waiter with the next token; the others keep theirs. */
static void test_expiry_hands_the_permit_on(void **state)
{
	hs_server *s = *state;
	json_decref(set_limit(s, "tri", 3));
	json_t *a = acquire_ok(s, "tri", "{\"holder\": \"a\", \"ttl_ms\": 300000}");
	json_t *b = acquire_ok(s, "tri", "{\"holder\": \"b\", \"ttl_ms\": 3000}");
	json_t *c = acquire_ok(s, "tri", "{\"holder\": \"c\", \"ttl_ms\": 300000}");
	assert_lease(a, 0, 1);
	assert_lease(b, 1, 2);
	assert_lease(c, 2, 3);
	lease_job *w =
	    job_start(s, "tri", "{\"holder\": \"w\", \"ttl_ms\": 300000, \"wait_ms\": 60000}");
	wait_counts(s, "tri", 3, 1); /* queued while b still held */
	json_t *lw = job_granted(w);
	assert_lease(lw, 1, 4);
	char path[256];
	snprintf(path, sizeof path, "/leases/%s", hs_str(b, "id"));
	json_t *got = NULL;
	assert_int_equal(call(s, "GET", path, NULL, &got), 200);
	assert_string_equal(hs_str(got, "state"), "expired");
	json_decref(got);
	snprintf(path, sizeof path, "/leases/%s/renew", hs_str(b, "id"));
	assert_int_equal(call(s, "POST", path, NULL, NULL), 410);
	json_t *res = resource_is(s, "tri", 3, 3, 0);
	assert_holder(holder_at(res, 0), "lease", "a", 0, 1);
	assert_holder(holder_at(res, 1), "lease", "c", 2, 3);
	assert_holder(holder_at(res, 2), "lease", "w", 1, 4);
	json_decref(res);
	json_t *ev = resource_events(s, "tri");
	assert_permits_kept(ev, 3);
	json_decref(ev);
	release(s, a);
	release(s, c);
	release(s, lw);
	json_decref(a);
	json_decref(b);
	json_decref(c);
}

/*
 * kill -9 with limit 4 and four holders: leases a and b, a claimed external step e, an
 * unclaimed one y; and three waiters: lease c (with a request_id), a workflow step w, lease
 * d (with a request_id). After the restart on the same database: a, b and e hold again
 * with their slots and tokens; y, whose attempt was cut off, is granted again first, on its
 * slot, with a token above every old one; c, w and d wait in their order. Then each release
 * grants the next waiter the slot it freed, at the next token.
 */
static void test_kill9_keeps_holders_slots_and_tokens(void **state)
{
	hs_server *s = *state;
	json_decref(set_limit(s, "quad", 4));
	json_t *a = acquire_ok(s, "quad", "{\"holder\": \"a\", \"ttl_ms\": 300000}");
	json_t *b = acquire_ok(s, "quad", "{\"holder\": \"b\", \"ttl_ms\": 300000}");
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:b}]}", "id", "e", "resource",
					    "quad", "workers", "name", "e", "external", 1)));
	json_t *task_e = NULL;
	assert_int_equal(call(s, "POST", "/tasks/claim",
			      "{\"worker\": \"e\", \"resource\": \"quad\", \"wait_ms\": 10000,"
			      " \"ttl_ms\": 300000}",
			      &task_e),
			 200);
	assert_int_equal(slot_of(task_e), 2);
	assert_int_equal(hs_int(task_e, "fencing_token"), 3);
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:b}]}", "id", "y", "resource",
					    "quad", "workers", "name", "y", "external", 1)));
	wait_counts(s, "quad", 4, 0);
	const char *c_body = "{\"holder\": \"c\", \"request_id\": \"c-1\", \"ttl_ms\": 300000,"
			     " \"wait_ms\": 60000}";
	const char *d_body = "{\"holder\": \"d\", \"request_id\": \"d-1\", \"ttl_ms\": 300000,"
			     " \"wait_ms\": 60000}";
	lease_job *c = job_start(s, "quad", c_body);
	wait_counts(s, "quad", 4, 1);
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:i}]}", "id", "w", "resource",
					    "quad", "workers", "name", "w", "work_ms", 200)));
	wait_counts(s, "quad", 4, 2);
	lease_job *d = job_start(s, "quad", d_body);
	wait_counts(s, "quad", 4, 3);
	json_t *before = resource_is(s, "quad", 4, 4, 3);
	assert_holder(holder_at(before, 0), "lease", "a", 0, 1);
	assert_holder(holder_at(before, 1), "lease", "b", 1, 2);
	assert_holder(holder_at(before, 2), "step", "e", 2, 3);
	assert_holder(holder_at(before, 3), "step", "y", 3, 4);

	hs_kill(s);
	job_join(c); /* their connections died with batond */
	job_join(d);
	assert_int_equal(hs_start(s), 0);
	wait_counts(s, "quad", 4, 3);
	json_t *res = resource_is(s, "quad", 4, 4, 3);
	for (size_t i = 0; i < 3; i++) {
		json_t *h0 = holder_at(before, i), *h1 = holder_at(res, i);
		assert_string_equal(hs_str(h1, "workflow_id"), hs_str(h0, "workflow_id"));
		assert_int_equal(slot_of(h1), slot_of(h0));
		assert_int_equal(hs_int(h1, "fencing_token"), hs_int(h0, "fencing_token"));
	}
	assert_holder(holder_at(res, 3), "step", "y", 3, 5);
	assert_int_equal(hs_int(res, "last_fencing_token"), 5);
	assert_string_equal(hs_str(waiter_at(res, 0), "workflow_id"), "lease-c-1");
	assert_string_equal(hs_str(waiter_at(res, 1), "workflow_id"), "w");
	assert_string_equal(hs_str(waiter_at(res, 2), "workflow_id"), "lease-d-1");
	json_decref(res);
	json_decref(before);

	/* the waiters' callers come back; each release grants the next one its slot */
	lease_job *c2 = job_start(s, "quad", c_body);
	lease_job *d2 = job_start(s, "quad", d_body);
	release(s, a);
	json_t *lc = job_granted(c2);
	assert_string_equal(hs_str(lc, "id"), "lease-c-1");
	assert_lease(lc, 0, 6);
	release(s, b);
	json_t *wf = hs_wait_workflow(s, "w", "completed", WAIT_MS);
	assert_int_equal(slot_of(hs_step_at(wf, 0)), 1);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "fencing_token"), 7);
	json_decref(wf);
	json_t *ld = job_granted(d2);
	assert_string_equal(hs_str(ld, "id"), "lease-d-1");
	assert_lease(ld, 1, 8);
	/* the claimed step still belongs to its claimer; the cut-off one is claimed anew */
	char path[256];
	snprintf(path, sizeof path, "/tasks/%s/complete", hs_str(task_e, "id"));
	assert_int_equal(call(s, "POST", path, "{\"result\": 1}", NULL), 200);
	json_t *task_y = NULL;
	assert_int_equal(call(s, "POST", "/tasks/claim",
			      "{\"worker\": \"y\", \"resource\": \"quad\", \"wait_ms\": 10000}",
			      &task_y),
			 200);
	assert_int_equal(slot_of(task_y), 3);
	assert_int_equal(hs_int(task_y, "fencing_token"), 5);
	assert_int_equal(hs_int(task_y, "attempt"), 2);
	snprintf(path, sizeof path, "/tasks/%s/complete", hs_str(task_y, "id"));
	assert_int_equal(call(s, "POST", path, "{\"result\": 1}", NULL), 200);
	json_decref(hs_wait_workflow(s, "e", "completed", WAIT_MS));
	json_decref(hs_wait_workflow(s, "y", "completed", WAIT_MS));
	release(s, lc);
	release(s, ld);
	json_decref(resource_is(s, "quad", 4, 0, 0));
	json_decref(task_y);
	json_decref(task_e);
	json_decref(a);
	json_decref(b);
}

/* What GET /resources/{name} showed while workflows ran. */
typedef struct watch {
	const hs_server *s;
	const char *name;
	const char *const *ids;
	size_t n;
	size_t most;	  /* the most holders seen at once */
	bool seen_excl;	  /* an exclusive holder seen */
	char broken[512]; /* the first answer that broke the permits, or "" */
} watch;

static void note_broken(watch *w, const json_t *res)
{
	if (w->broken[0])
		return;
	char *text = json_dumps(res, JSON_COMPACT);
	snprintf(w->broken, sizeof w->broken, "%s", text ? text : "?");
	free(text);
}

static bool all_done(void *arg)
{
	watch *w = arg;
	json_t *res = resource(w->s, w->name);
	int limit = (int)hs_int(res, "limit");
	size_t n = holders_n(res);
	if (n > w->most)
		w->most = n;
	json_int_t in_use = 0;
	for (size_t i = 0; i < n; i++) {
		bool excl = json_is_true(json_object_get(holder_at(res, i), "exclusive"));
		w->seen_excl |= excl;
		in_use += excl ? limit : 1;
		if (excl && n != 1)
			note_broken(w, res);
	}
	if (in_use > limit || hs_int(res, "permits_in_use") != in_use)
		note_broken(w, res);
	json_decref(res);
	for (size_t i = 0; i < w->n; i++) {
		json_t *wf = hs_get_workflow(w->s, w->ids[i]);
		const char *st = hs_str(wf, "status");
		if (strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0)
			fail_msg("%s ended %s", w->ids[i], st);
		bool done = strcmp(st, "completed") == 0;
		json_decref(wf);
		if (!done)
			return false;
	}
	return true;
}

/*
 * Workflows on a resource of 2 permits: their steps run two at a time, never more, and the
 * exclusive worker's step alone; grants follow requests in strict FIFO order (the plain step
 * that asked after the exclusive one waits for it). Watched on GET /resources/{name} while
 * they run, and checked on the resource's history afterwards.
 */
static void test_workflows_share_permits(void **state)
{
	hs_server *s = *state;
	json_decref(set_limit(s, "shared", 2));
	static const char *const ids[] = {"p1", "p2", "ex", "p3"};
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:i}, {s:s, s:i}]}", "id", "p1",
					    "resource", "shared", "workers", "name", "p1-0",
					    "work_ms", 1500, "name", "p1-1", "work_ms", 300)));
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:i}, {s:s, s:i}]}", "id", "p2",
					    "resource", "shared", "workers", "name", "p2-0",
					    "work_ms", 2000, "name", "p2-1", "work_ms", 300)));
	json_decref(hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:i, s:b}]}", "id", "ex",
						    "resource", "shared", "workers", "name", "ex-0",
						    "work_ms", 300, "exclusive", 1)));
	json_decref(hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:i, s:b}, {s:s, s:i}]}",
						    "id", "p3", "resource", "shared", "workers",
						    "name", "p3-0", "work_ms", 300, "exclusive", 0,
						    "name", "p3-1", "work_ms", 300)));
	watch w = {.s = s, .name = "shared", .ids = ids, .n = 4};
	if (!hs_wait_until(all_done, &w, WAIT_MS))
		fail_msg("the workflows did not complete");
	if (w.broken[0])
		fail_msg("the permits were broken: %s", w.broken);
	print_message("seen live: at most %zu holders, exclusive %s\n", w.most,
		      w.seen_excl ? "seen" : "not seen");
	assert_true(w.most <= 2);

	json_t *ev = resource_events(s, "shared");
	size_t most = assert_permits_kept(ev, 2);
	assert_int_equal(most, 2); /* two steps did run at once */
	assert_granted_in_request_order(ev);
	size_t i, excl = 0;
	json_t *e;
	json_array_foreach(ev, i, e)
	{
		if (is_type(e, "lock_acquired") && exclusive_of(e)) {
			excl++;
			assert_string_equal(hs_str(e, "workflow_id"), "ex");
		}
	}
	assert_int_equal(excl, 1);
	json_decref(ev);

	json_t *wf = hs_get_workflow(s, "ex");
	json_t *st = hs_step_at(wf, 0);
	assert_true(json_is_true(json_object_get(st, "exclusive")));
	assert_int_equal(slot_of(st), -1);
	json_decref(wf);
	json_decref(resource_is(s, "shared", 2, 0, 0));
	/* a worker object that said "exclusive": false is a plain one, as if it said nothing:
	 * its step has a slot and no "exclusive" (kept only when true) */
	wf = hs_get_workflow(s, "p3");
	st = hs_step_at(wf, 0);
	json_int_t slot = slot_of(st);
	assert_true(slot == 0 || slot == 1);
	assert_null(json_object_get(st, "exclusive"));
	json_decref(wf);
}

/*
 * Bad input answers 400 application/problem+json and changes nothing: limits out of range
 * or not integers, a body without limit or with another key, not an object; `exclusive`
 * that is not a boolean in a lease request and in a worker object.
 */
static void test_bad_input_changes_nothing(void **state)
{
	hs_server *s = *state;
	json_decref(set_limit(s, "db", 2));
	json_t *a = acquire_ok(s, "db", "{\"holder\": \"a\", \"ttl_ms\": 300000}");
	static const char *const bad_limits[] = {
	    "{\"limit\": 0}",
	    "{\"limit\": 10001}",
	    "{\"limit\": -1}",
	    "{\"limit\": \"3\"}",
	    "{\"limit\": 2.5}",
	    "{\"limit\": null}",
	    "{\"limit\": true}",
	    "{}",
	    "{\"limit\": 3, \"color\": \"red\"}",
	    "{\"limits\": 3}",
	    "[3]",
	    "3",
	    "{\"limit\": 3",
	};
	for (size_t i = 0; i < sizeof bad_limits / sizeof *bad_limits; i++) {
		hs_response r;
		put_raw(s, "db", bad_limits[i], &r);
		hs_assert_problem(&r, 400, "invalid-request", bad_limits[i]);
		hs_response_fini(&r);
		/* nor on a resource nobody used: it is not created */
		put_raw(s, "fresh", bad_limits[i], &r);
		hs_assert_problem(&r, 400, "invalid-request", bad_limits[i]);
		hs_response_fini(&r);
	}
	static const char *const bad_leases[] = {
	    "{\"holder\": \"b\", \"exclusive\": \"true\"}",
	    "{\"holder\": \"b\", \"exclusive\": 1}",
	    "{\"holder\": \"b\", \"exclusive\": null}",
	    "{\"holder\": \"b\", \"exclusive\": [true]}",
	};
	for (size_t i = 0; i < sizeof bad_leases / sizeof *bad_leases; i++) {
		hs_response r;
		assert_int_equal(hs_post(s, "/resources/db/leases", bad_leases[i], &r), 0);
		hs_assert_problem(&r, 400, "invalid-request", bad_leases[i]);
		hs_response_fini(&r);
	}
	static const char *const bad_workers[] = {
	    "{\"id\": \"bad\", \"resource\": \"db\", \"workers\": [{\"name\": \"w\","
	    " \"exclusive\": \"yes\"}]}",
	    "{\"id\": \"bad\", \"resource\": \"db\", \"workers\": [{\"name\": \"w\","
	    " \"exclusive\": 0}]}",
	    "{\"id\": \"bad\", \"resource\": \"db\", \"workers\": [\"v\", {\"name\": \"w\","
	    " \"external\": true, \"exclusive\": null}]}",
	};
	for (size_t i = 0; i < sizeof bad_workers / sizeof *bad_workers; i++) {
		hs_response r;
		assert_int_equal(hs_post(s, "/workflows", bad_workers[i], &r), 0);
		hs_assert_problem(&r, 400, "invalid-request", bad_workers[i]);
		hs_response_fini(&r);
	}
	json_t *res = resource_is(s, "db", 2, 1, 0);
	assert_holder(holder_at(res, 0), "lease", "a", 0, 1);
	assert_int_equal(hs_int(res, "last_fencing_token"), 1);
	json_decref(res);
	json_decref(hs_get_json(s, "/resources/fresh", 404));
	json_decref(hs_get_json(s, "/workflows/bad", 404));
	/* and the bounds themselves are limits */
	json_decref(set_limit(s, "db", 10000));
	json_decref(set_limit(s, "db", 1));
	json_decref(resource_is(s, "db", 1, 1, 0));
	release(s, a);
	json_decref(a);
}

/*
 * The same through a node that does not drive the resource: node1 sets the limit of a
 * resource node0 drives, and takes and releases leases on it, plain and exclusive; both
 * nodes tell the same resource. PostgreSQL only.
 */
static void test_through_another_node(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	assert_int_equal(cl_open(c, 2, LEASE_MS, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 3, WAIT_MS));
	unsigned long long avoid = 0;
	char name[64];
	cl_pick_resource(c, 0, "permits", &avoid, name, sizeof name);
	hs_server *n0 = c->node[0], *n1 = c->node[1];

	json_t *put = set_limit(n1, name, 2);
	assert_int_equal(holders_n(put), 0);
	json_decref(put);
	json_decref(resource_is(n0, name, 2, 0, 0));
	json_decref(resource_is(n1, name, 2, 0, 0));
	hs_response r;
	put_raw(n1, name, "{\"limit\": 0}", &r);
	hs_assert_problem(&r, 400, "invalid-request", "limit 0 through node1");
	hs_response_fini(&r);

	json_t *a = acquire_ok(n1, name, "{\"holder\": \"a\", \"ttl_ms\": 300000}");
	json_t *b = acquire_ok(n1, name, "{\"holder\": \"b\", \"ttl_ms\": 300000}");
	assert_lease(a, 0, 1);
	assert_lease(b, 1, 2);
	assert_refused(n1, name, "{\"holder\": \"q\"}");
	lease_job *x = job_start(n1, name,
				 "{\"holder\": \"x\", \"exclusive\": true, \"ttl_ms\": 300000,"
				 " \"wait_ms\": 60000}");
	wait_counts(n0, name, 2, 1);
	json_t *res = resource_is(n0, name, 2, 2, 1);
	assert_true(exclusive_of(waiter_at(res, 0)));
	assert_int_equal(hs_int(waiter_at(res, 0), "permits"), 2);
	json_decref(res);
	/* lowered through node1: both keep holding */
	res = set_limit(n1, name, 1);
	assert_int_equal(holders_n(res), 2);
	json_decref(res);
	res = resource_is(n0, name, 1, 2, 1);
	assert_int_equal(hs_int(res, "permits_in_use"), 2);
	json_decref(res);
	release(n1, a);
	release(n1, b);
	json_t *lx = job_granted(x);
	assert_lease(lx, -1, 3);
	res = resource_is(n1, name, 1, 1, 0);
	assert_holder(holder_at(res, 0), "lease", "x", -1, 3);
	assert_int_equal(hs_int(res, "permits_in_use"), 1);
	json_decref(res);
	/* raised through node1 while x holds exclusively: nobody else until it leaves */
	json_decref(set_limit(n1, name, 3));
	assert_refused(n1, name, "{\"holder\": \"q\"}");
	release(n1, lx);
	json_t *p = acquire_ok(n1, name, "{\"holder\": \"p\", \"ttl_ms\": 300000}");
	assert_lease(p, 0, 4);
	res = resource_is(n0, name, 3, 1, 0);
	assert_int_equal(hs_int(res, "permits_in_use"), 1);
	json_decref(res);
	release(n1, p);
	json_decref(p);
	json_decref(a);
	json_decref(b);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_raise_and_lower_limit, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_exclusive_waiter_not_starved, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_slot_reused_at_higher_token, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_expiry_hands_the_permit_on, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_kill9_keeps_holders_slots_and_tokens, hs_setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_workflows_share_permits, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_input_changes_nothing, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_through_another_node, cl_setup, cl_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
